"""Text from others made safe to show: terminal controls and bidi overrides made visible.

Process names, log lines, file names and Slurm reasons come from users. Printed raw, an ESC
sequence can clear an admin's screen or rewrite what a line seems to say, a backspace or CR can
hide part of it, and a bidi override (U+202E) shows a reason or path reversed (Trojan Source,
CVE-2021-42574). `printable()` replaces every such character with a visible escape (`\\x1b`,
`\\u202e`) and is used at every output edge: CLI text, HTML, evidence files. JSON goes through
`dumps()`, which keeps `json.dumps`'s ASCII escaping and escapes DEL too.

Nothing is imported at start but gpugate.regex (its patterns compile on first use): this runs
on the prolog path.
"""

from __future__ import annotations

from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# C0 controls (ESC, BEL, BS, CR, LF, TAB ...), DEL and C1 controls (CSI is U+009B); the
# Unicode bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069) and marks
# (U+200E/U+200F LRM/RLM, U+061C ALM); the line and paragraph separators U+2028/U+2029 (they
# end a line in some terminals and editors); lone surrogates (undecodable bytes of a file
# name under surrogateescape), which cannot even be written to a UTF-8 stream.
_BIDI_AND_SEPARATORS = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = lazy(f"[\x00-\x1f\x7f-\x9f{_BIDI_AND_SEPARATORS}]")
# The same but TAB and LF kept: for text meant to be several lines (a file's body).
_UNSAFE_MULTILINE = lazy(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI_AND_SEPARATORS}]")


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = ord(m[0])
    if m[0] in _SHORT:
        return _SHORT[m[0]]
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: object, multiline: bool = False) -> str:
    """`text` with controls, bidi marks and separators replaced by visible escapes (`\\x1b`)."""
    s = "" if text is None else str(text)
    if s.isascii() and s.isprintable():  # the common case, without a regex pass
        return s
    return (_UNSAFE_MULTILINE if multiline else _UNSAFE).sub(_escape, s)


def is_printable(text: str) -> bool:
    """Whether `printable(text)` would leave `text` unchanged."""
    return (text.isascii() and text.isprintable()) or _UNSAFE.search(text) is None


def dumps(obj: object, **kwargs: Any) -> str:
    """`json.dumps` that never emits a raw control or bidi character.

    json.dumps with its default `ensure_ascii=True` writes every non-ASCII character as
    `\\uXXXX` and C0 controls as escapes, but leaves DEL (0x7f) raw; with ensure_ascii=False
    it would pass U+202E and C1 controls through. So ASCII is forced and DEL escaped (`\\u007f`
    is the same JSON string).
    """
    import json

    kwargs.pop("ensure_ascii", None)
    return json.dumps(obj, ensure_ascii=True, **kwargs).replace("\x7f", "\\u007f")

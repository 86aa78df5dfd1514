"""Which board profile a node's GPUs belong to: matched by model family, on whole words.

A GPU name is split into words at anything but letters and digits ("NVIDIA A100-SXM4-80GB" is
NVIDIA, A100, SXM4, 80GB); a profile's pattern matches when all its words appear in the name in
order. "H200" therefore matches "NVIDIA H200" and "NVIDIA H200 NVL" but never "NVIDIA GH200
480GB", and of several matching profiles the one whose pattern has the most words wins ("H200
NVL" over "H200"), whatever order the packaged and the site's boards come in.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import BoardProfile

_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")

# What an unknown board's checks say about adding one.
HOW_TO_ADD = (
    "add a profile under `boards:` in the site file (match: a word of the GPU name), "
    "or learn one on a known-good node with `gpugate profile`"
)


def words(text: str) -> tuple[str, ...]:
    """The upper-cased words of a GPU name or pattern."""
    # The runs of ASCII letters and digits (re's [A-Za-z0-9]+), without importing re.
    marked = "".join(c if c in _WORD_CHARS else " " for c in text)
    return tuple(w.upper() for w in marked.split())


def pattern_fits(pattern: str, name: str) -> bool:
    """All words of `pattern` appear in `name`, in order (not necessarily adjacent)."""
    want = words(pattern)
    if not want:
        return False
    have = iter(words(name))
    return all(any(w == h for h in have) for w in want)


def match_board(
    names: list[str], boards: dict[str, BoardProfile]
) -> tuple[str | None, BoardProfile | None]:
    """The profile with the most specific pattern that fits any of the GPU names."""
    best: tuple[int, str | None, BoardProfile | None] = (0, None, None)
    for board, profile in boards.items():
        for pattern in profile.match:
            size = len(words(pattern))
            if size > best[0] and any(pattern_fits(pattern, n) for n in names):
                best = (size, board, profile)
    return best[1], best[2]


def unknown_board(models: list[str]) -> str:
    """Why a board check cannot judge: no profile fits these GPU models, and how to add one."""
    seen = ", ".join(sorted(set(models))) or "no GPU name reported"
    return f"board unknown: no profile matches {seen}; {HOW_TO_ADD}"

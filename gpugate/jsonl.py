"""JSON lines, as every store of gpugate keeps them: one object a line, oldest first.

Appends are one write() on an O_APPEND descriptor, so the lines of concurrent writers never
interleave. Readers trust no line: the files are read capped (only the newest `max_bytes`),
and a line that is torn, foreign, binary or longer than `max_line` comes back as NOT_JSON for
the store's own validation to skip, never as an exception. Users: the event log (gpugate.log),
the drain history and audit log (store.history), the app-Xid record (store.app_xids) and the
evidence index (store.evidence).
"""

from __future__ import annotations

import json
import os

from gpugate import fsutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

READ_MAX = 32 * 1024 * 1024
LINE_MAX = 64 * 1024


class _NotJson:
    def __repr__(self) -> str:
        return "NOT_JSON"


NOT_JSON = _NotJson()  # what parse() gives for a line that holds no usable JSON value


def dumps(entries: Iterable[object]) -> str:
    """The entries as JSON lines (compact; a value JSON cannot hold is written as its str())."""
    return "".join(json.dumps(e, separators=(",", ":"), default=str) + "\n" for e in entries)


def append(
    path: str,
    entries: Iterable[object],
    mode: int = fsutil.PRIVATE_FILE,
    gid: int | None = None,
    sync: bool = False,
) -> int:
    """Append the entries in one write (O_APPEND: no torn interleaving); the file's new size.

    The file is opened as fsutil.open_private does (no symlink; `mode`, group `gid`).
    """
    data = dumps(entries).encode()
    # fsutil.open_private looked up now: the tests' full-disk seam replaces it there.
    fd = fsutil.open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode, gid)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_tail(path: str, max_bytes: int = READ_MAX) -> tuple[bytes, int]:
    """(the file's bytes, or its newest `max_bytes` from the first whole line on; its size).

    Never follows a symlink nor waits on a FIFO; raises OSError (FileNotFoundError: no file).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        if size <= max_bytes:
            return fh.read(max_bytes + 1)[-max_bytes:], size
        fh.seek(size - max_bytes)
        data = fh.read(max_bytes)
    # The cut lands inside a line: drop it (an older entry, or the tail of a giant line).
    return (data[data.find(b"\n") + 1 :] if b"\n" in data else b""), size


def parse(data: bytes, max_line: int = LINE_MAX) -> list[object]:
    """The value of each non-blank line, NOT_JSON for one that is not JSON or too long."""
    lines = [line for line in data.splitlines() if line.strip()]
    if all(len(line) <= max_line for line in lines):
        try:
            # One parse for the whole file (20,000 entries take a tenth of the time of 20,000
            # parses); line by line only when some line is torn or foreign.
            values: list[object] = json.loads(b"[" + b",".join(lines) + b"]")
            if len(values) == len(lines):  # `1,2` on one line parses as two
                return values
        except (ValueError, RecursionError):  # RecursionError: "[[[[..." deep
            pass
    return [_one(line, max_line) for line in lines]


def _one(line: bytes, max_line: int) -> object:
    if len(line) > max_line:
        return NOT_JSON
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return NOT_JSON


def load(
    path: str,
    valid: Callable[[object], bool],
    max_bytes: int = READ_MAX,
    max_line: int = LINE_MAX,
) -> tuple[list[Any], int, int]:
    """(the entries `valid` accepts, how many lines it or parse() refused, the file's size).

    Raises OSError as read_tail() does.
    """
    data, size = read_tail(path, max_bytes)
    values = parse(data, max_line)
    kept = [v for v in values if valid(v)]
    return kept, len(values) - len(kept), size

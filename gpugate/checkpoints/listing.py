"""One scan's view of a checkpoint directory: its capped listing and the careful readers.

Every layout (layouts.py) and the torch file reader (torchfile.py) read the job's files
through these: listings are capped, files are opened with `open_regular` (no symlinks, no
FIFOs), a symlink that leaves the directory is refused, and what makes a candidate unusable is
raised as `Incomplete` with the reason the admin reads.
"""

from __future__ import annotations

import os
import re

from gpugate.record import Record
from gpugate.userfiles import UserFileError, open_regular, read_fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

MAX_ENTRIES = 10_000  # entries read from any one directory (and for spotting DCP directories)
_MAX_TAG = 4096
PARTIAL = (".tmp", ".partial")  # a sibling with these suffixes: a save in progress


class CheckpointDirError(OSError):
    """DIR does not exist, is not a directory, or cannot be listed."""


class Incomplete(Exception):
    """Raised by a layout's check: why the candidate cannot be resumed from."""


class Found(Record):
    """What a layout's check found, the newest mtime among the files, a step it read, and
    whether the format proves the save finished (else the settle time decides)."""

    why: str
    mtime: float
    step: int | None = None
    proven: bool = False


class ScanContext:
    """One scan: DIR's entries (listed once), the names layouts claimed, clock and limits."""

    def __init__(self, shown: str, root: str, settle_s: float, max_entries: int, now: float):
        self.shown, self.root = shown, root
        self.settle_s, self.max_entries, self.now = settle_s, max_entries, now
        self.budget = max_entries  # entries read while looking for DCP directories
        self.claimed: set[str] = set()
        self.notes: list[str] = []
        try:
            self.entries, more = listdir(root, max_entries)
        except OSError as exc:
            raise CheckpointDirError(f"{shown}: cannot list: {exc.strerror}") from None
        if more:
            self.notes.append(
                f"{shown} has more than {max_entries} entries: only the first {max_entries} "
                "(in directory order) were looked at"
            )

    def unclaimed(
        self, pattern: re.Pattern[str], kind: str = "any"
    ) -> Iterator[tuple[str, re.Match[str]]]:
        """Entries a layout before this one did not take, whose name matches `pattern`."""
        for name, entry in list(self.entries.items()):
            m = pattern.fullmatch(name)
            if m and name not in self.claimed and _kind_ok(entry, kind):
                yield name, m


def inside(ctx: ScanContext, path: str) -> str:
    """The real path of a symlink in DIR, refusing one that leaves DIR."""
    real = os.path.realpath(path)
    if os.path.commonpath([ctx.root, real]) != ctx.root:
        raise Incomplete(f"symlink to {os.readlink(path)} leaves {ctx.shown}: not followed")
    return real


def listdir(path: str, limit: int) -> tuple[dict[str, os.DirEntry[str]], bool]:
    """Up to `limit` entries of a directory (no stat calls), and whether there were more."""
    entries: dict[str, os.DirEntry[str]] = {}
    with os.scandir(path) as it:
        for entry in it:
            if len(entries) >= limit:
                return entries, True
            entries[entry.name] = entry
    return entries, False


def dir_entries(ctx: ScanContext, path: str) -> dict[str, os.DirEntry[str]]:
    """A checkpoint directory's entries; one too large to list whole is not judged."""
    entries, more = listdir(path, ctx.max_entries)
    if more:
        raise Incomplete(f"more than {ctx.max_entries} entries: not checked")
    return entries


def looks_dcp(ctx: ScanContext, path: str) -> bool:
    """Whether a directory holds DCP files (an unfinished save has only `*.distcp`)."""
    if os.path.lexists(os.path.join(path, ".metadata")):
        return True
    try:
        with os.scandir(path) as it:
            for entry in it:
                ctx.budget -= 1
                if entry.name.endswith(".distcp") or entry.name == ".metadata.tmp":
                    return True
                if ctx.budget <= 0:
                    ctx.notes.append(f"stopped looking into directories after {ctx.max_entries}")
                    return False
    except OSError:
        pass
    return False


def dcp_marked(names: dict[str, Any]) -> bool:
    return (
        ".metadata" in names
        or ".metadata.tmp" in names
        or any(n.endswith(".distcp") for n in names)
    )


def open_in(directory: str, name: str) -> int:
    """`open_regular` on a file of a checkpoint directory, naming it in the reason."""
    path = os.path.join(directory, name)
    try:
        return open_regular(path)
    except UserFileError as exc:
        raise Incomplete(str(exc).replace(path, name)) from None


def read_tag(directory: str, name: str) -> tuple[str | None, str | None]:
    """The one-line content of a tracker file: (text, None) or (None, what is wrong)."""
    try:
        fd = open_in(directory, name)
    except (Incomplete, OSError) as exc:
        return None, str(exc)
    try:
        text = read_capped(fd, _MAX_TAG).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    if not text or "/" in text or "\0" in text or text in (".", ".."):
        return None, f"{name} holds {text[:40]!r}, not a directory name"
    return text, None


def read_capped(fd: int, limit: int) -> bytes:
    """Up to `limit` + 1 bytes from `fd` (one more than allowed tells "too large")."""
    return read_fd(fd, limit + 1)


def _kind_ok(entry: os.DirEntry[str], kind: str) -> bool:
    if kind == "any" or entry.is_symlink():
        return True  # a symlink is judged (or refused) by what it points at
    return entry.is_dir(follow_symlinks=False) == (kind == "dir")


def entry_mtime(entry: os.DirEntry[str] | None) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime if entry else 0.0
    except OSError:
        return 0.0


def last_number(name: str) -> int | None:
    numbers = re.findall(r"\d+", name)
    return int(numbers[-1]) if numbers else None

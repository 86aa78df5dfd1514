"""File helpers: atomic replace, safe reads of files that other users control."""

from __future__ import annotations

import os
import tempfile


def atomic_write(path: str, text: str | bytes, mode: int = 0o644) -> None:
    """Write a file so that readers see the old or the new content, never half of one."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        data = text.encode() if isinstance(text, str) else text
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    finally:
        if fd >= 0:
            os.close(fd)
        if os.path.exists(tmp):
            os.unlink(tmp)

"""Trees deeper than any recursion or path limit, for code that walks users' files."""

from __future__ import annotations

import os


def deep_chain(top, depth: int) -> None:
    """`depth` nested directories `d/d/d/...` under `top`, made through descriptors (no path
    of that length is ever spelled out), with a file at the bottom."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)

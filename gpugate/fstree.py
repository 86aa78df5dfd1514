"""Removing and measuring directory trees that users may have written into, as root."""

from __future__ import annotations

import os


def remove_tree(path: str) -> bool:
    """Remove a directory tree as root without following a symlink a user put anywhere in it.

    A symlink (or a file) at `path` itself is unlinked, not followed. Inside, shutil.rmtree
    works on file descriptors (openat/unlinkat with O_NOFOLLOW) where the platform allows it,
    which `rmtree.avoids_symlink_attacks` says; without that it is not safe, and nothing is
    removed. Returns whether `path` is gone.
    """
    import shutil
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return True
    if not shutil.rmtree.avoids_symlink_attacks:
        return False
    shutil.rmtree(path)
    return True


def tree_bytes(path: str) -> int:
    """The apparent size of the files under `path` (symlinks not followed)."""
    total = 0
    for top, _dirs, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(top, n)).st_size
            except OSError:
                pass
    return total

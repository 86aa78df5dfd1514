"""Removing and measuring directory trees that users may have written into, as root."""

from __future__ import annotations

import errno
import os
import time

# Every directory is opened relative to its parent's descriptor and never through a symlink:
# a user who swaps a directory for a link to /etc mid-walk gets ELOOP, not root's deletions.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOT_A_DIR = (errno.ELOOP, errno.ENOTDIR)  # what O_NOFOLLOW|O_DIRECTORY says of a link or file
_CLOCK_EVERY = 512  # entries unlinked between looks at the clock


def remove_tree(path: str, deadline: float | None = None) -> bool:
    """Remove a directory tree as root without following a symlink a user put anywhere in it.

    A symlink (or a file) at `path` itself is unlinked, not followed; `path`'s parent is the
    caller's (root's) own. See remove_at. Returns whether `path` is gone.
    """
    parent, name = os.path.split(os.path.normpath(path))
    try:
        parent_fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        return remove_at(parent_fd, name, deadline)
    finally:
        os.close(parent_fd)


def remove_at(dir_fd: int, name: str, deadline: float | None = None) -> bool:
    """Remove `name` in the open directory `dir_fd`, and the whole tree below it.

    Any depth: the walk is iterative and holds two descriptors at a time, climbing back up
    through ".." only after checking that ".." is still the directory it came down from (a
    user who moves a directory out of the tree mid-walk stops the walk; nothing outside it is
    touched). Never enters another file system (a user's FUSE mount), never follows a symlink
    (links, FIFOs, sockets and devices are unlinked as names). Stops at `deadline` (a
    time.monotonic() value), leaving the rest. Returns whether `name` is gone; an entry that
    could not be removed makes it False, never an exception, so the caller can try again later.
    """
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in _NOT_A_DIR:
            return _unlink(dir_fd, name)
        return False
    if not _empty(fd, deadline):  # closes fd
        return False
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _empty(fd: int, deadline: float | None) -> bool:
    """Empty the directory open as `fd` (closed on return); whether it is empty now."""
    try:
        here = os.fstat(fd)
        dev = here.st_dev
        ident = (here.st_dev, here.st_ino)
        # One frame per level above the current directory: that level's identity, the name of
        # the current directory in it, and the subdirectories still to do there.
        above: list[tuple[tuple[int, int], str, list[str]]] = []
        complete = True
        pending, done = _clear_files(fd, deadline)
        while done:
            if pending:
                name = pending.pop()
                sub, ok = _open_subdir(fd, name, dev)
                complete &= ok
                if sub is None:
                    continue
                above.append((ident, name, pending))
                os.close(fd)
                fd = sub
                st = os.fstat(fd)
                ident = (st.st_dev, st.st_ino)
                pending, done = _clear_files(fd, deadline)
                continue
            if not above:
                return complete
            ident, name, pending = above.pop()
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = up
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != ident:
                return False  # moved while we worked: this is not the directory we came from
            try:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError:
                complete = False
        return False  # out of time
    except OSError:
        return False  # a directory removed under us (another sweep), ".." gone: try again later
    finally:
        os.close(fd)


def _open_subdir(fd: int, name: str, dev: int) -> tuple[int | None, bool]:
    """(the subdirectory `name` opened, or None; False where something could not be removed)."""
    try:
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None, True
    except OSError as exc:
        if exc.errno in _NOT_A_DIR:  # became a link or a file since it was listed
            return None, _unlink(fd, name)
        return None, False
    if os.fstat(sub).st_dev != dev:
        os.close(sub)  # a mount point: what is mounted there is not ours to empty
        return None, False
    return sub, True


def _clear_files(fd: int, deadline: float | None) -> tuple[list[str], bool]:
    """Unlink every entry of `fd` that is no directory; (the subdirectories, finished in time)."""
    subdirs: list[str] = []
    seen: set[str] = set()
    count = 0
    again = True
    while again:  # POSIX leaves open whether readdir() still returns entries after an unlink
        again = False
        with os.scandir(fd) as entries:
            for entry in entries:
                count += 1
                checked = deadline is not None and count % _CLOCK_EVERY == 0
                if checked and time.monotonic() > (deadline or 0.0):
                    return subdirs, False
                if entry.name in seen:
                    continue
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    seen.add(entry.name)
                    subdirs.append(entry.name)
                elif _unlink(fd, entry.name):
                    again = True
    if deadline is not None and time.monotonic() > deadline:
        return subdirs, False
    return subdirs, True


def _unlink(dir_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        return False
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

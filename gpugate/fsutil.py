"""File helpers: atomic replace, private state files, safe reads of files that other users control.

gpugate's state (per-job baselines, events, its log, the drain history) holds kernel lines and
users' paths, so it is readable by root and the site's admin group only: files 0640 owned by
root and the group of the directory they are in, directories no wider than 0751. The helpers
here create them that way and tighten what an older release left world-readable.
"""

from __future__ import annotations

import os

PRIVATE_FILE = 0o640
# The state directory itself: others may pass through it (to their own job's file under
# task/, see state.save_task_file) but not list it.
STATE_DIR_MODE = 0o751
# O_CLOEXEC: the hooks start children (scontrol, the as-user reader); they get no state fds.
_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def dir_group(directory: str) -> int:
    """The group new files in `directory` should get when root creates them (-1: leave it).

    The state directory carries the admin group (state.secure_state_dir sets it); files take
    it from their directory, so every writer agrees without being told the config.
    """
    if os.geteuid() != 0:
        return -1  # only root may give a file away to a group it is not in
    try:
        return os.stat(directory).st_gid
    except OSError:
        return -1


def tighten(fd: int, mode: int, gid: int = -1, uid: int = -1) -> None:
    """Give an open file or directory exactly `mode` and the owner/group asked (best effort).

    Best effort because a non-root hook (EpilogSlurmctld as SlurmUser) may open files it does
    not own; what it cannot change it leaves as it is.
    """
    try:
        st = os.fstat(fd)
        if (uid >= 0 and st.st_uid != uid) or (gid >= 0 and st.st_gid != gid):
            os.fchown(fd, uid, gid)
        if st.st_mode & 0o7777 != mode:
            os.fchmod(fd, mode)
    except OSError:
        pass


def open_private(path: str, flags: int, mode: int = PRIVATE_FILE, gid: int | None = None) -> int:
    """os.open() that never follows a symlink and leaves the file `mode`, group `gid`.

    `gid` None: the group of the file's directory (see dir_group). An existing file keeps
    its content but loses the bits beyond `mode` (an older release wrote 0644).
    """
    fd = os.open(path, flags | _NOFOLLOW, mode)
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        if gid is None:
            gid = dir_group(os.path.dirname(path) or ".")
        tighten(fd, mode, gid)
    return fd


def private_dir(path: str, mode: int, gid: int | None = None) -> str:
    """Create (or tighten) a directory of our own with exactly `mode`; refuse a symlink.

    Root refuses a directory that someone else owns: a user who could create it first could
    read and replace everything gpugate writes there. Missing parents are created with the
    default mode (they are the site's, e.g. /var/lib).
    """
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
        raise NotADirectoryError(f"{path}: not a plain directory ({exc.strerror})") from None
    try:
        euid = os.geteuid()
        owner = os.fstat(fd).st_uid
        if owner != euid:
            if euid == 0:
                raise PermissionError(
                    f"{path}: owned by uid {owner}, not root: no job state kept there"
                )
            return path  # not ours to change (a non-root hook in root's directory)
        if gid is None:
            gid = dir_group(os.path.dirname(path) or ".")
        tighten(fd, mode, gid)
    finally:
        os.close(fd)
    return path


def atomic_write(
    path: str, text: str | bytes, mode: int = 0o644, uid: int = -1, gid: int = -1
) -> None:
    """Write a file so that readers see the old or the new content, never half of one.

    The file has `mode` and owner uid/gid (-1: root's default) before its name appears, so
    there is no moment in which it is readable by anyone else.
    """
    import tempfile  # only writers pay for the import

    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        data = text.encode() if isinstance(text, str) else text
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if uid >= 0 or gid >= 0:
            os.fchown(fd, uid, gid)
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

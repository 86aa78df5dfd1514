"""Read files the job's user controls, as root, safely.

A job's stdout, its NCCL debug files and its checkpoint directory belong to the user: a
symlink there could point root at /etc/shadow, a FIFO could block the epilog forever, a file
could be 50 GB. So the reading happens in a child process (`gpugate.child`: a fresh
interpreter, not a fork of this threaded one) that runs as the job's user (groups, gid, uid,
set before its exec) — it can then read exactly what the user could read, nothing more —
opens with O_NOFOLLOW|O_NONBLOCK, refuses anything but a regular file, and sends back only
what was asked for (a capped tail, or the result of an allow-listed function run over the
files), at most ANSWER_MAX bytes. The parent waits with a timeout and kills the child if it
hangs (a stale NFS mount); the child also dies with its parent and holds none of its
descriptors, so a killed epilog never leaves slurmd waiting on its pipes. Where gpugate
cannot become the user (not root), it does not read with its own rights: it says so.
"""

from __future__ import annotations

import os
import pwd
import stat

from gpugate import child
from gpugate.fsutil import open_regular as open_plain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class UserFileError(OSError):
    """A user's file could not be read safely; the message says why."""


def open_regular(path: str) -> int:
    """Open a regular file without following a final symlink or blocking on a FIFO."""

    try:
        return open_plain(path, follow=False)
    except OSError as exc:  # fsutil.FileRefused says what the file is instead
        raise UserFileError(f"{path}: {exc.strerror or exc}") from None


def read_tail(path: str, max_bytes: int) -> bytes:
    """The last `max_bytes` of a regular file (in this process, with its privileges)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - max_bytes), os.SEEK_SET)
        return read_fd(fd, max_bytes)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from an open file, in 1 MiB reads (never more in memory)."""
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# What the reader may send back: 64 MiB holds the epilog's default caps (32 NCCL files and two
# logs of 256 KiB each, JSON-escaped) many times over; more is a runaway or a forged answer.
ANSWER_MAX = 64 << 20


def credentials(uid: int, gid: int | None) -> dict[str, Any]:
    """subprocess's `user`/`group`/`extra_groups` for reading as `uid` (empty: no drop needed).

    Raises UserFileError where this process cannot become `uid`: EpilogSlurmctld runs as a
    non-root SlurmUser, and reading the user's files with its own rights would let the user
    name files only the SlurmUser may read.
    """

    euid = os.geteuid()
    if uid == euid:
        return {}  # the user's own rights are ours already
    if euid != 0:
        raise UserFileError(
            f"running as uid {euid}, not root: cannot read as user {uid}; not reading"
        )
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:  # no passwd entry (a deleted user): no supplementary groups at all
        return {"user": uid, "group": uid if gid is None else gid, "extra_groups": []}
    gid = entry.pw_gid if gid is None else gid
    return {"user": uid, "group": gid, "extra_groups": os.getgrouplist(entry.pw_name, gid)}


def as_user(
    uid: int | None,
    gid: int | None,
    task: str,
    kwargs: dict[str, Any],
    timeout: float,
    max_bytes: int = ANSWER_MAX,
) -> object:
    """Run the allow-listed `task(**kwargs)` in a child running as `uid`; return its result.

    The child is a fresh interpreter (`gpugate.child`), never a fork of this process: the
    drop to the user (groups, gid, uid) happens before its exec, it holds none of our
    descriptors and dies with us. Raises UserFileError with the child's error, when `uid`
    cannot be become, or on timeout (the child is killed).
    """
    if uid is None:
        raise UserFileError("the job's user is unknown; not reading its files as root")
    creds = credentials(uid, gid)
    try:
        return child.call(task, kwargs, timeout, max_bytes, **creds)
    except child.ChildError as exc:
        message = str(exc)
        if message.startswith("timed out"):
            message = f"reading the user's files {message}"
        raise UserFileError(message) from None


NOTE_MAX = 4096  # a note is a few lines: what happened to the job, where to read more


def write_note(path: str, text: str) -> str:
    """Write a short note as the job's user (a child task): created exclusively, or the
    user's own note rewritten; never through a symlink, never into a FIFO or device, never
    into a file of another owner; the path written, or `skipped: why`."""

    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        # Issue 41: in a shared output directory another user may create the notes of coming
        # job ids first (0666) to read them; only this user's own earlier note is rewritten.
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_uid != os.geteuid():
            return f"skipped: {path} exists and is not the job user's (owner uid {st.st_uid})"
        fd = os.open(path, flags)  # a symlink: ELOOP
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserFileError(f"{path}: not a regular file; not written")
        if st.st_uid != os.geteuid():  # replaced since the lstat
            return f"skipped: {path} exists and is not the job user's (owner uid {st.st_uid})"
        os.ftruncate(fd, 0)
        os.write(fd, text.encode()[:NOTE_MAX])
    finally:
        os.close(fd)
    return path

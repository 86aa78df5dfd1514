"""Read files the job's user controls, as root, safely.

A job's stdout, its NCCL debug files and its checkpoint directory belong to the user: a
symlink there could point root at /etc/shadow, a FIFO could block the epilog forever, a file
could be 50 GB. So the reading happens in a forked child that first drops to the job's user
(groups, gid, uid) — it can then read exactly what the user could read, nothing more — opens
with O_NOFOLLOW|O_NONBLOCK, refuses anything but a regular file, and sends back only what was
asked for (a capped tail, or the result of a function run over the file). The parent waits
with a timeout and kills the child if it hangs (a stale NFS mount).
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class UserFileError(OSError):
    """A user's file could not be read safely; the message says why."""


def open_regular(path: str) -> int:
    """Open a regular file without following a final symlink or blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last component is a symlink
            raise UserFileError(f"{path}: is a symlink; not followed") from None
        raise UserFileError(f"{path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UserFileError(f"{path}: not a regular file; not read")
    return fd


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


def drop_to(uid: int, gid: int | None) -> None:
    """Become the job's user for good (in a child): groups first, then gid, then uid."""
    import pwd

    if os.geteuid() != 0 or uid == os.geteuid():
        return
    try:
        user = pwd.getpwuid(uid)
        gid = user.pw_gid if gid is None else gid
        os.initgroups(user.pw_name, gid)
    except KeyError:
        os.setgroups([])
    os.setgid(gid if gid is not None else uid)
    os.setuid(uid)


def as_user(uid: int | None, gid: int | None, fn: Callable[[], object], timeout: float) -> object:
    """Run `fn` in a child process that runs as `uid`; return its JSON-able result.

    Raises UserFileError with the child's error, or on timeout (the child is killed).
    """
    if uid is None:
        raise UserFileError("the job's user is unknown; not reading its files as root")
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 0
        try:
            os.close(rfd)
            drop_to(uid, gid)
            payload = {"ok": fn()}
        except BaseException as exc:
            payload = {"error": f"{type(exc).__name__}: {exc}"}
            code = 1
        try:
            data = json.dumps(payload, default=str).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view) :]
        finally:
            os._exit(code)
    os.close(wfd)
    try:
        data = _read_all(rfd, timeout, pid)
    finally:
        os.close(rfd)
    try:
        payload = json.loads(data or b"{}")
    except ValueError:
        raise UserFileError("the reader sent garbage") from None
    if "error" in payload:
        raise UserFileError(payload["error"])
    if "ok" not in payload:
        raise UserFileError("the reader died without an answer")
    return payload["ok"]


def _read_all(fd: int, timeout: float, pid: int) -> bytes:
    deadline = time.monotonic() + timeout
    chunks = []
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, left))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            # Reap if it is already gone; a child stuck in the kernel is left to init.
            os.waitpid(pid, os.WNOHANG)
            raise UserFileError(f"reading the user's files timed out after {timeout:g} s")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.waitpid(pid, 0)
    return b"".join(chunks)

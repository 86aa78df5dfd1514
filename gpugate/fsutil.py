"""File helpers: atomic replace, private state files, lock files, fresh temporary names.

gpugate's state (per-job baselines, events, its log, the drain history) holds kernel lines and
users' paths, so it is readable by root and the site's admin group only: files 0640 owned by
root and the group of the directory they are in, directories no wider than 0751. The helpers
here create them that way and tighten what an older release left world-readable.

Lock files are stricter: 0600 in a `locks/` directory 0700 of the hook's own user (root). flock
needs only an open descriptor, read-only will do: a user who can open a lock file can hold it
and make every hook that waits on it wait. So nobody else may open one, and no hook waits
without a bound either (FileLock has no unbounded wait).
"""

from __future__ import annotations

import errno
import os
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    T = TypeVar("T")

PRIVATE_FILE = 0o640
LOCK_DIR = "locks"  # beside the data it guards: <state_dir>/locks, <history_dir>/locks
LOCK_DIR_MODE = 0o700
LOCK_FILE_MODE = 0o600
# The state directory itself: others may pass through it (to their own job's file under
# task/, see state.save_task_file) but not list it.
STATE_DIR_MODE = 0o751
# O_CLOEXEC: the hooks start children (scontrol, the as-user reader); they get no state fds.
_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FRESH_TRIES = 32


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


def _fresh(directory: str, prefix: str, create: Callable[[str], T]) -> tuple[str, T]:
    """A new name in `directory` made by `create` (os.open with O_EXCL, os.mkdir), and its result.

    The name is unpredictable (48 random bits) as well as unique, so nobody can place a file
    or a symlink there first; on the rare clash another name is drawn.
    """
    for _ in range(_FRESH_TRIES):
        name = os.path.join(directory, f"{prefix}{os.getpid()}-{os.urandom(6).hex()}")
        try:
            return name, create(name)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", directory)


def fresh_dir(directory: str, prefix: str, mode: int = 0o700) -> str:
    """Create a new, empty directory with a unique hidden name in `directory`; its path."""
    return _fresh(directory, prefix, lambda name: os.mkdir(name, mode))[0]


def atomic_write(
    path: str, text: str | bytes, mode: int = 0o644, uid: int = -1, gid: int = -1
) -> None:
    """Write a file so that readers see the old or the new content, never half of one.

    The content goes to a new file (O_EXCL, 0600, never through a symlink) beside `path`,
    which gets `mode` and owner uid/gid (-1: root's default) and reaches the disk before it is
    renamed over `path`: there is no moment in which it is readable by anyone else.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
    directory = os.path.dirname(path) or "."
    tmp, fd = _fresh(directory, ".tmp-", lambda name: os.open(name, flags, 0o600))
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
        tmp = ""
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def lock_file(base: str, name: str) -> str:
    """`<base>/locks/<name>`, creating the lock directory (0700); check_lock_dir() vets it."""
    directory = os.path.join(base, LOCK_DIR)
    try:
        private_dir(directory, LOCK_DIR_MODE, gid=-1)
    except PermissionError:
        pass  # root finds it someone else's: check_lock_dir says whether that will do
    check_lock_dir(directory)
    return os.path.join(directory, name)


def check_lock_dir(directory: str) -> int:
    """The directory's owner; PermissionError unless only its owner can enter it, us or the
    data's (its parent's owner: a SlurmUser's history directory, which root's admin commands
    write too); a real directory, never a symlink."""

    st = os.lstat(directory)
    owners = {os.geteuid(), os.stat(os.path.dirname(os.path.abspath(directory))).st_uid}
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners or st.st_mode & 0o077:
        raise PermissionError(
            f"{directory}: not a private lock directory (uid {st.st_uid}, mode "
            f"{st.st_mode & 0o7777:04o}; want uid {os.geteuid()}, 0700): another user could "
            "open a lock file there and hold it"
        )
    return st.st_uid


class FileLock:
    """An exclusive flock on a lock file of its own, for one `with` block (closing releases it).

    A lock file apart from the data, because the data files are replaced by rename. The wait is
    always bounded: `held` says whether the lock came within `wait_s` (0: one try), and the
    caller goes on without it as it can. `path` None: no lock, `held` stays False. The file is
    0600 in a directory lock_file() made; one anywhere else is refused (check_lock_dir).
    Node-local files only: flock on NFS or Lustre is slow or unreliable.
    """

    def __init__(self, path: str | None, *, wait_s: float) -> None:
        if not isinstance(wait_s, (int, float)) or not 0 <= wait_s < float("inf"):
            raise ValueError(f"FileLock({path!r}): wait_s must be a finite number of seconds")
        self.path, self.wait_s = path, float(wait_s)
        self.fd = -1
        self.held = False

    def __enter__(self) -> FileLock:
        if self.path is None:
            return self
        import fcntl

        owner = check_lock_dir(os.path.dirname(self.path) or ".")
        self.fd = open_private(self.path, os.O_RDWR | os.O_CREAT, LOCK_FILE_MODE, gid=-1)
        if owner != os.geteuid():  # root in the data owner's directory: the file is theirs too
            tighten(self.fd, LOCK_FILE_MODE, uid=owner)
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held = True
                return self
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self
                time.sleep(min(0.05, left))

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class FileRefused(OSError):
    """A file gpugate was given, or keeps, is not one it reads: the message names the path and
    what is wrong (not a regular file, too big, a symlink where none is followed)."""


MIB = 1 << 20


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):  # fmt: skip
        if test(mode):
            return name
    return "not a plain file"


def open_regular(path: str, follow: bool = True) -> int:
    """Open a regular file for reading without ever blocking on it; its descriptor.

    O_NONBLOCK makes the open of a FIFO (or a device) return at once, and the fstat after it
    refuses anything but a regular file: a FIFO put in place of a state file, or `/dev/zero`
    given as an input, cannot hang or flood a command. `follow` False: a symlink is refused
    (state files, and anything root opens in a place others can write).
    Raises FileRefused (an OSError) or the open's own OSError, naming the path.
    """

    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags if follow else flags | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise FileRefused(errno.ELOOP, "is a symlink; not followed", path) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise FileRefused(errno.EINVAL, f"not a regular file ({_kind(mode)}); not read", path)
    return fd


def read_regular(path: str, cap: int, follow: bool = True) -> bytes:
    """The whole of a regular file of at most `cap` bytes, opened as open_regular() does.

    A bigger file is refused (FileRefused), never read in part: a truncated JSON or YAML
    would mislead more than an error. At most `cap` + 1 bytes are read, whatever fstat said.
    """
    fd = open_regular(path, follow)
    try:
        return read_open(fd, cap, path)
    finally:
        os.close(fd)


def read_open(fd: int, cap: int, path: str) -> bytes:
    """The rest of an open regular file, refused beyond `cap` bytes as read_regular() does."""
    size = os.fstat(fd).st_size
    data = b"" if size > cap else _read_upto(fd, cap + 1)
    if size > cap or len(data) > cap:
        raise FileRefused(errno.EFBIG, f"bigger than {_size(cap)}; not read", path)
    return data


def read_text(path: str, cap: int, follow: bool = True) -> str:
    """read_regular() decoded as UTF-8 (undecodable bytes replaced)."""
    return read_regular(path, cap, follow).decode("utf-8", "replace")


def _read_upto(fd: int, limit: int) -> bytes:
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, MIB))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n} bytes"


def refusal(exc: OSError) -> str:
    """`PATH: what is wrong` for one line of a command's error output."""
    what = exc.strerror or str(exc)
    return f"{exc.filename}: {what}" if exc.filename else what

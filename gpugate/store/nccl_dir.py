"""The jobs' NCCL directories, `<task_prolog.nccl_debug_dir>/<job id>`: who may trust them, how they go.

NCCL writes its debug log and PyTorch its flight-recorder dumps (as the job's user) where the
TaskProlog's exports point, so whoever controls that path controls where another user's logs
(secrets included) land and what a dump overwrites. The base is root's (the packages create
/var/lib/gpugate/nccl, 0755); the prolog (root) makes each job's directory the job's user's,
0700; the TaskProlog (the job's user) exports the paths only when `job_dir_problem` finds
nothing wrong; the epilog (root) renames the directory to a hidden `.gone-*` name at once and a
detached child removes it, or the next health run does (`sweep`). One check for all three:
`base_problem`.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from gpugate import log
from gpugate.child import ChildError, detach
from gpugate.fstree import remove_at
from gpugate.names import is_job_id
from gpugate.store.state import StateError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.config.schema import Config

GONE = ".gone-"  # a job directory set aside for removal: `.gone-<job>-<pid>-<ns>`
# The detached remover's own limit; what it leaves the next health run finishes (1.07 M empty
# files took 18 s to remove on a test node, issue 25).
BACKGROUND_S = 600.0
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 8  # symlinks followed on the way up to the base (e.g. /var/run -> /run)


def nccl_job_dir(config: Config, job_id: str | None) -> str | None:
    """Where this job's NCCL debug files go (created by the prolog), or None."""
    base = config.task_prolog.nccl_debug_dir
    if not base or not job_id:
        return None

    return os.path.join(base, job_id) if is_job_id(job_id) else None


# ---- the checks, shared by the prolog, the epilog, the TaskProlog and the health sweep ----


def base_problem(base: str) -> str | None:
    """Why `base` is no safe NCCL base directory, or None when it is.

    Safe: an absolute path; the base itself root's own real directory (lstat: no symlink),
    writable by no group and no other user; every directory above it root's and writable by
    no one else, unless sticky (a sticky directory such as /tmp lets no one rename or remove
    root's entries in it). Anyone else who could write in that chain could swap the base, or
    a job's directory in it, for their own after the check.
    """
    if not os.path.isabs(base):
        return f"{base}: not an absolute path"
    try:
        st = os.lstat(base)
    except OSError as exc:
        return f"{base}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{base}: not a plain directory"
    if st.st_uid != 0:
        return f"{base}: owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"{base}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return _parents_problem(os.path.dirname(base), _MAX_LINKS)


def _parents_problem(path: str, links_left: int) -> str | None:
    while True:
        try:
            st = os.lstat(path)
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        if st.st_uid != 0:
            return f"{path}: owned by uid {st.st_uid}, not root"
        if stat.S_ISLNK(st.st_mode):
            # Root's link, in a directory checked next: where it points must hold up too.
            if links_left <= 0:
                return f"{path}: too many symbolic links on the way"
            problem = _parents_problem(os.path.realpath(path), links_left - 1)
            if problem:
                return problem
        elif not stat.S_ISDIR(st.st_mode):
            return f"{path}: not a directory"
        elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def job_dir_problem(job_dir: str, uid: int) -> str | None:
    """Why user `uid` may not point NCCL and PyTorch at `job_dir`, or None when they may.

    The job's directory must be a real directory (lstat: a symlink is refused, never
    followed), the job's user's own, writable by no group or other user, in a safe base.
    """
    problem = base_problem(os.path.dirname(job_dir))
    if problem:
        return problem
    try:
        st = os.lstat(job_dir)
    except FileNotFoundError:
        return f"{job_dir}: missing (the prolog did not create it)"
    except OSError as exc:
        return f"{job_dir}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{job_dir}: not a plain directory"
    if st.st_uid != uid:
        return f"{job_dir}: owned by uid {st.st_uid}, not the job's user (uid {uid})"
    if st.st_mode & 0o022:
        return f"{job_dir}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


# ---- the prolog (root) ------------------------------------------------------------------


def prepare_nccl_dir(
    config: Config, job_id: str | None, uid: int | None, gid: int | None
) -> str | None:
    """Prolog side (root): create the job's NCCL directory afresh, owned by the job's user, 0700.

    The base is created where missing and must pass `base_problem` before anything is made in
    it (StateError otherwise: a squatted base is never used). Whatever an earlier job of the
    same id left there (a reused id, an epilog that never ran) is set aside and removed in the
    background first: one user's files are never handed to another.
    """
    job_dir = nccl_job_dir(config, job_id)
    if not job_dir or uid is None:
        return None
    base = os.path.dirname(job_dir)
    _make_base(base)
    problem = base_problem(base)
    if problem:
        raise StateError(f"{problem}; not using it")
    _traversable(base)
    if os.path.lexists(job_dir):
        set_aside(base, job_dir)
        remove_in_background(base)
    # No one else can create job_dir in between: base is root's and not writable by others.
    os.mkdir(job_dir, 0o700)
    fd = os.open(job_dir, _DIR_FLAGS)
    try:
        os.fchown(fd, uid, gid if gid is not None else -1)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return job_dir


def _make_base(base: str) -> None:
    """Create the base and any missing directory above it, root's, 0755 whatever the umask."""
    missing = []
    path = base
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            continue  # someone else's: base_problem judges it
        fd = os.open(path, _DIR_FLAGS)
        try:
            os.fchmod(fd, 0o755)
        finally:
            os.close(fd)


def _traversable(base: str) -> None:
    # The hooks run with a private umask (027): the job's user must still get through the
    # base to reach its own 0700 directory, or NCCL_DEBUG_FILE is never exported.
    fd = os.open(base, _DIR_FLAGS)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o111 != 0o111:
            os.fchmod(fd, mode | 0o111)
    finally:
        os.close(fd)


# ---- the epilog (root) and the removal ---------------------------------------------------


def remove_nccl_dir(
    config: Config, job_id: str | None, hand_off: Callable[[str], None] | None = None
) -> bool:
    """Epilog side (root): set the job's NCCL directory aside at once; it is removed apart.

    Only a rename (and sealing the directory root's, 0700) happens here, whatever the user
    left in it: `hand_off(base)` (default: a detached child, remove_in_background) removes
    it, and the next health run sweeps what that left. Returns whether the job's directory is
    out of the way (True also when there was none); never raises (the epilog's cleanup must
    go on), says what went wrong instead. An unsafe base is never touched.
    """
    job_dir = nccl_job_dir(config, job_id)
    if not job_dir:
        return True
    base = os.path.dirname(job_dir)
    try:
        if not os.path.lexists(job_dir):
            return True
        problem = base_problem(base)
        if problem:
            raise StateError(problem)
        set_aside(base, job_dir)
    except (OSError, StateError) as exc:  # an admin's to look at: in gpugate.log too
        log.error(config.state_dir, f"job {job_id}: NCCL directory {job_dir} not removed: {exc}")
        return False
    (hand_off or remove_in_background)(base)
    return True


def set_aside(base: str, job_dir: str) -> str:
    """Rename `job_dir` to a hidden `.gone-*` name in `base`, root's and 0700; the new path.

    The job's name is free at once, and the job's user can no longer reach the tree by its
    path while it is removed. `base` must have passed base_problem (only root renames in it).
    """
    name = os.path.basename(job_dir)
    gone = os.path.join(base, f"{GONE}{name}-{os.getpid()}-{time.time_ns()}")
    os.rename(job_dir, gone)
    try:
        fd = os.open(gone, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return gone  # a link or a file: removed as a name, nothing to seal
        raise
    try:
        os.fchown(fd, 0, 0)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return gone


def remove_in_background(base: str) -> None:
    """Start a detached child that removes what was set aside in `base` (see sweep)."""
    try:
        detach(f"{__name__}:sweep", {"base": base, "budget_s": BACKGROUND_S}, BACKGROUND_S + 5)
    except ChildError as exc:
        log.say(f"NCCL directories set aside in {base} left for the next health run: {exc}")


def sweep(base: str, budget_s: float) -> dict:
    """Remove the `.gone-*` entries in `base` within `budget_s` seconds; what was removed and left.

    Runs as root in a detached child (remove_in_background) and in the health check
    (sweep_nccl_base). Two sweeps over one tree are harmless: each entry goes once, and a
    sweep that loses a race leaves the rest to the next.
    """
    deadline = time.monotonic() + max(0.0, budget_s)
    problem = base_problem(base)
    if problem:
        raise StateError(f"{problem}; not sweeping it")
    fd = os.open(base, _DIR_FLAGS)
    try:
        names = sorted(n for n in os.listdir(fd) if n.startswith(GONE))
        removed = [n for n in names if time.monotonic() < deadline and remove_at(fd, n, deadline)]
    finally:
        os.close(fd)
    return {"removed": len(removed), "left": len(names) - len(removed)}


def sweep_nccl_base(config: Config, budget_s: float) -> dict | None:
    """The health run's share: sweep the configured base (None: no base, or no time)."""
    base = config.task_prolog.nccl_debug_dir
    if not base or budget_s <= 0 or not os.path.isdir(base):
        return None
    return sweep(base, budget_s)

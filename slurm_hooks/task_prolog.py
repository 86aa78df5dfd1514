"""The TaskProlog: NCCL settings from the seed's advice, exported into every job step.

Slurm runs the TaskProlog as the job's user with the job's environment; each `export NAME=value`
line it prints reaches the step (any other line is dropped). A variable the job already set is
left alone: the user's choice wins.
"""

from __future__ import annotations

import os

from gpugate.checkpoints.discover import latest_complete
from gpugate.fstree import remove_tree
from gpugate.log import say
from gpugate.names import is_job_id
from gpugate.slurm_hooks.state import StateError, ensure_dir, load_baseline, load_task_file
from gpugate.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.config.schema import Config


def nccl_job_dir(config: Config, job_id: str | None) -> str | None:
    """Where this job's NCCL debug files go (created by the prolog), or None."""
    base = config.task_prolog.nccl_debug_dir
    if not base or not job_id:
        return None

    return os.path.join(base, job_id) if is_job_id(job_id) else None


def exports(config: Config, environ: dict[str, str], job_id: str | None) -> list[tuple[str, str]]:
    """The (name, value) pairs to export, skipping what the job set itself."""
    tp = config.task_prolog
    wanted: list[tuple[str, str]] = []
    if tp.nccl_debug:
        wanted.append(("NCCL_DEBUG", tp.nccl_debug))
    # The seed: NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT only help when set together.
    if tp.nccl_ib_timeout is not None and tp.nccl_ib_retry_cnt is not None:
        wanted.append(("NCCL_IB_TIMEOUT", str(tp.nccl_ib_timeout)))
        wanted.append(("NCCL_IB_RETRY_CNT", str(tp.nccl_ib_retry_cnt)))
    if tp.async_error_handling:
        # PyTorch >= 2.2 reads TORCH_NCCL_ASYNC_ERROR_HANDLING; older releases the NCCL_ name.
        wanted.append(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"))
        wanted.append(("NCCL_ASYNC_ERROR_HANDLING", "1"))
    job_dir = nccl_job_dir(config, job_id)
    if job_dir and os.path.isdir(job_dir) and os.access(job_dir, os.W_OK):
        # %h and %p are expanded by NCCL: one file per host and process.
        wanted.append(("NCCL_DEBUG_FILE", os.path.join(job_dir, "nccl.%h.%p.log")))
    if job_id:
        wanted.append(("GPUGATE_JOB_ID", job_id))
    wanted += flight_recorder_exports(config, environ, job_id)
    wanted += resume_exports(config, environ, job_id)
    return [(k, v) for k, v in wanted if k not in environ]


# PyTorch's flight recorder, each setting under its newer TORCH_FR_* name and the older
# TORCH_NCCL_* one (PyTorch before 2.8 reads only those: NVIDIA/nvidia-resiliency-ext PR 163;
# task_prolog.fr_legacy_names: false drops them). 2.14.1 reads both, the TORCH_FR_* name
# first (torch/csrc/distributed/c10d/FlightRecorder.hpp: getCvarInt({"TORCH_FR_BUFFER_SIZE",
# "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000); the dump names are strings in libtorch_cpu.so). A
# job that set either name keeps its own setting: neither is exported then.
FR_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
# The dump file is this prefix + the global rank; PyTorch's default is /tmp/nccl_trace_rank_.
FR_DUMP_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FR_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"  # NCCL's watchdog dumps on a timeout
FR_PREFIX = "fr_rank_"  # in the job's NCCL directory, where the epilog looks
FR_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
NO_FR = "no-fr"  # `--comment gpugate:no-fr`


def fr_opted_out(comment: str | None) -> bool:
    """Whether the job's comment holds `gpugate:no-fr` as a token of its own.

    comment_tokens reads it as the key "no" (a key is letters and '_'), the same as
    `gpugate:no-ckpt`, so the whole token is matched here.
    """
    import re

    return bool(re.search(r"(?:^|[\s,;])gpugate:no-fr(?=$|[\s,;])", comment or ""))


def flight_recorder_exports(
    config: Config, environ: dict[str, str], job_id: str | None
) -> list[tuple[str, str]]:
    """The flight recorder's variables, unless the site, the job's comment or its env turned it off."""
    tp = config.task_prolog
    if not tp.flight_recorder or tp.fr_buffer_size <= 0:
        return []
    if any(environ.get(name, "").strip() == "0" for name in FR_BUFFER):
        return []  # the job's own opt-out: no recorder, so no dumps to point anywhere
    if job_id and (_task_data(config, job_id) or {}).get("no_fr") is True:
        return []
    out: list[tuple[str, str]] = []
    names = slice(None) if tp.fr_legacy_names else slice(1)  # the TORCH_FR_* name comes first
    if not any(name in environ for name in FR_BUFFER):
        out += [(name, str(tp.fr_buffer_size)) for name in FR_BUFFER[names]]
    out.append((FR_DUMP_ON_TIMEOUT, "1"))
    job_dir = nccl_job_dir(config, job_id)
    usable = job_dir and os.path.isdir(job_dir) and os.access(job_dir, os.W_OK)
    if usable and not any(name in environ for name in FR_DUMP_FILE):
        out += [(name, os.path.join(job_dir, FR_PREFIX)) for name in FR_DUMP_FILE[names]]
    return out


def _task_data(config: Config, job_id: str) -> dict | None:
    """The prolog's task file for the job (its comment's settings), or None."""
    try:
        return load_task_file(config.state_dir, job_id)
    except StateError:
        return None


def resume_exports(
    config: Config, environ: dict[str, str], job_id: str | None
) -> list[tuple[str, str]]:
    """GPUGATE_CKPT_DIR and GPUGATE_RESUME_FROM (the newest complete checkpoint), if declared.

    The directory comes from the job's environment (GPUGATE_CKPT_DIR) or from its
    `--comment gpugate:ckpt=DIR`, which the prolog saved in the job's own task file (only the
    job's user can read it: state.save_task_file). The TaskProlog runs as the job's user, so
    the directory is read with the user's rights.
    """
    ckpt_dir = environ.get("GPUGATE_CKPT_DIR")
    if not ckpt_dir and job_id:
        try:
            # The baseline: jobs whose prolog ran under a release without task files.
            state = config.state_dir
            saved = load_task_file(state, job_id) or load_baseline(state, job_id)
            ckpt_dir = (saved or {}).get("ckpt_dir")
        except StateError:
            ckpt_dir = None
        if ckpt_dir is not None and not isinstance(ckpt_dir, str):
            ckpt_dir = None
    if not ckpt_dir:
        return []

    out = [("GPUGATE_CKPT_DIR", ckpt_dir)]
    try:
        # The job is only starting: nothing of its own is being written yet, so no settling time.
        found = latest_complete(ckpt_dir, settle_s=0)
    except OSError:
        found = None
    if found is not None:
        out.append(("GPUGATE_RESUME_FROM", found.path))
    return out


def render(pairs: list[tuple[str, str]], note: Callable[[str], None] | None = None) -> str:
    """The TaskProlog output: one `export NAME=value` line per well-formed pair, others noted.

    slurmstepd reads this itself, no shell (src/slurmd/slurmstepd/task.c, `_proc_stdout`): a
    line starting `export ` is split at its first `=`, the value is everything up to the
    newline and is passed to setenv() as it is. So quotes would be kept literally and none are
    added; a value with a newline would start a line of its own (`export LD_PRELOAD=...` from a
    checkpoint directory's name), a NUL would cut it, a CR or other control character has no
    place in a path or setting. Such pairs, and names that are not `[A-Za-z_][A-Za-z0-9_]*`,
    are dropped with a note (stderr: slurmd's log), never repaired into another value.
    """
    if note is None:
        note = _note_to_stderr
    lines = []
    for name, value in pairs:
        problem = _export_problem(name, value)
        if problem:
            note(f"task-prolog: not exporting {printable(name)}={printable(value)}: {problem}")
        else:
            lines.append(f"export {name}={value}\n")
    return "".join(lines)


def _export_problem(name: str, value: str) -> str | None:
    """Why `export name=value` would not reach the job as exactly that variable, or None."""
    import re

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
        return "not a valid variable name"
    # Cc: C0 controls (LF, CR, NUL, ESC ...), DEL and C1 controls. Lone surrogates stand for
    # bytes that are not UTF-8; they are written back as those bytes (surrogateescape), so a
    # non-UTF-8 path still arrives intact.
    bad = next((c for c in value if c < " " or "\x7f" <= c <= "\x9f"), None)
    if bad is not None:
        what = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL"}.get(bad)
        return f"the value holds {what or f'the control character U+{ord(bad):04X}'}"
    return None


def _note_to_stderr(text: str) -> None:
    import sys

    print(text, file=sys.stderr)


def prepare_nccl_dir(
    config: Config, job_id: str | None, uid: int | None, gid: int | None
) -> str | None:
    """Prolog side (root): create the job's NCCL directory afresh, owned by the job's user, 0700.

    The base directory lives in a world-writable place, so it is checked to be root's own real
    directory (not a user's symlink) before anything is created inside it. Whatever an earlier
    job of the same id left there (a reused id, an epilog that never ran) is moved away and
    removed first: one user's files are never handed to another.
    """
    job_dir = nccl_job_dir(config, job_id)
    if not job_dir or uid is None:
        return None
    base = _safe_nccl_base(job_dir, create=True)
    _discard(base, job_dir)
    # No one else can create job_dir in between: base is root's and not writable by others.
    os.mkdir(job_dir, 0o700)
    fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchown(fd, uid, gid if gid is not None else -1)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return job_dir


def remove_nccl_dir(config: Config, job_id: str | None) -> bool:
    """Epilog side (root): remove the job's NCCL directory once its files were collected.

    Returns whether it is gone (True also when there was none); never raises (the epilog's
    cleanup must go on), says what went wrong instead. The user's files are removed without
    following any symlink the user put there.
    """
    job_dir = nccl_job_dir(config, job_id)
    try:
        if not job_dir or not os.path.lexists(job_dir):
            return True
        if _discard(_safe_nccl_base(job_dir, create=False), job_dir):
            return True
        why = "left under a hidden name (too deep, or no symlink-safe removal here)"
    except (OSError, RuntimeError) as exc:  # StateError: an unsafe base is not touched
        why = str(exc)

    say(f"job {job_id}: NCCL directory {job_dir} not removed: {why}")
    return False


def _safe_nccl_base(job_dir: str, create: bool) -> str:
    import stat

    base = os.path.dirname(job_dir)
    if create:
        ensure_dir(base, 0o755)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(f"{base}: not a plain directory")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise StateError(f"{base}: not owned by root or writable by others; not using it")
    if create and st.st_mode & 0o111 != 0o111:
        # The hooks run with a private umask (027): the job's user must still get through the
        # base to reach its own 0700 directory, or NCCL_DEBUG_FILE is never exported.
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o111)
        finally:
            os.close(fd)
    return base


def _discard(base: str, job_dir: str) -> bool:
    # Rename first, so the job's name is free at once even if removing the tree fails (a tree
    # deeper than Python's recursion limit); what is left is a hidden, unused name.
    if not os.path.lexists(job_dir):
        return True
    import time

    gone = os.path.join(base, f".gone-{os.path.basename(job_dir)}-{os.getpid()}-{time.time_ns()}")
    os.rename(job_dir, gone)
    try:
        return remove_tree(gone)
    except (OSError, RecursionError):
        return False

"""The TaskProlog: NCCL settings from the seed's advice, exported into every job step.

Slurm runs the TaskProlog as the job's user with the job's environment; each `export NAME=value`
line it prints reaches the step (any other line is dropped). A variable the job already set is
left alone: the user's choice wins.
"""

from __future__ import annotations

import os
import re
import sys

from gpugate.checkpoints.discover import latest_complete
from gpugate.store.nccl_dir import (  # noqa: F401  (prepare/remove: the hooks' names)
    job_dir_problem,
    nccl_job_dir,
    prepare_nccl_dir,
    remove_nccl_dir,
)
from gpugate.store.state import StateError, load_baseline, load_task_file
from gpugate.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpugate.config.schema import Config


def usable_nccl_dir(
    config: Config, job_id: str | None, note: Callable[[str], None] | None = None
) -> str | None:
    """The job's NCCL directory if this user may point NCCL and PyTorch at it, else None.

    Runs as the job's user: the directory must be the user's own real directory in a base
    only root controls (nccl_dir.job_dir_problem). Otherwise another user may have squatted
    the base to receive this job's debug log, or to have its flight-recorder dump follow a
    planted symlink; the reason goes to `note` (stderr: Slurm keeps only the export lines of
    stdout), and no NCCL or dump path is exported.
    """
    job_dir = nccl_job_dir(config, job_id)
    if not job_dir:
        return None
    problem = job_dir_problem(job_dir, os.getuid())
    if problem is None:
        return job_dir
    (note or _note_to_stderr)(
        f"task-prolog: NCCL_DEBUG_FILE and the flight-recorder dump path not exported: "
        f"{printable(problem)}"
    )
    return None


def exports(
    config: Config,
    environ: dict[str, str],
    job_id: str | None,
    note: Callable[[str], None] | None = None,
) -> list[tuple[str, str]]:
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
    job_dir = usable_nccl_dir(config, job_id, note)
    if job_dir:
        # %h and %p are expanded by NCCL: one file per host and process.
        wanted.append(("NCCL_DEBUG_FILE", os.path.join(job_dir, "nccl.%h.%p.log")))
    if job_id:
        wanted.append(("GPUGATE_JOB_ID", job_id))
    wanted += flight_recorder_exports(config, environ, job_id, job_dir)
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


def flight_recorder_exports(
    config: Config, environ: dict[str, str], job_id: str | None, job_dir: str | None = None
) -> list[tuple[str, str]]:
    """The flight recorder's variables, unless the site, the job's comment or its env turned it off.

    The dump prefix goes into `job_dir`, the job's NCCL directory once usable_nccl_dir
    vetted it; without one PyTorch keeps its default (/tmp/nccl_trace_rank_).
    """
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
    if job_dir and not any(name in environ for name in FR_DUMP_FILE):
        out += [(name, os.path.join(job_dir, FR_PREFIX)) for name in FR_DUMP_FILE[names]]
    return out


def _task_data(config: Config, job_id: str) -> dict[str, Any] | None:
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
            saved = load_task_file(state, job_id)
            if saved is None:  # a prolog of a release before task files kept it here
                old = load_baseline(state, job_id)
                saved = {"ckpt_dir": old.ckpt_dir} if old else None
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
    print(text, file=sys.stderr)

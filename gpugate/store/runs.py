"""A run is judged by its own run: what the prolog records of a run's start, and how the
epilog reads it back.

A requeued job keeps its id, its output files and some of Slurm's bookkeeping (the derived
exit code of an earlier run's steps, see epilog.abnormal_end). So the prolog records, per run,
in the job's root-only baseline (state.save_baseline):
- `log_offsets` (on a rerun, SLURM_JOB_RESTART_COUNT > 0): the size of the job's StdOut/StdErr
  (`scontrol show job`) as the run starts, read as the job's user (a child,
  userfiles.as_user: root never follows a user's symlink nor blocks on a FIFO). With
  `--open-mode=append` (or JobFileAppend=1) the file still holds the earlier runs' lines; the
  epilog's diagnosis reads from the offset on, so an earlier run's failure is never replayed.
  A first run asks nothing: its files are created after its prolog (a file another job
  appended to before is read by its tail, as before).
- `known_faults`: the failing findings (check id, GPU) the prolog itself found, e.g. a GPU
  already lost outside the job's allocation that the prolog let the job run beside. They are
  not "new since the prolog", and never the job's hardware fault.
- `job_gpus`: the job's GPUs on this node (SLURM_JOB_GPUS: Slurm's indices, read into devices
  by gate/allocation.py), for an epilog that lacks them.
- `started_at`: the prolog's clock, the run's start where Slurm gives none.
"""

from __future__ import annotations

import os
import time

from gpugate.store.state import KnownFault, RunRecord
from gpugate.userfiles import UserFileError, as_user, open_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.findings import Finding
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.hookenv import HookEnv
    from gpugate.slurm.records import JobInfo
    from gpugate.store.state import Baseline

OFFSETS_TIMEOUT_S = 5.0  # the prolog's own deadline is short: a hung NFS stat costs this at most
SIZES_TASK = "gpugate.store.runs:log_sizes"


def log_sizes(paths: list[str]) -> dict[str, int]:
    """In the child, as the user: each file's size now; 0 for one not there yet.

    A file that cannot be opened safely (a symlink, a FIFO, no permission) is left out: the
    epilog then reads its tail as before.
    """
    sizes: dict[str, int] = {}
    for path in paths:
        try:
            fd = open_regular(path)
        except UserFileError:
            if not os.path.lexists(path):
                sizes[path] = 0  # the run creates it: all of it is this run's
            continue
        try:
            sizes[path] = os.fstat(fd).st_size
        finally:
            os.close(fd)
    return sizes


def job_log_paths(job: JobInfo, node: str | None) -> list[str]:
    """The job's StdOut/StdErr paths that this node's epilog reads (on the batch host only)."""
    batch_host = getattr(job, "batch_host", "") or ""
    if batch_host and node and batch_host != node:
        return []
    paths: list[str] = []
    for path in (getattr(job, "stdout", ""), getattr(job, "stderr", "")):
        if path and path != "/dev/null" and os.path.isabs(path) and path not in paths:
            paths.append(path)
    return paths


def record_log_offsets(
    env: HookEnv, slurm: SlurmControl, timeout: float = OFFSETS_TIMEOUT_S
) -> dict[str, int]:
    """The sizes of the job's StdOut/StdErr as this run starts (read as the job's user).

    Best effort: {} when Slurm does not answer, the user is unknown or the reader fails.
    """
    if not env.job_id or env.uid is None:
        return {}
    try:
        paths = job_log_paths(slurm.job(env.job_id), env.node)
        if not paths:
            return {}
        sizes = as_user(env.uid, env.gid, SIZES_TASK, {"paths": paths}, timeout)
    except Exception:  # Slurm slow, the job gone, the child refused: read tails as before
        return {}
    if not isinstance(sizes, dict):
        return {}
    return {p: n for p, n in sizes.items() if isinstance(p, str) and _count(n)}


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def known_faults(findings: list[Finding]) -> list[KnownFault]:
    """The prolog's failing findings as (check, GPU) records for the baseline."""
    seen: list[KnownFault] = []
    for f in findings:
        entry = KnownFault(check=f.check, gpu=f.gpu)
        if f.status == "fail" and entry not in seen:
            seen.append(entry)
    return seen


def run_record(env: HookEnv, findings: list[Finding], slurm: SlurmControl | None) -> RunRecord:
    """What the prolog keeps of this run beside the counters (see the module docstring)."""
    offsets = None
    if slurm is not None and env.restart_count > 0:
        offsets = record_log_offsets(env, slurm)
    return RunRecord(restart_count=env.restart_count, known_faults=known_faults(findings),
                     job_gpus=None if env.gpus is None else list(env.gpus),
                     started_at=time.time(), log_offsets=offsets)  # fmt: skip


def baseline_offsets(baseline: Baseline | None) -> dict[str, int]:
    """The log offsets the prolog recorded for this run ({} without a baseline)."""
    offsets = (baseline.log_offsets if baseline else None) or {}
    return {p: n for p, n in offsets.items() if n >= 0}


def job_gpus(env: HookEnv, baseline: Baseline | None) -> tuple[int, ...] | None:
    """The job's GPUs on this node: the epilog's SLURM_JOB_GPUS, else the prolog's record."""
    if env.gpus is not None:
        return env.gpus
    saved = baseline.job_gpus if baseline else None
    if saved is not None and all(g >= 0 for g in saved):
        return tuple(saved)
    return None


def _known(baseline: Baseline | None) -> set[tuple[str, int | None]]:
    faults = baseline.known_faults if baseline else []
    return {(f.check, f.gpu if f.gpu is not None and f.gpu >= 0 else None) for f in faults}


def new_since_prolog(findings: list[Finding], baseline: Baseline | None) -> list[Finding]:
    """The findings that the job's own prolog did not already report."""
    known = _known(baseline)
    return [f for f in findings if (f.check, f.gpu) not in known]

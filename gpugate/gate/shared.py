"""A node shared by several jobs: what another job's load changes is not this node's fault.

Per-GPU scheduling puts a 4-GPU job next to another on an 8-GPU node. The checks a job's own
load trips carry `load=` on their `@check` line (gpugate/checks/declare.py): LOAD_GPU
(processes, heat, clocks of the GPUs a job holds) and LOAD_HOST (host memory). Health sets them
aside for every GPU Slurm has allocated; the prolog for the GPUs other jobs hold (issue 41,
R6: job B's prolog drained a healthy node for job A's CUDA context).

Which GPUs jobs hold comes from one bounded `scontrol -d show node` (GresUsed; where Slurm 22.05
names no indices there, `squeue -w NODE` and `scontrol -d show job` per job); whether any other
job runs (a CPU-only job holds no GPU but uses host memory) from `squeue -w NODE`. The prolog's
environment names only its own job's GPUs (SLURM_JOB_GPUS), so it asks Slurm only when a
finding another job could have caused would otherwise fail.
"""

from __future__ import annotations

import re
import sys

from gpugate.checks import findings as F
from gpugate.checks.registry import LOAD_GPU, job_load
from gpugate.gate.policy import effective_status
from gpugate.regex import lazy
from gpugate.slurm.hostlist import expand_lenient

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Policy
    from gpugate.slurm.control import SlurmControl

_GRES_USED = lazy(r"(?:^|\s)GresUsed=(\S+)")
_GPU_IDX = lazy(r"gpu(?::[^:(,\s]+)?:\d+\(IDX:([^)]*)\)")
_JOB_GRES = lazy(r"(?:^|\s)Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)")
SKIPPED = "skipped: GPU in use by a job"
# An 8-GPU node shared per GPU runs at most 8 GPU jobs; CPU jobs beside them are few. Beyond
# this many the prolog's cost is no longer small: which GPUs jobs hold counts as unknown.
MAX_JOBS = 16


def parse_gres_used(text: str) -> frozenset[int] | None:
    """The GPU indices in `scontrol -d show node`'s GresUsed (`gpu:h100:2(IDX:0,2-3)`); None
    (unknown: every GPU counts as in use) when the text names no GresUsed, or GPUs in use
    without their indices (Slurm 22.05 prints `GresUsed=gpu:8` for untyped GPUs; only
    `scontrol -d show job` has the IDX there)."""
    m = _GRES_USED.search(text or "")
    if not m:
        return None
    used = m.group(1)
    counted = re.findall(r"gpu(?::[^:(,\s]+)?:(\d+)(?!\d|\(IDX)", used)
    if any(int(n) > 0 for n in counted):
        return None
    out: set[int] = set()
    for idx in _GPU_IDX.findall(used):
        for part in idx.split(","):
            lo, _, hi = part.partition("-")
            if lo.isdigit() and (not hi or hi.isdigit()):
                out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def job_gpus(text: str, node: str) -> frozenset[int] | None:
    """The GPU indices a job holds on `node`, from `scontrol -d -o show job`'s detail
    (`Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)`); empty for a job without GPUs there;
    None (unknown) when the detail does not name the node or its GPUs' indices."""
    for nodes, gres in _JOB_GRES.findall(text or ""):
        if node in expand_lenient(nodes):
            return parse_gres_used(f"GresUsed={gres}") if "gpu" in gres else frozenset()
    return None


def gpus_in_use(slurm: SlurmControl, node: str) -> frozenset[int] | None:
    """The node's GPUs Slurm has allocated to jobs (bounded scontrol calls); None: unknown."""
    try:
        used = parse_gres_used(slurm.cli.scontrol("-d", "-o", "show", "node", node))
        return used if used is not None else _from_jobs(slurm, node)
    except Exception as exc:  # the adapter's SlurmError, or a backend without scontrol
        note(f"cannot tell which GPUs jobs use on {node} ({type(exc).__name__}: {exc})")
        return None


def jobs_on(slurm: SlurmControl, node: str) -> list[str]:
    """The ids of the jobs running (or starting, or ending) on `node`: one bounded squeue."""
    states = "CONFIGURING,RUNNING,COMPLETING"
    return slurm.cli.call("squeue", "-h", "-w", node, "-t", states, "-o", "%A").split()


def others_run(slurm: SlurmControl, node: str, job: str | None) -> bool | None:
    """Whether a job other than `job` runs on `node` (CPU-only ones included); None: unknown."""
    try:
        return any(j != job for j in jobs_on(slurm, node))
    except Exception as exc:  # the adapter's SlurmError, or a backend without squeue
        note(f"cannot tell which jobs run on {node} ({type(exc).__name__}: {exc})")
        return None


def _from_jobs(slurm: SlurmControl, node: str) -> frozenset[int] | None:
    """The GPUs the node's jobs hold, job by job: Slurm 22.05 names no indices in the node's
    GresUsed for untyped GPUs, `scontrol -d show job` does. At most MAX_JOBS jobs are asked
    (the calls are bounded by the adapter's timeout); more: unknown."""
    jobs = jobs_on(slurm, node)
    if len(jobs) > MAX_JOBS:
        note(f"{len(jobs)} jobs on {node}: which GPUs they hold is not asked job by job")
        return None
    out: set[int] = set()
    for job in jobs:  # a job ended between the two calls: scontrol fails, unknown (cautious)
        held = job_gpus(slurm.cli.scontrol("-d", "-o", "show", "job", job), node)
        if held is None:
            return None
        out |= held
    return frozenset(out)


def skip_for_jobs(
    findings: list[Finding],
    in_use: frozenset[int] | None,
    any_job: bool | None,
    mine: Collection[int] = (),
    report: bool = False,
) -> list[Finding]:
    """`findings` with what other running jobs legitimately change set aside.

    `in_use`: the GPUs those jobs hold (None: unknown); `any_job`: whether any runs (None:
    unknown); `mine`: GPUs judged whatever (the prolog's own job's: Slurm gave them to it
    alone). Set aside means skipped (ok); with `report` (the prolog) what cannot be told apart
    from another job's load (the GPUs unknown, host memory) becomes a warning instead: never a
    silent pass, never a drain for another job. Health runs every few minutes and logs the
    unknown: it skips.
    """
    if any_job is False:
        return findings
    out = []
    for f in findings:
        load = job_load(f.check)
        if f.status != F.OK and load is not None and not (f.gpu is not None and f.gpu in mine):
            f = _set_aside(f, load, in_use, report, any_job)
        out.append(f)
    return out


def _set_aside(
    f: Finding, load: str, in_use: frozenset[int] | None, report: bool, any_job: bool | None
) -> Finding:
    """One finding another job's load may have caused: skipped, reported, or kept as judged."""
    where = f"GPU{f.gpu}: " if f.gpu is not None else ""
    said = f.message.removeprefix(f"{f.check}: ")
    if load == LOAD_GPU:
        if f.gpu is None and report:
            return f  # not about one GPU: the prolog judges it
        if in_use is not None and f.gpu is not None and f.gpu not in in_use:
            return f  # a GPU no job holds: a leftover there is a leftover
        if in_use is None and report:
            why = "not judged: which GPUs other jobs hold is unknown"
            return F.warn(f.check, f"{where}{why} ({said})", gpu=f.gpu)
        return F.ok(f.check, f"{where}{SKIPPED}", gpu=f.gpu)
    if not report:
        return F.ok(f.check, "skipped: a job runs on the node", gpu=f.gpu)
    who = "another job runs on the node" if any_job else "other jobs may run on the node"
    return F.warn(f.check, f"reported, not drained: {who} ({said})", gpu=f.gpu)


def contested(f: Finding, mine: Collection[int] | None) -> bool:
    """Whether another job on the node may have caused `f`: host memory, or a GPU-load check
    on a GPU that is not the job's own (`mine` None: the job has no GPUs, none is its own)."""
    load = job_load(f.check)
    if load is None:
        return False
    if load != LOAD_GPU:
        return True
    return f.gpu is not None and (mine is None or f.gpu not in mine)


def judge_shared(
    findings: list[Finding],
    mine: Collection[int] | None,
    policy: Policy,
    ask: Callable[[], frozenset[int] | None],
    ask_jobs: Callable[[], bool | None] = lambda: None,
) -> list[Finding]:
    """The prolog's findings on a node other jobs may share (`ask`: the GPUs Slurm allocated,
    this job's included; None unknown; `ask_jobs`: whether another job runs there, None
    unknown). `mine` and `ask`'s GPUs are NVML indices of the findings' gather (the prolog
    reads Slurm's indices into them by device: gate/allocation.py). Slurm is asked only when a finding another job could have caused would fail: a
    healthy prolog, the common case, costs no call."""
    # The status first: `mine` may be read lazily (gate/allocation.JobGpus reads gres.conf).
    failing = [f for f in findings if effective_status(f, policy) == F.FAIL and contested(f, mine)]
    if not failing:
        return findings
    allocated = ask()
    # GresUsed counts this job's GPUs too (allocated before its prolog runs): the others' are
    # the rest. Unknown stays unknown: reported, neither passed nor drained.
    others = None if allocated is None else allocated - frozenset(mine or ())
    any_job: bool | None = others is None or bool(others)
    if not any_job and any(job_load(f.check) != LOAD_GPU for f in failing):
        # No other job holds a GPU, but a CPU-only job beside this one uses host memory too.
        any_job = ask_jobs()
    return skip_for_jobs(findings, others, any_job, mine or (), True)


def note(message: str) -> None:
    """A line for slurmd's log (hook output goes there)."""
    sys.stderr.write(f"gpugate: {message}\n")

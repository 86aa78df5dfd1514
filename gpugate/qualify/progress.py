"""What a waiting qualification tells its admin: each job, its step, its time left, why it waits.

The batch script echoes `gpugate-step: NAME` into the job's output before each step (jobs.py);
the last such line is the step running. A job Slurm keeps PENDING carries Slurm's reason
(`Reason=` of `scontrol show job`, squeue(1) "JOB REASON CODES"); `pending_meaning` says in words
what the common ones mean for a qualification job, so a timeout names the cause and the fix.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.qualify.records import Job

    Progress = Callable[[str], None]

STEP_MARK = "gpugate-step: "
# How often a waiting run prints its jobs (the issue: about every 10-15 s).
EVERY_S = 12.0
_TAIL_BYTES = 16384

# squeue(1) JOB REASON CODES, for a qualification job (exclusive, one named node, root).
_MEANINGS = {
    "Resources": "the node is busy or has not what the job asks (its CPUs, its GPUs, the whole "
    "node): wait for its jobs to end, or check qualify.ntasks_per_node against the node",
    "ReqNodeNotAvail": "the node is not available (down, drained, not responding, reserved for "
    "others): see `scontrol show node`",
    "PartitionConfig": "the request exceeds what the partition allows (more tasks than CPUs, "
    "more nodes or time than its limits): check qualify.ntasks_per_node, time_limit_min and "
    "partition",
    "PartitionNodeLimit": "the partition allows fewer nodes than the job asks",
    "PartitionTimeLimit": "qualify.time_limit_min is over the partition's MaxTime",
    "PartitionDown": "the partition is DOWN",
    "PartitionInactive": "the partition is INACTIVE",
    "Priority": "jobs of higher priority go first (a sweep's low priority: qualify.sweep_nice)",
    "Reservation": "the job waits for its reservation to start",
    "ReservationDeleted": "the job's reservation no longer exists",
    "Dependency": "the job waits on another job",
    "BeginTime": "the job's start time is still to come",
    "NodeDown": "a node the job needs is DOWN",
    "JobHeldAdmin": "an admin holds the job (scontrol release)",
    "JobHeldUser": "the job is held (scontrol release)",
    "InvalidQOS": "qualify.qos is not a QOS root may use",
    "InvalidAccount": "qualify.account is not an account root may use",
    "BadConstraints": "the job's request cannot be met by the node (its Gres, CPUs or memory)",
}


def _reason(job: Job) -> str:
    # Slurm writes Reason=None for a job just submitted, before the scheduler looked at it.
    return "" if job.note in ("", "None", "(null)") else job.note


def pending_meaning(reason: str) -> str:
    """What Slurm's pending reason means for a qualification job; "" when gpugate has no word."""
    key = reason.split(",")[0].strip()  # ReqNodeNotAvail,_UnavailableNodes:n1
    if key in _MEANINGS:
        return _MEANINGS[key]
    if key.startswith(("QOS", "Assoc")):
        return "a QOS or association limit holds the job (sacctmgr show qos / assoc)"
    return ""


def last_step(output: str) -> str:
    """The step a job's batch script last announced in its output file; "" when none yet."""
    try:
        with open(output, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - _TAIL_BYTES))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:  # not written yet (the job has not started), or gone
        return ""
    marks = [ln[len(STEP_MARK) :].strip() for ln in tail.splitlines() if ln.startswith(STEP_MARK)]
    return marks[-1] if marks else ""


def job_line(job: Job, left_s: float) -> str:
    """One waiting job: `job 12 on n1: RUNNING (step dcgm), 250 s left`."""
    where = ",".join(job.nodes)
    if job.state == "PENDING":
        doing = f"PENDING (Slurm: {_reason(job)})" if _reason(job) else "PENDING"
    else:
        step = last_step(job.output)
        doing = f"{job.state} (step {step})" if step else job.state
    return f"job {job.job_id} on {where}: {doing}, {max(0, int(left_s))} s left"


def never_started(job: Job, wait_s: float) -> str:
    """The note of a job cancelled still PENDING: Slurm's reason and what it means (the judge
    and the progress line put `job N on NODE:` before it)."""
    why = f" (Slurm: {_reason(job)})" if _reason(job) else ""
    meaning = pending_meaning(_reason(job))
    return (f"still PENDING after {wait_s:g} s (qualify.wait_s){why}: cancelled"
            + (f"; {meaning}" if meaning else ""))  # fmt: skip

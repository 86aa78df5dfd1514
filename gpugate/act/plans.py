"""Plans from decisions: draining a node for failing findings (prolog, epilog, health) and
carrying out the controller's requeue decision (EpilogSlurmctld, `gpugate requeue`)."""

from __future__ import annotations

from gpugate.act.steps import (
    Drain,
    Exclude,
    Isolate,
    Note,
    NoteBeside,
    RecordHeld,
    Requeue,
    StartNow,
    TellHeld,
    Undo,
)
from gpugate.slurm.reasons import drain_reason, evidence_detail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpugate.act.steps import Plan, Step
    from gpugate.checks.facts import Gpu
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config
    from gpugate.gate.requeue import JobEnd, RequeueDecision


def drain_steps(
    node: str,
    failing: list[Finding],
    gpus: tuple[Gpu, ...] | None = None,
    boot_id: str | None = None,
    bundle: str | None = None,
) -> Plan:
    """Drain `node` for `failing` with gpugate's reason (the first failure and how many more;
    the evidence bundle named when there is one), within the budget; undo a drain that ranks
    beyond it once concurrent drains have landed; say and record a drain the budget held back
    (either way: budget_drain); then take out only the faulty GPU where the site isolates GPUs
    (`isolate.unit: gpu`)."""
    from gpugate.gate.drain import drain_detail  # only a failing hook plans a drain (start-up)

    check, detail = drain_detail(failing)
    if bundle:
        detail = evidence_detail(bundle, detail)
    return (
        *budget_drain(node, check, drain_reason(check, detail)),
        Isolate(node=node, failing=tuple(failing), gpus=gpus, boot_id=boot_id),
    )


def budget_drain(node: str, check: str, reason: str) -> Plan:
    """Drain `node` with `reason` within the budget (counted first), undo it if it ranks beyond
    once concurrent drains have landed, and when the budget holds it back (either way) say so
    (the node's Comment, the log line, the event) and record it in the history: every drain
    gpugate decides (the hooks' drain_steps, a qualification's new drain)."""
    return (
        Drain(node=node, check=check, reason=reason),
        Undo(node=node, check=check),
        TellHeld(node=node),
        RecordHeld(node=node),
    )


def requeue_steps(
    decision: RequeueDecision, job: JobEnd, config: Config, pinned: tuple[str, ...] = ()
) -> Plan:
    """What the controller does with its requeue decision (gpugate/gate/requeue.py): requeue,
    keep the job off its suspects, start it now once pending, and tell the job why (its
    AdminComment when requeued, else a note beside its output). `pinned`: the suspects the job
    asks for by name (-w), which the exclusion leaves alone and the comment names."""
    plan: list[Step] = []
    if decision.requeue:
        plan.append(Requeue(job_id=job.job_id))
        if decision.suspects and config.requeue.exclude_suspects:
            plan.append(Exclude(job_id=job.job_id, nodes=decision.suspects))
    if (decision.requeue or decision.refused_on) and config.requeue.start_now:
        # After gpugate's own requeue, or Slurm's after gpugate's prolog refused the job on a
        # node that is now drained: the +120 s delay only protects a relaunch on the node
        # that revoked the job's credential (job_mgr.c batch_requeue_fini), and that node is
        # out of service or excluded.
        plan.append(StartNow(job_id=job.job_id))
    # Slurm takes an AdminComment only on a job that is not finished: a requeued one. A job
    # left finished hears why beside its output (root) and in `gpugate evidence` (always).
    if decision.tell and decision.requeue:
        text = decision.replace(pinned=pinned).describe()
        plan.append(Note(target="job+", name=job.job_id, text=text))
    elif decision.tell:
        plan.append(NoteBeside(job=job, decision=decision))
    return tuple(plan)


def requeued_notes(job_id: str, notes: Iterable[tuple[str, str | None]]) -> Plan:
    """What else a requeued job's AdminComment says, appended to what is there ("job+"):
    `notes` are (the report's name for it, the text or None: nothing to say). Only a requeued
    job: it is pending again, and slurmctld refuses an AdminComment on a finished one ("Job
    has already finished"), which the job is while its node epilogs run."""
    return tuple(
        Note(target="job+", name=job_id, text=text, label=label) for label, text in notes if text
    )

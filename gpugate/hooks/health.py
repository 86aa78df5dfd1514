"""`gpugate health`: Slurm's HealthCheckProgram — vet the node between jobs, lift what healed.

slurmd runs it every HealthCheckInterval seconds as root, with no job environment, and kills
it after 60 s (Slurm 26.05: after HealthCheckTimeout, which the run reads and keeps its budget
below: gpugate/slurm/health_check.py). Same gather, checks, reasons, ownership rules and drain budget as the prolog
(act.plans.drain_steps); its own deadline (`health.deadline_s`). On a node running jobs it does not judge
what the jobs legitimately change: for the GPUs Slurm has allocated (GresUsed), the checks
a job's load trips (`load=` on their `@check` line) are skipped, and host memory while any job
runs (gpugate/gate/shared.py, which the prolog uses too).
A drain gpugate set is lifted by the rules of gpugate/health/heal.py, through `gpugate
resume`'s own code path and audit log. A drain someone else set is never touched.
Each branch decides a plan (Drain, Lift, RecordHealing, ForgetHealing: gpugate/act/steps.py)
that the executor carries out, or with `dry_run` only says (`gpugate health --dry-run`).
"""

from __future__ import annotations

import os
import sys
import time

from gpugate.act.execute import Hands, execute, planned
from gpugate.act.plans import drain_steps
from gpugate.act.steps import (
    DRAINED,
    LIFTED,
    NOT_LIFTED,
    Drain,
    ForgetHealing,
    Lift,
    RecordDrain,
    RecordEvent,
    RecordHealing,
    RecordMetrics,
    Say,
)
from gpugate.checks.registry import fault_class
from gpugate.checks.run import run_checks
from gpugate.checks.sources import gather
from gpugate.checks.sources.kernel_log import boot_id
from gpugate.drill import active_drill
from gpugate.gate.allocation import SlurmGpus
from gpugate.gate.drain import drain_detail, failing_gpu
from gpugate.gate.ladder_result import Climb
from gpugate.gate.policy import DRAIN, Decision, decide
from gpugate.gate.shared import gpus_in_use, skip_for_jobs
from gpugate.gate.shared import parse_gres_used as parse_gres_used
from gpugate.health.heal import LIFT, heal_verdict, proof_gate
from gpugate.hooks.outside_resume import resumed_outside
from gpugate.hooks.prolog import check_statuses, remember_kernel_pos
from gpugate.isolate import remote
from gpugate.isolate.state import APPLIED as ISOLATION_APPLIED
from gpugate.isolate.state import indices_now, without_isolated
from gpugate.isolate.state import load_local as load_isolation
from gpugate.isolate.state import local_path as isolation_file
from gpugate.record import Record
from gpugate.regex import lazy
from gpugate.slurm.choose import slurm_gres_gpus
from gpugate.slurm.health_check import health_limit, node_is_healthy, read_health_check_timeout
from gpugate.slurm.reasons import reason_check
from gpugate.store import healing
from gpugate.store.healing import Healing
from gpugate.store.history import count_drains, history_dir
from gpugate.store.state import load_kernel_pos

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TypeVar

    from gpugate.act.steps import Attempt, Step
    from gpugate.checks.facts import Facts, Gpu
    from gpugate.checks.findings import Finding
    from gpugate.child import Detach

    _T = TypeVar("_T")
    from gpugate.config.schema import Config
    from gpugate.slurm.control import NodeInfo, SlurmControl


class HealthResult(Record):
    """What one health run decided and did."""

    status: str  # ok / warn / fail / error
    action: str  # allow / drain / keep / lift / none
    reason: str | None = None  # the drain reason set (drain)
    drained: bool = False
    resumed: bool = False
    blocked_by: str | None = None  # "admin", "budget" or "error"
    statuses: dict[str, Any] = {}
    message: str = ""
    duration_s: float = 0.0
    check: str | None = None  # the check the drain reason names (passed on, never parsed back)
    steps: tuple[str, ...] = ()  # what the executor did, step by step (gpugate/act/execute.py)
    # The run's own budget and slurmd's limit it was sized below (slurm/health_check.py):
    # "HealthCheckTimeout" read from Slurm (26.05), or "fixed" (60 s: older Slurm, or unread).
    budget_s: float = 0.0
    slurm_timeout_s: int = 0
    timeout_from: str = ""
    # SLURM_NODE_IS_HEALTHY as slurmd passed it (26.05.2+): None where unset.
    node_is_healthy: bool | None = None
    gpu: str | None = None  # the failing GPU's serial (else UUID) a drain names, when known


class Decided(Record):
    """One branch's decision: the result when its plan is carried out, the plan, and the
    result when the plan's Lift is refused (its message then ends with the refusal's why)."""

    result: HealthResult
    plan: tuple[Step, ...] = ()
    refused: HealthResult | None = None


def busy(info: NodeInfo) -> bool:
    """Whether a job runs (or is ending) on the node."""
    return info.busy


def out_of_service(info: NodeInfo) -> bool:
    """What SLURM_NODE_IS_HEALTHY=no stands for: DOWN, DRAIN, FAIL or MAINT
    (_node_unhealthy_for_hc, src/slurmctld/ping_nodes.c, 26.05.2)."""
    return info.drained or info.state == "MAINT" or "MAINT" in info.flags


def _said(healthy: bool) -> str:
    return f"slurmctld said {'in' if healthy else 'out of'} service"


def judge(
    config: Config, node: str, slurm: SlurmControl, any_job: bool, gres: int | None = None
) -> tuple[Facts, list[Finding]]:
    """The node's facts under the health deadline (with `gres`, Slurm's Gres GPU count
    gathered by the caller, where they do not say it), and the findings with job effects
    skipped."""
    in_use = gpus_in_use(slurm, node) if any_job else frozenset()
    position = load_kernel_pos(config.state_dir)
    facts = gather(config, node, position=position, deadline_s=config.health.deadline_s)
    if gres is not None and facts.slurm_gres_gpus is None:
        facts = facts.replace(slurm_gres_gpus=gres)
    # GresUsed names Slurm's indices: read into this gather's GPUs by device (gate/allocation.py).
    in_use = SlurmGpus(config, node, facts.gpus).nvml(in_use)
    return facts, skip_for_jobs(
        without_isolated(config, run_checks(facts, config), facts.gpus), in_use, any_job
    )


def run_health(
    config: Config,
    node: str,
    slurm: SlurmControl,
    dry_run: bool = False,
    environ: Mapping[str, str] | None = None,
    detach: Detach | None = None,
) -> HealthResult:
    """One HealthCheckProgram run on `node`: drain what fails, lift what healed, audited; its
    log line, history, metrics and event recorded by the executor. `dry_run`: gather, check
    and decide, and say the plan (`would ...` in `steps`): nothing drained, lifted, repaired
    or recorded. `environ`: slurmd's environment for the run (default: this process's).
    `detach`: what starts work that outlives the run (the ladder's qualification)."""
    timeout, why = read_health_check_timeout(slurm)
    if why:
        note(why)
    limit = health_limit(config.health.deadline_s, timeout)
    # The gather and the sweep read health.deadline_s: sized here, once, for the whole run.
    config = config.replace(health=config.health.replace(deadline_s=limit.budget_s))
    hint = node_is_healthy(os.environ if environ is None else environ)
    hands = Hands(config, slurm, note=note, hook="health", lift=lift_as_resume, detach=detach)
    result, boot = judge_and_act(config, node, hands, dry_run, hint)
    result = result.replace(budget_s=limit.budget_s, slurm_timeout_s=limit.timeout_s,
                            timeout_from=limit.source, node_is_healthy=hint)  # fmt: skip
    # Decided and done: the bookkeeping cannot undo it (each step on its own).
    records = (say_verdict, note_history, note_metrics, note_event)
    plan = planned("health", records, config, node, result, boot)
    report = execute(plan, hands, dry_run=dry_run, kept="decision")
    return result.replace(steps=result.steps + tuple(report.lines()))


def lift_as_resume(config: Config, slurm: SlurmControl, step: Lift) -> Attempt:
    """The plan's Lift, through `gpugate resume`'s own path (admin.resume.lift: the checks,
    the qualification, the audit); imported only once a drain has healed."""
    from gpugate.admin.resume import lift

    return lift(config, slurm, step)


def judge_and_act(
    config: Config, node: str, hands: Hands, dry_run: bool = False, hint: bool | None = None
) -> tuple[HealthResult, str | None]:
    """Gather, check, decide, act: what was decided and done, and this boot's id. Each branch
    decides a plan (Decided); the executor carries it out (`dry_run`: says it). `hint`:
    SLURM_NODE_IS_HEALTHY (node_is_healthy), None where slurmd did not set it."""
    started = time.monotonic()
    slurm = hands.slurm()
    try:
        info = slurm.node(node)
    except Exception as exc:  # without Slurm's view nothing may be drained or lifted
        said = "" if hint is None else f" ({_said(hint)} when it asked for this run)"
        return HealthResult(
            status="error", action="none", message=f"cannot read {node} from Slurm: {exc}{said}"
        ), None
    # SLURM_NODE_IS_HEALTHY is one bit (in service or not); the read stays, for what the bit
    # lacks: whose drain it is (the reason) and whether jobs run (docs/slurm-facts.md).
    if hint is not None and hint == out_of_service(info):
        note(f"{node}: {_said(hint)} when it asked for this run "
             f"(SLURM_NODE_IS_HEALTHY), Slurm now says {info.state}: the newer answer counts")  # fmt: skip
    any_job = busy(info)
    gres = slurm_gres_gpus(config, node, slurm)  # a gather source: Slurm's word, its own timeout
    facts, findings = judge(config, node, slurm, any_job, gres)
    decision = decide(findings, config.policy, phase="health", partitions=info.partitions)
    statuses = check_statuses(findings, config)
    boot = facts.boot_id or boot_id(config)
    repaired = ""
    outside = "" if dry_run else _outside(config, info, boot)
    if info.drained and info.reason and not info.gpugate_owned:
        # An admin's drain: gpugate's healing entry no longer applies.
        decided = Decided(result=HealthResult(status=decision.status, action="none", blocked_by="admin",
                          message=f"{node} drained by someone else ({info.reason!r}); left alone"),
                          plan=(ForgetHealing(node=node),))  # fmt: skip
    elif (asked := put_back_asked(config, node, any_job, decision.status, dry_run)) is not None:
        decided = asked  # a put-back asked on another host: started here, in its own session
    elif info.drained and info.gpugate_owned and _ended_drill(config, info):
        # A drill's drain whose window has closed (its command may have died): the fault was
        # never real, so the node goes back once the real facts pass (a drill never outlives it).
        decided = lift_drill(info, decision)
    elif info.drained and info.gpugate_owned:
        # The repair ladder acts before the decision (a reset is repair evidence): a dry run
        # does not repair, and decides on what it sees now.
        entry = current_entry(config, info, boot)
        climbed = (Climb() if dry_run else  # a dry run repairs nothing
                   on_ladder(f"repair of {node}", Climb(), "climb", config, slurm, info, entry,
                             findings, boot))  # fmt: skip
        repaired = "" if climbed.rma else climbed.said  # an RMA verdict is the run's message
        if climbed.rejudge:  # a GPU reset: look again before deciding (repair evidence)
            facts, findings = judge(config, node, slurm, any_job, gres)
            decision = decide(findings, config.policy, phase="health",
                              partitions=info.partitions)  # fmt: skip
            on_ladder(f"the ledger line of {node}", None, "recheck", config, info, findings,
                      "the checklist after the GPU reset")  # fmt: skip
        decided = keep_or_lift(config, info, decision, boot, any_job, climbed, dry_run,
                               hands.detach)  # fmt: skip
    elif decision.action == DRAIN:  # drain_for carries out its own plan (the drain's outcome)
        result = drain_for(config, hands, node, decision, boot, facts.gpus, dry_run)
        if result.drained:  # a reboot-class fault goes to Slurm now; a reset waits a run
            result = result.replace(message=_joined(result.message, repair(
                config, slurm, node, findings, idle=False, boot=boot)))  # fmt: skip
        decided = Decided(result=result)
    else:
        allowed = HealthResult(status=decision.status, action="allow", message=decision.status)
        put_back = put_back_if_repaired(config, info, facts, boot, any_job, decision.status)
        decided = put_back or Decided(result=allowed)
        decided = decided.replace(plan=(ForgetHealing(node=node), *decided.plan))
    result = carry_out(decided, hands, dry_run)
    result = result.replace(message=_joined(_joined(result.message, repaired), outside))
    # Not moved past a drain that failed (slurmctld down: the next run tries again), nor by a
    # dry run (the real runs' position stands). A drain the budget held back moves on, as the
    # prolog does: held is said and recorded (TellHeld, RecordHeld), and an old kernel-log
    # line must not be read again and drain the node once the window empties: each run
    # judges its own, fresh facts (issue 45).
    if not dry_run and not (result.action == "drain" and result.blocked_by == "error"):
        remember_kernel_pos(config, facts)
    return result.replace(statuses=statuses, duration_s=time.monotonic() - started), boot


def _outside(config: Config, info: NodeInfo, boot: str | None) -> str:
    """A drain of gpugate's lifted by a person, audited as theirs (gpugate/hooks/outside_resume.py)."""
    try:
        return resumed_outside(config, info, boot)
    except Exception as exc:  # bookkeeping: the run's verdict stands
        note(f"could not check how {info.name} came back in service: {exc}")
        return ""


def carry_out(decided: Decided, hands: Hands, dry_run: bool) -> HealthResult:
    """The executor carries out the branch's plan (a dry run says it); the result, as the
    Lift's attempt turned out, with the steps' lines."""
    if not decided.plan:
        return decided.result
    report = execute(decided.plan, hands, dry_run=dry_run, kept="decision")
    result = decided.result
    attempt = report.lift
    if attempt is not None and not attempt.resumed and decided.refused is not None:
        result = decided.refused.replace(message=decided.refused.message + attempt.why)
    elif dry_run:  # said, not done
        result = result.replace(resumed=False)
    return result.replace(steps=result.steps + tuple(report.lines()))


_DRILL_REASON = lazy(r"^gpugate:\s*DRILL (\S+?):")


def _ended_drill(config: Config, info: NodeInfo) -> bool:
    """Whether the node's drain is a drill's (`gpugate: DRILL <id>: ...`) whose window closed."""
    m = _DRILL_REASON.match(info.reason or "")
    if m is None:
        return False

    drill = active_drill(config)
    return drill is None or drill.id != m.group(1)


def lift_drill(info: NodeInfo, decision: Decision) -> Decided:
    """Resume a node drained by an ended drill, through resume's checked and audited path."""
    status = decision.status
    why = f"drill ended: {info.reason}"
    return Decided(
        result=HealthResult(status=status, action="lift", resumed=True, message=why),
        plan=(Lift(info=info, why=why), ForgetHealing(node=info.name, when=LIFTED)),
        refused=HealthResult(status=status, action="keep", message="drill drain kept: "),
    )


def repair(
    config: Config,
    slurm: SlurmControl,
    node: str,
    findings: list[Finding],
    idle: bool,
    boot: str | None = None,
) -> str:
    """Opt-in repair right after this run's own drain (gpugate/gate/repair.py): a reboot-class
    fault is handed to `scontrol reboot ASAP` once the node is idle (request_reboot reads it);
    a reset-class one on an idle node gets `nvidia-smi -r`. What was done, "" when nothing
    (opted out, not that kind, jobs run, once per drain, the budget). Never raises. Later runs
    climb the ladder (gpugate/gate/ladder.py)."""
    from gpugate.gate import repair as R

    try:
        fault = R.reboot_fault(findings, config)
        if fault is not None:
            return R.request_reboot(slurm, node, R.reboot_reason(fault), config, boot=boot) or ""
        targets = R.reset_targets(findings, config) if idle else []
        return "; ".join(R.reset_gpus(targets, config, node=node)) if targets else ""
    except Exception as exc:  # repair is a help: its failure must not stop the health run
        note(f"repair of {node} failed: {type(exc).__name__}: {exc}")
        return ""


def on_ladder(what: str, default: _T, name: str, *args: object) -> _T:
    """The repair ladder's `name` (gpugate/gate/ladder.py), imported only for gpugate's own
    drain, called with `args`; never raises: a failed step is a line in slurmd's log (`what`
    failed), `default` is returned, and the drain stays."""
    try:
        from gpugate.gate import ladder

        return getattr(ladder, name)(*args)  # type: ignore[no-any-return]
    except Exception as exc:  # repair is a help: its failure must not stop the health run
        note(f"{what} failed: {type(exc).__name__}: {exc}")
        return default


def _joined(message: str, extra: str) -> str:
    return f"{message}; {extra}" if extra else message


def drain_for(
    config: Config,
    hands: Hands,
    node: str,
    decision: Decision,
    boot: str | None,
    gpus: tuple[Gpu, ...] | None = None,
    dry_run: bool = False,
) -> HealthResult:
    """Drain an in-service node that fails, as the prolog does (budget, ownership: the
    executor carries out act.plans.drain_steps), and remember it for healing once drained."""
    plan = drain_steps(node, list(decision.failing), gpus, boot)
    drain = plan[0]
    check_id = drain.check if isinstance(drain, Drain) else "unknown"
    entry = Healing(node=node, check=check_id, fault=fault_class(check_id), since=time.time(),
                    boot_id=boot)  # fmt: skip
    plan += (RecordHealing(entry=entry, when=DRAINED),)
    message = f"fail: {check_id}: {drain_detail(list(decision.failing))[1]}"
    report = execute(plan, hands, dry_run=dry_run, kept="decision")
    outcome = report.drain
    steps = tuple(report.lines())
    if dry_run:
        return HealthResult(status="fail", action="drain", check=check_id, message=message,
                            steps=steps)  # fmt: skip
    if (
        outcome is None or outcome.blocked_by == "error"
    ):  # controller down: the next run tries again
        note(f"could not drain {node}: {outcome.why if outcome else 'no drain step'}")
        return HealthResult(status="fail", action="drain", blocked_by="error", check=check_id,
                            message=message, steps=steps)  # fmt: skip
    return HealthResult(status="fail", action="drain", reason=outcome.reason, drained=outcome.drained,
                        blocked_by=outcome.blocked_by, check=check_id, message=message,
                        steps=steps, gpu=failing_gpu(list(decision.failing), gpus))  # fmt: skip


def current_entry(config: Config, info: NodeInfo, boot: str | None) -> Healing:
    """The healing entry of gpugate's drain on the node; a new one for a drain not seen before
    (the prolog's or epilog's drain: the boot id from now, the time from Slurm)."""
    entry = healing.load(config.state_dir).get(info.name)
    since = float(info.reason_time) if info.reason_time is not None else time.time()
    if entry is not None and _back_since(config, info.name, entry.since):
        entry = None  # its drain ended (a qualification's or a person's resume): a new drain
    # Slurm's reason time moves only when the reason is set again: another drain, a new entry;
    # except the reboot gpugate asked for this drain, which rewrites the reason with the same
    # check (`gpugate: kernel.xid: reboot: ...`, gate/repair.py reboot_reason).
    if entry is not None and (info.reason_time is None or abs(entry.since - since) < 120
                              or _reboot_of(info.reason, entry.check)):  # fmt: skip
        return entry
    check = reason_check(info.reason) or "unknown"
    return Healing(node=info.name, check=check, fault=fault_class(check), since=since, boot_id=boot)


def _back_since(config: Config, node: str, since: float) -> bool:
    """Whether the ledger shows the node back in service since `since` (a resume, a person's
    resume): a healing entry that old belongs to a drain that ended. The health run forgets
    the entry when it sees the node in service, but a node may fail again before that run."""
    from gpugate.store import ledger  # only for gpugate's own drain

    try:
        found = ledger.recent(config, node, since)
    except Exception as exc:  # unknown: the entry stands, as before the ledger
        note(f"could not read the ledger of {node}: {exc}")
        return False
    return any(e.step in (ledger.RESUME, ledger.ADMIN) and e.when > since for e in found)


def _reboot_of(reason: str, check: str) -> bool:
    """Whether `reason` is the reboot request gpugate wrote for a drain of `check`."""
    return reason.startswith(f"gpugate: {check}: reboot:")


def keep_or_lift(
    config: Config,
    info: NodeInfo,
    decision: Decision,
    boot: str | None,
    any_job: bool,
    climbed: Climb | None = None,
    dry_run: bool = False,
    detach: Detach | None = None,
) -> Decided:
    """gpugate's own drain: count the passing runs, and lift it when heal.py says so (a
    refused resume starts the count again); `climbed`: what the repair ladder did this run
    (the RMA count, the boot before the reboot it asked for)."""

    entry = current_entry(config, info, boot)
    failing = tuple((f.check, fault_class(f.check)) for f in decision.failing)
    status = decision.status
    if not failing and any_job:
        # The jobs still on the draining node hide what they change: this run proves nothing.
        return Decided(result=HealthResult(status=status, action="keep",
                                           message="jobs still run; pass not counted"))  # fmt: skip
    climbed = climbed or Climb()
    same, reset_at = climbed.repeats, None
    if entry.fault == "hardware":
        reset_at = reset_time(config, info.name)
        if not climbed.repeats:  # a dry run, or the ladder could not count
            same = count_drains(history_dir(config), info.name, config.admin.history_window_days,
                                check=entry.check)  # fmt: skip
    if climbed.rma:  # the ladder's verdict: replace the part (the same GPU, or a failed reboot)
        return Decided(result=HealthResult(status=status, action="keep", message=climbed.said),
                       plan=(RecordHealing(entry=entry.replace(passes=0)),))  # fmt: skip
    judged = entry.replace(boot_id=climbed.boot_before) if climbed.boot_before else entry
    verdict = heal_verdict(
        judged,
        failing,
        boot,
        config.health.heal_after_passes,
        same,
        config.admin.rma_after_drains,
        reset_at=reset_at,
    )
    verdict = verdict.replace(entry=verdict.entry.replace(boot_id=entry.boot_id))
    if verdict.action == LIFT:
        level, passed = qualified_for_lift(config, info)
        verdict = proof_gate(verdict, level, passed)
        if verdict.action != LIFT:  # the proof is a qualification: the ladder starts it
            started = on_ladder(f"the qualification of {info.name}", "", "qualify_after_repair",
                                config, info, entry, level, dry_run, detach)  # fmt: skip
            verdict = verdict.replace(why=_joined(verdict.why, started))
    if verdict.action != LIFT:
        return Decided(result=HealthResult(status=status, action="keep", message=verdict.why),
                       plan=(RecordHealing(entry=verdict.entry),))  # fmt: skip
    return Decided(
        result=HealthResult(status=status, action="lift", resumed=True,
                            message=f"resumed: {verdict.why}"),
        plan=(Lift(info=info, why=verdict.why),
              ForgetHealing(node=info.name, when=LIFTED),
              RecordHealing(entry=verdict.entry.replace(passes=0), when=NOT_LIFTED)),
        refused=HealthResult(status=status, action="keep", message="not lifted: "),
    )  # fmt: skip


def put_back_asked(
    config: Config, node: str, any_job: bool, status: str, dry_run: bool = False
) -> Decided | None:
    """A put-back of the node's isolated GPUs asked on another host (`gpugate resume NODE`
    there, gpugate/isolate/remote.py): once no job runs, start `gpugate isolate put-back NODE`
    in a session of its own (it reconfigures Slurm, which restarts the slurmd waiting for this
    hook), which resumes the node as `gpugate resume` on the node would. None when none was
    asked (one failed stat when nothing is isolated here)."""
    if not os.path.exists(isolation_file(config)):
        return None
    record = remote.asked(config, node)
    if record is None:
        return None
    who = remote.who_asked(record)
    if remote.under_way(config, record):  # nothing else lifts the drain meanwhile
        return Decided(result=HealthResult(status=status, action="keep",
                       message=f"put-back asked by {who}: under way"))  # fmt: skip
    if any_job:
        return Decided(result=HealthResult(status=status, action="keep",
                       message=f"put-back asked by {who}: waits for the node's jobs to end"))  # fmt: skip
    if dry_run:
        said = f"would start gpugate isolate put-back {node} (asked by {who})"
        return Decided(result=HealthResult(status=status, action="keep", message=said,
                                           steps=(said,)))  # fmt: skip
    from gpugate.isolate.apply import spawn

    remote.mark_started(config, record)
    pid = spawn(config, node, "put-back")
    return Decided(result=HealthResult(status=status, action="keep",
                   message=f"put-back asked by {who}: started gpugate isolate put-back {node} "
                           f"(pid {pid})"))  # fmt: skip


def put_back_if_repaired(
    config: Config,
    info: NodeInfo,
    facts: Facts,
    boot: str | None,
    any_job: bool,
    status: str,
) -> Decided | None:
    """A node in service with a GPU isolated: put the GPU back when the heal rules see repair
    evidence (a reboot or a GPU reset since the fault) and its own checks pass, as `gpugate
    resume` would (audited, as gpugate health); None when nothing is isolated here. `status`:
    the run's verdict, which the result carries."""
    if not os.path.exists(isolation_file(config)):
        return None
    try:
        record = load_isolation(config)
    except ValueError as exc:
        return Decided(result=HealthResult(status=status, action="allow",
                                           message=f"isolation record: {exc}"))  # fmt: skip
    if record is None or record.state != ISOLATION_APPLIED or any_job:
        return None
    # Found by device in this snapshot, not by the index NVML gave it then (indices move).
    now = [indices_now(item.gpu, facts.gpus) for item in record.gpus]
    isolated = {i for found in now for i in found}
    if not all(now):  # a GPU not seen proves nothing: its checks did not run
        unseen = ", ".join(f"GPU {item.gpu.index} (minor {item.gpu.minor})"
                           for item, found in zip(record.gpus, now, strict=True) if not found)  # fmt: skip
        return Decided(result=HealthResult(status=status, action="allow",
                                           message=f"{unseen} stays isolated: not seen"))  # fmt: skip
    failing = tuple(
        (f.check, fault_class(f.check))
        for f in run_checks(facts, config)  # every GPU judged: the isolated one too
        if f.gpu in isolated and f.status == "fail"
    )
    first = record.gpus[0].gpu
    check = first.why.split(":", 1)[0] or "isolate"
    entry = Healing(node=info.name, check=check, fault="hardware", since=float(first.since),
                    boot_id=record.boot_id or None)  # fmt: skip
    same = count_drains(history_dir(config), info.name, config.admin.history_window_days,
                        check=check)  # fmt: skip
    verdict = heal_verdict(entry, failing, boot, config.health.heal_after_passes, same,
                           config.admin.rma_after_drains, reset_at=reset_time(config, info.name))  # fmt: skip
    if verdict.action == LIFT:
        verdict = proof_gate(verdict, *qualified_for_lift(config, info))
    gpus = ", ".join(f"GPU {g}" for g in sorted(isolated))
    if verdict.action != LIFT:
        return Decided(result=HealthResult(status=status, action="allow",
                                           message=f"{gpus} stays isolated: {verdict.why}"))  # fmt: skip
    return Decided(
        result=HealthResult(status=status, action="lift", resumed=True,
                            message=f"{gpus} put back: {verdict.why}"),
        plan=(Lift(info=info, why=verdict.why, put_back=True),),
        refused=HealthResult(status=status, action="allow", message=f"{gpus} not put back: "),
    )  # fmt: skip


def qualified_for_lift(config: Config, info: NodeInfo) -> tuple[int, bool]:
    """The qualification level the drain calls for, and whether a pass since it began exists."""
    from gpugate.admin.resume import earlier_pass, qualify_level

    level = qualify_level(config, info.reason)
    if not level:
        return 0, True
    try:
        return level, earlier_pass(config, info, level) is not None
    except Exception as exc:  # an unreadable record proves nothing: the drain stays
        note(f"could not read the qualification records: {exc}")
        return level, False


def reset_time(config: Config, node: str) -> float | None:
    """When gpugate's repair step last reset a GPU of `node` (None: never, or unknown)."""
    try:
        from gpugate.gate.repair import reset_recorded

        return reset_recorded(node, config)
    except Exception as exc:  # repair evidence is optional: without it only a reboot counts
        note(f"could not read the GPU-reset record: {exc}")
        return None


# ----------------------------------------------------- the bookkeeping, planned after acting


def say_verdict(config: Config, node: str, result: HealthResult, boot: str | None) -> Step:
    """One line for slurmd's log."""
    line = (
        f"health on {node}: {result.action}: {result.message} ({result.duration_s * 1000:.0f} ms)"
    )
    if result.drained:
        line += f"; drained: {result.reason}"
    return Say(text=line)


def note_history(config: Config, node: str, result: HealthResult, boot: str | None) -> Step | None:
    """The drain history (after a drain gpugate set), with this boot's id."""
    if not (result.drained and result.reason):
        return None
    return RecordDrain(node=node, reason=result.reason, check=result.check or "", hook="health",
                       boot_id=boot, gpu=result.gpu)  # fmt: skip


def note_metrics(config: Config, node: str, result: HealthResult, boot: str | None) -> Step:
    """The metrics textfile."""
    run = {"findings": result.statuses, "duration_s": result.duration_s,
           "drained_check": result.check if result.drained else None,
           "budget_exceeded": result.blocked_by == "budget"}  # fmt: skip
    return RecordMetrics(node=node, hook="health", run=run)


def note_event(config: Config, node: str, result: HealthResult, boot: str | None) -> Step:
    """The run's line in events.jsonl (with the steps the run took)."""
    fields = {"node": node, "status": result.status, "action": result.action,
              "reason": result.reason, "drained": result.drained, "resumed": result.resumed,
              "blocked_by": result.blocked_by, "message": result.message[:500],
              "duration_s": round(result.duration_s, 4), "steps": list(result.steps),
              "budget_s": result.budget_s, "slurm_timeout_s": result.slurm_timeout_s,
              "timeout_from": result.timeout_from,
              "node_is_healthy": result.node_is_healthy}  # fmt: skip
    return RecordEvent(directory=config.state_dir, hook="health", fields=fields)


def note(message: str) -> None:
    """A line for slurmd's log (hook output goes there)."""
    sys.stderr.write(f"gpugate: health: {message}\n")

"""The Prolog: gather, check, decide, act — before the job starts.

On failure the node is drained with `gpugate: <check id>: <detail>` and the prolog exits
non-zero, so Slurm requeues the job instead of running it on a bad node. A failure that only
concerns GPUs outside the job's allocation drains the node (no new jobs) and lets this job
start on its healthy GPUs (unless `prolog.refuse_for_other_gpus`).
"""

from __future__ import annotations

import os
import sys
import time

from gpugate import log
from gpugate.act.execute import Hands, execute, planned
from gpugate.act.steps import (
    NOT_HELD,
    Drain,
    Note,
    RecordDrain,
    RecordEvent,
    RecordMetrics,
    RecordUnknownXids,
    Refuse,
    Say,
    TellHeld,
)
from gpugate.checks.facts import facts_from_dict
from gpugate.checks.findings import SEVERITY, fail
from gpugate.checks.kernel import unknown_xids
from gpugate.checks.run import run_checks
from gpugate.checks.sources import gather
from gpugate.checks.sources.kernel_log import boot_id
from gpugate.gate.allocation import JobGpus
from gpugate.gate.budget import warn_daily
from gpugate.gate.policy import DRAIN, Decision, decide, effective_status, job_partitions
from gpugate.gate.shared import gpus_in_use, judge_shared, others_run
from gpugate.isolate.state import local_path as isolation_file
from gpugate.isolate.state import sync as sync_isolated
from gpugate.isolate.state import without_isolated
from gpugate.record import Record
from gpugate.slurm.choose import backend_for, slurm_gres_gpus
from gpugate.slurm.cli import expand_hostlist
from gpugate.slurm.hookenv import comment_tokens, fr_opted_out
from gpugate.slurm.reasons import drain_reason, refusal_comment
from gpugate.store.nccl_dir import prepare_nccl_dir
from gpugate.store.state import (
    RunRecord,
    StateError,
    load_kernel_pos,
    remove_task_file,
    save_baseline,
    save_kernel_pos,
    save_task_file,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpugate.act.steps import Plan, Step
    from gpugate.checks.facts import Facts, Gpu
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.hookenv import HookEnv


class PrologResult(Record):
    """What the prolog decided and did."""

    exit_code: int
    status: str  # ok / warn / fail / skipped
    action: str  # allow / warn / drain / skip
    reason: str | None = None  # the drain reason, when one was set
    check: str | None = None  # the check the drain reason names (passed on, never parsed back)
    drained: bool = False
    refused: bool = False
    blocked_by: str | None = None  # the drain was not done: "admin", "budget" or "error"
    statuses: dict[str, Any] = {}  # check id -> status after the policy (for the metrics)
    unknown_xids: tuple[Any, ...] = ()  # Xids NVIDIA's catalog does not list (warned, reported)
    message: str = ""
    duration_s: float = 0.0
    steps: tuple[str, ...] = ()  # what the executor did, step by step (gpugate/act/execute.py)
    gpu: str | None = None  # the failing GPU's serial (else UUID) the drain names, when known


def gather_for_prolog(
    config: Config, env: HookEnv, deadline_s: float, gres: int | None = None
) -> Facts:
    """The node's facts under the prolog's deadline (or the replayed snapshot), the kernel log
    from where the last check stopped, `gres` (Slurm's Gres GPU count, gathered by the caller)
    where the facts do not say it; the job's peers probed when it spans nodes."""
    peers = job_peers(config, env)
    probing = None
    if peers:  # pinged while the node gathers its own facts: the probe adds little to the start
        from gpugate.checks.sources.peers import start_probes

        probing = start_probes(peers, config.prolog.peers, max(1.0, deadline_s - 1.0))
    position = load_kernel_pos(config.state_dir)
    facts = gather(config, env.node or "", position=position, deadline_s=deadline_s)
    if gres is not None and facts.slurm_gres_gpus is None:  # how many GPUs slurm.conf gives it
        facts = facts.replace(slurm_gres_gpus=gres)
    if probing is not None:
        probes = [{**p, "prober": env.node} for p in probing()]
        facts = facts.replace(peers=facts_from_dict({"peers": probes}).peers)
    return facts


def job_peers(config: Config, env: HookEnv) -> list[str]:
    """The nodes this one probes, when the peer probe is on and the job spans several nodes:
    its ring neighbours in the job's node order and a few seeded others (choose_peers)."""
    cfg = config.prolog.peers
    if not cfg.enabled or not env.nodelist or (env.num_nodes or 0) < 2:
        return []
    from gpugate.checks.sources.peers import choose_peers

    order = expand_hostlist(env.nodelist)
    return choose_peers(order, env.node or "", cfg.neighbours, cfg.random, env.job_id or "")


def check_statuses(findings: list[Finding], config: Config) -> dict[str, str]:
    """Each check's worst status after the policy (what the metrics and events report)."""
    out: dict[str, str] = {}
    for f in findings:
        status = effective_status(f, config.policy)
        if f.check not in out or SEVERITY.get(status, 9) < SEVERITY.get(out[f.check], 9):
            out[f.check] = status
    return out


def keep_isolated_denied(config: Config, node: str | None) -> list[Finding]:
    """Deny this node's isolated GPUs' devices again (a reboot clears cgroup rules); one stat
    when nothing is isolated. A rule that cannot be written is a failure: Slurm no longer
    counts the GPU, so only the rule keeps jobs off it."""
    if not node or not os.path.exists(isolation_file(config)):
        return []
    try:
        sync_isolated(config, node)
    except OSError as exc:
        return [fail("isolate.deny", f"cannot deny the isolated GPUs' devices: {exc}")]
    from gpugate.isolate.apply import listed_again  # only on a node with a GPU isolated

    try:
        why = listed_again(config, node)
    except ValueError as exc:  # the node's record unreadable
        why = str(exc)
    return [fail("isolate.deny", why)] if why else []


def shared_node(
    config: Config,
    env: HookEnv,
    findings: list[Finding],
    hands: Hands,
    gpus: tuple[Gpu, ...] | None = None,
) -> list[Finding]:
    """The findings with another job's load set aside (gpugate/gate/shared.py); the Slurm
    adapter, if it had to be made for that, stays in `hands`. One bounded scontrol, only when
    such a finding would otherwise fail; where the other jobs' GPUs cannot be learned it is
    reported, not drained: a demanding admin would rather see a warning on a node than lose a
    healthy node (and drain budget) to a job's own CUDA context, while this job's own GPUs,
    which Slurm gave it alone, are still judged in full. Slurm's GPU indices (the job's, and
    those GresUsed names) are read into the facts' `gpus` by device (gate/allocation.py)."""
    made: list[SlurmControl] = []
    held = JobGpus(config, env.node, env.gpus, gpus)

    def allocated() -> frozenset[int] | None:
        try:
            made.append(hands.slurm())
        except Exception as exc:  # no adapter: which GPUs others hold is unknown
            note(f"cannot ask Slurm which GPUs jobs hold: {exc}")
            return None
        return held.order.nvml(gpus_in_use(made[0], env.node or ""))

    def other_jobs() -> bool | None:
        return others_run(made[0], env.node or "", env.job_id) if made else None

    mine = None if env.gpus is None else held  # None: the job has no GPU here
    return judge_shared(findings, mine, config.policy, allocated, other_jobs)


def concerns_job(f: Finding, held: JobGpus) -> bool:
    """A node-wide finding, or one about a GPU the job was given (by device, not by index:
    gate/allocation.py)."""
    return held.holds(f.gpu)


def run_prolog(
    config: Config,
    env: HookEnv,
    slurm: SlurmControl | None = None,
    make_slurm: Callable[[Config], SlurmControl] | None = None,
) -> PrologResult:
    """Run the whole prolog for one job on this node: gather, check, decide, act, record.

    The Slurm adapter is `slurm`, else made by `make_slurm` (default: the site's backend) on
    the first step that needs it: a healthy first run makes none (the start-up budget)."""
    started = time.monotonic()
    hands = Hands(config, slurm, make_slurm=make_slurm or backend_for, note=note, hook="prolog")
    result, boot = decide_and_act(config, env, hands, started)
    # Decided and done: nothing below (the history, the metrics, the events, a full or
    # read-only disk, a hostile drains.jsonl) may change the exit code or undo the drain.
    records = (say_verdict, note_history, note_unknown_xids, note_metrics, note_event)
    steps = planned("prolog", records, config, env, result, boot)
    report = execute(steps, hands, kept="decision")
    return result.replace(steps=result.steps + tuple(report.lines()))


def decide_and_act(
    config: Config, env: HookEnv, hands: Hands, started: float
) -> tuple[PrologResult, str | None]:
    """Gather, check, decide, act: what was decided and done, and the facts' boot id."""
    warn_daily(config)  # a drain budget too small to act is logged once a day
    if "skip" in comment_tokens(env.comment):
        if config.prolog.allow_user_skip:
            skipped = PrologResult(exit_code=0, status="skipped", action="skip",
                                   message="gpugate:skip in the job's comment: checks skipped")  # fmt: skip
            return skipped, None
        note("the job asked for gpugate:skip, which this site does not allow; checking anyway")
    gres = slurm_gres_gpus(config, env.node)  # a gather source: Slurm's word, its own timeout
    facts = gather_for_prolog(config, env, config.prolog.deadline_s, gres)
    findings = without_isolated(
        config, run_checks(facts, config), facts.gpus
    ) + keep_isolated_denied(config, env.node)
    findings = shared_node(config, env, findings, hands, facts.gpus)
    # The job's partition decides where a canary check acts: a node in several partitions is
    # judged by the one this job runs in, since the node's own list would take a Slurm call on
    # every job's start (health judges by the node's list, which it reads anyway).
    decision = decide(findings, config.policy, phase="prolog",
                      partitions=job_partitions(env.partition))  # fmt: skip
    # Decided. From here on nothing is allowed to undo the decision: the bookkeeping below is
    # best effort, and on a drain every step is guarded (gpugate/act/execute.py).
    try:
        statuses = check_statuses(findings, config)
        unknown = unknown_xids(findings)
    except Exception as exc:
        note(f"could not fold the findings for the metrics: {exc}")
        statuses, unknown = {}, ()
    try:
        remember_kernel_pos(config, facts)
        if env.job_id:
            prepare_job(config, env, facts, findings, hands)
    except Exception as exc:  # each step catches its own; this is for what they did not foresee
        note(f"could not prepare the job's state: {exc}")
    if decision.action != DRAIN:
        result = PrologResult(exit_code=0, status=decision.status, action=decision.action,
                              message=summary(decision), statuses=statuses)  # fmt: skip
    else:
        result = act_on_failure(config, env, decision, hands, statuses, facts.gpus, facts.boot_id)
    # This boot's id for the history (repair evidence): the facts', else this node's own (a
    # replayed snapshot may carry none); read here, with the facts, never by the store.
    boot = facts.boot_id or boot_id(config)
    return result.replace(unknown_xids=unknown, duration_s=time.monotonic() - started), boot


def _gpu_of(failing: list[Finding], gpus: tuple[Gpu, ...] | None) -> str | None:
    """failing_gpu, never raising (bookkeeping: the drain stands without it)."""
    from gpugate.gate.drain import failing_gpu

    try:
        return failing_gpu(failing, gpus)
    except Exception:
        return None


def failure_plan(
    config: Config,
    env: HookEnv,
    failing: list[Finding],
    concerns: bool,
    gpus: tuple[Gpu, ...] | None = None,
    boot_id: str | None = None,
) -> Plan:
    """The prolog's plan for a failing node: drain (within the budget), undo a drain beyond
    it, isolate the faulty GPU, and, when the failure concerns the job, refuse it and say why
    in its AdminComment (neither when the budget held the drain back)."""
    from gpugate.act.plans import drain_steps  # only a failing prolog drains (start-up)
    from gpugate.gate.drain import drain_detail

    plan: list[Step] = list(drain_steps(env.node or "", failing, gpus, boot_id))
    check, detail = drain_detail(failing)
    if concerns and env.job_id:
        plan.append(Refuse(job_id=env.job_id, reason=drain_reason(check, detail)))
        if config.prolog.admin_comment:
            text = refusal_comment(str(env.node), check, detail)
            plan.append(Note(target="job", name=env.job_id, text=text, when=NOT_HELD))
    return tuple(plan)


def act_on_failure(
    config: Config,
    env: HookEnv,
    decision: Decision,
    hands: Hands,
    statuses: dict[str, Any],
    gpus: tuple[Gpu, ...] | None = None,
    boot_id: str | None = None,
) -> PrologResult:
    """Drain, refuse the job when the failure concerns it, explain; never start it by accident.

    A job never runs where a failing check concerns its GPUs: when the drain cannot be done
    (slurmctld unreachable, the adapter raising) the prolog still exits 1, and Slurm drains
    the node itself ("Prolog error"). Only the drain budget lets such a job run (documented:
    a wrong threshold must not empty the cluster).
    """
    from gpugate.gate.drain import DrainOutcome  # only a failing prolog drains (start-up)

    failing = list(decision.failing)
    try:
        held = JobGpus(config, env.node, env.gpus, gpus)  # Slurm's indices, matched by device
        concerns = config.prolog.refuse_for_other_gpus or any(
            concerns_job(f, held) for f in failing
        )
    except Exception:  # cannot tell which GPUs: the failure may be the job's
        concerns = True
    try:
        plan = failure_plan(config, env, failing, concerns, gpus, boot_id)
    except Exception as exc:  # a bug in the plan: the job is refused all the same
        check = getattr(failing[0], "check", "?") if failing else "?"
        plan = (Drain(node=env.node or "", check=check, reason=f"gpugate: {check}"),
                TellHeld(node=env.node or ""))  # fmt: skip
        note(f"could not plan the drain ({type(exc).__name__}: {exc}); draining for {check}")
    report = execute(plan, hands, kept="decision")
    drain = next(s for s in plan if isinstance(s, Drain))  # failure_plan starts with it
    outcome = report.drain or DrainOutcome(reason=drain.reason, drained=False, blocked_by="error")
    # Over budget, a refusal would only make Slurm drain the node itself ("Prolog error").
    refuse = concerns and outcome.blocked_by != "budget"
    try:
        message = summary(decision)
    except Exception:
        message = f"fail: {drain.reason}"
    if outcome.blocked_by == "error":
        why = (f"could not drain {env.node} ({outcome.why}); refusing the job anyway, "
               "so Slurm drains the node itself")  # fmt: skip
        note(why)
        message += f"; {why}"
    return PrologResult(
        exit_code=1 if refuse else 0,
        status="fail",
        action=DRAIN,
        reason=outcome.reason,
        check=drain.check,
        drained=outcome.drained,
        refused=refuse,
        blocked_by=outcome.blocked_by,
        statuses=statuses,
        message=message,
        gpu=_gpu_of(failing, gpus),
        steps=tuple(report.lines()),
    )


# ----------------------------------------------------- the bookkeeping, planned after acting


def say_verdict(config: Config, env: HookEnv, result: PrologResult, boot: str | None) -> Step:
    """One line for slurmd's log: what was decided and done."""
    verdict = f"prolog job {env.job_id} on {env.node}: {result.message} ({result.duration_s * 1000:.0f} ms)"
    if result.drained:
        verdict += f"; drained: {result.reason}"
    if result.refused:
        verdict += "; job refused (Slurm requeues it)"
    return Say(text=verdict)


def note_history(
    config: Config, env: HookEnv, result: PrologResult, boot: str | None
) -> Step | None:
    """The drain history (after a drain gpugate set), with the boot id the facts had."""
    if not (result.drained and result.reason):
        return None
    return RecordDrain(node=env.node or "", reason=result.reason, check=result.check or "",
                       hook="prolog", job=env.job_id, boot_id=boot, gpu=result.gpu)  # fmt: skip


def note_unknown_xids(
    config: Config, env: HookEnv, result: PrologResult, boot: str | None
) -> Step | None:
    """Xids outside NVIDIA's catalog, in the history `gpugate nodes` reads (they never drain)."""
    if not result.unknown_xids:
        return None
    return RecordUnknownXids(node=env.node or "", xids=tuple(result.unknown_xids),
                             job=env.job_id, hook="prolog")  # fmt: skip


def note_metrics(config: Config, env: HookEnv, result: PrologResult, boot: str | None) -> Step:
    """The metrics textfile."""
    run = {"findings": result.statuses, "duration_s": result.duration_s,
           "drained_check": result.check if result.drained else None,
           "budget_exceeded": result.blocked_by == "budget", "unknown_xids": result.unknown_xids}  # fmt: skip
    return RecordMetrics(node=env.node, hook="prolog", run=run)


def note_event(config: Config, env: HookEnv, result: PrologResult, boot: str | None) -> Step:
    """The hook's line in events.jsonl (with the steps the prolog took)."""
    fields = {"job": env.job_id, "node": env.node, "status": result.status,
              "action": result.action, "reason": result.reason, "drained": result.drained,
              "refused": result.refused, "blocked_by": result.blocked_by,
              "unknown_xids": list(result.unknown_xids),
              "duration_s": round(result.duration_s, 4), "steps": list(result.steps)}  # fmt: skip
    return RecordEvent(directory=config.state_dir, hook="prolog", fields=fields)


def remember_kernel_pos(config: Config, facts: Facts) -> None:
    """The next check reads the kernel log from here on."""
    try:
        save_kernel_pos(config.state_dir, facts.boot_id, facts.kernel_log_seq)
    except Exception as exc:
        note(f"could not save the kernel-log position: {exc}")


def prepare_job(
    config: Config,
    env: HookEnv,
    facts: Facts,
    findings: list[Finding],
    hands: Hands,
) -> None:
    """Save the counters' baseline for the epilog (with what makes this run its own: the
    faults already known, its logs' start offsets, see runs.py) and the job's NCCL directory."""
    from gpugate.store.runs import run_record

    try:
        # Only a rerun asks Slurm for its files (a first run's are new): a healthy first
        # prolog starts no scontrol and no child (the start-up budget, tests/unit/commands/test_startup.py).
        slurm = hands.slurm() if env.restart_count > 0 else hands.made
        run = run_record(env, findings, slurm)
    except Exception as exc:  # the record serves the epilog's judgement; never stops a job
        note(f"could not record the run's start: {exc}")
        run = RunRecord(restart_count=env.restart_count)
    try:
        save_baseline(config.state_dir, env.job_id or "", facts, run=run)
    except Exception as exc:  # the baseline serves the epilog; its loss must not stop a job
        note(f"could not save the job's baseline: {exc}")
    try:
        prepare_task_file(config, env)
    except Exception as exc:
        note(f"could not write the job's TaskProlog file: {exc}")
    try:
        prepare_nccl_dir(config, env.job_id, env.uid, env.gid)
    except StateError as exc:  # an unsafe (squatted) base: the job runs without NCCL paths
        log.error(config.state_dir, f"job {env.job_id}: NCCL debug directory not prepared: {exc}")
    except Exception as exc:
        log.error(config.state_dir, f"job {env.job_id}: NCCL debug directory not prepared", exc)


def prepare_task_file(config: Config, env: HookEnv) -> str | None:
    """What the TaskProlog needs from the job's comment, in a file only the job's user reads.

    The TaskProlog runs as the job's user and cannot see `--comment gpugate:ckpt=DIR`; the
    directory is the user's own business, so it goes into `task/<job id>.json` (0400, the
    user's) and not into the root-only baseline. No checkpoint named: no file (and none left
    from an earlier job with the same id).
    """
    ckpt = comment_tokens(env.comment).get("ckpt") or None
    no_fr = fr_opted_out(env.comment)  # `gpugate:no-fr`: no flight recorder for this job
    if not (ckpt or no_fr) or env.uid is None:
        remove_task_file(config.state_dir, env.job_id or "")
        return None
    data: dict[str, Any] = {"job_id": env.job_id, "ckpt_dir": ckpt}
    if no_fr:
        data["no_fr"] = True
    return save_task_file(config.state_dir, env.job_id or "", env.uid, data)


def summary(decision: Decision) -> str:
    """One line: the verdict and the worst findings."""
    worst = [f.message for f in decision.failing]
    worst += [f"{f.message} (report only here)" for f in decision.reported]
    worst = (worst + [f.message for f in decision.warnings])[:3]
    return f"{decision.status}" + (": " + "; ".join(worst) if worst else "")


def note(message: str) -> None:
    """A line for slurmd's log (hook output goes there)."""
    sys.stderr.write(f"gpugate: {message}\n")

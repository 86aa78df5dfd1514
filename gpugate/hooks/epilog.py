"""The Epilog: after an abnormal end, collect the evidence, name the cause, drain a bad node.

Runs as root on every node of the job. What it reads from the node (NVML, kernel log, IB
counters) is root's; what it reads from the job (stdout/stderr, NCCL debug files) belongs to
the user and is read, and diagnosed, in a child process running as that user. It drains its
own node only when the node's own evidence shows a hardware fault — never for the user's own
errors (CUDA OOM, Python exceptions, Xid 13/31/43 alone).
"""

from __future__ import annotations

import os
import time

from gpugate.act.execute import Hands, execute, planned
from gpugate.act.plans import drain_steps
from gpugate.act.steps import Drain, RecordDrain, RecordEvent, RecordMetrics, Say
from gpugate.checks.kernel import app_xid_suspect, lost_detail, repeats
from gpugate.checks.registry import hardware_checks
from gpugate.checks.run import run_checks
from gpugate.checks.sources import gather
from gpugate.checks.sources.kernel_log import boot_id
from gpugate.clock import utc
from gpugate.gate.allocation import JobGpus, job_kernel_lines, split_by_job
from gpugate.gate.policy import DRAIN, decide, job_partitions
from gpugate.hooks import collect
from gpugate.hooks.deltas import counter_deltas, new_kernel_lines
from gpugate.hooks.epilog_result import EpilogResult
from gpugate.hooks.exit_verdict import with_slurm_exit
from gpugate.hooks.flightrec_collect import collect_dumps
from gpugate.isolate.state import without_isolated
from gpugate.log import say
from gpugate.slurm.choose import slurm_gres_gpus
from gpugate.store import app_xids as xid_history
from gpugate.store import controller_view
from gpugate.store.evidence import read_job_summary
from gpugate.store.history import history_dir
from gpugate.store.nccl_dir import remove_nccl_dir
from gpugate.store.runs import baseline_offsets, job_gpus, new_since_prolog
from gpugate.store.state import StateError, counters, job_dir, load_baseline, remove_job_state
from gpugate.store.suspects import closed_at

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.act.steps import Step
    from gpugate.checks.facts import Facts
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config
    from gpugate.gate.policy import Decision
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.hookenv import HookEnv
    from gpugate.store.app_xids import AppXidEntry
    from gpugate.store.state import Baseline
    from gpugate.store.view_records import ControllerRecord


def abnormal_end(env: HookEnv) -> str | None:
    """Why the job's end looks abnormal (exit code, signal, failed step), or None."""
    code2 = (env.exit_code2 or "").split(":")
    exit_status = int(code2[0]) if code2[0].isdigit() else None
    signal = int(code2[1]) if len(code2) > 1 and code2[1].isdigit() else None
    if signal == 54:
        return None  # 24.11: the job never started (its prolog failed): the prolog reported it
    if exit_status:
        return f"exit code {exit_status}"
    if signal:
        return f"killed by signal {signal}"
    if env.exit_code:  # the raw wait status, where EXIT_CODE2 is missing
        return f"wait status {env.exit_code}"
    if env.derived_ec and not derived_ec_of_an_earlier_run(env):
        return f"a job step failed (derived exit code {env.derived_ec >> 8 or env.derived_ec})"
    return None


def derived_ec_of_an_earlier_run(env: HookEnv) -> bool:
    """Whether SLURM_JOB_DERIVED_EC may be an earlier run's, not this run's: after a requeue.

    The node Epilog gets SLURM_JOB_EXIT_CODE, SLURM_JOB_EXIT_CODE2, SLURM_JOB_DERIVED_EC and
    SLURM_JOB_RESTART_COUNT in 22.05 and 24.11 alike (SLURM_JOB_START_TIME/_END_TIME only from
    23.x on): reference/slurm-in-ci.md, "What the hooks see", and the epilog captures in
    reference/real-outputs/slurm-24.11-debian13/hook-env/ (Slurm's prolog_epilog.html lists
    them). EXIT_CODE(2) is this run's batch script; DERIVED_EC is the highest step exit code
    of the job and Slurm keeps it across a requeue (issue 26: run 1 of a requeued job that
    completed 0:0 still showed run 0's 1). Which run a step failed in cannot be told, so on
    a restarted job whose own exit code is 0 it is not used.
    """
    own_exit_ok = (env.exit_code2 or "0:0") == "0:0" and not env.exit_code
    return env.restart_count > 0 and own_exit_ok


def gather_now(
    config: Config,
    env: HookEnv,
    baseline: Baseline | None,
    deadline_s: float | None = None,
    gres: int | None = None,
) -> Facts:
    """The node's facts now (or the replayed snapshot); the kernel log from where the job's
    prolog stopped; `gres` (Slurm's Gres GPU count, gathered by the caller) where unknown."""
    position = (baseline.boot_id, baseline.kernel_log_seq) if baseline else None
    facts = lost_since_prolog(
        gather(config, env.node or "", position=position, deadline_s=deadline_s), baseline
    )
    if gres is not None and facts.slurm_gres_gpus is None:
        facts = facts.replace(slurm_gres_gpus=gres)
    return facts


def lost_since_prolog(facts: Facts, baseline: Baseline | None) -> Facts:
    """`facts` with the prolog's time as the start of a kernel-record loss that begins at its
    position: the record there is gone, so the kernel cannot say when it was logged."""
    loss = facts.kernel_log_lost
    started = baseline.started_at if baseline else None
    if loss is None or loss.after_at or started is None or baseline is None:
        return facts
    if loss.after_seq is None or loss.after_seq != baseline.kernel_log_seq:
        return facts
    return facts.replace(
        kernel_log_lost=loss.replace(after_at=f"the job's prolog ({utc(started)})")
    )


def hardware_decision(
    facts: Facts,
    fresh_kernel: list[str],
    config: Config,
    app_xids: tuple[AppXidEntry, ...] = (),
    baseline: Baseline | None = None,
    partitions: tuple[str, ...] | None = None,
) -> Decision:
    """The policy's decision on the hardware checks now, judging only this job's kernel lines
    and only the faults the job's own prolog did not already report (runs.new_since_prolog).

    Its `failures` are the node's hardware faults, its `failing` those it drains for; its
    action is a drain only where the site lets the epilog drain (`epilog.drain_on_hardware`,
    not `policy.report_only`), for a check that may act here (`partitions`: the job's, where
    a canary check acts, as in the prolog: gate/policy.py).

    `app_xids` is the node's per-job record of application-class Xids (this job's included):
    kernel.xid fails on them only by the cross-job rule, never for one job's own.
    """
    # Only the checks marked `hardware` on their @check line (see gpugate/checks/registry.py).
    now = facts.replace(kernel_log=tuple(fresh_kernel))
    found = without_isolated(
        config, run_checks(now, config, only=list(hardware_checks()), app_xids=app_xids), now.gpus
    )
    found = new_since_prolog(found, baseline)
    may_drain = config.epilog.drain_on_hardware
    return decide(found, config.policy, phase="epilog", may_drain=may_drain, partitions=partitions)


def run_epilog(config: Config, env: HookEnv, slurm: SlurmControl | None = None) -> EpilogResult:
    """Run the whole epilog for one job on this node: gather, check, decide, act, record."""
    hands = Hands(config, slurm, make_slurm=lambda c: collect.slurm_for(c), hook="epilog")
    result = judge_and_act(config, env, hands)
    # The drain (if any) is done: each bookkeeping step below is on its own, best effort.
    records = (say_verdict, note_history, note_metrics, note_event)
    report = execute(planned("epilog", records, config, env, result), hands, kept="drain")
    return result.replace(steps=result.steps + tuple(report.lines()))


def judge_and_act(config: Config, env: HookEnv, hands: Hands) -> EpilogResult:
    """The epilog's judgement and acts, its decision record for the controller around them."""
    # The controller waits for this node while the record says running, up to its deadline.
    view_start(config, env)
    found: dict[str, Any] = {}
    result = None
    try:
        result = _run_epilog(config, env, hands, found)
        return result
    finally:
        view_finish(config, env, result, found.get("flightrec"))


def drain_now(
    config: Config,
    hands: Hands,
    env: HookEnv,
    faults: list[Finding],
    facts: Facts,
    bundle: str | None = None,
) -> dict[str, Any]:
    """Drain this node for its own hardware fault (act.plans.drain_steps, by the executor): the
    EpilogResult fields it sets (reason, check, drained, blocked_by, boot_id, gpu, steps)."""
    from gpugate.gate.drain import failing_gpu  # only a failing epilog drains

    plan = drain_steps(env.node or "", faults, facts.gpus, facts.boot_id, bundle)
    report = execute(plan, hands, kept="drain")
    drain = plan[0]
    outcome = report.drain
    return {"reason": outcome.reason if outcome else None,
            "check": drain.check if isinstance(drain, Drain) else None,
            "drained": bool(outcome and outcome.drained),
            "blocked_by": outcome.blocked_by if outcome else None,
            # For the history (repair evidence): the facts' boot id, else this node's own.
            "boot_id": facts.boot_id or boot_id(config),
            # The failing GPU's serial: the same part failing again counts to its RMA.
            "gpu": failing_gpu(faults, facts.gpus),
            "steps": tuple(report.lines())}  # fmt: skip


def view_start(config: Config, env: HookEnv) -> None:
    """The controller's record of this node's epilog: running, until the epilog's deadline."""
    _view_write(config, env, controller_view.running(config.epilog.deadline_s))


def view_finish(
    config: Config, env: HookEnv, result: EpilogResult | None, flightrec: dict[str, Any] | None
) -> None:
    """The record: done, with the bundle's decision fields (a normal end: none; no log text)."""

    if result is not None and not result.bundle and not result.abnormal:
        _view_forget(config, env)  # nothing to decide on: no file left for every job
        return
    if result is None:
        record = controller_view.done(None, error="the epilog did not finish")
    elif result.bundle:
        record = controller_view.done(read_job_summary(result.bundle), flightrec, bundle=True)
    else:  # the bundle could not be written: what the epilog knows itself
        record = controller_view.done(None, flightrec, why=result.why, bundle=False,
                                      category=result.category, confidence=result.confidence,
                                      hardware_fault=result.hardware_fault)  # fmt: skip
    _view_write(config, env, record)


def _view_forget(config: Config, env: HookEnv) -> None:
    if not env.job_id or not env.node:
        return
    try:
        controller_view.forget(config.evidence_dir, env.job_id, env.node, env.restart_count)
    except (OSError, ValueError) as exc:
        say(f"epilog job {env.job_id}: cannot remove the controller's record: {exc}")


def _view_write(config: Config, env: HookEnv, record: ControllerRecord) -> None:
    if not env.job_id or not env.node:
        return
    try:
        # The run's SLUID on every record (running and done): the controller takes no record
        # of another SLUID for this run's (a reused job id).
        record = record.replace(sluid=env.sluid) if env.sluid else record
        controller_view.write_record(config.evidence_dir, env.job_id, env.node,
                                     env.restart_count, record,
                                     group=config.epilog.view_group)  # fmt: skip
    except (OSError, ValueError) as exc:  # never fails the epilog; the controller waits it out
        say(f"epilog job {env.job_id}: cannot write the controller's record: {exc}")


def _run_epilog(config: Config, env: HookEnv, hands: Hands, found: dict[str, Any]) -> EpilogResult:
    """The epilog's work; `found` gets the flight-recorder dumps for the record."""
    started = time.monotonic()
    if env.job_id and refused_here(config, env.job_id):
        cleanup(config, env)
        return EpilogResult(abnormal=False, why="the prolog refused the job here: it never ran",
                            ran=False)  # fmt: skip
    baseline = load_baseline(config.state_dir, env.job_id) if env.job_id else None
    # Half the deadline at most for the node's facts; the job's files and the bundle get the rest.
    gres = slurm_gres_gpus(config, env.node)  # a gather source: Slurm's word, its own timeout
    facts = gather_now(config, env, baseline, config.epilog.deadline_s / 2, gres)
    fresh = new_kernel_lines(baseline, facts.kernel_log or ())
    deltas = counter_deltas(baseline, counters(facts))
    # The job's GPUs: Slurm's indices, matched to the facts' GPUs by device (gate/allocation.py).
    held = JobGpus(config, env.node, job_gpus(env, baseline), facts.gpus)
    app_xids, mine = note_app_xids(config, env, facts, fresh, held)
    decision = hardware_decision(facts, fresh, config, app_xids=app_xids, baseline=baseline,
                                 partitions=job_partitions(env.partition))  # fmt: skip
    flag_app_xid_suspect(config, env, app_xids, mine)
    new_faults = list(decision.failing)  # what the drain acts on: the node's own health
    # The job's verdict: only the new faults on its GPUs (or node-wide), those of checks that
    # only report here too. One on another job's GPUs may still drain the node, never make
    # this job an infrastructure failure.
    hardware, elsewhere = split_by_job(list(decision.failures), held)
    failed = abnormal_end(env)  # Slurm's own word; a hardware fault below does not fail the job
    why = failed
    if why is None and hardware:
        why = "hardware errors on the job's GPUs since its prolog"
    lost = lost_detail(facts.kernel_log_lost) if facts.kernel_log_lost else None
    if why is None and not config.epilog.always_bundle:
        result = EpilogResult(abnormal=False, why="normal end", kernel_log_lost=lost)
        if elsewhere and decision.action == DRAIN:  # no bundle: the job's run was a success
            result = result.replace(**drain_now(config, hands, env, new_faults, facts))
        cleanup(config, env)
        return result.replace(duration_s=time.monotonic() - started)

    job = collect.job_info(config, env, hands.made)
    left = config.epilog.deadline_s - (time.monotonic() - started) - 5  # keep time to write
    logs = collect.read_job_files(
        config,
        env,
        job,
        job_kernel_lines(fresh, facts, held),  # another job's GPU is not this job's cause
        timeout=max(1.0, min(left, config.epilog.read_timeout_s)),
        offsets=baseline_offsets(baseline),
    )
    # A failed job is never filed as no_failure; an unknown log of a 0:0 exit ended well.
    diagnosis = with_slurm_exit(logs.diagnosis, failed, env.exit_code2)
    logs = logs.replace(diagnosis=diagnosis)
    # At the ends that write a bundle (every abnormal one, requeues included: they lose work).
    left = config.epilog.deadline_s - (time.monotonic() - started) - 5
    freshness = collect.checkpoint_freshness(config, env, job, facts, max(1.0, min(left, 30)))
    left = config.epilog.deadline_s - (time.monotonic() - started) - 5
    flightrec = collect_dumps(config, env, job, max(1.0, min(left, 30)))
    found["flightrec"] = flightrec
    result = EpilogResult(
        abnormal=why is not None,
        why=why or "always_bundle",
        category=diagnosis.category,
        xid=diagnosis.xid,
        failing_rank=diagnosis.failing_rank,
        failing_node=collect.failing_node(diagnosis, env, job),
        confidence=diagnosis.confidence,
        hardware_fault=bool(hardware),
        hardware_checks=tuple(sorted({f.check for f in hardware})),
        checkpoint_age_s=freshness.age_s if freshness else None,
        checkpoint_stale=bool(freshness and freshness.stale),
        kernel_log_lost=lost,
    )
    drain = decision.action == DRAIN
    # The bundle first, then the drain naming it: a reason never points at a bundle that could
    # not be written. The drain's outcome is then added to the bundle's summary.
    bundle = collect.write_evidence(config, env, job, facts, fresh, deltas, hardware, logs, result,
                                    pending_drain=drain, freshness=freshness,
                                    flightrec=flightrec, elsewhere=elsewhere,
                                    baseline=baseline)  # fmt: skip
    if drain:
        result = result.replace(**drain_now(config, hands, env, new_faults, facts, bundle))
        if bundle:
            collect.record_outcome(config, bundle, result)
    cleanup(config, env)
    return result.replace(bundle=bundle, duration_s=time.monotonic() - started)


def note_app_xids(
    config: Config, env: HookEnv, facts: Facts, fresh: list[str], held: JobGpus | None = None
) -> tuple[tuple[AppXidEntry, ...], list[AppXidEntry]]:
    """Record this job's application-class Xids; (the node's open record with them, this job's).

    The record counts from the node's last resume or passed qualification on (suspects.closed_at):
    what jobs raised before an admin cleared the node primes nothing after.
    """
    now = time.time()
    mine = xid_history.job_events(fresh, env, facts, now, held.holds if held else None)
    if not mine:  # the rule judges only GPUs this job raised Xids on: nothing else to read
        return (), []
    known = xid_history.load(config, now)
    xid_history.record(config, mine, now)  # best effort: never fails the epilog
    since = closed_at(history_dir(config), env.node) if env.node else 0.0
    return tuple(e for e in (*known, *mine) if e.t > since), mine


def flag_app_xid_suspect(
    config: Config, env: HookEnv, app_xids: tuple[AppXidEntry, ...], mine: list[AppXidEntry]
) -> None:
    """Flag this node when a GPU of this job passes the application-Xid rule; never a drain."""

    k = config.checks.kernel
    for pci in sorted({e.gpu for e in mine}):
        if env.node and app_xid_suspect(app_xids, pci, k):
            from gpugate.gate.suspicion import point_at

            jobs, users = repeats(app_xids, pci)
            ids = sorted({e.job for e in app_xids if e.gpu == pci})
            uids = [e.uid for e in app_xids if e.gpu == pci]
            detail = f"GPU {pci}: application Xids in {jobs} jobs of {users} users"
            try:
                said = point_at(config, env.node, "app_xid", detail, ids, users, uids=uids)
            except Exception as exc:  # bookkeeping never fails the epilog
                said = f"not flagged: {type(exc).__name__}: {exc}"
            say(f"epilog job {env.job_id}: {said}")
            return


def refused_here(config: Config, job_id: str) -> bool:
    """Whether this node's prolog refused the job (see prolog.mark_refused)."""

    try:
        return os.path.isfile(os.path.join(job_dir(config.state_dir, job_id), "refused.json"))
    except StateError:
        return False


def cleanup(config: Config, env: HookEnv) -> None:
    """Drop the job's baseline and its NCCL directory (the bundle keeps what matters)."""
    if env.job_id:
        try:
            remove_job_state(config.state_dir, env.job_id)  # baseline, refusal note, task file
        except Exception:
            pass

        # Its files are in the bundle now (or never mattered). Only renamed here, whatever the
        # user left in it (a million files, a chain deeper than any recursion limit): a
        # detached child removes it, or the next health run, outside the epilog's deadline.
        remove_nccl_dir(config, env.job_id)


# ----------------------------------------------------- the bookkeeping, planned after acting


def say_verdict(config: Config, env: HookEnv, r: EpilogResult) -> Step | None:
    """One line for slurmd's log after an abnormal end (or a bundle); the kernel records lost."""
    lines = []
    if r.abnormal or r.bundle:
        text = f"epilog job {env.job_id} on {env.node}: {r.why}; cause {r.category}"
        if r.xid is not None:
            text += f" (Xid {r.xid})"
        text += f"; bundle {r.bundle}" + (f"; drained: {r.reason}" if r.drained else "")
        lines.append(text)
    if r.kernel_log_lost:  # at a normal end too: the node's evidence is incomplete
        lines.append(f"epilog job {env.job_id} on {env.node}: kernel.xid: {r.kernel_log_lost}")
    return Say(text="\ngpugate: ".join(lines)) if lines else None


def note_history(config: Config, env: HookEnv, r: EpilogResult) -> Step | None:
    """The drain history (after a drain the epilog set)."""
    if not (r.drained and r.reason):
        return None
    return RecordDrain(node=env.node or "", reason=r.reason, check=r.check or "", hook="epilog",
                       category=r.category, xid=r.xid, bundle=r.bundle, job=env.job_id,
                       boot_id=r.boot_id, gpu=r.gpu)  # fmt: skip


def note_metrics(config: Config, env: HookEnv, r: EpilogResult) -> Step:
    """The metrics textfile."""
    lost = {"kernel.xid": "unknown"} if r.kernel_log_lost else {}
    run = {"findings": {**lost, **{c: "fail" for c in r.hardware_checks}},
           "drained_check": r.check if r.drained else None,
           "category": r.category if r.abnormal else None,
           # A job the prolog refused never ran: no job end (it was counted as an ok end).
           "job_end": None if not r.ran else "failed" if r.abnormal else "ok",
           "confidence": r.confidence,
           "checkpoint_age_s": r.checkpoint_age_s, "checkpoint_stale": r.checkpoint_stale}  # fmt: skip
    return RecordMetrics(node=env.node, hook="epilog", run=run)


def note_event(config: Config, env: HookEnv, r: EpilogResult) -> Step:
    """The hook's line in events.jsonl (with the steps the epilog took)."""
    fields = {"job": env.job_id, "node": env.node, "abnormal": r.abnormal, "why": r.why,
              "category": r.category, "xid": r.xid, "failing_rank": r.failing_rank,
              "hardware_fault": r.hardware_fault, "drained": r.drained, "reason": r.reason,
              "bundle": r.bundle, "kernel_log_lost": r.kernel_log_lost,
              "duration_s": round(r.duration_s, 4), "steps": list(r.steps)}  # fmt: skip
    return RecordEvent(directory=config.state_dir, hook="epilog", fields=fields)

"""The Prolog: gather, check, decide, act — before the job starts.

On failure the node is drained with `gpugate: <check id>: <detail>` and the prolog exits
non-zero, so Slurm requeues the job instead of running it on a bad node. A failure that only
concerns GPUs outside the job's allocation drains the node (no new jobs) and lets this job
start on its healthy GPUs (unless `prolog.refuse_for_other_gpus`).
"""

from __future__ import annotations

import json
import os
import sys
import time

from gpugate import log
from gpugate.checks.facts import facts_from_dict
from gpugate.checks.findings import SEVERITY, fail
from gpugate.checks.kernel import unknown_xids
from gpugate.checks.run import run_checks
from gpugate.checks.sources import gather
from gpugate.gate.budget import warn_daily
from gpugate.gate.drain import DrainOutcome, drain_detail, drain_node, isolate_after_drain
from gpugate.gate.policy import DRAIN, Decision, decide, effective_status
from gpugate.gate.shared import gpus_in_use, judge_shared, others_run
from gpugate.hooks.task_prolog import fr_opted_out
from gpugate.isolate.state import local_path as isolation_file
from gpugate.isolate.state import sync as sync_isolated
from gpugate.isolate.state import without_isolated
from gpugate.record import Record
from gpugate.slurm.choose import backend, with_slurm_gres
from gpugate.slurm.cli import expand_hostlist
from gpugate.slurm.hookenv import comment_tokens
from gpugate.slurm.reasons import drain_reason, refusal_comment
from gpugate.store.nccl_dir import prepare_nccl_dir
from gpugate.store.state import (
    RunRecord,
    StateError,
    ensure_job_dir,
    load_kernel_pos,
    remove_task_file,
    save_baseline,
    save_kernel_pos,
    save_task_file,
    write_private,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.checks.facts import Facts, Gpu
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config
    from gpugate.gate.drain import DrainOutcome
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.hookenv import HookEnv


class PrologResult(Record):
    """What the prolog decided and did."""

    exit_code: int
    status: str  # ok / warn / fail / skipped
    action: str  # allow / warn / drain / skip
    reason: str | None = None  # the drain reason, when one was set
    drained: bool = False
    refused: bool = False
    blocked_by: str | None = None  # the drain was not done: "admin", "budget" or "error"
    statuses: dict[str, Any] = {}  # check id -> status after the policy (for the metrics)
    unknown_xids: tuple[Any, ...] = ()  # Xids NVIDIA's catalog does not list (warned, reported)
    message: str = ""
    duration_s: float = 0.0


def gather_for_prolog(config: Config, env: HookEnv, deadline_s: float) -> Facts:
    """The node's facts under the prolog's deadline (or the replayed snapshot), the kernel log
    from where the last check stopped; the job's peers probed when it spans nodes."""
    peers = job_peers(config, env)
    probing = None
    if peers:  # pinged while the node gathers its own facts: the probe adds little to the start
        from gpugate.checks.sources.peers import start_probes

        probing = start_probes(peers, config.prolog.peers, max(1.0, deadline_s - 1.0))
    position = load_kernel_pos(config.state_dir)
    facts = gather(config, env.node or "", position=position, deadline_s=deadline_s)
    facts = with_slurm_gres(config, env.node, facts)  # how many GPUs slurm.conf gives it
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
    config: Config, env: HookEnv, findings: list[Finding], slurm: SlurmControl | None
) -> tuple[list[Finding], SlurmControl | None]:
    """The findings with another job's load set aside (gpugate/gate/shared.py), and the Slurm
    adapter if it had to be made for that. One bounded scontrol, only when such a finding
    would otherwise fail; where the other jobs' GPUs cannot be learned it is reported, not
    drained: a demanding admin would rather see a warning on a node than lose a healthy
    node (and drain budget) to a job's own CUDA context, while this job's own GPUs, which
    Slurm gave it alone, are still judged in full."""
    made: list[SlurmControl] = []

    def allocated() -> frozenset[int] | None:
        try:
            made.append(slurm or _slurm(config))
        except Exception as exc:  # no adapter: which GPUs others hold is unknown
            note(f"cannot ask Slurm which GPUs jobs hold: {exc}")
            return None
        return gpus_in_use(made[0], env.node or "")

    def other_jobs() -> bool | None:
        return others_run(made[0], env.node or "", env.job_id) if made else None

    out = judge_shared(findings, env.gpus, config.policy, allocated, other_jobs)
    return out, (made[0] if made else slurm)


def concerns_job(f: Finding, env: HookEnv) -> bool:
    """A node-wide finding, or one about a GPU the job was given."""
    return f.gpu is None or env.gpus is None or f.gpu in env.gpus


def run_prolog(config: Config, env: HookEnv, slurm: SlurmControl | None = None) -> PrologResult:
    """Run the whole prolog for one job on this node."""
    started = time.monotonic()
    warn_daily(config)  # a drain budget too small to act is logged once a day
    if "skip" in comment_tokens(env.comment):
        if config.prolog.allow_user_skip:
            return PrologResult(exit_code=0, status="skipped", action="skip",
                                message="gpugate:skip in the job's comment: checks skipped")  # fmt: skip
        note("the job asked for gpugate:skip, which this site does not allow; checking anyway")
    facts = gather_for_prolog(config, env, config.prolog.deadline_s)
    findings = without_isolated(config, run_checks(facts, config)) + keep_isolated_denied(
        config, env.node
    )
    findings, slurm = shared_node(config, env, findings, slurm)
    decision = decide(findings, config.policy, phase="prolog")
    # Decided. From here on nothing is allowed to undo the decision: the bookkeeping below is
    # best effort, and on a drain every step is guarded (see act_on_failure).
    try:
        statuses = check_statuses(findings, config)
        unknown = unknown_xids(findings)
    except Exception as exc:
        note(f"could not fold the findings for the metrics: {exc}")
        statuses, unknown = {}, ()
    try:
        remember_kernel_pos(config, facts)
        if env.job_id:
            prepare_job(config, env, facts, findings, slurm)
    except Exception as exc:  # each step catches its own; this is for what they did not foresee
        note(f"could not prepare the job's state: {exc}")
    took = time.monotonic() - started
    if decision.action != DRAIN:
        result = PrologResult(exit_code=0, status=decision.status, action=decision.action,
                              message=summary(decision), duration_s=took, statuses=statuses)  # fmt: skip
    else:
        result = act_on_failure(
            config, env, decision, slurm, statuses, started, facts.gpus, facts.boot_id
        )
    return result.replace(unknown_xids=unknown)


def act_on_failure(
    config: Config,
    env: HookEnv,
    decision: Decision,
    slurm: SlurmControl | None,
    statuses: dict[str, Any],
    started: float,
    gpus: tuple[Gpu, ...] | None = None,
    boot_id: str | None = None,
) -> PrologResult:
    """Drain, refuse the job when the failure concerns it, explain; never start it by accident.

    A job never runs where a failing check concerns its GPUs: when the drain cannot be done
    (slurmctld unreachable, the adapter raising) the prolog still exits 1, and Slurm drains
    the node itself ("Prolog error"). Only the drain budget lets such a job run (documented:
    a wrong threshold must not empty the cluster).
    """
    failing = list(decision.failing)
    try:
        concerns = config.prolog.refuse_for_other_gpus or any(concerns_job(f, env) for f in failing)
    except Exception:  # cannot tell which GPUs: the failure may be the job's
        concerns = True
    try:
        check_id, detail = drain_detail(failing)
    except Exception:
        check_id, detail = (getattr(failing[0], "check", "?") if failing else "?"), "check failed"
    try:
        slurm = slurm or _slurm(config)
        outcome = drain_node(slurm, env.node or "", check_id, detail, config)
    except Exception as exc:  # the adapter's SlurmError (controller down), or any other
        outcome = drain_failed(env, check_id, detail, exc)
    if outcome.drained and slurm is not None:
        isolation = isolate_after_drain(config, slurm, env.node or "", failing, gpus, boot_id)
        if isolation:
            note(isolation)
    # Over budget, a refusal would only make Slurm drain the node itself ("Prolog error").
    refuse = concerns and outcome.blocked_by != "budget"
    if refuse and env.job_id:
        try:  # both catch their own errors; this is for what they did not foresee
            mark_refused(config, env, outcome.reason)
            if config.prolog.admin_comment and slurm is not None:
                explain_refusal(slurm, env, check_id, detail)
        except Exception as exc:
            note(f"could not record the refusal of job {env.job_id}: {exc}; refusing it")
    try:
        message = summary(decision)
    except Exception:
        message = f"fail: {check_id}: {detail}"
    if outcome.blocked_by == "error":
        message += f"; {outcome.why}"
    return PrologResult(
        exit_code=1 if refuse else 0,
        status="fail",
        action=DRAIN,
        reason=outcome.reason,
        drained=outcome.drained,
        refused=refuse,
        blocked_by=outcome.blocked_by,
        statuses=statuses,
        message=message,
        duration_s=time.monotonic() - started,
    )


def drain_failed(env: HookEnv, check_id: str, detail: str, exc: BaseException) -> DrainOutcome:
    """The outcome of a drain that raised: not drained; the job is refused all the same."""
    try:
        reason = drain_reason(check_id, detail)
    except Exception:
        reason = f"gpugate: {check_id}"
    why = (
        f"could not drain {env.node} ({type(exc).__name__}: {exc}); refusing the job anyway, "
        "so Slurm drains the node itself"
    )
    note(why)
    return DrainOutcome(reason=reason, drained=False, blocked_by="error", why=why)


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
    findings: list[Finding] | None = None,
    slurm: SlurmControl | None = None,
) -> None:
    """Save the counters' baseline for the epilog (with what makes this run its own: the
    faults already known, its logs' start offsets, see runs.py) and the job's NCCL directory."""
    from gpugate.store.runs import run_record

    try:
        # Only a rerun asks Slurm for its files (a first run's are new): a healthy first
        # prolog starts no scontrol and no child (the start-up budget, tests/test_startup.py).
        if slurm is None and env.restart_count > 0:
            slurm = _slurm(config)
        run = run_record(env, findings or [], slurm)
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


def mark_refused(config: Config, env: HookEnv, reason: str) -> None:
    """Leave a note for this job's epilog: the job never ran here, there is nothing to collect.

    Slurm runs the Epilog after a failed Prolog too; without the note it would collect
    "evidence" of the fault the prolog already reported, for a job that never started.
    """

    try:
        directory = ensure_job_dir(config.state_dir, env.job_id or "")
        write_private(os.path.join(directory, "refused.json"), json.dumps({"reason": reason}))
    except Exception as exc:
        note(f"could not mark job {env.job_id} as refused: {exc}")


def explain_refusal(slurm: SlurmControl, env: HookEnv, check_id: str, detail: str) -> None:
    """Put the refusal in the job's AdminComment, so `scontrol show job` says why."""
    text = refusal_comment(str(env.node), check_id, detail)
    try:
        slurm.set_admin_comment(env.job_id or "", text)
    except Exception as exc:  # best effort: the drain reason already says it
        note(f"could not set the job's AdminComment: {exc}")


def summary(decision: Decision) -> str:
    """One line: the verdict and the worst findings."""
    worst = [f.message for f in (*decision.failing, *decision.warnings)][:3]
    return f"{decision.status}" + (": " + "; ".join(worst) if worst else "")


def _slurm(config: Config) -> SlurmControl:
    return backend(config.slurm.backend, timeout=config.slurm.timeout_s)


def note(message: str) -> None:
    """A line for slurmd's log (hook output goes there)."""
    sys.stderr.write(f"gpugate: {message}\n")

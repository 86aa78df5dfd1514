"""The Prolog: gather, check, decide, act — before the job starts.

On failure the node is drained with `gpugate: <check id>: <detail>` and the prolog exits
non-zero, so Slurm requeues the job instead of running it on a bad node. A failure that only
concerns GPUs outside the job's allocation drains the node (no new jobs) and lets this job
start on its healthy GPUs (unless `prolog.refuse_for_other_gpus`).
"""

from __future__ import annotations

import sys
import time

from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.facts import Facts
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config
    from gpugate.slurm_hooks.hookenv import HookEnv


class PrologResult(Record):
    """What the prolog decided and did."""

    exit_code: int
    status: str  # ok / warn / fail / skipped
    action: str  # allow / warn / drain / skip
    reason: str | None = None  # the drain reason, when one was set
    drained: bool = False
    refused: bool = False
    message: str = ""
    duration_s: float = 0.0


def gather_for_prolog(config: Config, env: HookEnv, deadline_s: float) -> Facts:
    """The node's facts under the prolog's deadline (or the replayed snapshot)."""
    from gpugate.checks.facts import facts_from_dict, load_snapshot
    from gpugate.checks.sources import gather_dict, replay_path

    replay = replay_path(config, env.node or "")
    if replay:
        return load_snapshot(replay)
    return facts_from_dict(gather_dict(config, env.node or "", deadline_s=deadline_s))


def concerns_job(f: Finding, env: HookEnv) -> bool:
    """A node-wide finding, or one about a GPU the job was given."""
    return f.gpu is None or env.gpus is None or f.gpu in env.gpus


def drain_detail(failing: list[Finding]) -> tuple[str, str]:
    """(check id, detail) for the drain reason: the first failure, and how many more."""
    first = failing[0]
    detail = first.message.split(": ", 1)[-1] if first.message.startswith(first.check) else first.message
    others = len(failing) - 1
    if others:
        detail += f" (+{others} more)"
    return first.check, detail


def run_prolog(config: Config, env: HookEnv, slurm: object = None) -> PrologResult:
    """Run the whole prolog for one job on this node."""
    from gpugate.checks.run import run_checks
    from gpugate.slurm_hooks.hookenv import comment_tokens
    from gpugate.slurm_hooks.policy import DRAIN, decide
    from gpugate.slurm_hooks.state import save_baseline

    started = time.monotonic()
    if "skip" in comment_tokens(env.comment):
        if config.prolog.allow_user_skip:
            return PrologResult(exit_code=0, status="skipped", action="skip",
                                message="gpugate:skip in the job's comment: checks skipped")  # fmt: skip
        note("the job asked for gpugate:skip, which this site does not allow; checking anyway")
    facts = gather_for_prolog(config, env, config.prolog.deadline_s)
    findings = run_checks(facts, config)
    decision = decide(findings, config.policy, phase="prolog")
    if env.job_id:
        try:
            save_baseline(config.state_dir, env.job_id, facts)
        except Exception as exc:  # the baseline serves the epilog; its loss must not stop a job
            note(f"could not save the job's baseline: {exc}")
    took = time.monotonic() - started
    if decision.action != DRAIN:
        return PrologResult(exit_code=0, status=decision.status, action=decision.action,
                            message=summary(decision), duration_s=took)  # fmt: skip
    failing = list(decision.failing)
    check_id, detail = drain_detail(failing)
    slurm = slurm or _slurm(config)
    reason, drained = drain_node(slurm, env.node or "", check_id, detail)
    refuse = config.prolog.refuse_for_other_gpus or any(concerns_job(f, env) for f in failing)
    if refuse and env.job_id and config.prolog.admin_comment:
        explain_refusal(slurm, env, check_id, detail)
    return PrologResult(
        exit_code=1 if refuse else 0,
        status="fail",
        action=DRAIN,
        reason=reason,
        drained=drained,
        refused=refuse,
        message=summary(decision),
        duration_s=time.monotonic() - started,
    )


def drain_node(slurm: object, node: str, check_id: str, detail: str) -> tuple[str, bool]:
    """Drain with gpugate's reason; an admin's existing drain is left as it is."""
    from gpugate.slurm_hooks.slurm import NotOurDrain, drain_reason

    reason = drain_reason(check_id, detail)
    try:
        slurm.drain(node, reason)  # type: ignore[attr-defined]
    except NotOurDrain as exc:
        note(f"not draining {node}: {exc}")
        return reason, False
    return reason, True


def explain_refusal(slurm: object, env: HookEnv, check_id: str, detail: str) -> None:
    """Put the refusal in the job's AdminComment, so `scontrol show job` says why."""
    text = f"gpugate: node {env.node} refused: {check_id}: {detail}"
    try:
        slurm.set_admin_comment(env.job_id, text)  # type: ignore[attr-defined]
    except Exception as exc:  # best effort: the drain reason already says it
        note(f"could not set the job's AdminComment: {exc}")


def summary(decision: object) -> str:
    """One line: the verdict and the worst findings."""
    worst = [f.message for f in (*decision.failing, *decision.warnings)][:3]  # type: ignore[attr-defined]
    return f"{decision.status}" + (": " + "; ".join(worst) if worst else "")  # type: ignore[attr-defined]


def _slurm(config: Config) -> object:
    from gpugate.slurm_hooks.slurm import backend

    return backend(config.slurm.backend, timeout=config.slurm.timeout_s)


def note(message: str) -> None:
    """A line for slurmd's log (hook output goes there)."""
    sys.stderr.write(f"gpugate: {message}\n")

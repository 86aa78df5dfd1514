"""`gpugate prolog`: the Slurm Prolog entry point (slurm_hooks/gpugate-prolog calls it)."""

from __future__ import annotations

from gpugate import log
from gpugate.commands.guarded import each_on_its_own, run_hook_command
from gpugate.hooks.prolog import run_prolog
from gpugate.slurm.hookenv import from_environ
from gpugate.store import history, metrics

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config
    from gpugate.hooks.prolog import PrologResult
    from gpugate.slurm.hookenv import HookEnv


def main(argv: list[str]) -> int:
    """Run the prolog hook."""
    return run_hook_command("prolog", argv, _body)


def _body(config: Config) -> int:
    env = from_environ()
    result = run_prolog(config, env)
    # The decision is made: nothing below (the history, the metrics, the events, a full or
    # read-only disk, a hostile drains.jsonl) may change the exit code or undo the drain.
    code = result.exit_code
    bookkeeping(config, env, result)
    return code


def bookkeeping(config: Config, env: HookEnv, result: PrologResult) -> None:
    """slurmd's log line, the drain history, the metrics, the event: each on its own."""
    steps = (say_verdict, note_history, note_unknown_xids, note_metrics, note_event)
    each_on_its_own("prolog", steps, "decision", config, env, result)


def say_verdict(config: Config, env: HookEnv, result: PrologResult) -> None:
    """One line for slurmd's log: what was decided and done."""
    verdict = f"prolog job {env.job_id} on {env.node}: {result.message} ({result.duration_s * 1000:.0f} ms)"
    if result.drained:
        verdict += f"; drained: {result.reason}"
    if result.refused:
        verdict += "; job refused (Slurm requeues it)"
    log.say(verdict)


def note_history(config: Config, env: HookEnv, result: PrologResult) -> None:
    """The drain history (after a drain gpugate set)."""
    if result.drained and result.reason:
        history.note_drain(config, env.node or "", result.reason, job=env.job_id, hook="prolog")


def note_unknown_xids(config: Config, env: HookEnv, result: PrologResult) -> None:
    """Xids outside NVIDIA's catalog, in the history `gpugate nodes` reads (they never drain)."""
    if result.unknown_xids:
        history.note_unknown_xids(config, env.node or "", result.unknown_xids,
                                  job=env.job_id, hook="prolog")  # fmt: skip


def note_metrics(config: Config, env: HookEnv, result: PrologResult) -> None:
    """The metrics textfile."""
    metrics.note_run(config, env.node, "prolog", findings=result.statuses, duration_s=result.duration_s,
                     drained_check=history.reason_check(result.reason) if result.drained else None,
                     budget_exceeded=result.blocked_by == "budget",
                     unknown_xids=result.unknown_xids)  # fmt: skip


def note_event(config: Config, env: HookEnv, result: PrologResult) -> None:
    """The hook's line in events.jsonl."""
    log.event(config.state_dir, "prolog", job=env.job_id, node=env.node, status=result.status,
              action=result.action, reason=result.reason, drained=result.drained,
              refused=result.refused, blocked_by=result.blocked_by,
              unknown_xids=list(result.unknown_xids),
              duration_s=round(result.duration_s, 4))  # fmt: skip

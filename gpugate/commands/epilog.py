"""`gpugate epilog`: the Slurm Epilog entry point (slurm_hooks/gpugate-epilog calls it)."""

from __future__ import annotations

from gpugate import log
from gpugate.commands.guarded import each_on_its_own, run_hook_command
from gpugate.hooks.epilog import run_epilog
from gpugate.slurm.hookenv import from_environ
from gpugate.store import history, metrics

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config
    from gpugate.hooks.epilog_result import EpilogResult
    from gpugate.slurm.hookenv import HookEnv


def main(argv: list[str]) -> int:
    """Run the epilog hook."""
    return run_hook_command("epilog", argv, _body)


def _body(config: Config) -> int:
    env = from_environ()
    r = run_epilog(config, env)
    # The drain (if any) is done: each bookkeeping step below is on its own, best effort.
    steps = (say_verdict, note_history, note_metrics, note_event)
    each_on_its_own("epilog", steps, "drain", config, env, r)
    return 0


def say_verdict(config: Config, env: HookEnv, r: EpilogResult) -> None:
    """One line for slurmd's log after an abnormal end (or a bundle)."""
    if r.abnormal or r.bundle:
        text = f"epilog job {env.job_id} on {env.node}: {r.why}; cause {r.category}"
        if r.xid is not None:
            text += f" (Xid {r.xid})"
        text += f"; bundle {r.bundle}" + (f"; drained: {r.reason}" if r.drained else "")
        log.say(text)
    if r.kernel_log_lost:  # at a normal end too: the node's evidence is incomplete
        log.say(f"epilog job {env.job_id} on {env.node}: kernel.xid: {r.kernel_log_lost}")


def note_history(config: Config, env: HookEnv, r: EpilogResult) -> None:
    """The drain history (after a drain the epilog set)."""
    if r.drained and r.reason:
        history.note_drain(config, env.node or "", r.reason, category=r.category, xid=r.xid,
                           bundle=r.bundle, job=env.job_id, hook="epilog")  # fmt: skip


def note_metrics(config: Config, env: HookEnv, r: EpilogResult) -> None:
    """The metrics textfile."""
    lost = {"kernel.xid": "unknown"} if r.kernel_log_lost else {}
    metrics.note_run(config, env.node, "epilog",
                     findings={**lost, **{c: "fail" for c in r.hardware_checks}},
                     drained_check=history.reason_check(r.reason) if r.drained else None,
                     category=r.category if r.abnormal else None,
                     job_end="failed" if r.abnormal else "ok",
                     confidence=r.confidence, checkpoint_age_s=r.checkpoint_age_s,
                     checkpoint_stale=r.checkpoint_stale)  # fmt: skip


def note_event(config: Config, env: HookEnv, r: EpilogResult) -> None:
    """The hook's line in events.jsonl."""
    log.event(config.state_dir, "epilog", job=env.job_id, node=env.node, abnormal=r.abnormal,
              why=r.why, category=r.category, xid=r.xid, failing_rank=r.failing_rank,
              hardware_fault=r.hardware_fault, drained=r.drained, reason=r.reason,
              bundle=r.bundle, kernel_log_lost=r.kernel_log_lost,
              duration_s=round(r.duration_s, 4))  # fmt: skip

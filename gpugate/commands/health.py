"""`gpugate health`: Slurm's HealthCheckProgram entry point (slurm_hooks/gpugate-health calls it)."""

from __future__ import annotations

import time

from gpugate import log
from gpugate.commands.guarded import each_on_its_own, run_hook_command
from gpugate.hooks.health import run_health
from gpugate.slurm.hookenv import from_environ
from gpugate.store import history, metrics
from gpugate.store.nccl_dir import sweep_nccl_base

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config
    from gpugate.hooks.health import HealthResult


def main(argv: list[str]) -> int:
    """Run the health check; always exit 0 (slurmd ignores it; gpugate drains itself)."""
    return run_hook_command("health", argv, _body)


def _body(config: Config) -> int:
    from gpugate.slurm.choose import backend

    # No job environment: the node name as the other hooks find it (SLURMD_NODENAME, else
    # the short host name).
    node = from_environ().node or ""
    slurm = backend(config.slurm.backend, timeout=config.slurm.timeout_s)
    result = run_health(config, node, slurm)
    started = time.monotonic() - result.duration_s
    each_on_its_own("health", (say_verdict, note_history, note_metrics, note_event), "decision",
                    config, node, result)  # fmt: skip
    left = config.health.deadline_s - (time.monotonic() - started) - _SWEEP_MARGIN_S
    each_on_its_own("health", (sweep_nccl,), "decision", config, node, left)
    return 0


# What the health run keeps for itself after the sweep (writing its lines, exiting).
_SWEEP_MARGIN_S = 2.0


def sweep_nccl(config: Config, node: str, left: float) -> None:
    """Remove the NCCL directories epilogs set aside (and their children left), in `left` s."""
    done = sweep_nccl_base(config, left)
    if done and done["left"]:
        log.say(
            f"health on {node}: {done['left']} set-aside NCCL directories left for the next run"
        )


def say_verdict(config: Config, node: str, result: HealthResult) -> None:
    """One line for slurmd's log."""
    line = (
        f"health on {node}: {result.action}: {result.message} ({result.duration_s * 1000:.0f} ms)"
    )
    if result.drained:
        line += f"; drained: {result.reason}"
    log.say(line)


def note_history(config: Config, node: str, result: HealthResult) -> None:
    """The drain history (after a drain gpugate set)."""
    if result.drained and result.reason:
        history.note_drain(config, node, result.reason, hook="health")


def note_metrics(config: Config, node: str, result: HealthResult) -> None:
    """The metrics textfile."""
    metrics.note_run(config, node, "health", findings=result.statuses, duration_s=result.duration_s,
                     drained_check=history.reason_check(result.reason) if result.drained else None,
                     budget_exceeded=result.blocked_by == "budget")  # fmt: skip


def note_event(config: Config, node: str, result: HealthResult) -> None:
    """The run's line in events.jsonl."""
    log.event(config.state_dir, "health", node=node, status=result.status, action=result.action,
              reason=result.reason, drained=result.drained, resumed=result.resumed,
              blocked_by=result.blocked_by, message=result.message[:500],
              duration_s=round(result.duration_s, 4))  # fmt: skip

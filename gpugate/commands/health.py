"""`gpugate health`: Slurm's HealthCheckProgram entry point (slurm_hooks/gpugate-health calls it)."""

from __future__ import annotations

import time

from gpugate import log
from gpugate.commands.guarded import each_on_its_own, run_hook_command
from gpugate.hooks.health import run_health
from gpugate.slurm.hookenv import from_environ
from gpugate.store.nccl_dir import sweep_nccl_base

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config


def main(argv: list[str]) -> int:
    """Run the health check; always exit 0 (slurmd ignores it; gpugate drains itself)."""
    return run_hook_command("health", argv, _body)


def _body(config: Config) -> int:
    from gpugate.slurm.choose import backend

    # No job environment: the node name as the other hooks find it (SLURMD_NODENAME, else
    # the short host name).
    node = from_environ().node or ""
    slurm = backend(config.slurm.backend, timeout=config.slurm.timeout_s)
    # The hook decides, acts and records (its log line, history, metrics, event) itself.
    result = run_health(config, node, slurm)
    started = time.monotonic() - result.duration_s
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

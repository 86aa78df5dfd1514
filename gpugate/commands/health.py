"""`gpugate health`: Slurm's HealthCheckProgram entry point (slurm_hooks/gpugate-health calls it)."""

from __future__ import annotations

import time

from gpugate import log
from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, make_parser
from gpugate.commands import HOOK_HELP
from gpugate.commands.guarded import each_on_its_own, run_hook_command
from gpugate.config import load_config
from gpugate.hooks.health import run_health
from gpugate.slurm.hookenv import from_environ
from gpugate.store.nccl_dir import sweep_nccl_base
from gpugate.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config


def main(argv: list[str]) -> int:
    """Run the health check; always exit 0 (slurmd ignores it; gpugate drains itself).
    `--dry-run`: decide and print the plan, change nothing (not as slurmd's hook)."""
    if "--dry-run" in argv:
        return dry_run(argv)
    return run_hook_command("health", argv, _body)


def dry_run(argv: list[str]) -> int:
    """`gpugate health --dry-run [--config FILE] [--node NAME]`: gather, check, decide as the
    health run would now, and print what it would do (`would ...`): nothing drained, lifted,
    repaired or recorded. Exit 0 when the node passes (or warns), 1 when it fails, 2 when
    Slurm or the config cannot be read."""
    from gpugate.slurm.choose import backend

    p = make_parser("gpugate health --dry-run", HOOK_HELP["health"])
    p.add_argument("--dry-run", action="store_true", help="say the plan, change nothing")
    p.add_argument("--node", metavar="NAME", help="this node's Slurm name (default: as the hook)")
    p.add_argument("--config", metavar="FILE", help="site config")
    args = p.parse_args(argv)
    config = load_config(args.config)
    node = args.node or from_environ().node or ""
    result = run_health(config, node, backend(config.slurm.backend, timeout=config.slurm.timeout_s),
                        dry_run=True)  # fmt: skip
    print(
        f"{printable(node)}: {result.status.upper()}: {result.action}: {printable(result.message)}"
    )
    for line in result.steps:
        print(f"  PLAN    {printable(line)}")
    if result.status == "error":
        return EXIT_USAGE
    return EXIT_UNHEALTHY if result.status == "fail" else EXIT_OK


def _body(config: Config) -> int:
    from gpugate.slurm.choose import backend

    # No job environment: the node name as the other hooks find it (SLURMD_NODENAME, else
    # the short host name).
    node = from_environ().node or ""
    slurm = backend(config.slurm.backend, timeout=config.slurm.timeout_s)
    # The hook decides, acts and records (its log line, history, metrics, event) itself.
    result = run_health(config, node, slurm)
    started = time.monotonic() - result.duration_s
    # The run's budget, sized below slurmd's limit (HealthCheckTimeout on 26.05, else 60 s).
    left = result.budget_s - (time.monotonic() - started) - _SWEEP_MARGIN_S
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

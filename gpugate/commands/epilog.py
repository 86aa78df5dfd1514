"""`gpugate epilog`: the Slurm Epilog entry point (slurm_hooks/gpugate-epilog calls it)."""

from __future__ import annotations

from gpugate.commands.guarded import run_hook_command
from gpugate.hooks.epilog import run_epilog
from gpugate.slurm.hookenv import from_environ

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config


def main(argv: list[str]) -> int:
    """Run the epilog hook."""
    return run_hook_command("epilog", argv, _body)


def _body(config: Config) -> int:
    # The hook decides, acts and records (its log line, history, metrics, event) itself.
    run_epilog(config, from_environ())
    return 0

"""`gpugate prolog`: the Slurm Prolog entry point (slurm_hooks/gpugate-prolog calls it)."""

from __future__ import annotations

from gpugate.commands.guarded import run_hook_command
from gpugate.hooks.prolog import run_prolog
from gpugate.slurm.hookenv import from_environ

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config


def main(argv: list[str]) -> int:
    """Run the prolog hook."""
    return run_hook_command("prolog", argv, _body)


def _body(config: Config) -> int:
    # The hook decides, acts and records (its log line, history, metrics, event) itself.
    return run_prolog(config, from_environ()).exit_code

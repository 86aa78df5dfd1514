"""`gpugate prolog`: the Slurm Prolog entry point (slurm_hooks/gpugate-prolog calls it)."""

from __future__ import annotations

from gpugate.commands.guarded import run_hook_command
from gpugate.hooks.prolog import run_prolog
from gpugate.slurm.hookenv import from_environ

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl


def main(argv: list[str], make_slurm: Callable[[Config], SlurmControl] | None = None) -> int:
    """Run the prolog hook; `make_slurm` makes its Slurm adapter (default: the site's backend)."""
    return run_hook_command("prolog", argv, lambda config: _body(config, make_slurm))


def _body(config: Config, make_slurm: Callable[[Config], SlurmControl] | None = None) -> int:
    # The hook decides, acts and records (its log line, history, metrics, event) itself.
    return run_prolog(config, from_environ(), make_slurm=make_slurm).exit_code

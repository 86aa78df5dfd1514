"""`gpugate epilog-slurmctld`: the EpilogSlurmctld entry point (gpugate/hooks/epilog_slurmctld.py)."""

from __future__ import annotations

from gpugate.commands.guarded import run_hook_command
from gpugate.hooks.epilog_slurmctld import run_epilog_slurmctld

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config


def main(argv: list[str]) -> int:
    """Run the controller epilog."""
    return run_hook_command("epilog-slurmctld", argv, _body)


def _body(config: Config) -> int:
    return run_epilog_slurmctld(config)

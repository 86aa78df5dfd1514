"""selftest: which Slurm backend the hooks' `slurm.backend` gives on this host (issue 29).

`slurm.backend: pyslurm` fails every hook that talks to Slurm where pyslurm is missing, built
for another Slurm, or cannot import; `auto` falls back to scontrol and says why. selftest asks
the same question the hooks do, with the slurm.conf they read.
"""

from __future__ import annotations

from gpugate.admin.access import Problem
from gpugate.slurm.cli import CliBackend  # selftest only: no hook imports this module

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.slurm.cli import Runner

FIX = ("build pyslurm for this Slurm and the Python that runs gpugate (docs/guide/install.md, "
       "\"The Slurm backend\"), or set slurm.backend: auto")  # fmt: skip


def check_backend(
    kind: str,
    slurm_conf: str | None,
    runner: Runner | None = None,
    version_of: Callable[[str], str] | None = None,
) -> tuple[str, list[Problem]]:
    """A note naming the backend `kind` gives here and why, or the problem that stops it."""
    from gpugate.slurm.choose import select_backend
    from gpugate.slurm.control import SlurmError

    try:
        choice = select_backend(kind, runner=runner, version_of=version_of, slurm_conf=slurm_conf)
    except (SlurmError, ValueError) as exc:
        return "", [Problem(f"slurm.backend {kind}: the hooks cannot use it here: {exc}", FIX)]
    why = choice.why
    if choice.kind == "cli" and why.startswith("pyslurm is not installed"):
        why = f"{why}; {_release_note(slurm_conf, runner)}"
    return f"slurm backend: {choice.kind} ({why})", []


def _release_note(slurm_conf: str | None, runner: Runner | None) -> str:
    """Whether a pyslurm exists for this Slurm at all: the hooks' path never asks Slurm this."""
    from gpugate.slurm.choose import pyslurm_release_for
    from gpugate.slurm.control import SlurmError

    try:
        version = CliBackend(runner=runner, slurm_conf=slurm_conf).version()
    except SlurmError:
        version = None
    return pyslurm_release_for(version)

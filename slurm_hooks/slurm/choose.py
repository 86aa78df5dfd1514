"""Which backend to use: the CLI, or pyslurm when it matches Slurm and imports cleanly.

`backend()` is what the hooks and commands call; GPUGATE_SLURM_BACKEND (auto/cli/pyslurm)
overrides the configured kind.
"""

from __future__ import annotations

import os

from gpugate.record import Record
from gpugate.slurm_hooks.slurm.cli import CliBackend, parse_version
from gpugate.slurm_hooks.slurm.control import (
    DEFAULT_TIMEOUT,
    BackendUnavailable,
    SlurmControl,
    SlurmError,
)
from gpugate.slurm_hooks.slurm.pyslurm import PyslurmBackend

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.slurm_hooks.slurm.cli import Runner

PROBE_TIMEOUT = 5.0  # `python -c "import pyslurm"`; a missing slurm.conf makes it hang 59 s
ENV_BACKEND = "GPUGATE_SLURM_BACKEND"
KINDS = ("auto", "cli", "pyslurm")


class BackendChoice(Record):
    """Which backend select_backend() chose, and the reason (for the log)."""

    kind: str  # cli / pyslurm
    why: str


def select_backend(
    kind: str = "auto",
    *,
    runner: Runner | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    version_of: Callable[[str], str] | None = None,
) -> BackendChoice:
    """Pick cli or pyslurm; GPUGATE_SLURM_BACKEND (auto/cli/pyslurm) overrides `kind`."""
    requested = (os.environ.get(ENV_BACKEND) or kind or "auto").strip().lower()
    if requested not in KINDS:
        raise ValueError(f"{ENV_BACKEND}/backend: {requested!r} is not one of {', '.join(KINDS)}")
    if requested == "cli":
        return BackendChoice(kind="cli", why="the command-line backend was asked for")
    problem = _pyslurm_problem(CliBackend(timeout=timeout, runner=runner), version_of)
    if problem is None:
        return BackendChoice(kind="pyslurm", why="pyslurm matches Slurm and imports cleanly")
    if requested == "pyslurm":
        raise BackendUnavailable(f"pyslurm backend unavailable: {problem}")
    return BackendChoice(kind="cli", why=problem)


def _pyslurm_problem(cli: CliBackend, version_of: Callable[[str], str] | None) -> str | None:
    """Why pyslurm must not be used here, or None when it may."""
    if version_of is None:
        from importlib.metadata import version as version_of
    try:
        # Reads the installed metadata only: libslurm is not loaded.
        have = version_of("pyslurm")
    except Exception:  # PackageNotFoundError, or broken metadata
        return "pyslurm is not installed"
    try:
        slurm = cli.version()
    except SlurmError as e:
        return f"cannot read Slurm's version: {e}"
    if slurm is None or parse_version(have) != slurm:
        return f"pyslurm {have} does not match Slurm {slurm} (X.Y must be equal)"
    return _probe_import(cli)


def _probe_import(cli: CliBackend) -> str | None:
    import sys

    # In a child: `import pyslurm` runs slurm_init(), which exits or hangs without a usable
    # slurm.conf, and no try/except can catch that.
    res = cli._run([sys.executable, "-c", "import pyslurm"], PROBE_TIMEOUT, env=cli.env())
    return None if res.ok else f"`import pyslurm` failed in a subprocess: {res.describe()}"


def backend(
    kind: str = "auto", *, timeout: float = DEFAULT_TIMEOUT, runner: Runner | None = None
) -> SlurmControl:
    """The Slurm backend to use: see select_backend(); `.why` says why it was chosen."""
    choice = select_backend(kind, runner=runner, timeout=timeout)
    cli = CliBackend(timeout=timeout, runner=runner)
    chosen: SlurmControl = cli
    if choice.kind == "pyslurm":
        chosen = PyslurmBackend(cli=cli)
    chosen.why = choice.why
    return chosen

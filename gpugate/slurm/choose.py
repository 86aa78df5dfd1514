"""Which backend to use: the CLI, or pyslurm when it matches Slurm and imports cleanly.

`backend()` is what the hooks and commands call; GPUGATE_SLURM_BACKEND (auto/cli/pyslurm)
overrides the configured kind.
"""

from __future__ import annotations

import json
import os
import sys
import time

from gpugate.fsutil import atomic_write, read_regular
from gpugate.record import Record
from gpugate.slurm.cli import CliBackend, parse_version
from gpugate.slurm.control import (
    DEFAULT_TIMEOUT,
    BackendUnavailable,
    SlurmControl,
    SlurmError,
)
from gpugate.slurm.pyslurm import PyslurmBackend

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol, TypeVar

    from gpugate.config.schema import Config  # for annotations only

    class HasGres(Protocol):
        """What with_slurm_gres reads and returns: the checks' Facts (above the adapter)."""

        @property
        def slurm_gres_gpus(self) -> int | None: ...

        def replace(self: _G, **changes: object) -> _G: ...

    _G = TypeVar("_G", bound=HasGres)
    from gpugate.slurm.cli import Runner

_PROBE = "import json, sys; sys.path[:] = json.loads(sys.argv.pop(1)); import pyslurm"
PROBE_TIMEOUT = 5.0  # `python -c "import pyslurm"`; a missing slurm.conf makes it hang 59 s
ENV_BACKEND = "GPUGATE_SLURM_BACKEND"
KINDS = ("auto", "cli", "pyslurm")
# pyslurm's newest release series when last checked (docs/slurm-facts.md, "pyslurm": PyPI
# 25.11.x, 2026-12): a Slurm above it (26.05) has no pyslurm to build, only the CLI.
PYSLURM_NEWEST = (25, 11)
CLI_USED = "the scontrol/sinfo command line is used"


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
    slurm_conf: str | None = None,
) -> BackendChoice:
    """Pick cli or pyslurm; GPUGATE_SLURM_BACKEND (auto/cli/pyslurm) overrides `kind`."""
    requested = (os.environ.get(ENV_BACKEND) or kind or "auto").strip().lower()
    if requested not in KINDS:
        raise ValueError(f"{ENV_BACKEND}/backend: {requested!r} is not one of {', '.join(KINDS)}")
    if requested == "cli":
        return BackendChoice(kind="cli", why="the command-line backend was asked for")
    cli = CliBackend(timeout=timeout, runner=runner, slurm_conf=slurm_conf)
    problem = _pyslurm_problem(cli, version_of)
    if problem is None:
        return BackendChoice(kind="pyslurm", why="pyslurm matches Slurm and imports cleanly")
    if requested == "pyslurm":
        raise BackendUnavailable(f"pyslurm backend unavailable: {problem}")
    return BackendChoice(kind="cli", why=problem)


def _pyslurm_problem(cli: CliBackend, version_of: Callable[[str], str] | None) -> str | None:
    """Why pyslurm must not be used here, or None when it may."""
    if version_of is None:
        from importlib.metadata import version

        version_of = version
    try:
        # Reads the installed metadata only: libslurm is not loaded.
        have = version_of("pyslurm")
    except Exception:  # PackageNotFoundError, or broken metadata
        # No scontrol call here: this is every hook's path on a CLI site (selftest says more).
        return f"pyslurm is not installed: {CLI_USED}"
    try:
        slurm = cli.version()
    except SlurmError as e:
        return f"cannot read Slurm's version: {e}"
    if slurm is None or parse_version(have) != slurm:
        return (f"pyslurm {have} does not match Slurm {slurm_release(slurm)} (X.Y must be "
                f"equal): {CLI_USED}")  # fmt: skip
    return _probe_import(cli)


def slurm_release(version: tuple[int, int] | None) -> str:
    """Slurm's X.Y as Slurm writes it ("26.05"), or "of unknown version"."""
    return "of unknown version" if version is None else f"{version[0]}.{version[1]:02d}"


def pyslurm_release_for(version: tuple[int, int] | None) -> str:
    """Whether pyslurm has a release series for this Slurm X.Y, in words."""
    if version is None:
        return "Slurm's version is unknown"
    if version > PYSLURM_NEWEST:
        newest = slurm_release(PYSLURM_NEWEST)
        return (f"pyslurm has no release for Slurm {slurm_release(version)} (the newest "
                f"gpugate knows of is {newest})")  # fmt: skip
    return f"pyslurm {version[0]}.{version[1]}.x is the release for this Slurm"


def _probe_import(cli: CliBackend) -> str | None:
    # In a child: `import pyslurm` runs slurm_init(), which exits or hangs without a usable
    # slurm.conf, and no try/except can catch that.
    # The child searches this process's sys.path, nothing else (-I: no PYTHON* variables, no
    # user site): the packaged launcher puts its lib/ first, where a site may install pyslurm,
    # and `auto` found pyslurm's version there.
    paths = json.dumps([p for p in sys.path if os.path.isabs(p)])
    argv = [sys.executable, "-I", "-c", _PROBE, paths]
    res = cli._run(argv, PROBE_TIMEOUT, env=cli.env())
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


def backend_for(config: Config) -> SlurmControl:
    """The site's backend: backend() of `slurm.backend` under `slurm.timeout_s`.

    The default of every `make_slurm` parameter (a hook's, a command's): tests pass a fake.
    """
    return backend(config.slurm.backend, timeout=config.slurm.timeout_s)


# The prolog's question is on the job's critical path: never longer than this.
GRES_TIMEOUT = 3.0


def configured_gpus(
    node: str, slurm: SlurmControl | None = None, timeout: float = GRES_TIMEOUT
) -> int | None:
    """The GPUs slurm.conf gives `node` (`Gres=gpu:N`); None when unknown or Slurm is away.

    Best effort and cheap: one `scontrol show node` (or the backend already at hand), under
    `timeout`; any error means "not known" and gpu.count falls back to the PCI bus.
    """
    if not node:
        return None
    try:
        return (slurm or CliBackend(timeout=timeout)).node(node).gres_gpus
    except Exception:  # the controller down, scontrol missing, a parse surprise: not known
        return None


# A Gres change needs a slurm.conf edit and a reconfigure: ten minutes late at most, instead of
# one slurmctld RPC per job start on every node.
GRES_CACHE_S = 600.0
_GRES_CACHE = "slurm-gres.json"


def cached_gpus(
    state_dir: str, node: str, ask: Callable[[], int | None], now: float | None = None
) -> int | None:
    """Slurm's Gres GPU count for `node`: the node-local answer if under GRES_CACHE_S old at
    `now` (None: this moment), else ask()."""
    path = os.path.join(state_dir, _GRES_CACHE)
    now = time.time() if now is None else now
    try:
        data = json.loads(read_regular(path, 4096, follow=False))  # never blocks, capped
        gpus = data["gpus"]
        fresh = 0 <= now - float(data["at"]) < GRES_CACHE_S
        if data["node"] == node and fresh and type(gpus) is int and gpus >= 0:
            return gpus
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
        pass  # no answer kept, or a bad one: ask Slurm
    count = ask()
    if count is not None:
        try:
            atomic_write(path, json.dumps({"node": node, "gpus": count, "at": now}), mode=0o640)
        except OSError:
            pass  # only a cache
    return count


def slurm_gres_gpus(
    config: Config, node: str | None, slurm: SlurmControl | None = None
) -> int | None:
    """Slurm's Gres GPU count for `node`, a gather source for the hooks: asked once when it
    matters (the node-local answer if fresh), under its own timeout (GRES_TIMEOUT at most).

    Not asked for a replayed snapshot (it may carry `slurm_gres_gpus` itself), nor when the
    site sets `expect.gpu_count` (the site's word comes first): None then, as when unknown.
    """
    if config.facts_file or config.expect.gpu_count is not None:
        return None
    timeout = min(GRES_TIMEOUT, config.slurm.timeout_s)
    return cached_gpus(config.state_dir, node or "",
                       lambda: configured_gpus(node or "", slurm, timeout))  # fmt: skip


def with_slurm_gres(
    config: Config, node: str | None, facts: _G, slurm: SlurmControl | None = None
) -> _G:
    """`facts` with the node's Slurm Gres GPU count (slurm_gres_gpus) when not already known."""
    if facts.slurm_gres_gpus is not None:
        return facts
    count = slurm_gres_gpus(config, node, slurm)
    return facts if count is None else facts.replace(slurm_gres_gpus=count)

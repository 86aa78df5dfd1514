"""Asking Slurm for one node's or one job's record, for the commands that act on it."""

from __future__ import annotations

from gpugate import names
from gpugate.cli import EXIT_USAGE
from gpugate.config import load_config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl

    _T = TypeVar("_T")


def ask_slurm_for(
    prog: str,
    kind: str,
    ident: str,
    config_file: str | None,
    read: Callable[[SlurmControl, str], _T],
    make_slurm: Callable[[Config], SlurmControl] | None = None,
) -> tuple[Config, SlurmControl, _T] | int:
    """(config, the Slurm backend, `read(backend, ident)`: Slurm's record of the node or job),
    or the exit code after one line: 2 when `ident` is not one node name / job id, 1 when Slurm
    cannot say. The backend is made by `make_slurm` (default: the site's)."""
    # Late: the Slurm adapter is for the commands that ask Slurm; a replayed check, which
    # shares this package, never does (gpugate/startup.py).
    from gpugate.slurm.choose import backend_for
    from gpugate.slurm.control import JobNotFound, NodeNotFound, SlurmError

    try:
        (names.node_name if kind == "node" else names.job_id)(ident)
    except names.BadName as exc:
        return names.refuse(prog, exc, EXIT_USAGE)
    config = load_config(config_file)
    slurm: SlurmControl | None = None

    def fetch() -> _T:
        nonlocal slurm
        slurm = (make_slurm or backend_for)(config)
        return read(slurm, ident)

    not_found = NodeNotFound if kind == "node" else JobNotFound
    info, code = names.ask_slurm(
        prog, f"{kind} {ident}", fetch, not_found, (SlurmError, ValueError)
    )
    if code is not None:
        return code
    # fetch() returned: both are set
    assert slurm is not None and info is not None
    return config, slurm, info

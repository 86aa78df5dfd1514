"""The Slurm adapter: the only code that talks to Slurm.

`control.py` the interface the hooks call (SlurmControl, its errors), `choose.py` which
backend, `cli.py` scontrol/sinfo, `pyslurm.py` libslurm, `records.py` NodeInfo/JobInfo,
`parse_text.py` and `parse_json.py` every version's output, `jobid.py` job ids (plain,
array task, het component), `hostlist.py` host names, `reasons.py` the drain reasons gpugate
writes and recognises.

`from gpugate.slurm import backend` is the entry for scripts and tests (docs/interfaces.md).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.slurm.choose import backend

__all__ = ["backend"]


def __getattr__(name: str) -> object:
    """`backend`, imported on first use: reasons and hostlist import this package, cheaply."""
    if name == "backend":
        from gpugate.slurm.choose import backend

        return backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

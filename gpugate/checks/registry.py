"""The check registry: `@check("gpu.ecc", hardware=True, action=RESET)` records a pure function
under a stable id, with what its failure means elsewhere.

Checks are imported from the explicit list in `catalog.py`, so a missing module is an
ImportError, never a silently skipped check. Duplicate ids are refused.

A check's metadata lives on its `@check` line: `hardware` (a failure after a job is the node's
own fault, so the epilog drains for it; the host's limits or mounts do not change while a job
runs), `action` (what an admin should do about a node drained for it, see `gpugate nodes`)
and `fault` (TRANSIENT: the fault heals by itself, `gpugate health` lifts its own drain once the
check passes again; HARDWARE: it needs a repair or a person, see gpugate/health/heal.py; the
drain budget counts the two apart, gpugate/gate/budget.py) and `load` (LOAD_GPU, LOAD_HOST: what a
running job's own load changes, set aside for other jobs on a shared node, gpugate/gate/shared.py).
"""

from __future__ import annotations

# The words and tables a check module declares with live in declare.py (a check module importing
# this module would close a circle through the catalog); they are re-exported for the readers.
from gpugate.checks.declare import _ACTION, _DOCS, _FAULT, _HARDWARE, _LOAD, _REGISTRY
from gpugate.checks.declare import ACTIONS as ACTIONS
from gpugate.checks.declare import COOLING as COOLING
from gpugate.checks.declare import FAULTS as FAULTS
from gpugate.checks.declare import HARDWARE as HARDWARE
from gpugate.checks.declare import HOST as HOST
from gpugate.checks.declare import LOAD_GPU as LOAD_GPU
from gpugate.checks.declare import LOAD_HOST as LOAD_HOST
from gpugate.checks.declare import REBOOT as REBOOT
from gpugate.checks.declare import RESEAT as RESEAT
from gpugate.checks.declare import RESET as RESET
from gpugate.checks.declare import TRANSIENT as TRANSIENT
from gpugate.checks.declare import check as check

TYPE_CHECKING = False  # typing costs ~6 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any


def _load() -> None:
    from gpugate.checks import catalog  # noqa: F401 - importing registers the checks


def registered() -> dict[str, Callable[..., Any]]:
    """Every registered check, by id, in registration order (imports the catalog)."""
    _load()
    return dict(_REGISTRY)


def describe() -> dict[str, str]:
    """One line per check id: what it checks."""
    _load()
    return dict(_DOCS)


def hardware_checks() -> tuple[str, ...]:
    """The ids of the checks whose failure after a job is the node's own fault."""
    _load()
    return tuple(c for c in _REGISTRY if _HARDWARE[c])


def is_hardware(check_id: str | None) -> bool:
    """Whether `check_id` is a hardware check (False for an unknown or missing id)."""
    _load()
    return _HARDWARE.get(check_id or "", False)


def suggested_action(check_id: str | None) -> str:
    """What an admin does about a node drained by `check_id` (HOST for an unknown id)."""
    _load()
    return _ACTION.get(check_id or "", HOST)


def fault_class(check_id: str | None) -> str:
    """TRANSIENT or HARDWARE for `check_id`; HARDWARE for an unknown id (a person decides)."""
    _load()
    return _FAULT.get(check_id or "") or HARDWARE


def job_load(check_id: str | None) -> str | None:
    """LOAD_GPU or LOAD_HOST when a running job's load changes `check_id`'s finding, else None."""
    _load()
    return _LOAD.get(check_id or "")


def undeclared_faults() -> tuple[str, ...]:
    """The ids of registered checks whose `@check` line names no fault class."""
    _load()
    return tuple(c for c in _REGISTRY if _FAULT.get(c) is None)


def selects(patterns: Iterable[str], check_id: str) -> bool:
    """Whether `check_id` is named by `patterns`: each an id (`ib.rate`) or a family (`ib.*`,
    every id that starts `ib.`). Pure: the catalog is not loaded."""
    return any(
        p == check_id or (p.endswith(".*") and check_id.startswith(p[:-1])) for p in patterns
    )

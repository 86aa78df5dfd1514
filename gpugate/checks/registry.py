"""The check registry: `@check("gpu.ecc", hardware=True, action=RESET)` records a pure function
under a stable id, with what its failure means elsewhere.

Checks are imported from the explicit list in `catalog.py`, so a missing module is an
ImportError, never a silently skipped check. Duplicate ids are refused.

A check's metadata lives on its `@check` line: `hardware` (a failure after a job is the node's
own fault, so the epilog drains for it; the host's limits or mounts do not change while a job
runs), `action` (what an admin should do about a node drained for it, see `gpugate nodes`)
and `fault` (TRANSIENT: the fault heals by itself, `gpugate health` lifts its own drain once the
check passes again; HARDWARE: it needs a repair or a person, see gpugate/health/heal.py).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~6 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.checks.expect import Context
    from gpugate.checks.facts import Facts
    from gpugate.checks.findings import Finding

    CheckFn = Callable[[Facts, Context], list[Finding]]

# What an admin does about a node a check drained (the admin table's words and urgency).
REBOOT = "reboot"
RESET = "reset GPU"
RESEAT = "reseat/check cables"
COOLING = "check cooling/power"
HOST = "fix host setup"  # the default: limits, mounts, driver version, persistence, processes
ACTIONS = (REBOOT, RESET, RESEAT, COOLING, HOST)

# How a check's fault goes away: by itself, or only by a repair (or a person).
TRANSIENT = "transient"
HARDWARE = "hardware"
FAULTS = (TRANSIENT, HARDWARE)

_REGISTRY: dict[str, Callable] = {}
_DOCS: dict[str, str] = {}
_HARDWARE: dict[str, bool] = {}
_ACTION: dict[str, str] = {}
_FAULT: dict[str, str | None] = {}


def check(
    check_id: str, hardware: bool = False, action: str = HOST, fault: str | None = None
) -> Callable[[Callable], Callable]:
    """Register a check function under `check_id` (dotted, stable, unique) with its metadata."""
    if action not in ACTIONS:
        raise ValueError(f"check {check_id!r}: action {action!r} is not one of {ACTIONS}")
    # None is accepted here only so that the test naming every undeclared check can run.
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"check {check_id!r}: fault {fault!r} is not one of {FAULTS}")

    def register(fn: Callable) -> Callable:
        if check_id in _REGISTRY:
            raise ValueError(f"check id {check_id!r} registered twice")
        _REGISTRY[check_id] = fn
        _DOCS[check_id] = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        _HARDWARE[check_id] = hardware
        _ACTION[check_id] = action
        _FAULT[check_id] = fault
        fn.check_id = check_id
        return fn

    return register


def _load() -> None:
    from gpugate.checks import catalog  # noqa: F401 - importing registers the checks


def registered() -> dict[str, Callable]:
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


def undeclared_faults() -> tuple[str, ...]:
    """The ids of registered checks whose `@check` line names no fault class."""
    _load()
    return tuple(c for c in _REGISTRY if _FAULT.get(c) is None)

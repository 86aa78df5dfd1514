"""What a check module declares with: `@check("gpu.ecc", hardware=True, action=RESET)` and the
words of its metadata (see registry.py, which answers questions about the registered checks).

The check modules import this, never registry.py: the registry imports them (through the
catalog's explicit list), and a check module importing it back would make an import circle.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~6 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

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

# What a running job's own load changes, so that on a node shared by several jobs it is no
# fault (issue 41): the processes, heat and clocks of the GPUs a job holds (LOAD_GPU), or the
# host's memory (LOAD_HOST). gpugate/gate/shared.py sets such findings aside for other jobs.
LOAD_GPU = "gpu"
LOAD_HOST = "host"
LOADS = (LOAD_GPU, LOAD_HOST)

_REGISTRY: dict[str, Callable[..., Any]] = {}
_DOCS: dict[str, str] = {}
_HARDWARE: dict[str, bool] = {}
_ACTION: dict[str, str] = {}
_FAULT: dict[str, str | None] = {}
_LOAD: dict[str, str | None] = {}


def check(
    check_id: str,
    hardware: bool = False,
    action: str = HOST,
    fault: str | None = None,
    load: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a check function under `check_id` (dotted, stable, unique) with its metadata."""
    if load is not None and load not in LOADS:
        raise ValueError(f"check {check_id!r}: load {load!r} is not one of {LOADS}")
    if action not in ACTIONS:
        raise ValueError(f"check {check_id!r}: action {action!r} is not one of {ACTIONS}")
    # None is accepted here only so that the test naming every undeclared check can run.
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"check {check_id!r}: fault {fault!r} is not one of {FAULTS}")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if check_id in _REGISTRY:
            raise ValueError(f"check id {check_id!r} registered twice")
        _REGISTRY[check_id] = fn
        _DOCS[check_id] = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        _HARDWARE[check_id] = hardware
        _ACTION[check_id] = action
        _FAULT[check_id] = fault
        _LOAD[check_id] = load
        return fn

    return register

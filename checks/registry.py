"""The check registry: `@check("gpu.ecc")` records a pure function under a stable id.

Checks are imported from the explicit list in `catalog.py`, so a missing module is an
ImportError, never a silently skipped check. Duplicate ids are refused.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~6 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.checks.expect import Context
    from gpugate.checks.facts import Facts
    from gpugate.checks.findings import Finding

    CheckFn = Callable[[Facts, Context], list[Finding]]

_REGISTRY: dict[str, Callable] = {}
_DOCS: dict[str, str] = {}


def check(check_id: str) -> Callable[[Callable], Callable]:
    """Register a check function under `check_id` (dotted, stable, unique)."""

    def register(fn: Callable) -> Callable:
        if check_id in _REGISTRY:
            raise ValueError(f"check id {check_id!r} registered twice")
        _REGISTRY[check_id] = fn
        _DOCS[check_id] = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        fn.check_id = check_id
        return fn

    return register


def registered() -> dict[str, Callable]:
    """Every registered check, by id, in registration order (imports the catalog)."""
    from gpugate.checks import catalog  # noqa: F401 - importing registers the checks

    return dict(_REGISTRY)


def describe() -> dict[str, str]:
    """One line per check id: what it checks."""
    registered()
    return dict(_DOCS)

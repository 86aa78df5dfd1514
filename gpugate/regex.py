"""Regular expressions compiled on first use, not at import.

A healthy `gpugate check` imports modules holding about 56 module-level patterns and uses 11 of
them (the rest parse faults a healthy node does not have); compiling all of them at import cost
about 12 ms a run, more than the checklist itself (gpugate/startup.py). `lazy()` is
`re.compile` for module constants: the same pattern object, compiled when first used. Flags
go inline (`(?i)`, `(?s)`): a module that names `re.IGNORECASE` imports `re`, which alone
costs about 12 ms, and a healthy run needs no pattern at all (gpugate/startup.py).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import AnyStr


class _Lazy:
    """A stand-in for a compiled pattern: compiles on first use, then delegates."""

    def __init__(self, pattern: str | bytes, flags: int) -> None:
        self._args = (pattern, flags)

    def __getattr__(self, name: str) -> object:
        # Reached only for what this instance does not hold yet: compile once, then keep each
        # attribute asked for (`search`, `finditer`, ...), so a loop over a log's lines pays an
        # ordinary attribute lookup, not this call.
        if name.startswith("__"):
            raise AttributeError(name)
        state = self.__dict__
        compiled = state.get("_compiled")
        if compiled is None:
            import re  # late: importing re (with enum) costs ~12 ms (gpugate/startup.py)

            compiled = state["_compiled"] = re.compile(*self._args)
        value = getattr(compiled, name)
        state[name] = value
        return value

    def __repr__(self) -> str:
        return f"lazy({self._args[0]!r})"


def lazy(pattern: AnyStr, flags: int = 0) -> re.Pattern[AnyStr]:
    """`re.compile(pattern, flags)`, compiled when first used (module constants)."""
    # Typed as the Pattern it behaves as: every use goes through its methods and attributes
    # (never isinstance, never handed back to re.search(), which would want a real one).
    return _Lazy(pattern, flags)  # type: ignore[return-value]  # a proxy standing in for re.Pattern

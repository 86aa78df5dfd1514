"""Small immutable value objects, lighter to import than `dataclasses`.

The prolog runs before every job, so the import path matters: `dataclasses` pulls in `inspect`
(about 20 ms on the CI machines), which is more than the whole checklist costs. A `Record` takes
its fields from the class annotations (kept as strings by `from __future__ import annotations`)
and its defaults from class attributes.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar

    # typeshed's typing_extensions: the checker's own stubs, nothing installed or imported.
    from typing_extensions import dataclass_transform

    _R = TypeVar("_R", bound="Record")
else:  # PEP 681 is for the type checker alone: importing typing costs the prolog start-up

    def dataclass_transform(**_: object) -> object:
        """At run time a no-op decorator."""
        return lambda cls: cls


_MISSING = object()


# Type checkers check every subclass's construction like a frozen, keyword-only dataclass:
# `Expected(gpu_cuont=8)` or `board=3` for a string is an error before anything runs.
@dataclass_transform(kw_only_default=True, frozen_default=True, eq_default=True)
class Record:
    """Immutable record: `Gpu(index=0, name="H100")`, `rec.replace(...)`, `rec.to_dict()`."""

    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, object]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        own = [n for n in cls.__dict__.get("__annotations__", {}) if not n.startswith("_")]
        fields = list(cls._fields) + [n for n in own if n not in cls._fields]
        defaults = dict(cls._defaults)
        for name in own:
            if name in cls.__dict__:
                defaults[name] = cls.__dict__[name]
        cls._fields = tuple(fields)
        cls._defaults = defaults

    def __init__(self, **values: object) -> None:
        # One dict filled and stored at once (a run builds ~900 records: the config, the Xid
        # tables): a setattr call per field costs a hook's start-up about a millisecond.
        defaults = self._defaults
        state = {}
        for name in self._fields:
            if name in values:
                state[name] = values.pop(name)
            elif name in defaults:
                state[name] = defaults[name]
            else:
                raise TypeError(f"{type(self).__name__}: missing field {name!r}")
        if values:
            raise TypeError(f"{type(self).__name__}: unknown field(s) {', '.join(sorted(values))}")
        self.__dict__.update(state)  # not self.x = ...: a Record is immutable (__setattr__)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._fields)

    def __hash__(self) -> int:
        return hash(tuple(_hashable(getattr(self, f)) for f in self._fields))

    def __repr__(self) -> str:
        body = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({body})"

    def replace(self: _R, **changes: object) -> _R:
        """A copy with some fields changed."""
        values = {f: getattr(self, f) for f in self._fields}
        values.update(changes)
        return type(self)(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts and lists all the way down (for YAML and JSON)."""
        return {f: to_plain(getattr(self, f)) for f in self._fields}


def to_plain(value: object) -> object:
    """Turn records, tuples and dicts of them into plain JSON-able values."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def _hashable(value: object) -> object:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value

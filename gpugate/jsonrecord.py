"""Records that cross a process or outlive one: typed, validated when read, the JSON unchanged.

A `JsonRecord` is a `Record` whose fields are a file's keys (`summary.json`, a decision record,
a history line). `from_json(obj, where)` checks every present key against its field's annotation
and names what is wrong (`<where>: key 'xid': expected int | None, got str`); a field with no
default is required (every version gpugate wrote had it), one with a default may be missing (an
older release did not write it: it reads as its default). Keys no field names (a newer
release's, a drill's extra) are kept in `extra` and written back by `to_json`, so a reader that
rewrites a file loses nothing. `to_json()` is the JSON the writer writes: the fields in their
order, those in `_omit` left out while None (keys written only when known; `_omitted` may
decide otherwise), then `extra`.

The annotations are read as text (`from __future__ import annotations` keeps them so): the
vocabulary is `str`, `int`, `float`, `bool`, `None`, `Any`, `list[T]`, `dict[str, T]`, `X | Y`
and the name of another JsonRecord of the same module. No `typing` at run time: the prolog
writes a baseline and an event (gpugate/startup.py).

The docs' field tables are rendered from the classes (`field_table`): a field's description
is its entry in the class's `_doc`, and tests/unit/docs/test_interfaces_tables.py keeps
docs/interfaces.md equal to them.
"""

from __future__ import annotations

import sys

from gpugate.record import Record, to_plain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, TypeVar

    _J = TypeVar("_J", bound="JsonRecord")


class JsonRecord(Record):
    """A Record read from and written to JSON: `from_json` validates, `to_json` writes."""

    _doc: ClassVar[dict[str, str]] = {}  # field -> its description (docs/interfaces.md)
    _omit: ClassVar[frozenset[str]] = frozenset()  # left out of to_json while None
    _checks: ClassVar[dict[str, Callable[[object, str], object]] | None] = None
    _scope: ClassVar[dict[str, object]] = {}  # the defining module's names (__init_subclass__)

    extra: dict[str, Any] = {}  # keys of the file no field names: kept, written back

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # The names its annotations use, taken from the defining module now: looking the module
        # up in sys.modules at first read would find whatever stands there by then (a reload,
        # a test's stand-in), and a field naming a sibling record would no longer resolve.
        cls._scope = vars(sys.modules[cls.__module__])

    @classmethod
    def from_json(cls: type[_J], obj: object, where: str = "") -> _J:
        """The record of a parsed JSON object; ValueError naming `where` and the key."""
        name = where or cls.__name__
        if not isinstance(obj, dict):
            raise ValueError(f"{name}: not a JSON object ({type(obj).__name__})")
        checks = _compiled(cls)
        values: dict[str, Any] = {}
        extra: dict[str, object] = {}
        for key, value in obj.items():
            check = checks.get(key)
            if check is None:
                extra[str(key)] = value
                continue
            values[key] = check(value, f"{name}: key {key!r}")
        missing = [f for f in cls._fields if f not in values and f not in cls._defaults]
        if missing:
            raise ValueError(f"{name}: missing key {missing[0]!r}")
        if extra:
            values["extra"] = extra
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The JSON object the writer writes (plain values, the file's key order)."""
        omit = self._omitted()
        out = {f: _plain(getattr(self, f)) for f in self._fields if f != "extra" and f not in omit}
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    def _omitted(self) -> set[str] | frozenset[str]:
        """The fields to_json leaves out: those of `_omit` that are None (a subclass may
        decide otherwise, per record)."""
        return {f for f in self._omit if getattr(self, f) is None}


def _plain(value: object) -> object:
    """to_plain, with a nested JsonRecord written as its JSON (its omissions, its extra keys)."""
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return to_plain(value)


def _compiled(cls: type[JsonRecord]) -> dict[str, Callable[[object, str], object]]:
    checks = cls.__dict__.get("_checks")
    if checks is None:
        scope = cls._scope
        notes = _annotations(cls)
        checks = {f: _compile(str(notes[f]), scope) for f in cls._fields if f != "extra"}
        cls._checks = checks  # per class: set on the class itself, never read from a base
    return checks


def _annotations(cls: type[JsonRecord]) -> dict[str, str]:
    """Every field's annotation, as text, the subclass's last."""
    notes: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        notes.update(klass.__dict__.get("__annotations__", {}))
    return notes


def _split(text: str, sep: str) -> list[str]:
    """`text` split on `sep` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c == "["
        depth -= c == "]"
        if c == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def _compile(note: str, scope: dict[str, object]) -> Callable[[object, str], object]:
    """A checker for one annotation: returns the value (a nested record built), or raises."""
    options = _split(note, "|")
    if len(options) > 1:
        return _union(note, [_compile(o, scope) for o in options])
    if note.startswith("list[") and note.endswith("]"):
        return _list(note, _compile(note[5:-1], scope))
    if note.startswith("dict[") and note.endswith("]"):
        _, value = _split(note[5:-1], ",")
        return _dict(note, _compile(value, scope))
    if note in _SCALARS:
        return _scalar(note, _SCALARS[note])
    target = scope.get(note)
    if isinstance(target, type) and issubclass(target, JsonRecord):
        record = target
        return lambda value, where: record.from_json(value, where)
    raise TypeError(f"jsonrecord: cannot read the annotation {note!r}")


def _is(kind: str, value: object) -> bool:
    if kind == "Any":
        return True
    if kind == "None":
        return value is None
    if kind in ("int", "float") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[kind])


_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str, "int": int, "float": (int, float), "bool": bool, "object": object,
}  # fmt: skip
_SCALARS = {"str": "str", "int": "int", "float": "float", "bool": "bool", "None": "None",
            "Any": "Any", "object": "Any"}  # fmt: skip


def _scalar(note: str, kind: str) -> Callable[[object, str], object]:
    def check(value: object, where: str) -> object:
        if not _is(kind, value):
            raise ValueError(f"{where}: expected {note}, got {_kind(value)}")
        return value

    return check


def _union(
    note: str, options: list[Callable[[object, str], object]]
) -> Callable[[object, str], object]:
    def check(value: object, where: str) -> object:
        for option in options:
            try:
                return option(value, where)
            except ValueError:
                continue
        raise ValueError(f"{where}: expected {note}, got {_kind(value)}")

    return check


def _list(note: str, item: Callable[[object, str], object]) -> Callable[[object, str], object]:
    def check(value: object, where: str) -> object:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected {note}, got {_kind(value)}")
        return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]

    return check


def _dict(note: str, item: Callable[[object, str], object]) -> Callable[[object, str], object]:
    def check(value: object, where: str) -> object:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ValueError(f"{where}: expected {note}, got {_kind(value)}")
        return {k: item(v, f"{where}[{k!r}]") for k, v in value.items()}

    return check


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


# ------------------------------------------------------------------------------ the docs


def field_table(cls: type[JsonRecord]) -> str:
    """The Markdown table of a record's keys: key, type, since when optional, description."""
    notes = _annotations(cls)
    rows = ["| key | type | required | what |", "|---|---|---|---|"]
    for f in cls._fields:
        if f == "extra":
            continue
        kind = str(notes[f]).replace("|", "or").replace("  ", " ")
        required = "yes" if f not in cls._defaults else "no"
        rows.append(f"| `{f}` | `{kind}` | {required} | {cls._doc.get(f, '')} |")
    return "\n".join(rows) + "\n"

"""gpugate.jsonrecord: records read from JSON are checked key by key; written back unchanged."""

from __future__ import annotations

import pytest

from gpugate.jsonrecord import JsonRecord, field_table


class Inner(JsonRecord):
    """A nested record."""

    name: str
    size: int | None = None


class Outer(JsonRecord):
    """A record with every kind of annotation the vocabulary has."""

    id: str
    count: int = 0
    ratio: float | None = None
    flag: bool = False
    tags: list[str] = []
    sizes: dict[str, int] = {}
    inner: Inner | None = None
    many: list[Inner] = []
    anything: object = None
    later: str | None = None

    _omit = frozenset({"later"})
    _doc = {"id": "its id"}


def test_every_key_is_checked_and_named():
    good = {"id": "a", "count": 2, "ratio": 1, "flag": True, "tags": ["x"], "sizes": {"a": 1},
            "inner": {"name": "n"}, "many": [{"name": "m", "size": 3}], "anything": [1]}  # fmt: skip
    rec = Outer.from_json(good, "f.json")
    assert rec.inner == Inner(name="n") and rec.many[0].size == 3 and rec.ratio == 1
    for key, bad in (("count", True), ("count", "2"), ("flag", 1), ("tags", ["x", 1]),
                     ("sizes", {"a": "1"}), ("ratio", "1.0"), ("id", None)):  # fmt: skip
        with pytest.raises(ValueError, match=f"f.json: key '{key}'"):
            Outer.from_json(dict(good, **{key: bad}), "f.json")
    with pytest.raises(ValueError, match=r"f.json: key 'many'\[0\]: key 'name': expected str"):
        Outer.from_json(dict(good, many=[{"name": 5}]), "f.json")
    with pytest.raises(ValueError, match=r"f\.json: missing key 'id'"):
        Outer.from_json({"count": 1}, "f.json")
    with pytest.raises(ValueError, match=r"f\.json: not a JSON object"):
        Outer.from_json([], "f.json")


def test_unknown_keys_are_kept_and_written_back_and_absent_ones_omitted_while_none():
    rec = Outer.from_json({"id": "a", "newer": {"x": 1}})
    assert rec.extra == {"newer": {"x": 1}}
    out = rec.to_json()
    assert "later" not in out and out["newer"] == {"x": 1} and list(out)[-1] == "newer"
    assert rec.replace(later="z").to_json()["later"] == "z"
    assert Outer.from_json(out) == rec


def test_the_table_lists_each_key_its_type_and_whether_required():
    table = field_table(Outer)
    assert "| `id` | `str` | yes | its id |" in table
    assert "| `inner` | `Inner or None` | no |  |" in table and "extra" not in table


def test_a_nested_record_resolves_in_its_own_module_after_the_module_is_swapped(monkeypatch):
    """A field naming a sibling record is read through the module that defined it, even when
    sys.modules holds a stand-in by the first read (a test's fake store; CI found this)."""
    import sys
    import types

    module = types.ModuleType("gpugate_test_swapped")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    source = (
        "from __future__ import annotations\n"
        "from gpugate.jsonrecord import JsonRecord\n"
        "class Outer(JsonRecord):\n"
        "    inner: list[Inner]\n"
        "class Inner(JsonRecord):\n"
        "    n: int\n"
    )
    exec(compile(source, module.__name__, "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, types.ModuleType(module.__name__))
    outer = module.Outer.from_json({"inner": [{"n": 3}]})
    assert outer.inner[0].n == 3
    with pytest.raises(ValueError, match="key 'n'"):
        module.Outer.from_json({"inner": [{"n": "3"}]})

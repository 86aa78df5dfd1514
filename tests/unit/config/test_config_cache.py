"""The built-Config cache (gpugate/config/built.py): served only for the very inputs it was built
from, equal to a fresh build down to each value's type; anything else builds (and validates)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpugate import config as cfg
from gpugate.config import ConfigError, built, load_config
from gpugate.record import Record

SITE = """\
policy:
  unknown: fail
checks:
  disabled: [ib.rate]
  kernel:
    xid_actions: {79: drain, 31: ignore}
budget:
  hardware_share: 0.25
health:
  heal_after_passes: 3
"""
CLASSES = """\
classes:
  - nodes: "gpu[01-02]"
    health:
      heal_after_passes: 5
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("GPUGATE_CACHE_DIR", str(directory))
    return directory


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per Config built (validated) from the files rather than fetched."""
    seen: list[str] = []
    real = cfg.build

    def counting(cls: type[Record], data: object, source: str, prefix: str) -> Record:
        if not prefix:
            seen.append(source)
        return real(cls, data, source, prefix)

    monkeypatch.setattr(cfg, "build", counting)
    return seen


def same(a: object, b: object, path: str = "config") -> None:
    """Equal, and of the same type at every level (1 is not 1.0 nor True)."""
    assert type(a) is type(b), (path, a, b)
    if isinstance(a, Record):
        assert isinstance(b, Record)
        for f in a._fields:
            same(getattr(a, f), getattr(b, f), f"{path}.{f}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    else:
        assert a == b, path


@pytest.mark.parametrize("text", [None, SITE])
def test_a_second_load_is_fetched_and_equal_to_a_build(cache, builds, tmp_path, text):
    path = os.devnull
    if text is not None:
        path = str(tmp_path / "gpugate.yaml")
        Path(path).write_text(text)
    first = load_config(path)
    second = load_config(path)
    assert len(builds) == 1  # the second came from the cache
    same(first, second)
    assert second == first and repr(second) == repr(first)
    if text is not None:
        assert second.checks.kernel.xid_actions == {"79": "drain", "31": "ignore"}
        assert second.budget.hardware_share == 0.25 and second.checks.disabled == ["ib.rate"]
    with pytest.raises(AttributeError):
        second.policy = None  # still immutable


def test_a_rewritten_site_file_is_built_again(cache, builds, tmp_path):
    site = tmp_path / "gpugate.yaml"
    site.write_text("health:\n  heal_after_passes: 3\n")
    assert load_config(str(site)).health.heal_after_passes == 3
    stat = site.stat()
    site.write_text("health:\n  heal_after_passes: 4\n")  # same size
    os.utime(site, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime
    assert load_config(str(site)).health.heal_after_passes == 4
    assert len(builds) == 2


def test_an_invalid_file_is_refused_even_after_a_valid_one(cache, builds, tmp_path):
    site = tmp_path / "gpugate.yaml"
    site.write_text("health:\n  heal_after_passes: 3\n")
    load_config(str(site))
    site.write_text("health:\n  heal_after_passes: 3.0\n")  # equal in Python, not an int
    with pytest.raises(ConfigError, match="heal_after_passes: expected int"):
        load_config(str(site))


def test_node_classes_are_fetched_per_node(cache, builds, tmp_path, monkeypatch):
    site = tmp_path / "gpugate.yaml"
    site.write_text(CLASSES)
    seen = {}
    for node in ("gpu01", "gpu09", "gpu01", "gpu09"):
        monkeypatch.setenv("SLURMD_NODENAME", node)
        seen.setdefault(node, set()).add(load_config(str(site)).health.heal_after_passes)
    assert seen == {"gpu01": {5}, "gpu09": {3}}  # 3: the packaged default
    assert len(builds) == 2  # each node's config built once


def test_a_corrupt_entry_or_no_cache_means_a_build(cache, builds, tmp_path, monkeypatch):
    first = load_config(os.devnull)
    (entry,) = [p for p in cache.iterdir() if "-config-" in p.name]
    entry.write_bytes(b"\xff not marshal")
    same(load_config(os.devnull), first)
    assert len(builds) == 2
    monkeypatch.setenv("GPUGATE_CACHE_DIR", "")
    same(load_config(os.devnull), first)
    assert len(builds) == 3


def test_an_entry_that_is_not_a_config_is_not_served(cache, builds, monkeypatch):
    load_config(os.devnull)
    real = built._decode
    monkeypatch.setattr(built, "_decode", lambda value: real(value).health)  # a record
    load_config(os.devnull)
    monkeypatch.setattr(built, "_decode", lambda value: real(("R", "Nope", {})))
    load_config(os.devnull)
    assert len(builds) == 3


def test_what_marshal_cannot_hold_is_not_cached():
    with pytest.raises(ValueError):
        built._encode(("a tuple", "would read back as a record"))


def test_changed_validating_code_is_a_miss(cache, builds, tmp_path, monkeypatch):
    """An upgrade or an edit of the loader, the schema or a check module (the check ids a site
    file may name) builds again: the code's files are part of what the entry is found by."""
    module = tmp_path / "gpu.py"
    module.write_text("# a check module\n")
    code = built._code()
    assert any(p.endswith(os.path.join("checks", "gpu.py")) for p in code)
    monkeypatch.setattr(built, "_code", lambda: [*code, str(module)])
    load_config(os.devnull)
    load_config(os.devnull)
    module.write_text("# a check module, its ids edited\n")
    load_config(os.devnull)
    assert len(builds) == 2

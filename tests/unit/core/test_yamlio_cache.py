"""The parsed-YAML cache (gpugate/yamlio.py): used only when it is the truth, else YAML is parsed.

Every case counts how often PyYAML was asked to parse: a hit parses nothing, anything doubtful
parses the file again (and returns what the file says now).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpugate import yamlio


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("GPUGATE_CACHE_DIR", str(directory))
    return directory


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files PyYAML parsed during the test."""
    seen: list[str] = []
    real = yamlio.parse_yaml

    def counting(text: str, name: str = "<string>") -> object:
        seen.append(name)
        return real(text, name)

    monkeypatch.setattr(yamlio, "parse_yaml", counting)
    return seen


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith(".tmp-"))


def test_a_second_load_comes_from_the_cache(tmp_path, cache, parses):
    f = tmp_path / "a.yaml"
    f.write_text("checks:\n  kernel:\n    xid_actions: {79: drain}\n")
    first = yamlio.load_yaml(str(f))
    assert yamlio.load_yaml(str(f)) == first
    assert parses == [str(f)]
    (entry,) = entries(cache)
    assert entry.stat().st_mode & 0o777 == 0o600
    # marshal keeps YAML's integer keys (JSON, the cache before, turned them into strings)
    assert yamlio.load_yaml(str(f))["checks"]["kernel"]["xid_actions"] == {79: "drain"}


def test_a_rewritten_file_is_parsed_again(tmp_path, cache, parses):
    f = tmp_path / "a.yaml"
    f.write_text("a: 1\n")
    assert yamlio.load_yaml(str(f)) == {"a": 1}
    f.write_text("a: 22\n")
    assert yamlio.load_yaml(str(f)) == {"a": 22}
    assert len(parses) == 2


def test_a_same_size_rewrite_that_keeps_the_times_is_never_served_stale(tmp_path, cache, parses):
    """The stat key cannot see it (one clock tick, mtime restored, same inode): the CRC does."""
    f = tmp_path / "a.yaml"
    f.write_text("a: 1\n")
    st = f.stat()
    assert yamlio.load_yaml(str(f)) == {"a": 1}
    key = yamlio._cache_key(st)
    f.write_text("a: 2\n")  # in place: same inode and size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    # Make the key the file now has point at the old entry (what a tick-equal ctime would do).
    old = cache / key
    new = cache / yamlio._cache_key(f.stat())
    if new != old:
        old.rename(new)
    assert yamlio.load_yaml(str(f)) == {"a": 2}
    assert len(parses) == 2


@pytest.mark.parametrize(
    "damage",
    [b"", b"\x00garbage", b"\xe9not marshal at all" * 10],
    ids=["empty", "garbage", "not-marshal"],
)
def test_a_corrupt_entry_falls_back_to_yaml(tmp_path, cache, parses, damage):
    f = tmp_path / "a.yaml"
    f.write_text("a: [1, 2]\n")
    yamlio.load_yaml(str(f))
    (entry,) = entries(cache)
    entry.write_bytes(damage)
    assert yamlio.load_yaml(str(f)) == {"a": [1, 2]}
    assert len(parses) == 2


def test_a_truncated_entry_falls_back_to_yaml(tmp_path, cache, parses):
    f = tmp_path / "a.yaml"
    f.write_text("a: " + "x" * 500 + "\n")
    yamlio.load_yaml(str(f))
    (entry,) = entries(cache)
    entry.write_bytes(entry.read_bytes()[:-100])
    assert yamlio.load_yaml(str(f)) == {"a": "x" * 500}
    assert len(parses) == 2


def test_another_files_entry_is_not_used(tmp_path, cache, parses):
    """An entry renamed to another file's key (or a key collision) fails the length/CRC check."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("who: a\n")
    yamlio.load_yaml(str(a))
    (entry,) = entries(cache)
    b.write_text("who: b\n")
    entry.rename(cache / yamlio._cache_key(b.stat()))
    assert yamlio.load_yaml(str(b)) == {"who": "b"}


def test_an_entry_others_could_write_is_not_trusted(tmp_path, cache, parses):
    f = tmp_path / "a.yaml"
    f.write_text("a: 1\n")
    yamlio.load_yaml(str(f))
    (entry,) = entries(cache)
    entry.chmod(0o622)
    assert yamlio.load_yaml(str(f)) == {"a": 1}
    cache.chmod(0o777)  # and a directory anybody may write into is neither read nor written
    entry.chmod(0o600)
    assert yamlio.load_yaml(str(f)) == {"a": 1}
    assert len(parses) == 3


def test_a_symlinked_cache_directory_or_entry_is_never_followed(tmp_path, monkeypatch, parses):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("GPUGATE_CACHE_DIR", str(link))
    f = tmp_path / "a.yaml"
    f.write_text("a: 1\n")
    assert yamlio.load_yaml(str(f)) == {"a": 1}
    assert list(real.iterdir()) == []  # not written through the link
    monkeypatch.setenv("GPUGATE_CACHE_DIR", str(real))
    yamlio.load_yaml(str(f))
    (entry,) = entries(real)
    target = tmp_path / "elsewhere"
    entry.rename(target)
    entry.symlink_to(target)  # an entry that is a symlink: refused, parsed again
    assert yamlio.load_yaml(str(f)) == {"a": 1}
    assert len(parses) == 3


def test_an_unmarshallable_parse_is_returned_but_not_cached(tmp_path, cache, parses):
    f = tmp_path / "a.yaml"
    f.write_text("when: 2026-12-03\n")  # a date: marshal cannot hold it
    assert str(yamlio.load_yaml(str(f))["when"]) == "2026-12-03"
    assert not cache.exists() or entries(cache) == []


def test_no_cache_dir_means_no_cache(tmp_path, monkeypatch, parses):
    monkeypatch.setenv("GPUGATE_CACHE_DIR", "")
    f = tmp_path / "a.yaml"
    f.write_text("a: 1\n")
    yamlio.load_yaml(str(f))
    yamlio.load_yaml(str(f))
    assert len(parses) == 2


def test_an_unwritable_cache_still_loads(tmp_path, monkeypatch, parses):
    monkeypatch.setenv("GPUGATE_CACHE_DIR", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a directory")
    f = tmp_path / "a.yaml"
    f.write_text("a: 1\n")
    assert yamlio.load_yaml(str(f)) == {"a": 1}

"""The shared primitives: UTC time (gpugate.clock), JSON lines (gpugate.jsonl), atomic write,
fresh names and the lock (gpugate.fsutil)."""

from __future__ import annotations

import calendar
import os
import threading
import time
from pathlib import Path

import pytest

from gpugate import clock, fsutil, jsonl


@pytest.mark.parametrize("when", [0, 1, 951782400, 1796000000.75, 253402300799])
def test_utc_is_the_one_format_and_parse_reads_it_back(when):
    text = clock.utc(when)
    assert text == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    assert clock.parse_utc(text) == calendar.timegm(time.gmtime(when))


def test_utc_with_microseconds():
    assert clock.utc(1_800_000_100.25, micro=True) == "2027-01-15T08:01:40.250000Z"
    assert clock.parse_utc("2027-01-15T08:01:40.250000Z") == 1_800_000_100.25


@pytest.mark.parametrize(
    "text", ["", None, "2026-02-30T00:00:00Z", "2026-11-29T24:00:00Z", "2026-11-29 10:00:00",
             "2026-11-29T10:00:00", "x2026-11-29T10:00:00Z", "0000-01-01T00:00:00Z"],
)  # fmt: skip
def test_parse_utc_refuses_what_is_not_a_time(text):
    assert clock.parse_utc(text) is None


def test_civil_days_agrees_with_the_calendar():
    for year in (1, 1900, 1970, 2000, 2024, 2100, 9999):
        for month, day in ((1, 1), (2, 28), (3, 1), (12, 31)):
            expected = calendar.timegm((year, month, day, 0, 0, 0)) // 86400
            assert clock.civil_days(year, month, day) == expected
    assert clock.civil_days(2024, 2, 29) is not None and clock.civil_days(2100, 2, 29) is None


def test_append_is_one_line_per_entry_and_reads_back(tmp_path):
    path = str(tmp_path / "x.jsonl")
    size = jsonl.append(path, [{"a": 1}, {"b": object.__name__}])
    assert size == os.path.getsize(path)
    assert Path(path).read_text() == '{"a":1}\n{"b":"object"}\n'
    assert os.stat(path).st_mode & 0o777 == fsutil.PRIVATE_FILE
    entries, skipped, _ = jsonl.load(path, lambda e: isinstance(e, dict))
    assert entries == [{"a": 1}, {"b": "object"}] and skipped == 0


def test_append_never_follows_a_symlink(tmp_path):
    target = tmp_path / "target"
    target.write_text("root's\n")
    os.symlink(target, tmp_path / "link")
    with pytest.raises(OSError):
        jsonl.append(str(tmp_path / "link"), [{"a": 1}])
    assert target.read_text() == "root's\n"


def test_parse_marks_torn_foreign_and_long_lines():
    data = b'{"a":1}\n\n{torn\n1,2\n[1]\n"' + b"x" * 100 + b'"\n{"b":2}\n'
    values = jsonl.parse(data, max_line=50)
    assert values == [{"a": 1}, jsonl.NOT_JSON, jsonl.NOT_JSON, [1], jsonl.NOT_JSON, {"b": 2}]


def test_read_tail_reads_only_the_newest_whole_lines(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"".join(b'{"n":%d}\n' % i for i in range(1000)))
    data, size = jsonl.read_tail(str(path), max_bytes=100)
    assert size == path.stat().st_size and len(data) <= 100
    assert jsonl.parse(data)[-1] == {"n": 999} and data.startswith(b'{"n":')
    with pytest.raises(FileNotFoundError):
        jsonl.read_tail(str(tmp_path / "missing"))


def test_atomic_write_leaves_no_temporary_file_and_sets_the_mode(tmp_path):
    path = str(tmp_path / "f")
    fsutil.atomic_write(path, "one", mode=0o640)
    fsutil.atomic_write(path, b"two", mode=0o600)
    assert Path(path).read_text() == "two" and os.stat(path).st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path) == ["f"]


def test_atomic_write_cleans_up_after_a_failure(tmp_path, monkeypatch):
    def broken(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError):
        fsutil.atomic_write(str(tmp_path / "f"), "x")
    assert os.listdir(tmp_path) == []


def test_fresh_names_are_new_and_never_reused(tmp_path, monkeypatch):
    first = fsutil.fresh_dir(str(tmp_path), ".b.")
    assert os.path.isdir(first) and os.stat(first).st_mode & 0o777 == 0o700
    # Someone else took the first names drawn: the next free one is used.
    names = iter([b"\0" * 6, b"\0" * 6, b"\1" * 6])
    monkeypatch.setattr(os, "urandom", lambda n: next(names))
    taken = fsutil.fresh_dir(str(tmp_path), ".c.")
    assert fsutil.fresh_dir(str(tmp_path), ".c.") != taken


def test_the_lock_is_exclusive_and_a_bounded_wait_gives_up(tmp_path):
    path = fsutil.lock_file(str(tmp_path), "x.lock")
    with fsutil.FileLock(path, wait_s=0) as held:
        assert held.held
        with fsutil.FileLock(path, wait_s=0.1) as other:  # another open file description
            assert not other.held
    with fsutil.FileLock(path, wait_s=0.1) as again:
        assert again.held
    with fsutil.FileLock(None, wait_s=0) as none:
        assert not none.held


@pytest.mark.parametrize("wait", [None, -1, float("inf"), float("nan")])
def test_a_lock_always_has_a_bounded_wait(tmp_path, wait):
    with pytest.raises(TypeError):
        fsutil.FileLock(str(tmp_path / "x.lock"))  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="wait_s"):
        fsutil.FileLock(str(tmp_path / "x.lock"), wait_s=wait)


def test_lock_files_are_0600_in_a_0700_directory_of_our_own(tmp_path):
    path = fsutil.lock_file(str(tmp_path / "state"), "x.lock")
    assert path == str(tmp_path / "state" / "locks" / "x.lock")
    with fsutil.FileLock(path, wait_s=0):
        pass
    assert os.stat(path).st_mode & 0o777 == 0o600
    st = os.stat(os.path.dirname(path))
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.geteuid()


def test_a_lock_where_others_could_open_it_is_refused(tmp_path):
    """flock works on a read-only descriptor: a lock file others can open, they can hold."""
    shared = tmp_path / "textfile"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    refused = pytest.raises(PermissionError, match="not a private lock directory")
    with refused, fsutil.FileLock(str(shared / "x.lock"), wait_s=0):
        pass
    assert not (shared / "x.lock").exists()
    if os.geteuid() == 0:  # a directory of another user's, even 0700, is theirs to lock in
        theirs = tmp_path / "other" / fsutil.LOCK_DIR
        theirs.mkdir(mode=0o700, parents=True)
        os.chown(theirs, 12345, 12345)
        with pytest.raises(PermissionError, match="not a private lock directory"):
            fsutil.lock_file(str(tmp_path / "other"), "x.lock")
        refused = pytest.raises(PermissionError, match="not a private lock directory")
        with refused, fsutil.FileLock(str(theirs / "x.lock"), wait_s=0):
            pass


@pytest.mark.skipif(os.geteuid() != 0, reason="root gives directories away")
def test_root_locks_in_the_lock_directory_of_the_datas_owner(tmp_path):
    """A history directory of the SlurmUser's (EpilogSlurmctld writes there) is written by
    root's admin commands too: its 0700 lock directory is the data's owner's, not a user's."""
    data = tmp_path / "history"
    data.mkdir()
    (data / fsutil.LOCK_DIR).mkdir(mode=0o700)
    for d in (data, data / fsutil.LOCK_DIR):
        os.chown(d, 12345, 12345)
    path = fsutil.lock_file(str(data), "x.lock")
    with fsutil.FileLock(path, wait_s=0) as lock:
        assert lock.held
    st = os.stat(path)
    assert (st.st_uid, st.st_mode & 0o777) == (12345, 0o600)  # the owner can take it next
    os.chmod(data / fsutil.LOCK_DIR, 0o755)  # but never one others can enter
    with pytest.raises(PermissionError, match="not a private lock directory"):
        fsutil.lock_file(str(data), "x.lock")


def test_the_lock_serialises_read_modify_write(tmp_path):
    path = tmp_path / "n"
    path.write_text("0")
    lock = fsutil.lock_file(str(tmp_path), "n.lock")

    def bump() -> None:
        for _ in range(50):
            with fsutil.FileLock(lock, wait_s=60) as held:
                assert held.held
                path.write_text(str(int(path.read_text()) + 1))

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert path.read_text() == "200"

"""Drain history and resume audit log: entries, bounds, the repeat window, torn lines, and
several processes writing at once (the flock)."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from gpugate.config import load_config
from gpugate.store import history as H

DAY = 86400.0
T0 = 1_790_000_000.0


def test_record_drain_writes_one_entry_with_the_check_from_the_reason(tmp_path):
    entry = H.record_drain(
        str(tmp_path), "gpu-01", "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100",
        category="ecc_error", when=T0, job="4242", hook="prolog",
    )  # fmt: skip
    assert entry.check == "gpu.ecc"
    assert entry.at == "2026-09-21T14:13:20Z"
    [stored] = H.drains(str(tmp_path))
    assert stored == entry
    assert stored.job == "4242" and stored.hook == "prolog"
    line = (tmp_path / H.DRAINS).read_text()
    assert line.count("\n") == 1 and json.loads(line)["node"] == "gpu-01"


def test_reason_helpers():
    assert H.reason_check("gpugate: kernel.xid: GPU1 Xid 79") == "kernel.xid"
    assert H.reason_check("gpugate: gpu.lost") == "gpu.lost"
    assert H.reason_check("IT-4461 swap PSU") is None
    assert H.reason_check(None) is None
    reason = "gpugate: gpu.ecc: evidence 4242/gpu-01-r1: GPU3 volatile uncorrected ECC 2 > 0"
    assert H.reason_bundle(reason) == "4242/gpu-01-r1"
    assert H.reason_bundle("gpugate: gpu.ecc: GPU3 volatile") is None


def test_a_repeat_of_the_same_drain_within_minutes_is_one_event(tmp_path):
    d = str(tmp_path)
    assert H.record_drain(d, "n1", "gpugate: gpu.ecc: x", when=T0)
    assert H.record_drain(d, "n1", "gpugate: gpu.ecc: x", when=T0 + 60) is None
    assert H.record_drain(d, "n1", "gpugate: pcie.link: x8", when=T0 + 60)  # another check
    assert H.record_drain(d, "n1", "gpugate: gpu.ecc: x", when=T0 + DAY)  # a day later
    assert H.record_drain(d, "n2", "gpugate: gpu.ecc: x", when=T0 + 1)  # another node
    assert [(e.node, e.check) for e in H.drains(d)] == [
        ("n1", "gpu.ecc"), ("n1", "pcie.link"), ("n1", "gpu.ecc"), ("n2", "gpu.ecc"),
    ]  # fmt: skip


def test_history_is_bounded_per_node_and_in_all(tmp_path):
    d = str(tmp_path)
    for i in range(8):
        H.record_drain(d, "busy", f"gpugate: gpu.ecc: {i}", when=T0 + i * DAY, max_per_node=5)
    kept = H.drains(d, "busy")
    assert [e.reason for e in kept] == [f"gpugate: gpu.ecc: {i}" for i in range(3, 8)]
    for i in range(6):
        H.record_drain(d, f"n{i}", "gpugate: ib.ports: down", when=T0 + 10 * DAY + i,
                       max_per_node=5, max_entries=4)  # fmt: skip
    everything = H.drains(d)
    assert [e.node for e in everything] == ["n2", "n3", "n4", "n5"]  # the newest 4


def test_drains_filters_by_node_and_time_and_counts_the_window(tmp_path):
    d = str(tmp_path)
    now = T0 + 40 * DAY
    for days_ago, check in ((35, "gpu.ecc"), (20, "gpu.ecc"), (10, "pcie.link"), (1, "gpu.ecc")):
        H.record_drain(d, "n1", f"gpugate: {check}: x", when=now - days_ago * DAY)
    H.record_drain(d, "n2", "gpugate: gpu.ecc: x", when=now - DAY)
    assert len(H.drains(d, "n1")) == 4
    assert len(H.drains(d, "n1", since=now - 15 * DAY)) == 2
    assert H.count_drains(d, "n1", 30, now=now) == 3
    assert H.count_drains(d, "n1", 30, now=now, check="gpu.ecc") == 2
    assert H.count_drains(d, "n3", 30, now=now) == 0
    assert H.count_drains(str(tmp_path / "missing"), "n1", 30) == 0


def test_torn_and_foreign_lines_are_skipped(tmp_path):
    d = str(tmp_path)
    H.record_drain(d, "n1", "gpugate: gpu.ecc: x", when=T0)
    with open(tmp_path / H.DRAINS, "a") as fh:
        fh.write('{"node": "n2", "when": 1}\n[1, 2]\n{"no node": 1}\n{"node": "n3", "wh')
    assert [e.node for e in H.drains(d)] == ["n1", "n2"]
    H.record_drain(d, "n4", "gpugate: gpu.ecc: x", when=T0 + 1)  # rewriting drops the junk
    assert [e.node for e in H.drains(d)] == ["n1", "n2", "n4"]


def test_record_resume_appends_to_the_audit_log(tmp_path, monkeypatch):
    d = str(tmp_path)
    monkeypatch.setenv("SUDO_USER", "alice")
    first = H.record_resume(d, "n1", why="GPU3 replaced", result={"status": "ok"}, when=T0,
                            reason="gpugate: gpu.ecc: x")  # fmt: skip
    H.record_resume(d, "n1", who="bob", why="admin drain done", result="fail", forced=True,
                    when=T0 + 5)  # fmt: skip
    assert first.who == "alice" and first.forced is False
    lines = (tmp_path / H.AUDIT).read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1]) == {
        "node": "n1", "when": T0 + 5, "at": "2026-09-21T14:13:25Z", "who": "bob",
        "why": "admin drain done", "result": "fail", "forced": True, "resumed": True,
        "reason": None,
    }  # fmt: skip
    assert [r.who for r in H.resumes(d, "n1", since=T0 + 1)] == ["bob"]
    # The audit log is never trimmed by the history's bounds.
    for i in range(10):
        H.record_drain(d, "n1", f"gpugate: c{i}: x", when=T0 + i, max_per_node=1)
    assert len(H.resumes(d)) == 2


def _writer(directory: str, worker: int, count: int) -> None:
    for i in range(count):
        H.record_drain(directory, f"w{worker}-n{i}", f"gpugate: gpu.ecc: {worker}/{i}",
                       when=T0 + i, max_per_node=100, max_entries=100000)  # fmt: skip
        H.record_resume(directory, f"w{worker}-n{i}", who="t", why=str(i))


def test_concurrent_writers_lose_nothing(tmp_path):
    d, workers, count = str(tmp_path), 6, 25
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(d, w, count)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = H.drains(d)
    assert len(got) == workers * count
    assert len({e.node for e in got}) == workers * count
    assert len(H.resumes(d)) == workers * count
    assert not [n for n in os.listdir(d) if n.startswith(".tmp-")]  # no temporary file left


def test_note_drain_uses_the_config_and_never_raises(tmp_path):
    cfg_file = tmp_path / "site.yaml"
    cfg_file.write_text(
        f"state_dir: {tmp_path / 'state'}\nadmin:\n  history_dir: {tmp_path / 'shared'}\n"
        "  history_max_per_node: 2\n"
    )
    config = load_config(str(cfg_file))
    assert H.history_dir(config) == str(tmp_path / "shared")
    for i in range(3):
        H.note_drain(config, "n1", f"gpugate: c{i}: x", when=T0 + i)
    assert len(H.drains(str(tmp_path / "shared"))) == 2
    (tmp_path / "blocked").write_text("a file, not a directory")
    broken = config.replace(admin=config.admin.replace(history_dir=str(tmp_path / "blocked")))
    assert H.note_drain(broken, "n1", "gpugate: gpu.ecc: x") is None  # logged, not raised


@pytest.mark.parametrize("when", [None, T0])
def test_iso(when):
    text = H.iso(when)
    assert text == ("" if when is None else "2026-09-21T14:13:20Z")


def test_a_drain_after_a_resume_is_a_new_event(tmp_path):
    d = str(tmp_path)
    now = time.time()
    assert H.record_drain(d, "n1", "gpugate: gpu.ecc: x", when=now - 100)
    assert H.record_drain(d, "n1", "gpugate: gpu.ecc: x", when=now - 50) is None
    H.record_resume(d, "n1", who="bob", why="reset GPU3", when=now - 40)
    assert H.record_drain(d, "n1", "gpugate: gpu.ecc: x", when=now)  # it came back: counted
    assert H.count_drains(d, "n1", 1, now=now) == 2

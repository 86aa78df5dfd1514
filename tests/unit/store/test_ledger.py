"""The repair ledger (gpugate/store/ledger.py): one line per step, read back untrusted."""

from __future__ import annotations

import json

import pytest

from gpugate.store import ledger as L

T0 = 1_790_000_000.0


def test_a_step_is_one_line_read_back_with_every_field(tmp_path):
    entry = L.record(str(tmp_path), "gpu-01", L.REBOOT, who="gpugate health",
                     why="GPU3 Xid 79: fallen off the bus", outcome="requested",
                     evidence="4242/gpu-01-r0", check="kernel.xid", gpu="1650924060795",
                     reason="gpugate: kernel.xid: GPU3 Xid 79", when=T0)  # fmt: skip
    [read] = L.entries(str(tmp_path), "gpu-01")
    assert read == entry and read.at == "2026-09-21T14:13:20Z"
    assert L.entries(str(tmp_path), "gpu-02") == []
    assert L.entries(str(tmp_path), since=T0 + 1) == []


def test_lines_are_appended_in_order_and_last_finds_a_step(tmp_path):
    for i, step in enumerate((L.DRAIN, L.REBOOT, L.RECHECK, L.RESUME)):
        L.record(str(tmp_path), "n1", step, who="gpugate health", when=T0 + i)
    found = L.entries(str(tmp_path), "n1")
    assert [e.step for e in found] == [L.DRAIN, L.REBOOT, L.RECHECK, L.RESUME]
    assert L.last(found, L.REBOOT).when == T0 + 1  # type: ignore[union-attr]
    assert L.last(found).step == L.RESUME  # type: ignore[union-attr]
    assert L.last(found, L.RMA) is None


def test_an_unknown_step_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match="'fix' is not a step"):
        L.record(str(tmp_path), "n1", "fix", who="me")


def test_lines_that_are_not_the_ledgers_are_skipped(tmp_path):
    L.record(str(tmp_path), "n1", L.DRAIN, who="gpugate prolog", when=T0)
    with open(tmp_path / L.LEDGER, "a") as f:
        f.write('{"node": "n1", "when": 1.0, "step": "pwn", "who": "x"}\n')  # not a step
        f.write('{"node": "n1", "when": 1.0, "step": "rma", "who": 5}\n')  # who not text
        f.write("[]\n{torn\n")
        f.write(json.dumps({"node": "n1", "when": 2.0, "step": "rma", "who": "x",
                            "why": "y" * 10000}) + "\n")  # fmt: skip
    assert [e.step for e in L.entries(str(tmp_path), "n1")] == [L.DRAIN]


def test_note_never_raises_when_the_ledger_cannot_be_written(tmp_path):
    from gpugate.config import load_config

    (tmp_path / "cfg.yaml").write_text(
        f"state_dir: {tmp_path / 'state'}\nadmin:\n  history_dir: {tmp_path / 'file'}\n"
    )
    (tmp_path / "file").write_text("not a directory")
    config = load_config(str(tmp_path / "cfg.yaml"))
    assert L.note(config, "n1", L.DRAIN, who="gpugate prolog") is None


def test_recent_reads_only_the_ledgers_tail(tmp_path, monkeypatch):
    from gpugate.config import load_config

    (tmp_path / "cfg.yaml").write_text(f"state_dir: {tmp_path}\n")
    config = load_config(str(tmp_path / "cfg.yaml"))
    L.record(str(tmp_path), "n1", L.DRAIN, who="gpugate prolog", when=T0)
    for i in range(200):  # newer lines of another node, past the tail's size
        L.record(str(tmp_path), "n2", L.WAIT, who="gpugate health", why="x" * 500, when=T0 + i)
    L.record(str(tmp_path), "n1", L.REBOOT, who="gpugate health", when=T0 + 300)
    monkeypatch.setattr(L, "RECENT_MAX", 64 * 1024)
    assert [e.step for e in L.recent(config, "n1", 0)] == [L.REBOOT]  # the old drain: past it
    assert [e.step for e in L.entries(config, "n1")] == [L.DRAIN, L.REBOOT]
    assert L.recent(config, "n1", T0 + 301) == []

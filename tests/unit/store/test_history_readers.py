"""Readers of the drain history and the audit log trust neither (issue 11, point 3).

`gpugate nodes`, `gpugate report` and the history readers skip an entry that is not what
gpugate writes, with one warning per file, and never show a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import paths
import pytest

from gpugate import cli
from gpugate.store import history as H

NOW = 1_790_000_000.0
FIXTURES = paths.FIXTURES / "slurm"

BAD_DRAINS = [
    b'{"time": "x"}',
    b"[]",
    b'{"node": 5, "when": 1}',
    b'{"node": "vm", "when": "x"}',
    b'{"node": "vm", "when": true}',
    b'{"node": "vm", "when": 1e400}',  # Infinity: time.gmtime() raises
    b'{"node": "vm", "when": NaN}',
    b'{"node": "vm", "when": -5}',
    b'{"node": "vm", "when": 1, "check": {"a": 1}}',  # unhashable: the report counts by check
    b'{"node": "vm", "when": 1, "reason": ["x"]}',
    b'{"node": "vm", "when": 1, "xid": "79"}',
    b'{"node": "", "when": 1}',
    b"\xff\xfe\x00\x9b binary",
    b"[" * 50_000,
    b'{"node": "vm", "when": 1, "reason": "' + b"x" * (H.LINE_MAX + 1) + b'"}',
]
BAD_RESUMES = [
    b'{"node": "vm", "when": 1, "forced": "no"}',
    b'{"node": "vm", "when": 1, "who": 7}',
    b'{"node": "vm", "when": "yesterday"}',
]


def good_drain(node: str = "vm", when: float = NOW) -> bytes:
    entry = {"node": node, "when": when, "check": "gpu.ecc", "reason": "gpugate: gpu.ecc: x"}
    return json.dumps(entry).encode()


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_drains_keeps_the_good_entries_and_warns_once(tmp_path, capsys):
    write_lines(tmp_path / H.DRAINS, [good_drain("a"), *BAD_DRAINS, good_drain("b")])
    assert [e.node for e in H.drains(str(tmp_path))] == ["a", "b"]
    err = capsys.readouterr().err.splitlines()
    assert err == [f"gpugate: {tmp_path / H.DRAINS}: skipped {len(BAD_DRAINS)} malformed entries"]


def test_each_bad_drain_line_alone_is_skipped(tmp_path):
    for line in BAD_DRAINS:
        write_lines(tmp_path / H.DRAINS, [line, good_drain()])
        assert [e.node for e in H.drains(str(tmp_path))] == ["vm"], line[:60]


def test_two_entries_on_one_line_are_not_taken_for_one_each(tmp_path):
    # `a,b` on one line parses as two entries in the one-parse fast path: line by line instead.
    write_lines(tmp_path / H.DRAINS, [good_drain("a") + b"," + good_drain("b"), good_drain("c")])
    assert [e.node for e in H.drains(str(tmp_path))] == ["c"]


def test_resumes_skip_bad_audit_entries(tmp_path, capsys):
    H.record_resume(str(tmp_path), "vm", who="alice", why="reseated", when=NOW)
    with open(tmp_path / H.AUDIT, "ab") as fh:
        fh.write(b"\n".join(BAD_RESUMES) + b"\n")
    assert [e.who for e in H.resumes(str(tmp_path))] == ["alice"]
    assert f"skipped {len(BAD_RESUMES)} malformed entries" in capsys.readouterr().err


def test_a_bad_entry_never_breaks_counting_or_the_same_event_check(tmp_path):
    d = str(tmp_path)
    write_lines(tmp_path / H.DRAINS, [b'{"node": "vm", "when": "x", "check": "gpu.ecc"}'])
    assert H.record_drain(d, "vm", "gpugate: gpu.ecc: x", when=NOW) is not None
    assert H.count_drains(d, "vm", 30, now=NOW) == 1


@pytest.fixture
def site(tmp_path, monkeypatch):
    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nevidence_dir: {tmp_path / 'ev'}\n")
    monkeypatch.setenv("GPUGATE_CONFIG", str(cfg))
    doc = json.loads((FIXTURES / "22.05" / "sinfo.drained.json").read_text())
    doc["nodes"][0].update(reason="gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120", name="vm")
    (tmp_path / "sinfo.json").write_text(json.dumps(doc))
    state = tmp_path / "state"
    write_lines(state / H.DRAINS, [*BAD_DRAINS, good_drain()])
    write_lines(state / H.AUDIT, BAD_RESUMES)
    return tmp_path


def test_nodes_with_a_hostile_history_lists_and_warns(site, capsys):
    argv = ["nodes", "--sinfo-json", str(site / "sinfo.json"), "--json", "--window-days", "36500"]
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    [row] = json.loads(out.out)["nodes"]
    assert row["node"] == "vm" and row["drains"] == 1
    assert "Traceback" not in out.err and out.err.count("malformed") == 1


def test_report_with_a_hostile_history_writes_the_page(site, capsys):
    page = site / "report.html"
    argv = ["report", "--html", str(page), "--sinfo-json", str(site / "sinfo.json"),
            "--window-days", "36500"]  # fmt: skip
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("malformed") == 2  # drains and audit
    assert "vm" in page.read_text()


@pytest.mark.parametrize("content", ["[]", '{"nodes": 5}', '{"sinfo": [{"nodes": 3}]}', "7"])
def test_nodes_with_a_sinfo_file_of_another_shape_says_so_in_one_line(site, capsys, content):
    saved = site / "other.json"
    saved.write_text(content)
    assert cli.main(["nodes", "--sinfo-json", str(saved)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(saved) in err and "Traceback" not in err


def test_report_to_a_missing_directory_says_so_in_one_line(site, capsys):
    page = site / "no" / "such" / "dir" / "report.html"
    argv = ["report", "--html", str(page), "--sinfo-json", str(site / "sinfo.json")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"cannot write {page}" in err and "Traceback" not in err


def test_nodes_ignores_a_hostile_bundle_summary(site, capsys):
    """A summary.json whose xid is text must cost its row the Xid, not the listing."""
    bundle = site / "ev" / "4242" / "vm-r0"
    bundle.mkdir(parents=True)
    (bundle / "summary.json").write_text(json.dumps({"category": ["x"], "xid": "79"}))
    write_lines(site / "state" / H.DRAINS, [json.dumps(
        {"node": "vm", "when": NOW, "check": "kernel.xid", "reason": "gpugate: kernel.xid: x",
         "bundle": str(bundle)}).encode()])  # fmt: skip
    doc = json.loads((site / "sinfo.json").read_text())
    doc["nodes"][0]["reason"] = "gpugate: kernel.xid: GPU1 Xid 79"
    (site / "sinfo.json").write_text(json.dumps(doc))
    argv = ["nodes", "--sinfo-json", str(site / "sinfo.json"), "--json", "--window-days", "36500"]
    assert cli.main(argv) == 0
    [row] = json.loads(capsys.readouterr().out)["nodes"]
    assert row["xid"] is None and row["category"] is None

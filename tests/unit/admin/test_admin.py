"""`gpugate nodes` and its library: one Slurm call (faked at the runner, serving recorded
output), the grouped parse against the adapter's own, suggested actions from the check, the
Xid catalog and the repeat count, urgency order, evidence found through the reason and the
history, and the CLI's output and exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from admin_site import (
    bundle,
    gpugate_sinfo,
    node,
    site,
)
from slurm_recorded import FIXTURES, FakeRunner, fixture

from gpugate import cli
from gpugate.admin import nodes as A
from gpugate.slurm.cli import CliBackend
from gpugate.slurm.parse_json import parse_nodes_json
from gpugate.slurm.records import NodeInfo
from gpugate.store import history as H
from gpugate.store.entries import DrainEntry, HeldEntry
from gpugate.store.evidence import write_bundle
from gpugate.store.suspects import FlagEntry

__all__ = ["site"]  # the fixture, from tests/support/admin_site.py

DAY = 86400.0
NOW = 1_790_000_000.0
NODE_JSON = sorted(
    p.relative_to(FIXTURES).as_posix()
    for p in FIXTURES.glob("*/*.json")
    if {"nodes", "sinfo"} & set(json.loads(p.read_text()))
)


def rows(nodes: list[NodeInfo], drains: list[dict] = (), evidence: str = "/nonexistent",
         **kw) -> list[A.NodeRow]:  # fmt: skip
    return A.node_rows(A.as_groups(nodes), list(drains), evidence, now=NOW, **kw)


def drain(node: str, check: str, days_ago: float, **extra) -> DrainEntry:
    return DrainEntry.from_json({"node": node, "when": NOW - days_ago * DAY, "check": check,
                                 "reason": f"gpugate: {check}: x", **extra})  # fmt: skip


# ----------------------------------------------------------------------- reading Slurm


@pytest.mark.parametrize("rel", NODE_JSON)
def test_grouped_parse_gives_what_the_adapter_gives(rel):
    text = fixture(rel)
    expanded = [g.replace(name=n) for g, names in A.parse_node_groups(text) for n in names]
    assert expanded == parse_nodes_json(text)


def test_aggregated_sinfo_record_stays_one_group():
    [(first, names)] = A.parse_node_groups(fixture("23.02/sinfo.allocated-drain-excerpt.json"))
    assert first.reason == "IT-4461" and first.flags == ("DRAIN",)
    assert names[:3] == ["cs62", "cs63", "cs64"] and len(names) == 10


def test_one_sinfo_json_call_reads_every_node():
    runner = FakeRunner().ok(("sinfo", "--json"), fixture("24.11/sinfo.trimmed-drain-down.json"))
    groups = A.read_node_groups(CliBackend(runner=runner))
    assert runner.argvs == [("sinfo", "--json")]
    assert sum(len(n) for _, n in groups) == 15


def test_nodes_that_sinfo_aggregated_under_one_reason_are_read_one_by_one():
    """24.11 (Debian 13): two nodes drained for different checks come as one `sinfo` record
    with the first node's reason; scontrol's text gives each its own."""
    runner = (
        FakeRunner()
        .ok(("sinfo", "--json"), fixture("24.11-debian13/sinfo.two-drain-reasons.json"))
        .ok(("scontrol", "-o", "show", "node"),
            fixture("24.11-debian13/scontrol-show-node-o.two-drain-reasons.txt"))
    )  # fmt: skip
    groups = A.read_node_groups(CliBackend(runner=runner))
    reasons = {names[0]: (node.name, node.reason) for node, names in groups if len(names) == 1}
    assert reasons["gpu-node-01"] == (
        "gpu-node-01",
        "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100",
    )
    assert reasons["gpu-node-02"] == (
        "gpu-node-02",
        "gpugate: kernel.xid: GPU0 Xid 79 (reboot the node)",
    )
    assert sorted(n for _, names in groups for n in names) == [f"gpu-node-0{i}" for i in (1, 2, 3)]
    rows = A.node_rows(groups, [], "/nonexistent", now=NOW)
    assert {r.node: r.check for r in rows if r.check} == {
        "gpu-node-01": "gpu.ecc", "gpu-node-02": "kernel.xid"
    }  # fmt: skip


def test_only_aggregated_groups_with_a_reason_are_asked_again():
    doc = json.loads(fixture("23.02/sinfo.allocated-drain-excerpt.json"))  # 10 nodes, IT-4461
    runner = FakeRunner().ok(("sinfo", "--json"), json.dumps(doc))
    runner.ok(("scontrol", "-o", "show", "node"), "")
    [(first, names)] = A.read_node_groups(CliBackend(runner=runner))
    # Nodes scontrol no longer lists (gone since sinfo answered) stay as sinfo said.
    assert first.reason == "IT-4461" and len(names) == 10
    assert runner.argvs == [("sinfo", "--json"), ("scontrol", "-o", "show", "node")]
    doc["sinfo"][0]["reason"] = {"description": "", "time": 0, "user": ""}
    runner = FakeRunner().ok(("sinfo", "--json"), json.dumps(doc))
    [(_, names)] = A.read_node_groups(CliBackend(runner=runner))
    assert len(names) == 10 and runner.argvs == [("sinfo", "--json")]


def test_without_json_the_scontrol_text_is_read():
    runner = (
        FakeRunner()
        .fail(("sinfo", "--json"), stderr="sinfo: error: unable to find plugin for data_parser")
        .ok(("scontrol", "-o", "show", "node"), fixture("22.05/scontrol-show-node-o.drained.txt"))
    )
    [(first, _)] = A.read_node_groups(CliBackend(runner=runner))
    assert (first.name, first.reason, first.drained) == ("vm", "test: custom reason", True)
    assert runner.argvs == [("sinfo", "--json"), ("scontrol", "-o", "show", "node")]


def test_unparsable_json_falls_back_too():
    runner = (
        FakeRunner()
        .ok(("sinfo", "--json"), "sinfo: JSON output is not supported\n")
        .ok(("scontrol", "-o", "show", "node"), fixture("25.11/scontrol-show-nodes-o.drain-maint-resv.txt"))
    )  # fmt: skip
    assert len(A.read_node_groups(CliBackend(runner=runner))) > 1


def test_a_slurm_timeout_is_not_retried_and_failures_are_reported():
    runner = FakeRunner().fail(("sinfo", "--json"), status="timeout", rc=None)
    with pytest.raises(A.NodesUnavailable, match="cannot list"):
        A.read_node_groups(CliBackend(runner=runner))
    assert runner.argvs == [("sinfo", "--json")]
    runner = FakeRunner().fail(("sinfo", "--json")).fail(("scontrol", "-o", "show", "node"))
    with pytest.raises(A.NodesUnavailable):
        A.read_node_groups(CliBackend(runner=runner))


# -------------------------------------------------------------------------- actions


@pytest.mark.parametrize(
    ("check", "reason", "expected"),
    [
        ("gpu.ecc", "gpugate: gpu.ecc: GPU3 volatile uncorrected ECC 2 > 0 (reset it)", A.RESET),
        ("gpu.ecc", "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100", A.RMA),
        ("gpu.memory_errors", "gpugate: gpu.memory_errors: GPU1 row remapping failed: RMA candidate", A.RMA),
        ("gpu.memory_errors", "gpugate: gpu.memory_errors: GPU1 row remap pending", A.RESET),
        ("kernel.xid", "gpugate: kernel.xid: GPU1 (0000:18:00) Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS", A.REBOOT),
        ("kernel.xid", "gpugate: kernel.xid: GPU1 Xid 48 GPU_ECC_DBE: double-bit", A.RESET),
        ("kernel.xid", "gpugate: kernel.xid: GPU1 Xid 13 GR_EXCEPTION (5 burst(s))", A.RESET),
        ("gpu.recovery_action", "gpugate: gpu.recovery_action: GPU0 node_reboot (reboot the node)", A.REBOOT),
        ("gpu.lost", "gpugate: gpu.lost: GPU2 (0000:3b:00.0): gpu_is_lost", A.REBOOT),
        ("pcie.link", "gpugate: pcie.link: GPU6 PCIe x8 < x16", A.RESEAT),
        ("ib.ports", "gpugate: ib.ports: mlx5_3/1 Down", A.RESEAT),
        ("gpu.temperature", "gpugate: gpu.temperature: GPU4 91 C > 85", A.COOLING),
        ("host.nofile", "gpugate: host.nofile: soft 1024 < 1048576", A.HOST),
        (None, "gpugate: odd", A.HOST),
    ],
)  # fmt: skip
def test_suggested_action_from_the_check_and_the_reason(check, reason, expected):
    assert A.suggest_action(check, reason) == expected


def test_repeats_of_a_hardware_check_make_an_rma_candidate():
    reason = "gpugate: gpu.ecc: GPU3 volatile uncorrected ECC 2 > 0 (reset it)"
    assert A.suggest_action("gpu.ecc", reason, same_check_drains=2) == A.RESET
    assert A.suggest_action("gpu.ecc", reason, same_check_drains=3) == A.RMA
    assert A.suggest_action("gpu.ecc", reason, same_check_drains=3, rma_after=4) == A.RESET
    # A host setting that keeps coming back is a configuration problem, not a part to replace.
    assert A.suggest_action("host.nofile", "gpugate: host.nofile: x", same_check_drains=9) == A.HOST


def test_the_bundle_decides_where_the_reason_is_vague():
    assert A.suggest_action("kernel.xid", "gpugate: kernel.xid: see evidence", xid=79) == A.REBOOT
    assert A.suggest_action(None, "gpugate: ?", category="nvlink_error") == A.RESET


# -------------------------------------------------------------------------- the rows


def test_rows_most_urgent_first_then_nodes_in_service_in_slurm_order():
    nodes = [
        node("ok-2", flags=(), reason=""),
        node("admin", reason="IT-4461 swap PSU", user="alice", when=1_700_000_000),
        node(
            "dead", state="DOWN", flags=("NOT_RESPONDING",), reason="Not responding", user="slurm"
        ),
        node("cables", reason="gpugate: pcie.link: GPU6 PCIe x8 < x16"),
        node("reset-old", reason="gpugate: gpu.ecc: GPU3 volatile (reset it)", when=1_780_000_000),
        node("reset-new", reason="gpugate: gpu.ecc: GPU3 volatile (reset it)", when=1_789_500_000),
        node("bus", reason="gpugate: kernel.xid: GPU1 Xid 79 fallen off the bus"),
        node("ok-1", state="ALLOCATED", flags=(), reason=""),
        node("resumed", flags=(), reason="gpugate: gpu.ecc: kept by 24.11 after the resume"),
        node("flaky", reason="gpugate: gpu.ecc: GPU3 volatile (reset it)"),
        node("hook", reason="Prolog error"),
    ]
    history = [drain("flaky", "gpu.ecc", d) for d in (20, 9, 1)]
    history += [drain("reset-new", "gpu.ecc", 2), drain("reset-new", "gpu.ecc", 45)]
    got = rows(nodes, history)
    assert [r.node for r in got] == [
        "flaky", "bus", "reset-new", "reset-old", "cables", "dead", "hook", "admin",
        "ok-2", "ok-1", "resumed",
    ]  # fmt: skip
    by = {r.node: r for r in got}
    assert by["flaky"].action == A.RMA and by["flaky"].same_check_drains == 3
    assert by["reset-new"].drains == 1  # 45 days ago is outside the 30-day window
    assert by["dead"].action == A.NOT_RESPONDING and by["dead"].gpugate is False
    assert by["hook"].action == A.HOOK_ERROR and by["admin"].action == A.ADMIN
    assert by["admin"].set_by == "alice" and by["admin"].since == "2023-11-14T22:13:20Z"
    # 24.11 keeps a reason on a resumed node: in service, no action, and no stale reason shown.
    assert by["resumed"].drained is False and by["resumed"].action == ""
    assert (by["resumed"].reason, by["resumed"].set_by, by["resumed"].gpugate) == ("", "", False)
    assert by["admin"].reason == "IT-4461 swap PSU"  # a drained node's reason stays
    assert by["bus"].check == "kernel.xid" and by["bus"].state == "IDLE+DRAIN"
    assert [r.node for r in rows(nodes, history, drained_only=True)][-1] == "admin"


def test_evidence_named_in_the_reason_gives_category_and_xid(tmp_path):
    evidence = str(tmp_path / "evidence")
    bundle = write_bundle(evidence, "4242", "gpu-07", 1, {"kernel.log": "Xid 79\n"},
                          {"category": "gpu_xid_hardware", "xid": 79, "node": "gpu-07"})  # fmt: skip
    reason = "gpugate: kernel.xid: evidence 4242/gpu-07-r1: GPU1 fell off the bus"
    [row] = rows([node("gpu-07", reason=reason)], evidence=evidence)
    assert (row.bundle, row.category, row.xid) == (bundle, "gpu_xid_hardware", 79)
    assert row.action == A.REBOOT


def test_evidence_found_through_the_history(tmp_path):
    evidence = str(tmp_path / "evidence")
    bundle = write_bundle(evidence, "77", "n1", 0, {}, {"category": "ecc_error", "xid": 48})
    history = [drain("n1", "gpu.ecc", 3, bundle=bundle), drain("n1", "pcie.link", 1)]
    [row] = rows([node("n1", reason="gpugate: gpu.ecc: GPU3 volatile")], history, evidence)
    assert (row.bundle, row.category, row.xid) == (bundle, "ecc_error", 48)
    assert (row.drains, row.same_check_drains) == (2, 1)
    # Without a bundle, the history entry's own category still tells.
    history = [drain("n2", "gpu.ecc", 1, category="ecc_error")]
    [row] = rows([node("n2", reason="gpugate: gpu.ecc: GPU3")], history, evidence)
    assert (row.bundle, row.category) == (None, "ecc_error")


def test_grouped_nodes_with_their_own_history_get_their_own_rows():
    text = fixture("23.02/sinfo.allocated-drain-excerpt.json")
    got = A.node_rows(A.parse_node_groups(text), [drain("cs64", "gpu.ecc", 1)], "/x", now=NOW)
    assert len(got) == 10 and {r.reason for r in got} == {"IT-4461"}
    assert got[0].node == "cs64"  # the one with drains on record
    assert next(r for r in got if r.node == "cs200").drains == 0


def test_table_is_one_sanitised_line_per_node():
    hostile = "gpugate: gpu.ecc: \x1b[31mred\x1b[0m\nsecond line"
    text = A.render_table(rows([node("n1", reason=hostile)]))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["NODE", "STATE", "CHECK"]
    assert len(lines) == 2 and "\x1b" not in text and "second line" in lines[1]


# ----------------------------------------------------------------------------- the CLI


def test_cli_json_from_a_saved_file(site, capsys):
    saved = site / "sinfo.json"
    saved.write_text(gpugate_sinfo("gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100"))
    H.record_drain(str(site / "state"), "vm", "gpugate: gpu.ecc: x", when=NOW)
    assert cli.main(["nodes", "--sinfo-json", str(saved), "--json", "--window-days", "36500"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["window_days"] == 36500
    [row] = out["nodes"]
    assert row["node"] == "vm" and row["gpugate"] is True and row["drains"] == 1
    assert row["action"] == A.RMA and row["check"] == "gpu.ecc"


def test_cli_table_and_drained_filter(site, capsys):
    saved = site / "sinfo.json"
    saved.write_text(fixture("24.11/sinfo.trimmed-drain-down.json"))
    assert cli.main(["nodes", "--sinfo-json", str(saved)]) == 0
    every = capsys.readouterr().out.splitlines()
    assert cli.main(["nodes", "--sinfo-json", str(saved), "--drained"]) == 0
    drained = capsys.readouterr().out.splitlines()
    assert every[0].startswith("NODE") and len(every) == 16
    assert 1 < len(drained) < len(every)
    assert "dave30" in drained[1] or "trevor1" in drained[1]


def test_cli_exit_codes(site, capsys, monkeypatch):
    assert cli.main(["nodes", "--sinfo-json", str(site / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    runner = FakeRunner().fail(("sinfo", "--json"), status="missing", rc=None)
    runner.fail(("scontrol", "-o", "show", "node"), status="missing", rc=None)
    monkeypatch.setattr(A, "cli_backend", lambda config=None: CliBackend(runner=runner))
    assert cli.main(["nodes"]) == 1
    assert "cannot list Slurm's nodes" in capsys.readouterr().err


def test_cli_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["nodes", "--help"])
    assert exc.value.code == 0
    assert "--sinfo-json" in capsys.readouterr().out


def test_fixture_list_is_not_empty():
    assert len(NODE_JSON) >= 10 and Path(FIXTURES).is_dir()


# ------------------------------------------------------------------------ gpugate evidence


def test_evidence_of_a_node_newest_first(site, capsys):
    old = bundle(site, "100", "gpu-07", collected_at="2026-11-01T10:00:00Z", category="cuda_oom")
    new = bundle(site, "205", "gpu-07", 1, collected_at="2026-11-20T10:00:00Z",
                 category="gpu_xid_hardware", xid=79, failing_rank=3, action="drained",
                 why="exit code 1", drain_reason="gpugate: kernel.xid: evidence 205/gpu-07-r1: x")  # fmt: skip
    bundle(site, "205", "gpu-08", collected_at="2026-11-20T10:00:00Z")  # another node
    elsewhere = write_bundle(str(site / "old-root"), "7", "gpu-07", 0, {}, {"node": "gpu-07"})
    H.record_drain(str(site / "state"), "gpu-07", "gpugate: kernel.xid: x", bundle=elsewhere)
    assert cli.main(["evidence", "gpu-07", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "node"
    assert [b["path"] for b in out["bundles"]] == [new, old, elsewhere]
    first = out["bundles"][0]
    assert (first["category"], first["xid"], first["failing_rank"]) == ("gpu_xid_hardware", 79, 3)
    assert first["action"] == "drained" and "kernel.log" in first["files"]
    assert cli.main(["evidence", "gpu-07"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("3 evidence bundle(s) for gpu-07")
    assert "xid: 79" in text and "failing rank: 3" in text and f"raw files: {new}/" in text


def test_evidence_shows_the_failing_ranks_node_and_why(site, capsys):
    bundle(site, "301", "gpu-07", collected_at="2026-11-21T10:00:00Z", category="cuda_oom",
           failing_rank=9, failing_node="gpu-09", rank_confidence="high",
           rank_reason="rank 9: the only rank on the decisive cuda_oom lines")  # fmt: skip
    assert cli.main(["evidence", "gpu-07", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["bundles"][0]
    assert (first["failing_rank"], first["failing_node"]) == (9, "gpu-09")
    assert cli.main(["evidence", "gpu-07"]) == 0
    text = capsys.readouterr().out
    assert "failing rank: 9 on gpu-09" in text
    assert "rank:     rank 9: the only rank on the decisive cuda_oom lines" in text


def test_evidence_says_the_dumps_were_the_users_and_must_not_be_unpickled(site, capsys):
    files = {"kernel.log": "x\n", "flightrec.json": "{}", "flightrec/fr_rank_0.json": "{}"}
    write_bundle(str(site / "ev"), "311", "gpu-03", 0, files, {"job_id": "311", "node": "gpu-03"})
    assert cli.main(["evidence", "311"]) == 0
    text = capsys.readouterr().out
    assert "dumps:    the flight-recorder dumps were the job user's (pickles)" in text
    assert "kept only their parsed JSON" in text and "never unpickle a raw dump" in text
    # A bundle of an older gpugate that kept the raw pickle: named, with the warning.
    old = {"flightrec.json": "{}", "flightrec/fr_rank_1": b"\x80\x04."}
    write_bundle(str(site / "ev"), "312", "gpu-03", 0, old, {"job_id": "312", "node": "gpu-03"})
    assert cli.main(["evidence", "312", "--json"]) == 0
    (item,) = json.loads(capsys.readouterr().out)["bundles"]
    assert (
        "raw flight-recorder dumps from an older gpugate (flightrec/fr_rank_1)"
        in item["dumps_note"]
    )
    assert "never to be unpickled" in item["dumps_note"]


def test_evidence_of_a_job_and_of_a_numeric_node(site, capsys):
    a = bundle(site, "4242", "gpu-01", category="nccl_timeout")
    b = bundle(site, "4242", "gpu-02", category="ecc_error")
    assert cli.main(["evidence", "4242", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "job" and {x["path"] for x in out["bundles"]} == {a, b}
    assert cli.main(["evidence", "4242", "--node"]) == 1  # no node named 4242
    assert "no evidence bundles for node 4242" in capsys.readouterr().err


def test_evidence_none_and_hostile_text(site, capsys):
    assert cli.main(["evidence", "gpu-99"]) == 1
    assert "no evidence bundles for node gpu-99" in capsys.readouterr().err
    path = bundle(site, "9", "gpu-99", why="\x1b[2J\x1b[31mboom\nsecond", category="other")
    os.rename(path, path + ".old-123")  # an older copy kept beside: not listed
    bundle(site, "10", "gpu-99", why="\x1b[2J\x1b[31mboom\nsecond", category="other")
    assert cli.main(["evidence", "gpu-99"]) == 0
    text = capsys.readouterr().out
    # Shown escaped, one line: the admin sees what the text tried (gpugate.text.printable).
    assert "\x1b" not in text and "\\x1b[2J\\x1b[31mboom\\nsecond" in text
    assert text.count("job 10 ") == 1
    assert cli.main(["evidence", "../etc"]) == 2  # one line, no argparse usage block
    assert capsys.readouterr().err.count("\n") == 1


def test_rows_json_is_json_dumps():
    nodes = [node(f"n{i}", flags=(), reason="") for i in range(5)]
    nodes += [node('h\u00e9"x', reason='gpugate: gpu.ecc: caf\u00e9 "quoted" \\ \n')]
    got = rows(nodes, [drain("n2", "gpu.ecc", 1)])
    assert A.rows_json(got) == json.dumps([r.to_json() for r in got], separators=(",", ":"))
    assert A.rows_json([]) == "[]"
    # Rows equal but for a held-back drain or a suspicion are encoded each on its own.
    held = HeldEntry(node="n0", when=NOW, at="2026-01-01T00:00:00Z", check="ib.ports",
                     reason="gpugate: ib.ports: down", why=None)  # fmt: skip
    flag = FlagEntry(node="n1", when=NOW, at="2026-01-02T00:00:00Z", source="votes",
                     detail="first to fail", jobs=["1"], users=2, action="review")  # fmt: skip
    got = rows(nodes[:3], held={"n0": held}, suspects={"n1": flag})
    assert [r.node for r in got] == ["n0", "n1", "n2"]
    doc = json.loads(A.rows_json(got))
    assert doc == [r.to_json() for r in got]
    assert list(doc[0])[-3:] == ["would_drain_reason", "would_drain_why", "would_drain_since"]
    assert doc[0]["would_drain_why"] is None and "suspect_source" not in doc[0]
    assert doc[1]["suspect_asked"] == "review" and doc[1]["suspect_note"] == ""
    assert "would_drain_reason" not in doc[2] and "suspect_source" not in doc[2]


def test_history_entry_about_the_named_bundle_spares_the_read(tmp_path):
    evidence = str(tmp_path / "evidence")  # no bundle written: summary.json cannot be read
    named = f"{evidence}/88/n1-r0"
    reason = "gpugate: nvlink.links: evidence 88/n1-r0: GPU2 12/18 NVLinks active"
    entry = drain("n1", "nvlink.links", 1, bundle=named, category="nvlink_error")
    [row] = rows([node("n1", reason=reason)], [entry], evidence)
    assert (row.bundle, row.category) == (named, "nvlink_error")
    older = drain("n1", "nvlink.links", 5, bundle=f"{evidence}/70/n1-r0", category="other")
    [row] = rows([node("n1", reason=reason)], [older], evidence)
    assert (row.bundle, row.category) == (named, "other")  # unreadable: history's best

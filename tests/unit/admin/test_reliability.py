"""Fleet reliability figures (gpugate/admin/reliability.py) over hand-made histories: outages,
MTBF per node, board, check and fleet, the jobs that failed only on one node, their gauges,
the report's sections and `--json`."""

from __future__ import annotations

import json

import pytest
from factories import make_bundle, make_decision
from report_page import DAY, Page, section

from gpugate import cli
from gpugate.admin import reliability as F
from gpugate.admin import reliability_page as P
from gpugate.admin import report as R
from gpugate.slurm.reasons import REASON_GRAMMAR_VERSION
from gpugate.slurm.records import gres_gpu_type
from gpugate.store.entries import AuditEntry, DrainEntry
from gpugate.store.metrics import RELIABILITY_FILE, render

H = 3600.0
NOW = 1_790_000_000.0
SINCE = NOW - 10 * DAY  # a 10-day window: 240 hours


def drain(node: str, at: float, check: str = "gpu.ecc", **more: object) -> DrainEntry:
    return DrainEntry(node=node, when=at, check=check, reason=f"gpugate: {check}: x", **more)  # type: ignore[arg-type]


def lift(node: str, at: float, resumed: bool = True) -> AuditEntry:
    return AuditEntry(node=node, when=at, who="alice", why="fixed", resumed=resumed)


# --------------------------------------------------------------------------- outages


def test_an_outage_runs_from_the_drain_to_the_audited_lift() -> None:
    found = F.outages([drain("a", NOW - 5 * DAY)], [lift("a", NOW - 5 * DAY + 6 * H)], NOW)
    assert [(o.start, o.end, o.ended) for o in found] == [
        (NOW - 5 * DAY, NOW - 5 * DAY + 6 * H, "lifted")
    ]


def test_drains_before_the_lift_are_one_outage_with_the_first_check() -> None:
    drains = [drain("a", NOW - 5 * DAY), drain("a", NOW - 5 * DAY + H, "kernel.xid")]
    found = F.outages(drains, [lift("a", NOW - 4 * DAY)], NOW)
    assert len(found) == 1 and found[0].check == "gpu.ecc" and found[0].end == NOW - 4 * DAY


def test_a_refused_resume_lifts_nothing_and_a_drill_is_no_outage() -> None:
    drains = [drain("a", NOW - 2 * DAY), drain("b", NOW - 2 * DAY, drill="d1")]
    found = F.outages(drains, [lift("a", NOW - DAY, resumed=False)], NOW, drained_now={"a"})
    assert [(o.node, o.end, o.ended) for o in found] == [("a", NOW, "still drained")]


def test_an_unaudited_lift_ends_at_the_last_drain() -> None:
    # Slurm shows the node in service and no audit entry lifted it: scontrol, at an unknown time.
    found = F.outages([drain("a", NOW - 2 * DAY)], [], NOW, drained_now=set())
    assert [(o.end, o.ended) for o in found] == [(NOW - 2 * DAY, "outside gpugate")]
    unknown = F.outages([drain("a", NOW - 2 * DAY)], [], NOW, drained_now=None)
    assert unknown[0].end == NOW  # Slurm unread: still out


# ------------------------------------------------------------------------------ MTBF


def history() -> tuple[list[DrainEntry], list[AuditEntry]]:
    """a: two failures of 12 h each in the window; b: one failure still open for 24 h; c:
    one failure that began before the window, lifted 12 h into it (no failure counted)."""
    drains = [
        drain("a", NOW - 8 * DAY), drain("a", NOW - 3 * DAY, "kernel.xid"),
        drain("b", NOW - DAY, "kernel.xid"),
        drain("c", SINCE - DAY),
    ]  # fmt: skip
    audit = [lift("a", NOW - 8 * DAY + 12 * H), lift("a", NOW - 3 * DAY + 12 * H),
             lift("c", SINCE + 12 * H)]  # fmt: skip
    return drains, audit


def test_node_mtbf_is_its_hours_in_service_per_failure() -> None:
    drains, audit = history()
    rows = F.node_mtbf(["a", "b", "c", "d"], F.outages(drains, audit, NOW, {"b"}), SINCE, NOW)
    assert {n: (r.failures, r.in_service_h) for n, r in rows.items()} == {
        "a": (2, 216.0), "b": (1, 216.0), "c": (0, 228.0), "d": (0, 240.0)}  # fmt: skip
    assert rows["a"].mtbf_h == 108.0 and rows["b"].mtbf_h == 216.0
    assert rows["c"].mtbf_h is None and rows["d"].mtbf_h is None


def test_boards_sum_their_nodes_and_the_fleet_comes_last() -> None:
    drains, audit = history()
    rows = F.node_mtbf(["a", "b", "c", "d"], F.outages(drains, audit, NOW, {"b"}), SINCE, NOW)
    boards = F.group_mtbf(rows, {"a": "h100", "b": "h100", "c": "a100"})
    got = [(r.key, r.nodes, r.failures, r.in_service_h, r.mtbf_h) for r in boards]
    assert got == [("a100", 1, 0, 228.0, None), ("h100", 2, 3, 432.0, 144.0),
                   ("unknown", 1, 0, 240.0, None), ("fleet", 4, 3, 900.0, 300.0)]  # fmt: skip


def test_a_checks_mtbf_is_the_fleets_hours_per_failure_of_that_check() -> None:
    drains, audit = history()
    found = F.outages(drains, audit, NOW, {"b"})
    rows = F.node_mtbf(["a", "b", "c", "d"], found, SINCE, NOW)
    checks = F.check_mtbf(rows, found, SINCE, NOW)
    assert [(c.key, c.failures, c.mtbf_h) for c in checks] == [("kernel.xid", 2, 450.0),
                                                               ("gpu.ecc", 1, 900.0)]  # fmt: skip


def test_the_board_is_the_gres_gpu_type() -> None:
    assert gres_gpu_type("gpu:h100:8(S:0-1)") == "h100"
    assert gres_gpu_type("gpu:h100:4,gpu:a100:2,nic:1") == "a100+h100"
    assert gres_gpu_type("gpu:8") == "" and gres_gpu_type("(null)") == ""
    assert gres_gpu_type({"gpu:h200": 8}) == "h200"


# ---------------------------------------------------------------- failed only here


def done(job: str, at: float, nodes: str, **more: object):
    return make_decision(at, job=job, ended_well=True, nodes=nodes, requeue=False, **more)


def test_a_job_that_failed_here_and_completed_elsewhere_counts_here() -> None:
    failed = [make_bundle("10", "bad", failed=NOW - 5 * H, user="ann"),
              make_bundle("11", "bad", failed=NOW - 4 * H, user="bob"),
              make_bundle("12", "ok-1", failed=NOW - 4 * H, user="cid")]  # fmt: skip
    ends = F.completions([done("10", NOW - 2 * H, "n[1-2]"), done("11", NOW - H, "n3"),
                          done("12", NOW - H, "ok-1")])  # fmt: skip
    rows = F.failed_only_here(failed, ends)
    assert [(r.node, r.jobs, r.users, r.suspect) for r in rows] == [
        ("bad", ("10", "11"), ("ann", "bob"), True)]  # fmt: skip


def test_what_does_not_count() -> None:
    failed = [make_bundle("20", "x", failed=NOW - 5 * H, user="ann")]
    not_yet = [done("20", NOW - 6 * H, "n1")]  # completed before it failed (another job)
    failed_again = [make_decision(NOW - H, job="20", ended_well=False, nodes="n1")]
    old_line = [make_decision(NOW - H, job="20", state="COMPLETED", requeue=False)]  # no nodes
    for decisions in (not_yet, failed_again, old_line):
        assert F.failed_only_here(failed, F.completions(decisions)) == []
    other_sluid = F.completions([done("20", NOW - H, "n1", sluid="S2")])
    assert F.failed_only_here([failed[0].replace(sluid="S1")], other_sluid) == []
    same = F.failed_only_here([failed[0].replace(sluid="S1")],
                              F.completions([done("20", NOW - H, "n1", sluid="S1")]))  # fmt: skip
    assert [(r.node, r.suspect) for r in same] == [("x", False)]  # one user: no suspect


def test_the_failing_ranks_node_alone_is_charged() -> None:
    run = [make_bundle("30", n, failed=NOW - 5 * H, user="ann", failing_node="n2")
           for n in ("n1", "n2", "n3")]  # fmt: skip
    rows = F.failed_only_here(run, F.completions([done("30", NOW - H, "n[4-6]")]))
    assert [r.node for r in rows] == ["n2"]
    unnamed = [b.replace(failing_node=None) for b in run]
    rows = F.failed_only_here(unnamed, F.completions([done("30", NOW - H, "n[4-6]")]))
    assert [r.node for r in rows] == ["n1", "n2", "n3"]


# ----------------------------------------------------------------- gauges and page


def sample_figures() -> F.Figures:
    drains, audit = history()
    failed = [make_bundle("10", "a", failed=NOW - 5 * H, user="ann"),
              make_bundle("11", "a", failed=NOW - 4 * H, user="bob")]  # fmt: skip
    decisions = [done("10", NOW - 2 * H, "b"), done("11", NOW - H, "c")]
    boards = {"a": "h100", "b": "h100", "c": "a100", "d": "a100"}
    return F.figures(drains, audit, failed, decisions, SINCE, NOW, boards, {"b"})


def test_the_gauges_are_bounded_and_say_the_figures() -> None:
    lost = [("nccl_timeout", 2, 16.5), ("made-up", 1, 1.0), ("undiagnosed", 1, 2.0)]
    samples = F.samples(sample_figures(), lost, {"a": 2})
    text = render(samples)
    for line in (
        f"gpugate_reason_grammar_version {REASON_GRAMMAR_VERSION}",
        "gpugate_fleet_window_failures 3", "gpugate_fleet_mtbf_hours 300",
        'gpugate_board_mtbf_hours{board="h100"} 144', 'gpugate_board_window_failures{board="a100"} 0',
        'gpugate_check_mtbf_hours{check="kernel.xid"} 450',
        'gpugate_node_mtbf_hours{node="a"} 108', 'gpugate_node_window_failures{node="b"} 1',
        'gpugate_node_repeat_drains{node="a"} 2',
        'gpugate_node_failed_only_here_jobs{node="a"} 2',
        'gpugate_node_failed_only_here_users{node="a"} 2',
        'gpugate_cause_window_gpu_hours_lost{cause="nccl_timeout"} 16.5',
        'gpugate_cause_window_failed_runs{cause="other"} 1',
    ):  # fmt: skip
        assert line in text.splitlines(), line
    series = {k for k, _ in samples}
    assert "gpugate_board_mtbf_hours" in series  # h100's; a100 failed never: no MTBF series
    assert ("gpugate_board_mtbf_hours", (("board", "a100"),)) not in samples
    failed = {labels for name, labels in samples if name == "gpugate_node_window_failures"}
    assert failed == {(("node", "a"),), (("node", "b"),)}  # c and d failed never: none
    assert "made-up" not in text


def test_an_unknown_check_is_counted_as_other() -> None:
    fig = F.figures([drain("a", NOW - DAY, "old.check")], [], [], [], SINCE, NOW, {"a": "h100"})
    text = render(F.samples(fig, [], {}))
    assert 'gpugate_check_window_failures{check="other"} 1' in text and "old.check" not in text


def test_the_page_shows_the_figures_with_their_definitions() -> None:
    html = R.render_html([], [], [], now=NOW, reliability=P.sections(sample_figures()))
    text = Page(section(html, "reliability")).all_text
    assert "MTBF = hours in service" in text and "h100 2 3 432.0 144.0" in text
    assert "all nodes 4 3 900.0 300.0" in text and "kernel.xid 4 2 900.0 450.0" in text
    here = Page(section(html, "failed-here")).all_text
    assert "a 2 2 10, 11 suspect" in here and "ann" not in here  # users counted, not named
    assert html.index('id="reliability"') < html.index('id="offenders"')


def test_report_json_and_the_metrics_file(tmp_path, monkeypatch, capsys) -> None:
    import time

    from gpugate.store import history as Hs

    state, prom = tmp_path / "state", tmp_path / "textfile"
    prom.mkdir()
    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {state}\nevidence_dir: {tmp_path / 'ev'}\n"
                   f"admin:\n  metrics_file: {prom / 'gpugate.prom'}\n")  # fmt: skip
    monkeypatch.setenv("GPUGATE_CONFIG", str(cfg))
    sinfo = {"nodes": [{"name": "vm", "state": "IDLE", "gres": "gpu:h100:8", "reason": ""}]}
    (tmp_path / "sinfo.json").write_text(json.dumps(sinfo))
    now = time.time()
    Hs.record_drain(str(state), "vm", "gpugate: gpu.ecc: x", when=now - 2 * DAY)
    Hs.record_resume(str(state), "vm", who="carol", why="fixed", when=now - 2 * DAY + 24 * H)
    assert cli.main(["report", "--json", "--sinfo-json", str(tmp_path / "sinfo.json")]) == 0
    doc = json.loads(capsys.readouterr().out)["reliability"]
    assert doc["boards"]["h100"]["failures"] == 1 and doc["nodes"]["vm"]["failures"] == 1
    assert doc["fleet"]["mtbf_hours"] == pytest.approx(30 * 24 - 24, abs=0.1)
    text = (prom / RELIABILITY_FILE).read_text()
    assert 'gpugate_node_window_failures{node="vm"} 1' in text
    assert 'gpugate_board_window_failures{board="h100"} 1' in text

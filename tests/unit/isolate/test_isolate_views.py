"""Isolated GPUs (issue 31) in every admin view: the node Comment read by each backend's
parser (recorded outputs with gpugate's Comment added, tests/fixtures/slurm/README.md), the
rows and text of `gpugate nodes`, the report's section and GPU-hours kept serving, and the
`gpugate_isolated_gpus` gauge."""

from __future__ import annotations

import json

import paths
import pytest
from exposition import assert_exposition
from slurm_recorded import FakeRunner, fake_pyslurm, fixture

from gpugate import cli
from gpugate.admin import nodes as A
from gpugate.admin import report as R
from gpugate.config import load_config
from gpugate.isolate.comment import IsolatedGpu, format_comment, parse_comment
from gpugate.slurm.cli import CliBackend
from gpugate.slurm.parse_json import parse_nodes_json, parse_sinfo_json
from gpugate.slurm.parse_text import parse_show_node_text
from gpugate.slurm.pyslurm import PyslurmBackend
from gpugate.slurm.records import NodeInfo
from gpugate.store import metrics as M

HOUR = 3600.0
NOW = 1_790_000_000.0
SINCE = 1_764_782_400
WHY = "gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100"
# As SlurmControl.set_node_comment writes it: after `gpugate: ` (gpugate/isolate/comment.py).
COMMENT = f"gpugate: gpugate-isolated: gpu3 minor=3 serial=1654922010523 since={SINCE} why={WHY}"
GPU3 = IsolatedGpu(index=3, minor=3, serial="1654922010523", since=SINCE, why=WHY)


# ------------------------------------------------------------------- every backend's parser


@pytest.mark.parametrize(
    ("rel", "parse"),
    [
        ("22.05/scontrol-show-node-o.isolated-comment.txt", parse_show_node_text),
        ("22.05/scontrol-show-node.isolated-comment.txt", parse_show_node_text),  # multi-line
        ("24.11-debian13/scontrol-show-node-o.isolated-comment.txt", parse_show_node_text),
        ("24.11-debian13/scontrol-show-node.isolated-comment.json", parse_nodes_json),
        ("22.05/sinfo.isolated-comment.json", parse_sinfo_json),
    ],
)
def test_each_parser_reads_the_comment_whole(rel, parse):
    [node] = parse(fixture(rel))
    assert node.comment == COMMENT
    assert parse_comment(node.comment) == [GPU3]
    assert node.gres_gpus == 7


def test_the_comment_ends_at_the_key_slurm_prints_after_it_not_inside_it():
    # 24.11 text: `Comment=... Extra=rack=r12`; the reason before it keeps its own end.
    [node] = parse_show_node_text(
        fixture("24.11-debian13/scontrol-show-node-o.isolated-comment.txt")
    )
    assert node.comment == COMMENT and node.reason == "Prolog error"
    # A why with words that look like scontrol keys (State=, Reason=) stays in the Comment.
    tricky = COMMENT.replace("120 > 100", "State=IDLE Reason=x Gres=gpu:8")
    line = fixture("22.05/scontrol-show-node-o.isolated-comment.txt").replace(COMMENT, tricky)
    [node] = parse_show_node_text(line)
    assert node.comment == tricky and node.state == "IDLE" and node.gres_gpus == 7
    assert parse_comment(node.comment)[0].why.endswith("State=IDLE Reason=x Gres=gpu:8")


def test_nodes_without_a_comment_have_none():
    for rel in (
        "22.05/scontrol-show-node-o.drained.txt",
        "24.11-debian13/scontrol-show-node.drained.json",
    ):
        parse = parse_nodes_json if rel.endswith(".json") else parse_show_node_text
        assert [n.comment for n in parse(fixture(rel))] == [""]


def test_an_aggregated_sinfo_record_gives_its_comment_only_to_a_lone_node():
    """23.02+ `sinfo --json` aggregates nodes ignoring the Comment, as it does the reason: the
    record's Comment is its first node's, so a record of two nodes gives neither one."""
    nodes = {
        n.name: n for n in parse_sinfo_json(fixture("24.11-debian13/sinfo.isolated-comment.json"))
    }
    assert nodes["gpu-node-01"].comment == nodes["gpu-node-02"].comment == ""
    assert [g.index for g in parse_comment(nodes["gpu-node-03"].comment)] == [5]


@pytest.mark.parametrize("version", ["22.5", "24.11"])
def test_the_pyslurm_backend_reads_the_comment(version):
    nodes = {
        "n1": NodeInfo(name="n1", state="IDLE", gres_gpus=7, comment=COMMENT),
        "n2": NodeInfo(name="n2", state="IDLE", gres_gpus=8),
    }
    backend = PyslurmBackend(module=fake_pyslurm(nodes, {}, version=version))
    assert backend.node("n1").comment == COMMENT
    assert {n: i.comment for n, i in backend.nodes().items()} == {"n1": COMMENT, "n2": ""}


# --------------------------------------------------------------------------- gpugate nodes


def isolated_node(name="gpu-07", gpus=7, comment=COMMENT, **kw) -> NodeInfo:
    return NodeInfo(name=name, state="IDLE", gres_gpus=gpus, comment=comment, **kw)


def test_a_row_lists_the_isolated_gpus_and_others_an_empty_list():
    rows = A.node_rows(A.as_groups([isolated_node(), isolated_node("gpu-08", 8, "")]), [], "/x",
                       now=NOW)  # fmt: skip
    got = {r.node: r.isolated_gpus for r in rows}
    assert got["gpu-08"] == ()
    assert [g.to_json() for g in got["gpu-07"]] == [{
        "index": 3, "minor": 3, "serial": "1654922010523", "since": "2025-12-03T17:20:00Z",
        "since_epoch": SINCE, "why": WHY,
    }]  # fmt: skip
    doc = json.loads(A.rows_json(rows))
    # The cache never mixes rows with GPUs up.
    assert doc == json.loads(json.dumps([r.to_json() for r in rows]))
    assert doc[0]["isolated_gpus"][0]["serial"] == "1654922010523"
    assert doc[1]["isolated_gpus"] == []
    # Existing keys stay (DESIGN.md: outside tests rely on them).
    assert {"node", "state", "drained", "reason", "action", "unknown_xids"} <= set(doc[0])


def test_drained_only_listing_keeps_nodes_with_isolated_gpus():
    nodes = [isolated_node(), isolated_node("gpu-08", 8, ""),
             NodeInfo(name="gpu-09", state="IDLE", flags=("DRAIN",), reason="IT-1")]  # fmt: skip
    rows = A.node_rows(A.as_groups(nodes), [], "/x", now=NOW, drained_only=True)
    assert sorted(r.node for r in rows) == ["gpu-07", "gpu-09"]


def test_text_lines_say_which_gpu_serial_since_and_why():
    rows = A.node_rows(A.as_groups([isolated_node()]), [], "/x", now=NOW)
    assert A.render_isolated(rows) == (
        f"gpu-07: isolated GPU 3 (serial 1654922010523) since 2025-12-03T17:20:00Z: {WHY}\n"
    )
    hostile = COMMENT.replace(WHY, "x\x1b[2J\u202eevil")
    rows = A.node_rows(A.as_groups([isolated_node(comment=hostile)]), [], "/x", now=NOW)
    assert "\x1b" not in A.render_isolated(rows) and "\u202e" not in A.render_isolated(rows)
    assert A.render_isolated(A.node_rows(A.as_groups([isolated_node(comment="")]), [], "/x")) == ""


def hidden_in_aggregate() -> str:
    """24.11 `sinfo --json`: the isolated gpu-node-03 aggregated with gpu-node-02 (not first)."""
    doc = json.loads(fixture("24.11-debian13/sinfo.two-drain-reasons.json"))
    idle = doc["sinfo"][1]
    idle["nodes"]["nodes"] = ["gpu-node-02", "gpu-node-03"]
    doc["sinfo"][0]["nodes"]["nodes"] = ["gpu-node-01"]
    doc["sinfo"][0]["reason"] = {"description": "", "time": 0, "user": ""}
    return json.dumps(doc)


def scontrol_with_comment() -> str:
    text = fixture("24.11-debian13/scontrol-show-node-o.two-drain-reasons.txt").splitlines()
    text[2] = text[2].replace("Gres=gpu:8", "Gres=gpu:7").rstrip() + f" Comment={COMMENT}"
    return "\n".join(text) + "\n"


def test_with_isolation_on_aggregated_nodes_are_read_one_by_one():
    runner = (FakeRunner().ok(("sinfo", "--json"), hidden_in_aggregate())
              .ok(("scontrol", "-o", "show", "node"), scontrol_with_comment()))  # fmt: skip
    groups = A.read_node_groups(CliBackend(runner=runner), per_node=True)
    assert runner.argvs == [("sinfo", "--json"), ("scontrol", "-o", "show", "node")]
    [entry] = A.isolated_gpus(groups)
    assert (entry.node, entry.gpu.index, entry.gpus_serving) == ("gpu-node-03", 3, 7)
    # Isolation off: one sinfo call, as before (the aggregate hides gpu-node-03's Comment).
    runner = FakeRunner().ok(("sinfo", "--json"), hidden_in_aggregate())
    groups = A.read_node_groups(CliBackend(runner=runner))
    assert runner.argvs == [("sinfo", "--json")] and A.isolated_gpus(groups) == []


def test_per_node_records_need_no_second_call():
    """22.05's `sinfo --json` has one record per node, each with its own Comment."""
    runner = FakeRunner().ok(("sinfo", "--json"), fixture("22.05/sinfo.isolated-comment.json"))
    groups = A.read_node_groups(CliBackend(runner=runner), per_node=True)
    assert runner.argvs == [("sinfo", "--json")]
    assert [(e.node, e.gpu.index, e.gpus_serving) for e in A.isolated_gpus(groups)] == [
        ("vm", 3, 7)
    ]


def test_wants_comments_follows_isolate_unit(tmp_path):
    site = tmp_path / "gpugate.yaml"
    site.write_text(f"state_dir: {tmp_path}\n")
    config = load_config(str(site))
    assert config.isolate is not None and not A.wants_comments(config)
    assert A.wants_comments(config.replace(isolate=config.isolate.replace(unit="gpu")))
    assert not A.wants_comments(config.replace(isolate=None)) and not A.wants_comments(None)


@pytest.fixture
def site(tmp_path, monkeypatch):
    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nevidence_dir: {tmp_path / 'ev'}\n"
                   "isolate:\n  unit: gpu\n")  # fmt: skip
    monkeypatch.setenv("GPUGATE_CONFIG", str(cfg))
    return tmp_path


def test_cli_nodes_text_and_json(site, capsys):
    saved = site / "sinfo.json"
    saved.write_text(fixture("22.05/sinfo.isolated-comment.json"))
    assert cli.main(["nodes", "--sinfo-json", str(saved)]) == 0
    out = capsys.readouterr().out
    assert f"vm: isolated GPU 3 (serial 1654922010523) since 2025-12-03T17:20:00Z: {WHY}" in out
    assert cli.main(["nodes", "--json", "--sinfo-json", str(saved)]) == 0
    [row] = json.loads(capsys.readouterr().out)["nodes"]
    assert [g["index"] for g in row["isolated_gpus"]] == [3]


# ------------------------------------------------------------------------------ the report


def entries(*nodes: NodeInfo) -> list[A.IsolatedOn]:
    return A.isolated_gpus(A.as_groups(nodes))


def test_gpu_hours_kept_serving_count_from_the_earliest_isolation_within_the_window():
    two = format_comment([GPU3.replace(since=int(NOW - 10 * HOUR)),
                          GPU3.replace(index=5, minor=5, since=int(NOW - 2 * HOUR))])  # fmt: skip
    isolated = entries(isolated_node("a", 6, two), isolated_node("b", 7, COMMENT),
                       isolated_node("c", None, COMMENT))  # fmt: skip
    assert [(e.node, e.gpu.index) for e in isolated] == [("a", 3), ("a", 5), ("b", 3), ("c", 3)]
    kept = R.kept_serving(isolated, since=NOW - 24 * HOUR, now=NOW)
    # a: 6 GPUs for 10 h; b: isolated before the window, 7 GPUs for its 24 h; c: count unknown.
    assert kept == {"a": pytest.approx(60.0), "b": pytest.approx(168.0)}
    assert R.kept_serving([], NOW - HOUR, NOW) == {}


def test_the_page_has_a_section_and_cards_for_isolated_gpus():
    hostile = COMMENT.replace(WHY, "<script>alert(1)</script>")
    isolated = entries(isolated_node("gpu-07", 7, hostile))
    page = R.render_html([], [], [], window_days=30, now=NOW, total_nodes=1, isolated=isolated)
    assert '<h2 id="isolated">Isolated GPUs</h2>' in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert '<div class="card" id="isolated-card"><b>1</b>GPUs isolated</div>' in page
    hours = (NOW - (NOW - 30 * 86400)) / HOUR * 7  # isolated before the window: all of it
    assert f'<div class="card" id="kept-card"><b>{hours:.1f}</b>GPU-hours kept serving' in page
    empty = R.render_html([], [], [], now=NOW, total_nodes=1)
    assert "No GPU is isolated" in empty and "<b>0</b>GPUs isolated" in empty


def test_report_page_shows_an_isolated_node_apart_from_the_drained_ones(site, capsys):
    saved = site / "sinfo.json"
    saved.write_text(fixture("22.05/sinfo.isolated-comment.json"))
    page = site / "report.html"
    assert cli.main(["report", "--html", str(page), "--sinfo-json", str(saved)]) == 0
    assert "0 drained node(s)" in capsys.readouterr().out
    html = page.read_text()
    drained = html.split('<h2 id="drained">')[1].split("<h2")[0]
    isolated = html.split('<h2 id="isolated">')[1].split("<h2")[0]
    assert "No drained nodes" in drained and ">vm<" not in drained
    assert ">vm<" in isolated and "1654922010523" in isolated


def test_report_json_lists_isolated_gpus_and_kept_hours(site, capsys):
    saved = site / "sinfo.json"
    saved.write_text(fixture("22.05/sinfo.isolated-comment.json"))
    assert cli.main(["report", "--json", "--sinfo-json", str(saved)]) == 0
    doc = json.loads(capsys.readouterr().out)
    [gpu] = doc["isolated_gpus"]
    assert {k: gpu[k] for k in ("node", "index", "minor", "serial", "why")} == {
        "node": "vm", "index": 3, "minor": 3, "serial": "1654922010523", "why": WHY}  # fmt: skip
    assert gpu["since"] == "2025-12-03T17:20:00Z"
    # Isolated long before the 30-day window: 7 GPUs for the whole window.
    assert doc["gpu_hours_kept_serving"] == pytest.approx(30 * 24 * 7, rel=1e-3)


# ------------------------------------------------------------------------------- metrics


def test_note_isolated_sets_the_gauge_and_keeps_the_node_series(tmp_path):
    prom = tmp_path / "textfile" / "gpugate.prom"
    prom.parent.mkdir()
    site = tmp_path / "site.yaml"
    site.write_text(f"state_dir: {tmp_path / 'state'}\nadmin:\n  metrics_file: {prom}\n")
    config = load_config(str(site))
    assert M.note_run(config, "n1", "prolog", drained_check="gpu.ecc") is True
    assert M.note_isolated(config, "n1", 1) is True
    text = prom.read_text()
    assert assert_exposition(text)["gpugate_isolated_gpus"] == "gauge"
    samples = M.parse_samples(text)
    assert samples[("gpugate_isolated_gpus", (("node", "n1"),))] == 1
    assert samples[("gpugate_drains_total", (("node", "n1"), ("check", "gpu.ecc")))] == 1
    assert M.note_run(config, "n1", "epilog") is True  # a later hook run keeps the gauge
    assert M.parse_samples(prom.read_text())[("gpugate_isolated_gpus", (("node", "n1"),))] == 1
    assert M.note_isolated(config, "n1", 0) is True  # put back: 0, not a stale 1
    assert M.parse_samples(prom.read_text())[("gpugate_isolated_gpus", (("node", "n1"),))] == 0


def test_note_isolated_never_raises_and_needs_node_exporters_directory(tmp_path):
    site = tmp_path / "site.yaml"
    prom = tmp_path / "missing" / "gpugate.prom"
    site.write_text(f"state_dir: {tmp_path / 'state'}\nadmin:\n  metrics_file: {prom}\n")
    config = load_config(str(site))
    assert M.note_isolated(config, "n1", 1) is False and not prom.parent.exists()
    assert M.note_isolated(config, None, 1) is False
    prom.parent.mkdir()
    prom.mkdir()  # a directory where the file should be: logged, not raised
    assert M.note_isolated(config, "n1", 1) is False


def test_the_fixture_comment_is_what_format_comment_writes():
    assert f"gpugate: {format_comment([GPU3])}" == COMMENT
    for path in paths.FIXTURES.glob("slurm/*/*.isolated-comment.*"):
        assert "gpugate-isolated: gpu" in path.read_text(), path

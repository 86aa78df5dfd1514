"""The repair ledger shown (issue 45): `gpugate nodes NODE` (text and --json), the RMA list
(`gpugate nodes --rma`: a node leaves it when an admin's act or a resume follows its RMA line),
and the report's "RMA list" and per-node ledger sections, escaped."""

from __future__ import annotations

import json

from admin_site import gpugate_sinfo, node, site  # noqa: F401  (site: a fixture)

from gpugate.admin import ledger_view as V
from gpugate.admin.nodes import node_rows
from gpugate.admin.report import render_html
from gpugate.cli import main
from gpugate.config import load_config
from gpugate.store import history as H
from gpugate.store import ledger as L

T0 = 1_790_000_000.0
REASON = "gpugate: kernel.xid: GPU2 Xid 79 GPU has fallen off the bus"
SERIAL = "1650924060795"


def where() -> str:
    return H.history_dir(load_config(None))


def repair_loop(directory: str, name: str = "vm", then: str | None = None,
                serial: str = SERIAL) -> None:  # fmt: skip
    """A drain, a reboot, the same GPU failing again (a second drain) and the RMA verdict."""
    H.record_drain(directory, name, REASON, when=T0, hook="health", gpu=serial, bundle="7/vm-r0")
    L.record(directory, name, L.REBOOT, who="gpugate health", why="Xid 79", outcome="requested",
             when=T0 + 10)  # fmt: skip
    H.record_drain(directory, name, REASON, when=T0 + 3600, hook="health", gpu=serial)
    L.record(directory, name, L.RMA, who="gpugate health", why="GPU2 fell off the bus twice",
             outcome="stays drained", check="kernel.xid", gpu=serial, when=T0 + 3601)  # fmt: skip
    if then == "admin":
        H.record_resume(directory, name, who="admin (outside gpugate)", step=L.ADMIN,
                        result="resumed outside gpugate", when=T0 + 7200)  # fmt: skip
    elif then == "resume":
        H.record_resume(directory, name, who="alice", why="GPU2 swapped", when=T0 + 7200)


def nodes(site, capsys, *extra: str) -> str:  # noqa: F811
    (site / "sinfo.json").write_text(gpugate_sinfo(REASON))
    assert main(["nodes", "--sinfo-json", str(site / "sinfo.json"), *extra]) == 0
    return capsys.readouterr().out


def test_nodes_node_shows_its_ledger_newest_last(site, capsys):  # noqa: F811
    repair_loop(where())
    out = nodes(site, capsys, "vm")
    table, ledger = out.split("\nRepair ledger of vm")
    assert table.splitlines()[1].startswith("vm ")  # the node's row, and only it
    assert len(table.strip().splitlines()) == 2
    steps = [line.split()[1] for line in ledger.splitlines()[1:]]
    assert steps == ["DRAIN", "REBOOT", "DRAIN", "RMA"]
    first = ledger.splitlines()[1]
    assert "gpugate health  drained: " + REASON in first and first.endswith("[7/vm-r0]")


def test_nodes_node_json_has_the_ledger_with_every_key(site, capsys):  # noqa: F811
    repair_loop(where())
    doc = json.loads(nodes(site, capsys, "vm", "--json"))
    assert [r["node"] for r in doc["nodes"]] == ["vm"]
    assert [e["step"] for e in doc["ledger"]] == ["drain", "reboot", "drain", "rma"]
    rma = doc["ledger"][-1]
    assert rma == {"at": "2026-09-21T15:13:21Z", "when": T0 + 3601, "step": "rma",
                   "who": "gpugate health", "outcome": "stays drained",
                   "why": "GPU2 fell off the bus twice", "evidence": None,
                   "check": "kernel.xid", "gpu": SERIAL, "reason": None}  # fmt: skip


def test_nodes_node_shows_at_most_the_newest_30_steps(site, capsys):  # noqa: F811
    for i in range(40):
        L.record(where(), "vm", L.WAIT, who="gpugate health", why=f"job {i}", when=T0 + i)
    doc = json.loads(nodes(site, capsys, "vm", "--json"))
    assert [e["why"] for e in doc["ledger"]] == [f"job {i}" for i in range(10, 40)]


def test_a_node_with_no_steps_says_so_and_others_show_no_ledger(site, capsys):  # noqa: F811
    assert "Repair ledger of vm: no steps recorded." in nodes(site, capsys, "vm")
    assert "ledger" not in json.loads(nodes(site, capsys, "--json"))
    assert "Repair ledger" not in nodes(site, capsys)


def test_ledger_text_is_printable(site, capsys):  # noqa: F811
    L.record(where(), "vm", L.ADMIN, who="eve\x1b[31m", why="fixed\u202ereversed", when=T0)
    out = nodes(site, capsys, "vm")
    assert "\x1b" not in out and "\u202e" not in out and "eve\\x1b[31m" in out


def test_the_rma_list_keeps_an_rma_no_admin_act_or_resume_followed(tmp_path):
    repair_loop(str(tmp_path / "a"))
    [item] = V.rma_list(L.entries(str(tmp_path / "a")), H.drains(str(tmp_path / "a")))
    assert (item.node, item.gpu, item.check, item.drains, item.at) == (
        "vm", SERIAL, "kernel.xid", 2, "2026-09-21T15:13:21Z")  # fmt: skip
    for then in ("admin", "resume"):  # a person replaced the part and put the node back
        d = str(tmp_path / then)
        repair_loop(d, then=then)
        assert V.rma_list(L.entries(d), H.drains(d)) == []


def test_a_new_rma_after_a_resume_is_on_the_list_again(tmp_path):
    d = str(tmp_path)
    repair_loop(d, then="resume")
    L.record(d, "vm", L.RMA, who="gpugate health", why="again", when=T0 + 9000)
    L.record(d, "vm", L.REFUSED, who="bob", when=T0 + 9001)  # not a person's fix
    [item] = V.rma_list(L.entries(d), H.drains(d))
    assert item.why == "again" and item.gpu is None


def test_the_rma_drains_count_the_part_as_the_ladder_does_in_the_window_and_no_drill(tmp_path):
    d = str(tmp_path)
    repair_loop(d)  # two drains of SERIAL for kernel.xid on vm
    H.record_drain(d, "gpu-09", "gpugate: gpu.ecc: GPU0 120", when=T0 + 5000, gpu=SERIAL)  # moved
    H.record_drain(d, "vm", "gpugate: DRILL d1: kernel.xid: x", when=T0 + 6000, gpu=SERIAL)
    [item] = V.rma_list(L.entries(d), H.drains(d))
    assert item.drains == 3  # the GPU's, on any node (more than the check's 2 on vm)
    [item] = V.rma_list(L.entries(d), H.drains(d), since=T0 + 1)
    assert item.drains == 2
    L.record(d, "vm", L.RMA, who="gpugate health", why="no GPU named", check="kernel.xid",
             when=T0 + 7000)  # fmt: skip
    [item] = V.rma_list(L.entries(d), H.drains(d))
    assert item.drains == 2  # the check's, on the node


def test_nodes_rma_reads_no_slurm_and_prints_text_and_json(site, capsys):  # noqa: F811
    repair_loop(where())
    repair_loop(where(), "gpu-07", then="admin", serial="1650924069999")
    assert main(["nodes", "--rma", "--window-days", "36500"]) == 0  # no sinfo: Slurm not asked
    head, row = capsys.readouterr().out.splitlines()
    assert head.split() == ["NODE", "GPU", "CHECK", "SINCE", "DRAINS", "WHY"]
    assert row.split()[:5] == ["vm", SERIAL, "kernel.xid", "2026-09-21T15:13:21Z", "2"]
    assert main(["nodes", "--rma", "--json", "--window-days", "36500"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["window_days"] == 36500 and [i["node"] for i in doc["rma"]] == ["vm"]
    assert doc["rma"][0] == {"node": "vm", "when": T0 + 3601, "at": "2026-09-21T15:13:21Z",
                             "gpu": SERIAL, "check": "kernel.xid", "who": "gpugate health",
                             "why": "GPU2 fell off the bus twice", "evidence": None,
                             "drains": 2}  # fmt: skip


def test_an_empty_rma_list_says_so(site, capsys):  # noqa: F811
    assert main(["nodes", "--rma"]) == 0
    assert capsys.readouterr().out.startswith("RMA list: empty")


def test_the_report_shows_the_rma_list_and_each_drained_nodes_ledger_escaped(tmp_path):
    d = str(tmp_path)
    repair_loop(d)
    L.record(d, "vm", L.ADMIN, who="<script>alert(1)</script>", why="a & b", when=T0 + 3602)
    L.record(d, "vm", L.RMA, who="gpugate health", why="<b>again</b>", gpu=SERIAL,
             check="kernel.xid", when=T0 + 3603)  # fmt: skip
    L.record(d, "idle-node", L.DRAIN, who="gpugate prolog", why="not drained now", when=T0)
    rows = node_rows([(node("vm", reason=REASON), ["vm"])], H.drains(d), str(tmp_path / "ev"),
                     window_days=36500, rma_after=2, now=T0 + 4000)  # fmt: skip
    page = render_html(rows, H.drains(d), [], window_days=36500, now=T0 + 4000,
                       ledger=L.entries(d))  # fmt: skip
    rma = page.split('<h2 id="rma">')[1].split("<h2")[0]
    assert "&lt;b&gt;again&lt;/b&gt;" in rma and f"<code>{SERIAL}</code>" in rma
    ledger = page.split('<h2 id="ledger">')[1].split("<h2")[0]
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in ledger
    assert "a &amp; b" in ledger and "not drained now" not in ledger  # drained nodes only
    assert ledger.count('<td class="node">vm</td>') == 6

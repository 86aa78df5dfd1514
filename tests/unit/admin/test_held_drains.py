"""Suppressed drains are loud: a drain the budget held back shows as "would drain (budget)"
in `gpugate nodes`, `gpugate report`, `gpugate evidence` and `gpugate resume`, all read
from the one record the hooks write (store/held.py)."""

from __future__ import annotations

import json

from admin_site import bundle, gpugate_sinfo, node, site  # noqa: F401  (site: a fixture)
from factories import default_config
from report_page import Page

from gpugate import cli
from gpugate.admin import nodes as A
from gpugate.admin import report as R
from gpugate.admin.resume import held_notice
from gpugate.clock import parse_utc
from gpugate.commands.evidence import mark_held
from gpugate.hooks.collect import _action
from gpugate.hooks.epilog import EpilogResult
from gpugate.store import held as held_store
from gpugate.store import history as H
from gpugate.store.entries import DrainEntry, HeldEntry

NOW = 1_790_000_000.0
REASON = "gpugate: kernel.gpu_bus: GPU1 fell off the bus"
WHY = "partition gpu: gpugate already drained 1 of 3 nodes (limit 1)"


def held_entry(name: str = "gpu-02", when: float = NOW - 60) -> HeldEntry:
    return HeldEntry(node=name, when=when, at=H.iso(when), check="kernel.gpu_bus", reason=REASON,
                     why=WHY)  # fmt: skip


def test_current_held_is_fresh_and_not_superseded_by_a_drain():
    entries = [held_entry("a"), held_entry("b"), held_entry("c", NOW - 2 * 86400)]
    drains = [DrainEntry(node="b", when=NOW - 30, check="kernel.gpu_bus", reason=REASON)]
    assert list(held_store.current_held(entries, drains, NOW)) == ["a"]


def test_nodes_rows_show_the_held_drain_first():
    nodes = [node("gpu-01", reason="gpugate: gpu.ecc: x"), node("gpu-02", flags=()),
             node("gpu-03", flags=())]  # fmt: skip
    held = {"gpu-02": held_entry()}
    rows = A.node_rows(A.as_groups(nodes), [], "/ev", now=NOW, held=held)
    assert [r.node for r in rows] == ["gpu-02", "gpu-01", "gpu-03"]
    first = rows[0]
    assert first.action == A.HELD == "would drain (budget)" and first.check == "kernel.gpu_bus"
    assert first.held.reason == REASON and first.held.why == WHY
    assert first.drained is False
    # --drained keeps it: gpugate wanted it drained.
    only = A.node_rows(A.as_groups(nodes), [], "/ev", now=NOW, drained_only=True, held=held)
    assert [r.node for r in only] == ["gpu-02", "gpu-01"]
    table = A.render_table(rows)
    line = next(x for x in table.splitlines() if x.startswith("gpu-02"))
    assert "would drain (budget)" in line and f"wanted: {REASON} (held back: {WHY})" in line
    # A node Slurm shows drained now is drained, whatever was held before.
    drained = A.node_rows(
        A.as_groups([node("gpu-02", reason=REASON)]), [], "/ev", now=NOW, held=held
    )
    assert drained[0].action != A.HELD


def test_nodes_cli_reads_the_held_record(site, capsys):  # noqa: F811
    saved = site / "sinfo.json"
    doc = json.loads(gpugate_sinfo(""))
    doc["nodes"][0].update(state_flags=[], reason="")  # in service
    saved.write_text(json.dumps(doc))
    held_store.record_held(str(site / "state"), "vm", REASON, WHY)
    assert cli.main(["nodes", "--sinfo-json", str(saved), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["nodes"]
    assert row["action"] == "would drain (budget)" and row["would_drain_why"] == WHY


def test_report_shows_the_held_drain():
    nodes = [node("gpu-02", flags=())]
    rows = A.node_rows(A.as_groups(nodes), [], "/ev", now=NOW, drained_only=True,
                       held={"gpu-02": held_entry()})  # fmt: skip
    page = Page(R.render_html(rows, [], [], now=NOW, total_nodes=3, held=[held_entry()]))
    text = page.all_text
    assert "held back by the drain budget" in text and f"wanted: {REASON}" in text
    assert text.count("would drain (budget)") >= 3  # the card, the row, the timeline
    assert ("id", "would-card") in page.attrs


def test_the_epilog_says_would_drain_not_refused():
    result = EpilogResult(abnormal=True, why="x", reason=REASON)
    assert _action(result.replace(blocked_by="budget"), False) == "would drain (budget)"
    assert _action(result.replace(blocked_by="admin"), False) == "drain refused (not gpugate's)"
    assert _action(result.replace(blocked_by="error"), False) == "drain failed (scontrol)"
    assert _action(result.replace(drained=True), False) == "drained"


def test_evidence_corrects_old_bundles_from_the_held_record(site, capsys):  # noqa: F811
    at = "2026-11-20T10:00:00Z"
    old = {"node": "gpu-02", "collected_at": at, "action": "drain refused (not gpugate's)",
           "drain_reason": REASON}  # fmt: skip
    when = parse_utc(at)
    [marked] = mark_held([old], [held_entry(when=when + 5)])
    assert marked["action"] == "would drain (budget)" and marked["held_why"] == WHY
    # Another reason, another node, or a day apart: not that drain.
    assert mark_held([old], [held_entry(when=when + 86400)])[0]["action"] == old["action"]
    assert mark_held([old], [held_entry(when=when).replace(node="x")])[0] == old

    bundle(site, "300", "gpu-02", collected_at=at, action="drain refused (not gpugate's)",
           drain_reason=REASON)  # fmt: skip
    held_store.record_held(str(site / "state"), "gpu-02", REASON, WHY, when=when)
    held_store.record_held(str(site / "state"), "gpu-02", REASON, WHY)  # standing now
    assert cli.main(["evidence", "gpu-02", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bundles"][0]["action"] == "would drain (budget)"
    assert out["would_drain"]["reason"] == REASON
    assert cli.main(["evidence", "gpu-02"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("gpu-02: would drain (budget) since ") and f"held back: {WHY}" in text


def test_resume_of_a_held_node_says_what_happened(tmp_path):
    config = default_config().replace(state_dir=str(tmp_path))
    assert held_notice(config, "gpu-02") is None
    held_store.record_held(str(tmp_path), "gpu-02", REASON, WHY)
    said = held_notice(config, "gpu-02")
    assert said.startswith(
        "gpu-02 is in service, but gpugate wanted it drained: would drain (budget)"
    )
    assert WHY in said and REASON in said


def test_a_drain_clears_the_stale_would_drain_comment_it_supersedes(tmp_path):
    """A node held back once ("would drain" in its Comment) and drained by its next job: the
    Comment no longer says what the node is (seen in CI on the pyslurm backend)."""
    from fakes import FakeSlurm, idle

    from gpugate.gate.drain import drain_counted
    from gpugate.slurm.reasons import admin_comment, budget_comment, drain_reason

    def drain_node(slurm, node, check, detail):  # the Drain step's primitive, no budget
        return drain_counted(slurm, node, drain_reason(check, detail), None, check)

    held = idle("n1").replace(comment=admin_comment(budget_comment(WHY, REASON)))
    slurm = FakeSlurm([held, "n2", "n3", "n4"])
    outcome = drain_node(slurm, "n1", "kernel.gpu_bus", "GPU1 fell off the bus")
    assert outcome.drained
    assert slurm.node_comments == [("n1", "")]
    other = FakeSlurm([idle("n1").replace(comment="an admin's note"), "n2", "n3", "n4"])
    assert drain_node(other, "n1", "kernel.gpu_bus", "GPU1").drained
    assert other.node_comments == []  # someone else's Comment is left alone

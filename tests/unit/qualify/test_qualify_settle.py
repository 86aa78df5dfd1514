"""A qualification's new drain is a plan the executor carries out (gpugate/qualify/settle.py).

The plan is gpugate's every drain (act.plans.budget_drain): count, drain, undo beyond the budget,
and when the budget holds the drain back, say so (Comment, log line, event) and record it.
qualify_nodes runs on FakeSlurm and test_qualify_run's FakeOps.
"""

from __future__ import annotations

import json

from fakes import FakeSlurm
from qualify_ops import FAST, HELD_BACK, NODES, ROOM, SLOW, FakeOps, config_with, go

from gpugate.act import steps as S
from gpugate.act.execute import WOULD, Hands, execute
from gpugate.qualify.settle import drain_plan
from gpugate.slurm.control import SlurmError
from gpugate.store.held import held_entries
from gpugate.store.history import drains
from gpugate.store.qualify import qualifications

DETAIL = "allreduce: 2.00 GB/s is below the floor 8.00 GB/s (job 102)"


def test_the_plan_drains_within_the_budget_and_says_and_records_a_held_drain():
    plan = drain_plan("n2", DETAIL)
    assert [type(s) for s in plan] == [S.Drain, S.Undo, S.TellHeld, S.RecordHeld]
    assert plan[0] == S.Drain(node="n2", check="qualify", reason=f"gpugate: qualify: {DETAIL}")
    assert plan[1] == S.Undo(node="n2", check="qualify")
    assert [s.when for s in plan] == [S.ALWAYS, S.DRAINED, S.HELD, S.HELD]


def test_a_dry_run_of_the_plan_does_nothing(tmp_path):
    config = config_with(tmp_path, HELD_BACK)  # held back, were it counted
    slurm = FakeSlurm(NODES)
    asked: list[str] = []
    slurm.nodes = lambda names=None: asked.append("nodes")  # type: ignore[method-assign]
    slurm.node = lambda name: asked.append(f"node {name}")  # type: ignore[method-assign]
    report = execute(drain_plan("n2", DETAIL), Hands(config, slurm), dry_run=True)
    assert {o.status for o in report.outcomes} == {WOULD} and report.drain is None
    assert report.lines() == [
        f"would drain n2: gpugate: qualify: {DETAIL}",
        "would undo the drain of n2 if beyond the budget",
        "would say the held drain of n2 (node comment, log line, event) if the budget holds it back",
        "would record the held drain of n2 if the budget holds it back",
    ]
    # Nothing asked of Slurm (not even the count), nothing written.
    assert asked == [] and slurm.calls == [] and slurm.drains == [] and slurm.node_comments == []
    assert not (tmp_path / "state").exists()


def test_a_new_failure_within_the_budget_is_drained_by_the_plan(tmp_path):
    config = config_with(tmp_path, ROOM)
    slurm = FakeSlurm(NODES)
    result = go(config, slurm, FakeOps(slurm, {"n1": FAST, "n2": SLOW, "n3": FAST}))
    v = result.verdicts["n2"]
    assert v["action"] == "drained" and slurm.infos["n2"].reason.startswith("gpugate: qualify: ")
    assert held_entries(config.state_dir) == [] and slurm.node_comments == []
    [drain] = drains(config.state_dir, "n2")
    assert (drain.reason, drain.hook) == (slurm.infos["n2"].reason, "qualify")


def test_a_new_failure_over_the_budget_is_said_and_recorded_by_the_plan(tmp_path, capsys):
    config = config_with(tmp_path, HELD_BACK)
    slurm = FakeSlurm(NODES)
    result = go(config, slurm, FakeOps(slurm, {"n1": FAST, "n2": SLOW, "n3": FAST}))
    v = result.verdicts["n2"]
    assert v["action"].startswith("not drained (budget: ") and slurm.drains == []
    [entry] = held_entries(config.state_dir)  # the RecordHeld step, drain_node's no more
    assert entry.node == "n2" and entry.reason.startswith("gpugate: qualify: allreduce: 2.00")
    assert v["action"] == f"not drained (budget: {entry.why})"
    [(node, comment)] = slurm.node_comments  # the TellHeld step: Comment, log line, event
    assert node == "n2" and "would drain (budget exceeded" in comment and entry.reason in comment
    events = [json.loads(line) for line in (tmp_path / "state" / "events.jsonl").open()]
    [budget] = [e for e in events if e["hook"] == "budget"]
    assert (budget["outcome"], budget["node"], budget["why"], budget["reason"]) == (
        "budget_exceeded", "n2", entry.why, entry.reason)  # fmt: skip
    assert f"DRAIN BUDGET EXCEEDED: not draining n2: {entry.why}" in capsys.readouterr().err
    assert drains(config.state_dir, "n2") == []  # not drained: no drain in the history
    assert not qualifications(config.state_dir, "n2")[0].passed


def test_a_new_drain_that_raises_is_reported_and_the_records_still_written(tmp_path, capsys):
    config = config_with(tmp_path, ROOM)
    slurm = FakeSlurm(NODES)
    slurm.errors["drain"] = SlurmError("Unable to contact slurm controller")
    result = go(config, slurm, FakeOps(slurm, {"n1": FAST, "n2": SLOW, "n3": FAST}))
    v = result.verdicts["n2"]
    assert v["action"] == "not drained (error: SlurmError: Unable to contact slurm controller)"
    assert "gpugate: qualify: drain n2: gpugate: qualify: " in capsys.readouterr().err
    assert [e.node for e in qualifications(config.state_dir)] == NODES
    assert held_entries(config.state_dir) == [] and drains(config.state_dir) == []

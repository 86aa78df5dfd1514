"""The executor (gpugate/act/execute.py): each step kind carried out, each on its own, reported.

Slurm is the fake adapter (tests/support/fakes.py), passed in; the stores write under tmp_path.
"""

from __future__ import annotations

import json

import paths
import pytest
from factories import default_config
from fakes import NODE, FakeSlurm

from gpugate.act import steps as S
from gpugate.act.execute import DONE, FAILED, SKIPPED, WOULD, Hands, execute, planned
from gpugate.checks.findings import fail
from gpugate.slurm.control import SlurmError
from gpugate.store import history as H

REASON = "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100"
REASON_HELD = "gpugate: gpu.ecc: GPU3 ECC 120 > 100"  # drain_steps' reason for that failure


@pytest.fixture
def config(tmp_path):
    c = default_config()
    metrics = tmp_path / "prom" / "gpugate.prom"
    metrics.parent.mkdir()
    return c.replace(
        state_dir=str(tmp_path / "state"),
        budget=c.budget.replace(settle_s=0, jitter_s=0),
        admin=c.admin.replace(metrics_file=str(metrics)),
    )


def hands(config, slurm=None, **kw):
    return Hands(config, slurm or FakeSlurm(), **kw)


def drain_plan(job="42"):
    return (
        S.Drain(node=NODE, check="gpu.ecc", reason=REASON),
        S.Undo(node=NODE, check="gpu.ecc"),
        S.Isolate(node=NODE, failing=(fail("gpu.ecc", "GPU3 ECC", gpu=3),)),
        S.Refuse(job_id=job, reason=REASON),
        S.Note(target="job", name=job, text="gpugate: node n refused: gpu.ecc: x", when=S.NOT_HELD),
    )


def statuses(report):
    return [(o.kind, o.status) for o in report.outcomes]


def test_a_drain_plan_drains_keeps_refuses_and_explains(config, tmp_path):
    slurm = FakeSlurm()
    report = execute(drain_plan(), hands(config, slurm))
    assert slurm.drains == [(NODE, REASON)]
    assert report.drain is not None and report.drain.drained
    assert statuses(report) == [("drain", DONE), ("undo", DONE), ("isolate", DONE),
                                ("refuse", DONE), ("note", DONE)]  # fmt: skip
    refused = json.loads((tmp_path / "state" / "jobs" / "42" / "refused.json").read_text())
    assert refused == {"reason": REASON}
    assert [c for _, c in slurm.comments] == ["gpugate: node n refused: gpu.ecc: x"]
    assert report.lines()[0] == f"drain {NODE}: {REASON} (drained)"


def test_an_admins_drain_is_left_and_what_depends_on_ours_skipped(config):
    slurm = FakeSlurm()
    slurm.infos[NODE] = slurm.infos[NODE].replace(flags=("DRAIN",), reason="IT-4461 swap PSU")
    report = execute(drain_plan(), hands(config, slurm))
    assert slurm.drains == []  # the ownership rule stays in SlurmControl.drain
    assert report.drain.blocked_by == "admin"
    assert statuses(report)[:3] == [("drain", DONE), ("undo", SKIPPED), ("isolate", SKIPPED)]
    assert statuses(report)[3:] == [("refuse", DONE), ("note", DONE)]  # not the budget


def test_a_drain_the_budget_holds_back_refuses_nothing(config):
    slurm = FakeSlurm()
    held = config.replace(budget=config.budget.replace(max_drained_share=0.0, min_drains_allowed=0))
    report = execute(drain_plan(), hands(held, slurm))
    assert report.drain.blocked_by == "budget" and slurm.drains == []
    assert [o.status for o in report.outcomes[1:]] == [SKIPPED] * 4
    assert "budget" in report.outcomes[-1].said


def test_a_held_drain_is_recorded_by_its_step_and_a_dry_run_records_none(config, tmp_path):
    from gpugate.act.plans import drain_steps
    from gpugate.store.held import held_entries

    slurm = FakeSlurm()
    held = config.replace(budget=config.budget.replace(max_drained_share=0.0, min_drains_allowed=0),
                          admin=config.admin.replace(history_dir=str(tmp_path / "hist")))  # fmt: skip
    plan = drain_steps(NODE, [fail("gpu.ecc", "GPU3 ECC 120 > 100", gpu=3)])
    assert [type(s) for s in plan] == [S.Drain, S.Undo, S.TellHeld, S.RecordHeld, S.Isolate]
    dry = execute(plan, hands(held, slurm), dry_run=True)
    assert dry.lines()[2:4] == [
        f"would say the held drain of {NODE} (node comment, log line, event) if the budget "
        "holds it back",
        f"would record the held drain of {NODE} if the budget holds it back",
    ]
    assert not (tmp_path / "hist").exists() and slurm.node_comments == []
    assert not (tmp_path / "state").exists()  # no log line, no event
    report = execute(plan, hands(held, slurm))
    assert report.drain.held and statuses(report)[2:4] == [("note", DONE), ("record", DONE)]
    [entry] = held_entries(str(tmp_path / "hist"))
    assert (entry.node, entry.reason) == (NODE, report.drain.reason)
    assert entry.why == report.drain.why and "already drained" in entry.why
    # Said by its step: the Comment, the loud line and the event, each naming why and what.
    [(node, comment)] = slurm.node_comments
    assert node == NODE and "would drain (budget exceeded" in comment and REASON_HELD in comment
    [event] = [json.loads(line) for line in (tmp_path / "state" / "events.jsonl").open()]
    assert (event["hook"], event["outcome"], event["node"]) == ("budget", "budget_exceeded", NODE)
    assert (event["why"], event["reason"]) == (entry.why, entry.reason)
    # Within the budget the drain is done and nothing is held: the steps are skipped.
    other = FakeSlurm()
    report = execute(plan, hands(config, other))
    assert report.drain.drained and not report.drain.held
    assert [o.status for o in report.outcomes[2:4]] == [SKIPPED, SKIPPED]
    assert report.outcomes[3].said == "the drain budget held nothing back"
    assert held_entries(str(tmp_path / "hist")) == [entry] and other.node_comments == []


def test_a_failing_step_does_not_stop_the_others(config, tmp_path, capsys):
    slurm = FakeSlurm()
    slurm.errors["admin_comment"] = SlurmError("slurmctld down")
    plan = (
        *drain_plan(),
        S.RecordEvent(directory=config.state_dir, hook="prolog", fields={"x": 1}),
    )
    report = execute(plan, hands(config, slurm, hook="prolog"), kept="decision")
    assert statuses(report)[-2:] == [("note", FAILED), ("record", DONE)]
    assert "slurmctld down" in report.outcomes[-2].said
    event = json.loads((tmp_path / "state" / "events.jsonl").read_text().splitlines()[-1])
    assert (event["hook"], event["x"]) == ("prolog", 1)
    err = capsys.readouterr().err
    assert (
        "gpugate: prolog: admin comment failed (SlurmError: slurmctld down); decision kept" in err
    )


def test_a_drain_that_raises_skips_what_needs_it_and_still_refuses(config):
    slurm = FakeSlurm()
    slurm.errors["drain"] = SlurmError("Unable to contact slurm controller")
    report = execute(drain_plan(), hands(config, slurm))
    assert (report.drain.drained, report.drain.blocked_by) == (False, "error")
    assert "Unable to contact" in report.drain.why
    assert statuses(report) == [("drain", FAILED), ("undo", SKIPPED), ("isolate", SKIPPED),
                                ("refuse", DONE), ("note", DONE)]  # fmt: skip


def test_the_adapter_is_made_on_first_need_only(config):
    made = []

    def make(c):
        made.append(c)
        return FakeSlurm()

    h = Hands(config, make_slurm=make)
    execute((S.Say(text="hello"),), h)
    assert made == [] and h.made is None
    execute((S.Requeue(job_id="7"),), h)
    assert len(made) == 1 and h.made.calls == [("requeue", "7")]


def test_requeue_and_notes(config):
    slurm = FakeSlurm()
    plan = (
        S.Requeue(job_id="7"),
        S.Note(target="node", name=NODE, text="would drain (budget exceeded ...)"),
        S.Note(target="job+", name="7", text="requeued"),
    )
    report = execute(plan, hands(config, slurm))
    assert ("requeue", "7") in slurm.calls
    assert slurm.node_comments == [(NODE, "gpugate: would drain (budget exceeded ...)")]
    # job+ adds to a job Slurm does not hold here: the adapter's merge raises, reported
    assert [o.status for o in report.outcomes] == [DONE, DONE, FAILED]


def test_the_record_steps_write_the_stores(config, tmp_path, capsys):
    plan = (
        S.Say(text="prolog job 42 on n: fail"),
        S.RecordDrain(
            node=NODE,
            reason=REASON,
            check="gpu.ecc",
            hook="prolog",
            job="42",
            boot_id="boot-passed-in",
        ),
        S.RecordUnknownXids(node=NODE, xids=(999,), hook="prolog", job="42"),
        S.RecordMetrics(
            node=NODE,
            hook="prolog",
            run={"findings": {"gpu.ecc": "fail"}, "drained_check": "gpu.ecc"},
        ),
        S.RecordEvent(directory=config.state_dir, hook="prolog", fields={"job": "42"}),
    )
    report = execute(plan, hands(config))
    assert {o.status for o in report.outcomes} == {DONE}
    (entry,) = H.drains(config.state_dir)
    assert (entry.check, entry.boot_id, entry.hook) == (
        "gpu.ecc",
        "boot-passed-in",
        "prolog",
    )
    assert [list(e.xids) for e in H.unknown_xids(config.state_dir)] == [[999]]
    prom = (tmp_path / "prom" / "gpugate.prom").read_text()
    assert 'check="gpu.ecc"' in prom
    assert json.loads((tmp_path / "state" / "events.jsonl").read_text())["job"] == "42"
    assert "gpugate: prolog job 42 on n: fail" in capsys.readouterr().err


def test_a_dry_run_does_nothing_and_reports_the_plan(config, tmp_path):
    slurm = FakeSlurm()
    plan = (*drain_plan(), S.Requeue(job_id="7"),
            S.RecordDrain(node=NODE, reason=REASON, check="gpu.ecc", hook="prolog"),
            S.RecordEvent(directory=config.state_dir, hook="prolog"))  # fmt: skip
    report = execute(plan, hands(config, slurm), dry_run=True)
    assert {o.status for o in report.outcomes} == {WOULD}
    assert report.lines()[:2] == [f"would drain {NODE}: {REASON}",
                                  f"would undo the drain of {NODE} if beyond the budget"]  # fmt: skip
    assert "would scontrol requeue 7" in report.lines()
    assert slurm.drains == slurm.calls == slurm.comments == []
    assert not (tmp_path / "state").exists()  # no refusal note, no history, no event


def test_a_builder_that_raises_costs_only_its_step(capsys):
    def fine(x):
        return S.Say(text=x)

    def broken(x):
        raise TypeError("bug")

    def nothing(x):
        return None

    assert planned("epilog", (broken, fine, nothing), "hi") == (S.Say(text="hi"),)
    assert (
        "gpugate: epilog: broken failed (TypeError: bug); decision kept" in capsys.readouterr().err
    )


def test_steps_are_records_checked_when_built():
    with pytest.raises(TypeError, match="unknown field"):
        S.Drain(node=NODE, check="gpu.ecc", reason=REASON, detial="x")  # type: ignore[call-arg]
    assert S.Drain(node=NODE, check="c", reason="r") == S.Drain(node=NODE, check="c", reason="r")
    assert S.Undo(node=NODE, check="c").when == S.DRAINED


def test_check_dry_run_says_the_prolog_plan_and_does_nothing(tmp_path, capsys):
    import os

    from gpugate.cli import main

    snap = os.path.join(paths.SNAPSHOTS, "h100-ecc.yaml")
    site = tmp_path / "site.yaml"
    site.write_text(f"state_dir: {tmp_path / 'state'}\n")
    code = main(["check", "--facts", snap, "--config", str(site), "--node", "n7", "--dry-run",
                 "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["plan"][0].startswith("would drain n7: gpugate: gpu.ecc: ")
    assert out["plan"][1:] == ["would undo the drain of n7 if beyond the budget",
                               "would say the held drain of n7 (node comment, log line, event) "
                               "if the budget holds it back",
                               "would record the held drain of n7 if the budget holds it back",
                               "would isolate the faulty GPU(s) of n7 (isolate.unit: gpu)"]  # fmt: skip
    assert not (tmp_path / "state").exists()
    main(["check", "--facts", snap, "--config", str(site), "--json"])
    assert "plan" not in json.loads(capsys.readouterr().out)  # the contract's output, as before


def test_a_lift_goes_through_the_path_its_hands_hold(config):
    """The executor sits below the admin: the resume path is handed in (Hands.lift, the health
    hook's admin.resume.lift); a plan that lifts without one fails that step, reported."""
    from fakes import drained

    info = drained(NODE, REASON)
    plan = (S.Lift(info=info, why="repaired: rebooted"),
            S.ForgetHealing(node=NODE, when=S.LIFTED))  # fmt: skip
    asked = []

    def lift(c, slurm, step):
        asked.append((c, step))
        return S.Attempt(resumed=True, why="", result="ok (this node)")

    report = execute(plan, hands(config, lift=lift))
    assert asked == [(config, plan[0])] and report.lift.resumed
    assert statuses(report) == [("lift", DONE), ("record", DONE)]
    report = execute(plan, hands(config), kept=None)
    assert (report.lift.resumed, statuses(report)[0]) == (False, ("lift", FAILED))
    assert "no resume path" in report.lift.why and report.outcomes[1].status == SKIPPED

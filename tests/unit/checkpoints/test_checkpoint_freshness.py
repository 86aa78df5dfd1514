"""Checkpoint freshness at a job's end: measured as the user, flagged, counted, told."""

from __future__ import annotations

import json
import os
import time

import pytest
from checkpoint_files import set_age, torch_zip
from epilog_setup import NCCL_TIMEOUT, env, job_77, member, setup, snapshot
from factories import default_config, make_bundle, make_decision, make_facts, views
from fakes import FakeSlurm

from gpugate.act.execute import Hands, execute
from gpugate.act.plans import requeued_notes
from gpugate.admin import losses
from gpugate.admin.report import runs_section
from gpugate.checkpoints.freshness import judge, measure, message, span
from gpugate.clock import utc
from gpugate.config import ConfigError, load_config
from gpugate.hooks.epilog import run_epilog
from gpugate.hooks.prolog import run_prolog
from gpugate.store import controller_view as V
from gpugate.store.metrics import apply_run
from gpugate.store.summary import CheckpointAtEnd, EvidenceSummary
from gpugate.store.view_records import stale_note

MIN = 60.0
END = 1_800_000_000.0


def tell_stale(slurm, job_id, note):
    """EpilogSlurmctld's stale line after a requeue: its Note step, carried out by the
    executor; the report's line, or None (no step: nothing to tell)."""
    plan = requeued_notes(job_id, [("checkpoint age comment", note)])
    lines = execute(plan, Hands(default_config(), slurm), kept=None).lines()
    return lines[0] if lines else None


def test_a_fresh_checkpoint_is_not_stale_and_costs_its_age():
    f = judge("/ck", {"path": "/ck/a.pt", "mtime": END - 2 * MIN}, END, END - 3600, 4, 300)
    assert (f.age_s, f.at_risk_s, f.stale) == (120, 120, False)
    assert f.gpu_hours == pytest.approx(4 * 120 / 3600)
    assert message(f) is None


def test_an_old_checkpoint_is_stale_and_the_user_reads_its_age():
    f = judge("/ck", {"path": "/ck/a.pt", "mtime": END - 42 * MIN}, END, END - 3600, 8, 300)
    assert f.stale and f.age_s == 42 * MIN
    assert f.gpu_hours == pytest.approx(8 * 42 / 60)
    assert message(f) == "newest complete checkpoint was 42 min old at the end (policy: 5 min)"


def test_a_run_that_just_resumed_from_an_old_checkpoint_is_not_blamed():
    # The checkpoint is an hour old, but this run started 2 minutes before it ended.
    f = judge("/ck", {"path": "/ck/a.pt", "mtime": END - 3600}, END, END - 2 * MIN, 8, 300)
    assert f.age_s == 3600 and f.at_risk_s == 2 * MIN and not f.stale


def test_no_checkpoint_counts_from_the_run_start():
    f = judge("/ck", None, END, END - 30 * MIN, 2, 300)
    assert f.age_s is None and f.at_risk_s == 30 * MIN and f.stale
    assert message(f) == "no complete checkpoint in /ck after 30 min (policy: 5 min)"
    assert judge("/ck", None, END, None, 2, 300).stale is False  # nothing known: no blame


@pytest.mark.parametrize("answer", ["/etc/shadow", {"path": 3, "mtime": "x"}, [1], {"mtime": True}])
def test_an_odd_answer_from_the_users_child_is_no_checkpoint(answer):
    f = judge("/ck", answer, END, None, 1, 300)
    assert f.mtime is None and f.age_s is None and f.path in (None,)


def test_measure_asks_the_users_child_and_never_raises():
    calls = []

    def run_as(uid, gid, task, kwargs, timeout):
        calls.append((uid, gid, task, kwargs))
        raise OSError("not mounted here")

    f = measure("/ck", 1234, 99, END, None, 1, 300, 5.0, run_as=run_as)
    assert calls == [
        (1234, 99, "gpugate.checkpoints.freshness:newest_complete", {"ckpt_dir": "/ck"})
    ]
    assert f.error == "not mounted here" and not f.stale
    assert measure("rel/dir", 1, 1, END, None, 1, 300, 5.0, run_as=run_as).error
    assert len(calls) == 1  # a relative directory is not looked up at all
    unknown = measure("/ck", None, None, END, None, 1, 300, 5.0)  # the real as_user
    assert "user is unknown" in unknown.error


def test_the_child_task_is_allow_listed():
    from gpugate.child import TASKS

    assert "gpugate.checkpoints.freshness:newest_complete" in TASKS


def test_span_reads_like_people_write():
    assert [span(40), span(42 * MIN), span(3.5 * 3600)] == ["40 s", "42 min", "3.5 h"]


# --- the epilog, a real checkpoint directory, FakeSlurm ---------------------------------------


def epilog_with_checkpoint(tmp_path, ckpt_age_s: float, admin_comment: str = "", via="comment"):
    """A job with `gpugate:ckpt=DIR` fails with an NCCL timeout; its newest checkpoint is that old."""
    ckpt = tmp_path / "ckpt"
    torch_zip(ckpt / "step_100.pt", {"step": 100})
    set_age(ckpt, ckpt_age_s)
    config = setup(tmp_path)
    snapshot(tmp_path, make_facts())
    comment = f"gpugate:ckpt={ckpt}"
    job = job_77("").replace(admin_comment=admin_comment, comment=comment)
    assert run_prolog(config, env(comment=comment), FakeSlurm(jobs=[job])).exit_code == 0
    out = tmp_path / "job.out"
    out.write_text(NCCL_TIMEOUT)
    slurm = FakeSlurm(jobs=[job.replace(stdout=str(out), stderr=str(out))])
    now = int(time.time())
    changes = {"start_time": now - 7200, "end_time": now, "gpus": (0, 1)}
    if via == "comment":
        changes["comment"] = comment
    return run_epilog(config, env(**changes), slurm), slurm, ckpt


def test_a_stale_end_is_recorded_flagged_and_told_to_the_user(tmp_path):
    result, slurm, ckpt = epilog_with_checkpoint(tmp_path, 42 * MIN, admin_comment="ticket 7")
    summary = json.loads(member(result, "summary.json"))
    assert summary["checkpoint_age_s"] == pytest.approx(42 * MIN, abs=5)
    assert summary["checkpoint_stale"] is True
    assert summary["checkpoint"]["path"] == str(ckpt / "step_100.pt")
    assert summary["checkpoint"]["gpu_hours"] == pytest.approx(2 * 42 / 60, abs=0.01)
    assert summary["checkpoint"]["at"].endswith("Z")
    assert set(summary["checkpoint"]) == {"ckpt_dir", "max_age_s", "path", "mtime", "age_s",
                                          "at_risk_s", "gpu_hours", "stale", "error", "at"}  # fmt: skip
    assert CheckpointAtEnd.from_json(summary["checkpoint"]).to_json() == summary["checkpoint"]
    assert "newest complete checkpoint was 42 min old" in member(result, "decisive.txt")
    assert result.checkpoint_stale and result.checkpoint_age_s == pytest.approx(42 * MIN, abs=5)
    assert slurm.comments == []  # the job has finished: slurmctld would refuse it
    # EpilogSlurmctld, once it has requeued the job, tells the user from the bundle.
    told = tell_stale(
        slurm, "77", stale_note([V.done({"checkpoint_stale": False}), V.done(summary)])
    )
    assert told == "checkpoint age comment"
    ((_, text),) = slurm.comments
    assert text == ("ticket 7 | gpugate: newest complete checkpoint was 42 min old at the end "
                    "(policy: 5 min)")  # fmt: skip
    assert tell_stale(slurm, "77", stale_note([V.done(summary)])).endswith(
        "(unchanged: already there, or no room)"
    )


def test_a_fresh_end_is_recorded_and_nobody_is_bothered(tmp_path):
    result, slurm, _ = epilog_with_checkpoint(tmp_path, 2 * MIN)
    summary = json.loads(member(result, "summary.json"))
    assert summary["checkpoint_stale"] is False
    assert summary["checkpoint_age_s"] == pytest.approx(2 * MIN, abs=5)
    assert "checkpoint" not in member(result, "decisive.txt")
    assert tell_stale(slurm, "77", stale_note([V.done(summary)])) is None and slurm.comments == []


def test_the_prologs_task_file_names_the_directory(tmp_path):
    # SLURM_JOB_COMMENT missing from the epilog's environment: the task file still has it.
    result, _, _ = epilog_with_checkpoint(tmp_path, 42 * MIN, via="task file")
    assert json.loads(member(result, "summary.json"))["checkpoint_stale"] is True


def test_a_symlink_out_of_the_directory_is_not_followed(tmp_path):
    outside = torch_zip(tmp_path / "elsewhere" / "step_900.pt", {"step": 900})
    _, _, ckpt = epilog_with_checkpoint(tmp_path, 42 * MIN)
    os.symlink(outside, ckpt / "step_900.pt")
    config = setup(tmp_path)
    now = int(time.time())
    again = run_epilog(config, env(comment=f"gpugate:ckpt={ckpt}", end_time=now, job_id="78"),
                       FakeSlurm(jobs=[job_77("", "78")]))  # fmt: skip
    summary = json.loads(member(again, "summary.json"))
    assert summary["checkpoint"]["path"] == str(ckpt / "step_100.pt")  # not the outside one


def test_a_failed_comment_write_is_reported_not_raised(tmp_path):
    slurm = FakeSlurm(jobs=[job_77("")])
    slurm.errors["admin_comment"] = RuntimeError("slurmctld down")
    stale = {"checkpoint_stale": True, "checkpoint_message": "newest complete checkpoint was ..."}
    assert (
        tell_stale(slurm, "77", stale_note(views([stale])))
        == "checkpoint age comment failed: slurmctld down"
    )
    assert tell_stale(slurm, "77", None) is None  # no record said stale
    with pytest.raises(ValueError, match="checkpoint_message"):  # not a decision record
        views([{"checkpoint_stale": True, "checkpoint_message": 7}])


def test_epilog_slurmctld_tells_the_user_after_a_requeue():
    from gpugate.hooks import epilog_slurmctld as E

    config = default_config()
    config = config.replace(requeue=config.requeue.replace(start_now=False))  # no child
    # The node's record: a stale checkpoint, and (requeued) its own checks failed, or not.
    for hardware_fault in (True, False):
        stale = views([{
            "node": "gpu-node-01",
            "hardware_fault": hardware_fault,
            "checkpoint_stale": True,
            "checkpoint_message": "newest complete checkpoint was 9 min old",
        }])[0]  # fmt: skip
        # What the controller reads and writes beside Slurm: that record, no vote, no look
        # into /ck (the decision and the plan are the real ones).
        edges = E.Edges(records=lambda *a, r=stale: ([r], {}), vote=lambda *a: None,
                        checkpoint=lambda *a: None)  # fmt: skip
        job = E.JobEnd(job_id="77", uid=0, gid=0, comment="gpugate:ckpt=/ck", restarts=0,
                       exit_code2="1:0", nodes=("gpu-node-01",))  # fmt: skip
        slurm = FakeSlurm(jobs=[job_77("")])
        decision, done = E.run_requeue(config, job, slurm, 0, edges=edges)
        assert decision.requeue is hardware_fault
        # The executor's report: the comment is one step, taken only after a requeue.
        assert ("checkpoint age comment" in done) is hardware_fault
        assert ("scontrol requeue 77" in done) is hardware_fault
        said = [c for _, c in slurm.comments]
        if hardware_fault:
            assert said[-1].endswith(" | gpugate: newest complete checkpoint was 9 min old")
        else:
            assert said == []
        # A dry run says the comment and writes none.
        slurm = FakeSlurm(jobs=[job_77("")])
        _, dry = E.run_requeue(config, job, slurm, 0, dry_run=True, edges=edges)
        assert ("would checkpoint age comment" in dry) is hardware_fault
        assert slurm.comments == [] and all(d.startswith("would ") for d in dry)


def test_a_job_without_a_directory_gets_no_checkpoint_fields(tmp_path):
    config = setup(tmp_path)
    snapshot(tmp_path, make_facts())
    out = tmp_path / "job.out"
    out.write_text(NCCL_TIMEOUT)
    slurm = FakeSlurm(jobs=[job_77(str(out))])
    result = run_epilog(config, env(), slurm)
    assert "checkpoint_age_s" not in json.loads(member(result, "summary.json"))
    assert result.checkpoint_age_s is None and slurm.comments == []


# --- metrics, report, config -------------------------------------------------------------------


def test_the_gauge_keeps_the_last_age_and_the_counter_counts_stale_ends():
    s = apply_run({}, "n1", "epilog", checkpoint_age_s=2520.0, checkpoint_stale=True, now=1)
    s = apply_run(s, "n1", "epilog", checkpoint_age_s=60.0, now=2)
    s = apply_run(s, "n1", "epilog", checkpoint_age_s=900.0, checkpoint_stale=True, now=3)
    n = (("node", "n1"),)
    assert s[("gpugate_checkpoint_age_seconds", n)] == 900
    assert s[("gpugate_checkpoint_stale_ends_total", n)] == 2
    assert ("gpugate_checkpoint_age_seconds", n) not in apply_run({}, "n1", "prolog", now=1)


def test_the_report_uses_the_recorded_checkpoint_time(tmp_path):
    failure = losses._run("77/n1-r0", "77", "n1", EvidenceSummary(
        job_id="77", node="n1", category="nccl_timeout", gpus=[0, 1], job_start=utc(END - 7200),
        job_end=utc(END), checkpoint_age_s=2520.0, checkpoint_stale=True,
        checkpoint=CheckpointAtEnd(ckpt_dir="/ck", max_age_s=1800.0, path="/ck/step_100.pt",
                                   mtime=END - 2520)))  # fmt: skip
    events = [make_decision(END, job="77", restarts=0, checkpoint="/ck/other.pt")]
    (c,) = losses.costed([failure], events, stat=lambda p: pytest.fail("read an mtime"))
    assert c.lost_from == END - 2520 and c.from_checkpoint
    assert c.checkpoint == "/ck/step_100.pt"
    assert c.gpu_hours == pytest.approx(2 * 2520 / 3600)
    page = runs_section([c])
    assert "Checkpoint age at end" in page and "42 min <strong>stale</strong>" in page


def test_without_a_record_the_report_still_reads_the_requeues_checkpoint():
    failure = make_bundle("77", gpus=1, start=END - 7200, failed=END)
    events = [make_decision(END, job="77", restarts=0, checkpoint="/ck/other.pt")]
    (c,) = losses.costed([failure], events, stat=lambda p: END - 600)
    assert c.lost_from == END - 600 and c.checkpoint == "/ck/other.pt"


@pytest.mark.parametrize("value", [0, -5, "5m", None])
def test_max_age_is_validated(tmp_path, value):
    site = tmp_path / "site.yaml"
    site.write_text(f"checkpoints:\n  max_age_s: {json.dumps(value)}\n")
    with pytest.raises(ConfigError, match=r"checkpoints\.max_age_s"):
        load_config(str(site))


def test_the_default_is_the_articles_five_minutes():
    assert load_config("/dev/null").checkpoints.max_age_s == 300

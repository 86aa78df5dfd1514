"""The controller's view: decision records, the waiting rule, controller_dir, its readers."""

from __future__ import annotations

import grp
import json
import os
import stat
from pathlib import Path

import pytest
from factories import default_config, views

from gpugate.config import load_config
from gpugate.gate import requeue as _requeue
from gpugate.gate.requeue import JobEnd, RequeueDecision, note_path, tell_user
from gpugate.store import controller_view as V
from gpugate.store import history

HW = {"node": "n1", "hardware_fault": True, "category": "gpu_xid_hardware",
      "first_hardware_error_at": "2026-11-29T10:00:00Z"}  # fmt: skip
NODES = ("n1", "n2")


def decide_requeue(job: JobEnd, summaries: list, *rest) -> RequeueDecision:
    """The decision over records read from these JSON shapes (factories.view)."""
    return _requeue.decide_requeue(job, views(summaries), *rest)


def job(**changes) -> JobEnd:
    values = {"job_id": "5", "uid": os.getuid(), "gid": os.getgid(), "comment": "gpugate:ckpt=/c",
              "restarts": 0, "state": "FAILED", "exit_code2": "1:0", "nodes": NODES}  # fmt: skip
    values.update(changes)
    return JobEnd(**values)


# ------------------------------------------------------------------------------ the records


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_record_is_root_and_slurmusers_only_in_directories_nobody_else_can_pass(tmp_path):
    """Red team (issue 41, R3): another user read any job's record (0644 in 0711 dirs)."""
    group = grp.getgrgid(1)  # SlurmUser's group stands in: any group root is not in
    ev = tmp_path / "ev"
    ev.mkdir(mode=0o750)
    path = V.write_record(str(ev), "5", "n1", 2, V.running(45, now=1000.0), group=group.gr_name)
    assert path == str(ev / "controller-view" / "5" / "n1-r2.json")
    assert _mode(path) == 0o640 and os.stat(path).st_gid == group.gr_gid
    for d in (ev / "controller-view", ev / "controller-view" / "5"):
        assert _mode(d) == 0o750 and d.stat().st_gid == group.gr_gid
    assert _mode(ev) & 0o001  # SlurmUser passes through evidence_dir, lists nothing
    assert not _mode(ev) & 0o004
    doc, why = V.read_record(path)
    assert why is None and doc.state == "running" and doc.deadline == 1045.0
    assert (doc.node, doc.run) == ("n1", 2)
    V.write_record(str(ev), "5", "n1", 2, V.done(HW), group=group.gr_name)
    digest = ev / "controller-view" / "5" / "@digest-r2.json"
    assert _mode(digest) == 0o640 and digest.stat().st_gid == group.gr_gid
    assert V.read_digest(str(digest), "5", 2)[1] is None


def test_an_open_view_of_before_is_closed_and_takes_its_groups_records(tmp_path):
    """An upgrade: controller-view/ 0711 (the old mode) closes; without a view_group the
    records take the group the admin gave controller-view/ (a group this node lacks too)."""
    group = grp.getgrgid(1)
    view = tmp_path / "ev" / "controller-view"
    (view / "5").mkdir(parents=True)
    view.chmod(0o711)
    (view / "5").chmod(0o711)
    os.chown(view, -1, group.gr_gid)
    path = V.write_record(str(tmp_path / "ev"), "5", "n1", 0, V.running(45),
                          group="no-such-group-41")  # fmt: skip
    assert _mode(view) == 0o750 and _mode(view / "5") == 0o750
    assert os.stat(path).st_gid == group.gr_gid and (view / "5").stat().st_gid == group.gr_gid
    path = V.write_record(str(tmp_path / "ev"), "6", "n1", 0, V.running(45))
    assert _mode(path) == 0o640 and os.stat(path).st_gid == group.gr_gid


def test_a_done_record_holds_the_decision_fields_and_no_log_text():
    summary = dict(HW, summary_text="NCCL WARN secret token", untrusted_claims=["Xid 79"],
                   checkpoint_stale=True, checkpoint={"ckpt_dir": "/home/u/ckpt"},
                   checkpoint_message="no complete checkpoint in /home/u/ckpt after 3.0 h")  # fmt: skip
    rec = {"rank": 1, "node": "n1", "frames": ["train.py:12"], "pgs": {"0": {"name": "g",
           "last_enqueued": 3, "secret": 1}}, "entries": [{"seq": 3, "pg_id": "0", "op": "x",
           "frames": ["f"]}]}  # fmt: skip
    doc = V.done(summary, {"records": [rec], "errors": []})
    text = json.dumps(doc.to_json())
    assert doc.state == "done" and doc.hardware_fault is True
    assert doc.checkpoint_stale is True
    assert "secret" not in text and "train.py" not in text and "untrusted" not in text
    # No path of the user's (issue 41): the controller's readers learn no directory names.
    assert "/home/u" not in text
    assert doc.checkpoint_message == (
        "no complete checkpoint in the checkpoint directory after 3.0 h"
    )
    assert doc.flightrec["records"][0]["entries"] == [{"seq": 3, "pg_id": "0", "op": "x"}]


@pytest.mark.parametrize("content", [b"not json", b"[1]", b'{"state": "other"}'])
def test_what_is_not_a_record_is_said_not_taken(tmp_path, content):
    path = tmp_path / "r.json"
    path.write_bytes(content)
    doc, why = V.read_record(str(path))
    assert doc is None and why


def test_a_fifo_in_place_of_a_record_never_blocks(tmp_path):
    path = tmp_path / "r.json"
    os.mkfifo(path)
    doc, why = V.read_record(str(path))
    assert doc is None and why == "not a regular file"


# ------------------------------------------------------------------------------ the waiting rule


class Clock:
    """A fake clock that sleep() moves forward."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.slept = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.slept += s


def wait(ev, clock, wait_s=60.0, cap_s=105.0, nodes=NODES):
    return V.wait_for_records(str(ev), "5", nodes, 0, wait_s, cap_s, clock.sleep, clock.time)


def test_done_records_end_the_wait_at_once(tmp_path):
    for node in NODES:
        V.write_record(str(tmp_path), "5", node, 0, V.done(dict(HW, node=node)))
    clock = Clock(1000.0)
    summaries, problems, _ = wait(tmp_path, clock)
    assert len(summaries) == 2 and problems == {} and clock.slept == 0


def test_a_running_epilog_is_waited_for_until_its_deadline_even_past_the_wait(tmp_path):
    V.write_record(str(tmp_path), "5", "n1", 0, V.done(HW))
    V.write_record(str(tmp_path), "5", "n2", 0, V.running(45, now=1050.0))  # ends at 1095
    clock = Clock(1000.0)
    summaries, _, found = wait(tmp_path, clock, wait_s=60)
    assert 1095.0 <= clock.now < 1096.0  # past wait_s (1060): n2 might still find a fault
    assert [s.node for s in summaries] == ["n1"] and found["n2"].state == "running"


def test_a_running_record_that_turns_done_is_taken(tmp_path):
    V.write_record(str(tmp_path), "5", "n1", 0, V.done(HW))
    V.write_record(str(tmp_path), "5", "n2", 0, V.running(45, now=1000.0))
    clock = Clock(1000.0)

    def sleep(s: float) -> None:
        clock.sleep(s)
        if clock.now >= 1030:  # the node epilog found an Xid 79 after 30 s
            V.write_record(str(tmp_path), "5", "n2", 0, V.done(dict(HW, node="n2")))

    summaries, _, _ = V.wait_for_records(str(tmp_path), "5", NODES, 0, 60, 105, sleep, clock.time)
    assert sorted(s.node for s in summaries) == ["n1", "n2"] and clock.now < 1031


def test_a_missing_record_is_waited_for_the_configured_wait_only(tmp_path):
    V.write_record(str(tmp_path), "5", "n1", 0, V.done(HW))
    clock = Clock(1000.0)
    summaries, problems, _ = wait(tmp_path, clock, wait_s=60)
    assert 1060.0 <= clock.now < 1061.0 and len(summaries) == 1 and problems == {}


def test_the_cap_bounds_a_deadline_far_off(tmp_path):
    V.write_record(str(tmp_path), "5", "n1", 0, V.running(10_000, now=1000.0))
    clock = Clock(1000.0)
    wait(tmp_path, clock, wait_s=60, cap_s=105, nodes=("n1",))
    assert 1105.0 <= clock.now < 1106.0


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to an ordinary user to be denied")
def test_an_unreadable_evidence_dir_is_said_at_once_never_waited_for(tmp_path):
    import subprocess

    from e2e import gpugate_for_job_user

    for directory in (tmp_path, *tmp_path.parents):  # pytest's 0700: passable, as /var/lib is
        directory.chmod(directory.stat().st_mode | 0o001)
    ev = tmp_path / "ev"
    ev.mkdir(mode=0o700)
    V.write_record(str(ev), "5", "n1", 0, V.done(HW))
    ev.chmod(0o700)  # an older release's evidence dir: SlurmUser cannot pass

    code = ("import json,sys; from gpugate.store import controller_view as V; "
            "s,p,_=V.wait_for_records(sys.argv[1],'5',('n1',),0,60,105); print(json.dumps(p))")  # fmt: skip
    python, env = gpugate_for_job_user()  # the checkout may be out of nobody's reach
    out = subprocess.run([python, "-s", "-c", code, str(ev)], user=65534, group=65534, env=env,
                         extra_groups=[], capture_output=True, text=True, timeout=30)  # fmt: skip
    problems = json.loads(out.stdout)
    assert problems["n1"] == f"cannot read {ev}: Permission denied"  # the dir that blocks


# ------------------------------------------------------------------------------ the decision


def test_evidence_that_cannot_be_read_is_never_no_fault():
    config = default_config()
    unreadable = {"n1": "cannot read /ev/controller-view/5 as slurm: chmod o+x"}
    d = decide_requeue(job(), [], config, unreadable)
    assert not d.requeue and d.why.startswith("cannot read /ev/controller-view/5 as slurm")
    assert "not an infrastructure failure" not in d.describe()
    # Readable hardware evidence from another node still requeues.
    assert decide_requeue(job(), [HW], config, {"n2": "cannot read x as slurm: y"}).requeue


def test_the_comment_names_the_checkpoint_directory_when_the_controller_cannot_look():
    config = default_config()
    d = decide_requeue(job(), [HW], config).replace(ckpt_dir="/c")
    text = d.describe()
    assert text.startswith("requeued: infrastructure failure") and "excluded n1" in text
    assert "the newest complete checkpoint in /c, found by the job's TaskProlog" in text
    assert "not visible" not in text
    assert "resume from /c/ckpt_2.pt" in d.replace(checkpoint="/c/ckpt_2.pt").describe()


def test_a_failed_job_not_requeued_gets_a_note_beside_its_output_as_its_user(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    end = job(job_id="77", stdout=str(out / "slurm-77.out"))
    d = decide_requeue(end, [], default_config())
    assert not d.requeue and d.tell
    assert note_path(end) == str(out / "gpugate-77.requeue.txt")
    said = tell_user(end, d)
    text = (out / "gpugate-77.requeue.txt").read_text()
    if os.geteuid() == 0:
        assert said == note_path(end)
        assert "was not requeued: not an infrastructure failure" in text
        assert "gpugate evidence 77" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file to another owner")
def test_a_note_file_another_user_made_first_is_left_alone_and_said(tmp_path):
    """Red team (issue 41, R5): a user pre-creates `gpugate-<J>.requeue.txt` (0666) in a
    shared output directory for coming job ids; the victim's note must not land in it."""
    out = tmp_path / "out"
    out.mkdir(mode=0o1777)
    planted = out / "gpugate-78.requeue.txt"
    planted.write_text("")
    planted.chmod(0o666)
    os.chown(planted, 65534, 65534)
    end = job(job_id="78", stdout=str(out / "slurm-78.out"))
    d = decide_requeue(end, [], default_config())
    said = tell_user(end, d)
    assert said.startswith(f"skipped: {planted} exists and is not the job user's"), said
    assert "owner uid 65534" in said
    assert planted.read_text() == "" and planted.stat().st_uid == 65534
    # The job user's own note of an earlier run is rewritten in place.
    planted.unlink()
    (out / "gpugate-78.requeue.txt").write_text("old run")
    assert tell_user(end, d) == str(planted)
    assert "was not requeued" in planted.read_text()


def test_a_note_is_created_exclusively(tmp_path):
    from gpugate.userfiles import write_note

    path = tmp_path / "note.txt"
    assert write_note(str(path), "x") == str(path) and path.read_text() == "x"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~_umask()
    assert write_note(str(path), "y") == str(path) and path.read_text() == "y"  # its own


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_note_never_follows_a_symlink(tmp_path):
    from gpugate.userfiles import write_note

    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "note.txt").symlink_to(target)
    with pytest.raises(OSError):
        write_note(str(tmp_path / "note.txt"), "x")
    assert target.read_text() == "keep"


# ------------------------------------------------------------------------------ controller_dir


def test_controller_dir_defaults_below_state_dir_and_readers_merge_it(tmp_path):
    config = default_config().replace(state_dir=str(tmp_path / "state"))
    assert history.controller_dir(config) == str(tmp_path / "state" / "controller")
    assert history.read_dirs(config) == (str(tmp_path / "state"), str(tmp_path / "state" / "controller"))  # fmt: skip
    other = config.replace(controller_dir=str(tmp_path / "ctl"))
    assert history.controller_dir(other) == str(tmp_path / "ctl")


def test_the_report_reads_decisions_from_both_directories(tmp_path):
    from gpugate.admin.losses import requeue_events
    from gpugate.jsonl import append

    old, new = tmp_path / "state", tmp_path / "ctl"
    for d in (old, new):
        d.mkdir()
    append(str(old / "events.jsonl"), [{"time": "2026-12-01T10:00:00Z", "hook": "epilog-slurmctld",
                                        "job": "1", "requeue": False}])  # fmt: skip
    append(str(new / "events.jsonl"), [{"time": "2026-12-01T11:00:00Z", "hook": "epilog-slurmctld",
                                        "job": "2", "requeue": True}])  # fmt: skip
    assert [e.job for e in requeue_events((str(old), str(new)), 0)] == ["1", "2"]


def test_votes_go_to_controller_dir_and_flags_are_read_from_both(tmp_path):
    from gpugate.gate.suspicion import vote
    from gpugate.store import suspects

    config = default_config()
    config = config.replace(
        state_dir=str(tmp_path / "state"),
        controller_dir=str(tmp_path / "ctl"),
        health=config.health.replace(suspect_votes=1, suspect_users_min=1, suspect_action="review"),
    )
    summaries = [{"node": "a", "first_failure_at": "2026-12-01T10:00:00Z"},
                 {"node": "b", "first_failure_at": "2026-12-01T10:10:00Z"}]  # fmt: skip
    end = job(job_id="9", nodes=("a", "b"), comment="")
    said = vote(config, end, views(summaries), "nccl_timeout", 1.8e9)
    assert "flagged a" in said
    assert (tmp_path / "ctl" / suspects.SUSPECTS).exists()
    assert not (tmp_path / "state" / suspects.SUSPECTS).exists()
    assert "a" in suspects.open_flags(history.read_dirs(config))
    # An admin's resume (root, in the history) closes the controller's flag.
    history.record_resume(str(tmp_path / "state"), "a", "admin", when=1.8e9 + 10)
    assert suspects.open_flags(history.read_dirs(config)) == {}


def test_gpugate_evidence_shows_the_controllers_decision_for_a_job(tmp_path, capsys):
    from gpugate.commands.evidence import main
    from gpugate.jsonl import append

    site = tmp_path / "site.yaml"
    site.write_text(f"state_dir: {tmp_path / 'state'}\nevidence_dir: {tmp_path / 'ev'}\n")
    (tmp_path / "state" / "controller").mkdir(parents=True)
    said = "not requeued: not an infrastructure failure (cuda_oom)"
    append(str(tmp_path / "state" / "controller" / "events.jsonl"),
           [{"time": "2026-12-01T10:00:00Z", "hook": "epilog-slurmctld", "job": "42",
             "restarts": 0, "requeue": False, "why": "x", "said": said}])  # fmt: skip
    assert main(["42", "--config", str(site)]) == 0
    assert f"run 0 (2026-12-01T10:00:00Z): {said}" in capsys.readouterr().out


# ------------------------------------------------------------------------------ the config


def test_a_wait_shorter_than_the_epilog_deadline_is_raised_to_it(tmp_path, capsys):
    """Accepted by the previous release: raised with a warning, never refused (issue 40)."""
    site = tmp_path / "site.yaml"
    site.write_text("requeue:\n  wait_for_bundles_s: 30\nepilog:\n  deadline_s: 45\n")
    assert load_config(str(site)).requeue.wait_for_bundles_s == 45
    assert "requeue.wait_for_bundles_s: 30 s is shorter than epilog." in capsys.readouterr().err
    site.write_text("requeue:\n  wait_for_bundles_s: 45\nepilog:\n  deadline_s: 45\n")
    assert load_config(str(site)).requeue.wait_for_bundles_s == 45


def test_the_packaged_wait_covers_the_packaged_deadline():
    config = default_config()
    assert config.requeue.wait_for_bundles_s >= config.epilog.deadline_s
    assert config.controller_dir is None


def test_a_requeued_job_is_told_which_record_could_not_be_read(tmp_path):
    from fakes import FakeSlurm

    from gpugate.act.execute import Hands, execute
    from gpugate.act.plans import requeued_notes
    from gpugate.gate.requeue import JobEnd
    from gpugate.hooks.epilog_slurmctld import told_notes, writable_problem
    from gpugate.slurm.records import JobInfo

    pending = JobInfo(job_id=5, state="PENDING", nodes=NODES, requeue=True)
    slurm = FakeSlurm(nodes=NODES, jobs=[pending])
    job = JobEnd(job_id="5", nodes=NODES)
    unreadable = {"n2": "cannot read /ev as slurm: let slurm pass"}
    plan = requeued_notes("5", told_notes(job, [], unreadable, None))
    said = execute(plan, Hands(default_config(), slurm)).lines()
    assert said == ["admin comment: a record unreadable"]
    assert "cannot read /ev as slurm: let slurm pass" in slurm.job("5").admin_comment
    assert requeued_notes("5", told_notes(job, [], {}, None)) == ()
    assert writable_problem(str(tmp_path / "ctl")) is None and (tmp_path / "ctl").is_dir()
    (tmp_path / "file").write_text("")
    problem = writable_problem(str(tmp_path / "file"))
    assert problem.startswith(f"cannot write {tmp_path / 'file'} as ")


# ------------------------------------------------------------------------------ the node epilog


def test_the_epilog_leaves_a_done_record_after_an_abnormal_end_and_none_after_a_good_one(
    tmp_path,
):
    from epilog_setup import XID79, job_run
    from factories import make_facts

    from gpugate.store import evidence as E

    broken = make_facts().replace(kernel_log=(XID79,))
    for sub in ("bad", "good"):
        (tmp_path / sub).mkdir()
    _, _, config = job_run(tmp_path / "bad", "NCCL WARN x\n", after=broken)
    record = Path(config.evidence_dir) / "controller-view" / "77" / "gpu-node-01-r0.json"
    doc = json.loads(record.read_text())
    assert doc["state"] == "done" and doc["hardware_fault"] is True and doc["bundle"] is True
    assert doc["node"] == "gpu-node-01" and "NCCL WARN" not in record.read_text()
    # The record goes with its bundle when the node prunes it (retention's removal).
    assert E._remove_bundle(config.evidence_dir, "77/gpu-node-01-r0")
    assert not record.exists() and not record.parent.exists()

    good, _, config = job_run(tmp_path / "good", "done\n", exit_code=0, exit_code2="0:0")
    assert good.bundle is None
    assert not (Path(config.evidence_dir) / "controller-view" / "77").exists()

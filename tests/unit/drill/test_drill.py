"""Fault drills: the overlays, the window, the marks, the refusals, the follow and the record."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import paths
import pytest
from factories import site

from gpugate import drill
from gpugate.checks.run import run_checks
from gpugate.checks.sources import gather
from gpugate.commands import drill as cmd
from gpugate.config import ConfigError
from gpugate.gate.policy import decide
from gpugate.slurm import reasons
from gpugate.store import drills

SNAPSHOTS = paths.SNAPSHOTS
EXPECTED = {
    "xid79": "kernel.xid",
    "ecc": "gpu.ecc",
    "gpu-lost": "gpu.lost",
    "nvlink": "nvlink.links",
    "ib-down": "ib.ports",
    "hang": "gpu.recovery_action",
}


@pytest.fixture(autouse=True)
def unmarked():
    """Each test starts (and leaves) the process unmarked."""
    reasons.mark_drill(None)
    yield
    reasons.mark_drill(None)


@pytest.fixture
def config(tmp_path):
    return site(tmp_path, f"facts_file: {SNAPSHOTS}/h100-healthy.yaml\n"
                f"state_dir: {tmp_path / 'state'}\ndrill:\n  max_minutes: 5\n")  # fmt: skip


def failing(config, node: str = "n1") -> set[str]:
    return {f.check for f in decide(run_checks(gather(config, node), config), config.policy).failing}  # fmt: skip


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_each_overlay_fails_its_check_over_the_real_facts(config, fault):
    assert failing(config) == set()
    d = drill.start_drill(config, "n1", fault, 1)
    assert EXPECTED[fault] in failing(config)
    assert reasons.drill_mark() == d.id


def test_the_overlay_keeps_the_snapshot_it_was_given():
    data = {"gpus": [{"index": 0, "ecc_volatile_uncorrected": 0}]}
    out = drill.overlay("ecc", data)
    assert data["gpus"][0]["ecc_volatile_uncorrected"] == 0
    assert out["gpus"][0]["ecc_volatile_uncorrected"] == 1


def test_xid79_names_gpu0s_bus_as_the_driver_does():
    out = drill.overlay("xid79", {"gpus": [{"index": 0, "pci_bus_id": "00000000:AB:00.0"}]})
    assert "NVRM: Xid (PCI:0000:ab:00): 79," in out["kernel_log"][-1]


def test_a_drill_of_another_node_or_a_named_snapshot_is_not_overlaid(config):
    drill.start_drill(config, "n2", "xid79", 1)
    assert failing(config, "n1") == set()
    facts = gather(config, "n2", snapshot=str(SNAPSHOTS / "h100-healthy.yaml"))
    assert not any("Xid" in line for line in facts.kernel_log)


def test_the_window_closes_and_the_file_goes(config):
    d = drill.start_drill(config, "n1", "xid79", 1)
    assert drill.active_drill(config, d.start + 59) == d
    assert drill.active_drill(config, d.end) is None
    assert not (config.state_dir and os.path.exists(drill.drill_path(config)))
    assert failing(config) == set()  # nothing acts after the window, whoever reads next


def test_a_broken_drill_file_is_ignored_and_removed(config, tmp_path):
    (tmp_path / "state").mkdir(exist_ok=True)
    path = drill.drill_path(config)
    with open(path, "w") as fh:
        fh.write('{"fault": "xid79"')
    assert drill.active_drill(config) is None and not os.path.exists(path)


@pytest.mark.parametrize(
    ("fault", "minutes", "problem"),
    [
        ("melt", 1, "unknown fault"),
        ("xid79", 6, "at most drill.max_minutes (5)"),
        ("xid79", 0, "above 0"),
    ],
)
def test_bad_drills_are_refused(config, fault, minutes, problem):
    with pytest.raises(drill.DrillError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        drill.start_drill(config, "n1", fault, minutes)


def test_one_drill_at_a_time(config):
    drill.start_drill(config, "n1", "ecc", 1)
    with pytest.raises(drill.DrillError, match="already running"):
        drill.start_drill(config, "n1", "xid79", 1)


def test_max_minutes_is_validated(tmp_path):
    with pytest.raises(ConfigError, match=r"drill\.max_minutes: must be at most 1440"):
        site(tmp_path, "drill:\n  max_minutes: 5000\n")
    with pytest.raises(ConfigError, match=r"drill\.max_minutes: must not be negative"):
        site(tmp_path, "drill:\n  max_minutes: -1\n")


def test_reasons_and_comments_under_a_drill_say_so_and_read_back():
    reasons.mark_drill("20261201-101500")
    reason = reasons.drain_reason("kernel.xid", "Xid 79 on GPU0")
    assert reason == "gpugate: DRILL 20261201-101500: kernel.xid: Xid 79 on GPU0"
    assert reasons.reason_check(reason) == "kernel.xid"
    assert reasons.admin_comment("requeue: x").startswith("gpugate: DRILL 20261201-101500: requeue")
    comment = reasons.admin_comment(reasons.refusal_comment("n1", "gpu.ecc", "2 errors"))
    assert reasons.refused_nodes(comment) == ["n1"]
    reasons.mark_drill(None)
    assert reasons.drain_reason("kernel.xid", "x") == "gpugate: kernel.xid: x"


def test_events_under_a_drill_carry_its_id(tmp_path):
    from gpugate import log

    reasons.mark_drill("d1")
    log.event(str(tmp_path), "prolog", job="7")
    line = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert line["drill"] == "d1"


def test_non_root_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(cmd.os, "geteuid", lambda: 1000)
    assert cmd.main(["n1", "--fault", "xid79"]) == 2
    assert "root only" in capsys.readouterr().err


def test_another_node_is_refused(monkeypatch, capsys, config, tmp_path):
    monkeypatch.setattr(cmd.os, "geteuid", lambda: 0)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    cfg = tmp_path / "site.yaml"
    assert cmd.main(["n2", "--fault", "xid79", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "n2 is not this host's Slurm name (n1: SLURMD_NODENAME, else the short host" in err
    assert "set SLURMD_NODENAME=n2" in err  # the way out where NodeName is not the host name
    assert not os.path.exists(drill.drill_path(config))
    assert cmd.main(["n2", "--end", "--config", str(cfg)]) == 2  # --end of another node, too
    assert "set SLURMD_NODENAME=n2" in capsys.readouterr().err
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    assert cmd.usage_problem(cmd.parser().parse_args(["n2", "--fault", "xid79"])) is None


class FakeOps:
    """Slurm as a drill sees it: the job is killed, the node drained, the job requeued."""

    def __init__(self, config, resume_ok: bool = True) -> None:
        self.config, self.resume_ok = config, resume_ok
        self.killed: list[str] = []
        self.resumed = False

    def running_jobs(self, node):
        return ["42"]

    def kill(self, job):
        self.killed.append(job)

    def health(self, node):
        return "drain"

    def node(self, node):
        # What the epilog would do: gather under the overlay, drain with its reason.
        if self.resumed:
            return False, ""
        return bool(self.killed), reasons.drain_reason(
            "kernel.xid", "Xid 79"
        ) if self.killed else ""

    def job(self, job):
        if self.killed:
            return "RUNNING", 1, ("n2",), "gpugate: requeue: x; resume from /ck/ckpt_200.pt"
        return "RUNNING", 0, ("n1",), ""

    def resume(self, node, drill_id):
        self.resumed = self.resume_ok and drill.active_drill(self.config) is None
        return self.resumed, "" if self.resumed else "still failing"


def short_drill(config, monkeypatch):
    monkeypatch.setattr(cmd, "POLL_S", 0.01)
    monkeypatch.setattr(cmd, "GRACE_S", 0.3)
    d = drill.start_drill(config, "n1", "xid79", 0.005)  # 0.3 s
    gather(config, "n1")  # the epilog's gather marks its reasons
    return d


def test_a_drill_is_followed_and_recorded_as_passed(config, monkeypatch):
    d = short_drill(config, monkeypatch)
    ops = FakeOps(config)
    entry = cmd.follow(config, d, ops)
    steps = [s.step for s in entry.steps]
    assert steps == ["injected", "job_killed", "drained", "requeued", "window_ended", "resumed"]
    assert entry.passed and ops.killed == ["42"]
    requeued = entry.steps[3]
    assert requeued.checkpoint == "/ck/ckpt_200.pt" and requeued.nodes == ["n2"]
    assert all(s.when >= d.start for s in entry.steps)
    assert drills.drill_records(config) == [entry]
    assert drill.active_drill(config) is None


class TaskPrologResumeOps(FakeOps):
    """SlurmUser=slurm: the controller could not look; the comment says the TaskProlog picks."""

    def job(self, job):
        if self.killed:
            said = ("gpugate: requeued: x; resumes from the newest complete checkpoint in "
                    "/ck/run7, found by the job's TaskProlog")  # fmt: skip
            return "RUNNING", 1, ("n2",), said
        return super().job(job)


def test_a_checkpoint_only_the_task_prolog_saw_is_recorded_as_unknown(config, monkeypatch):
    d = short_drill(config, monkeypatch)
    entry = cmd.follow(config, d, TaskPrologResumeOps(config))
    requeued = next(s for s in entry.steps if s.step == "requeued")
    assert requeued.checkpoint is None and entry.passed
    assert "no checkpoint" not in requeued.detail
    assert "unknown: the newest complete checkpoint in /ck/run7" in requeued.detail


def test_the_controllers_event_line_without_a_checkpoint_is_unknown(config):
    # EpilogSlurmctld as SlurmUser wrote checkpoint null and the directory it could not read.
    where = cmd.controller_dir(config)
    os.makedirs(where, exist_ok=True)
    # Every release's event line has its time (log.Event).
    line = {"time": "2026-12-01T10:00:00Z", "hook": "epilog-slurmctld", "job": "42",
            "requeue": True, "checkpoint": None, "ckpt_dir": "/ck/run7"}  # fmt: skip
    Path(where, "events.jsonl").write_text(json.dumps(line) + "\n")
    ckpt, words = cmd.requeue_checkpoint(config, "42", "")
    assert ckpt is None and words.startswith("unknown: the newest complete checkpoint in /ck/run7")
    line["checkpoint"] = "/ck/run7/step-90"
    Path(where, "events.jsonl").write_text(json.dumps(line) + "\n")
    assert cmd.requeue_checkpoint(config, "42", "") == ("/ck/run7/step-90",) * 2
    assert cmd.requeue_checkpoint(config, "43", "")[1] == cmd.UNKNOWN  # nothing names it


class RequeueSeenLateOps(FakeOps):
    """Slurm 24.11: the killed run, requeued, ends its COMPLETING with Restarts=1 and no nodes."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.polls = 0

    def job(self, job):
        if not self.killed:
            return super().job(job)
        self.polls += 1
        if self.polls <= 2:
            return "COMPLETING", 1, (), "gpugate: requeue: x; resume from /ck/ckpt_200.pt"
        return super().job(job)


def test_the_requeued_run_is_the_one_on_nodes(config, monkeypatch):
    d = short_drill(config, monkeypatch)
    ops = RequeueSeenLateOps(config)
    entry = cmd.follow(config, d, ops)
    requeued = next(s for s in entry.steps if s.step == "requeued")
    assert requeued.nodes == ["n2"] and ops.polls > 2, entry
    assert entry.passed


def test_a_node_not_resumed_fails_the_drill(config, monkeypatch):
    d = short_drill(config, monkeypatch)
    entry = cmd.follow(config, d, FakeOps(config, resume_ok=False))
    assert not entry.passed and entry.why == "no resumed step"


class SlurmLiftsFirst(FakeOps):
    """Slurm's ResumeAfter lifted the drill's drain before the drill command's resume."""

    def node(self, node):
        if drill.active_drill(self.config) is None:
            return False, ""
        return super().node(node)

    def resume(self, node, drill_id):
        raise AssertionError("nothing left to resume")


def test_a_drain_slurm_already_lifted_counts_as_resumed(config, monkeypatch):
    d = short_drill(config, monkeypatch)
    entry = cmd.follow(config, d, SlurmLiftsFirst(config))
    resumed = next(s for s in entry.steps if s.step == "resumed")
    assert "already lifted: Slurm's ResumeAfter" in resumed.detail and entry.passed, entry


def test_an_admins_drain_laid_over_the_drills_is_no_resume(config, monkeypatch):
    class AdminTookIt(FakeOps):
        def node(self, node):
            if drill.active_drill(self.config) is None:
                return True, "admin: PSU swap"
            return super().node(node)

    d = short_drill(config, monkeypatch)
    entry = cmd.follow(config, d, AdminTookIt(config))
    assert not entry.passed and entry.why == "no resumed step"


def test_a_drills_drain_is_timed_to_end_after_its_window(config, monkeypatch):
    from fakes import FakeSlurm

    from gpugate.gate.drain import drain_counted

    d = short_drill(config, monkeypatch)  # gather() marked the process with the drill
    slurm = FakeSlurm([f"n{i}" for i in range(1, 21)])  # room in the drain budget for two
    slurm.version = (24, 11)
    reason = reasons.drain_reason("kernel.xid", "Xid 79")
    assert "DRILL" in reason
    assert drain_counted(slurm, "n1", reason, config, "kernel.xid").drained
    ((node, written, seconds),) = slurm.timed_drains
    lift_in = d.end + drill.SLURM_LIFT_MARGIN_S - time.time()
    assert (node, written) == ("n1", reason) and lift_in <= seconds <= lift_in + 1
    # Unmarked (no drill): gpugate's drain is never timed; over the drill's it cancels the timer.
    reasons.mark_drill(None)
    assert drain_counted(slurm, "n1", reasons.drain_reason("gpu.ecc", "x"), config, None).drained
    assert slurm.timed_drains[-1][2] == -1
    assert drain_counted(slurm, "n2", reasons.drain_reason("gpu.ecc", "x"), config, None).drained
    assert len(slurm.timed_drains) == 2 and slurm.drains[-1][0] == "n2"


def test_the_report_lists_past_drills(config, monkeypatch, capsys, tmp_path):
    d = drill.start_drill(config, "n1", "ecc", 1)
    step = drills.DrillStep(step="drained", at="2026-12-06T10:00:03Z", when=d.start + 3.5,
                            after_s=3.5)  # fmt: skip
    drills.record_drill(config, d, [step], False, "no requeued step")
    cfg = str(tmp_path / "site.yaml")
    assert cmd.main(["--report", "--config", cfg]) == 0
    out = capsys.readouterr().out
    assert f"{d.id}  n1  ecc  FAIL (no requeued step)  drained +3.5s" in out
    assert cmd.main(["--report", "--json", "--config", cfg]) == 0
    assert json.loads(capsys.readouterr().out)[0]["drill"] == d.to_json()


def test_the_record_is_bounded(config, monkeypatch):
    monkeypatch.setattr(drills, "MAX_RECORDS_PER_NODE", 3)
    d = drill.start_drill(config, "n1", "ecc", 1)
    for _ in range(5):
        drills.record_drill(config, d, [], True, "")
    assert len(drills.drill_records(config)) == 3


def test_drill_file_times_are_the_window(config):
    now = time.time()
    d = drill.start_drill(config, "n1", "hang", 0.5, now=now)
    assert d.end - d.start == pytest.approx(30) and d.node == "n1"


def test_end_closes_the_window_and_resumes_the_drills_drain(config, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    drill.start_drill(config, "n1", "xid79", 1)
    gather(config, "n1")
    ops = FakeOps(config)
    ops.killed.append("42")  # drained by the drill
    assert cmd.end_now(config, ops) == 0
    assert ops.resumed and drill.active_drill(config) is None


def test_end_resumes_a_drain_left_by_a_drill_that_died(config, monkeypatch, capsys):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    reasons.mark_drill("20261201-090000")  # its window is long over, its drain is not
    ops = FakeOps(config)
    ops.killed.append("42")
    assert cmd.end_now(config, ops) == 0 and ops.resumed
    ops = FakeOps(config)  # not drained: nothing to end
    assert cmd.end_now(config, ops) == 1
    assert "no drill is open and n1 has no drill's drain" in capsys.readouterr().err


def test_a_report_the_user_cannot_read_says_so(config, monkeypatch, capsys, tmp_path):
    d = drill.start_drill(config, "n1", "ecc", 1)
    drills.record_drill(config, d, [], True, "")
    monkeypatch.setattr(cmd.os, "access", lambda path, mode: False)
    assert cmd.main(["--report", "--config", str(tmp_path / "site.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_the_drill_mark_follows_each_gather(config):
    # A process that gathered under a drill and gathers again after it builds unmarked reasons.
    drill.start_drill(config, "n1", "ecc", 5)
    gather(config, "n1")
    assert "DRILL" in reasons.drain_reason("gpu.ecc", "x")
    drill.end_drill(config)
    gather(config, "n1")
    assert reasons.drain_reason("gpu.ecc", "x") == "gpugate: gpu.ecc: x"


class NotASlurmNode(FakeOps):
    """This host as Slurm sees it when it is no Slurm node (or has no scontrol)."""

    def __init__(self, config, error) -> None:
        super().__init__(config)
        self.error = error

    def node(self, node):
        raise self.error


def scontrol_result(status: str) -> object:
    from gpugate.runner import CommandResult

    return CommandResult(argv=("scontrol", "-o", "show", "node"), status=status)


@pytest.mark.parametrize("why", ["no scontrol", "unknown node", "no slurm.conf"])
def test_end_on_a_host_that_is_not_a_slurm_node_says_so_and_exits_2(config, monkeypatch,
                                                                     capsys, why):  # fmt: skip
    from gpugate.runner import CommandResult
    from gpugate.slurm import control

    monkeypatch.setenv("SLURMD_NODENAME", "laptop")
    if why == "no scontrol":
        error = control.SlurmMissing(scontrol_result("missing"))
    elif why == "unknown node":
        error = control.NodeNotFound("node laptop not found")
    else:  # scontrol installed, this host configured for no cluster
        fatal = "scontrol: fatal: Could not establish a configuration source"
        error = control.SlurmCommandError(CommandResult(argv=("scontrol",), status="nonzero",
                                                        returncode=1, stderr=fatal))  # fmt: skip
    assert cmd.end_now(config, NotASlurmNode(config, error)) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("gpugate drill: laptop is not a Slurm node here") and "Traceback" not in err
    )


def test_end_while_slurmctld_is_away_says_so_and_exits_1(config, monkeypatch, capsys):
    from gpugate.slurm.control import SlurmTimeout

    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    ops = NotASlurmNode(config, SlurmTimeout(scontrol_result("timeout")))
    assert cmd.end_now(config, ops) == 1
    assert "cannot ask Slurm about n1" in capsys.readouterr().err

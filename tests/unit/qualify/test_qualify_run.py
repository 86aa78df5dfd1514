"""qualify_nodes' orchestration: jobs, waits, verdicts, drains, the reservation, the records.

Slurm is FakeSlurm (nodes, drains, resumes) plus FakeOps, which "runs" each submitted job by
writing the result files a real job's steps would write, from a per-node bandwidth table.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import paths
import pytest
from factories import site
from fakes import FakeSlurm, drained
from qualify_ops import FAST, NODES, SLOW, FakeOps, config_with, go

from gpugate.qualify import jobs
from gpugate.qualify.run import QualifyError, qualify_nodes
from gpugate.store.history import drains, resumes
from gpugate.store.qualify import QualifyEntry, latest_pass, qualifications, record_qualification


def flag(argv: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in argv if a.startswith(name + "="))


@pytest.fixture
def config(tmp_path):
    return config_with(tmp_path, more="qualify:\n  wait_s: 5\n")


def test_a_node_slow_with_every_partner_is_named_and_drained_the_others_pass(config):
    slurm = FakeSlurm(NODES)
    ops = FakeOps(slurm, {"n1": FAST, "n2": SLOW, "n3": FAST})
    result = go(config, slurm, ops, requested_by="alice")
    v = result.verdicts
    assert v["n1"]["passed"] and v["n3"]["passed"] and not v["n2"]["passed"]
    assert (
        result.pairs["suspects"] == ["n2"]
        and "n2 is slow with every partner" in (result.pairs["text"])
    )
    n2_job = v["n2"]["job_ids"][0]
    reason = slurm.infos["n2"].reason
    assert reason.startswith("gpugate: qualify: allreduce: 2.00 GB/s is below")
    assert reason.endswith(f"(job {n2_job})") and v["n2"]["action"] == "drained"
    assert not slurm.infos["n1"].drained and not slurm.infos["n3"].drained
    # Every job exclusive, one node each, then 3 pair rounds of one pair (3 nodes: one sits out).
    argvs = ops.submitted
    assert all("--exclusive" in a and "--job-name=gpugate-qualify" in a for a in argvs)
    assert [flag(a, "--nodes") for a in argvs] == ["1"] * 3 + ["2"] * 3
    # No node was drained, so no reservation of gpugate's own (none configured: one anyway).
    assert ops.deleted == [ops.reservations[0][0]] and result.reservation == ops.deleted[0]
    state = config.state_dir
    recorded = qualifications(state)
    assert [(e.node, e.passed, e.by) for e in recorded] == [
        ("n1", True, "alice"), ("n2", False, "alice"), ("n3", True, "alice")]  # fmt: skip
    (drain,) = drains(state, "n2")
    assert drain.reason == reason and drain.job == n2_job and drain.hook == "qualify"
    with open(os.path.join(v["n2"]["bundle"], "summary.json")) as fh:
        summary = json.load(fh)
    assert summary["job"] == n2_job and summary["passed"] is False and summary["tests"]
    assert "allreduce.json" in summary["files"] and "dcgm.json" in summary["files"]


def test_a_low_priority_sweep_of_nodes_in_service_makes_no_reservation(config):
    slurm = FakeSlurm(NODES)
    ops = FakeOps(slurm, {"n1": FAST, "n2": FAST, "n3": FAST})
    swept = config.replace(qualify=config.qualify.replace(nice=100))
    result = go(swept, slurm, ops)
    assert all(v["passed"] for v in result.verdicts.values())
    assert ops.reservations == [] and result.reservation is None
    assert all("--nice=100" in a and not any(x.startswith("--reservation") for x in a)
               for a in ops.submitted)  # fmt: skip


def test_a_drained_node_is_resumed_into_the_reservation_and_drained_again_as_before(config):
    old = "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100"
    slurm = FakeSlurm(["n1", drained("n2", old), "n3"])
    ops = FakeOps(slurm, {"n1": FAST, "n2": FAST, "n3": FAST})
    result = go(config, slurm, ops)
    assert all(v["passed"] for v in result.verdicts.values())
    assert slurm.resumed == ["n2"] and slurm.infos["n2"].reason == old
    assert result.verdicts["n2"]["action"] == "drained as before"
    # drained again while the reservation still held it; the reservation named every node
    assert ops.drained_at_delete["n2"] and ops.reservations[0][1] == ["n1", "n2", "n3"]
    assert all(f"--reservation={ops.reservations[0][0]}" in a for a in ops.submitted)
    assert latest_pass(config.state_dir, "n2").run_id == result.run_id
    assert resumes(config.state_dir, "n2") == []


def test_resume_passed_resumes_a_passing_drained_node_with_an_audit_entry(config):
    slurm = FakeSlurm(["n1", drained("n2", "gpugate: gpu.ecc: x")])
    ops = FakeOps(slurm, {"n1": FAST, "n2": FAST})
    result = go(config, slurm, ops, resume_passed=True, requested_by="bob")
    assert not slurm.infos["n2"].drained and result.verdicts["n2"]["action"] == "resumed"
    (entry,) = resumes(config.state_dir, "n2")
    assert entry.who == "bob" and result.run_id in entry.why


def test_a_failing_node_that_was_drained_stays_drained_with_the_qualification_reason(config):
    slurm = FakeSlurm(["n1", drained("n2", "gpugate: gpu.ecc: x"), "n3"])
    ops = FakeOps(slurm, {"n1": FAST, "n2": SLOW, "n3": FAST})
    result = go(config, slurm, ops)
    assert result.verdicts["n2"]["action"] == "kept drained"
    assert slurm.infos["n2"].reason.startswith("gpugate: qualify: ")


def test_a_crash_mid_run_drains_every_taken_node_again_and_deletes_the_reservation(config):
    old = "gpugate: gpu.ecc: x"
    slurm = FakeSlurm(["n1", drained("n2", old)])
    ops = FakeOps(slurm, {"n1": FAST, "n2": FAST}, never=("n1",))
    ops.fail_state = RuntimeError("slurmctld went away")
    with pytest.raises(RuntimeError):
        go(config, slurm, ops)
    assert slurm.infos["n2"].drained and slurm.infos["n2"].reason == old
    assert ops.deleted == [ops.reservations[0][0]] and ops.drained_at_delete["n2"]
    assert ops.cancelled == ["101", "102"]  # every job not seen ending is cancelled


def test_a_job_that_never_starts_is_cancelled_and_reported_without_a_drain(config):
    slurm = FakeSlurm(NODES)
    ops = FakeOps(slurm, {"n1": FAST, "n2": FAST, "n3": FAST}, never=("n3",))
    result = go(config, slurm, ops, wait_s=0.2)
    v = result.verdicts["n3"]
    assert not v["passed"] and not v["failed"] and not slurm.infos["n3"].drained
    assert (
        "job 103: still PENDING after 0.2 s (qualify.wait_s) (Slurm: ReqNodeNotAvail): "
        "cancelled; the node is not available" in v["why"]
    )
    assert ops.cancelled == ["103"]
    assert result.verdicts["n1"]["passed"] and result.pairs["suspects"] == []
    # no pair with the node that never ran
    assert [flag(a, "--nodelist") for a in ops.submitted[3:]] == ["n1,n2"]


def test_the_same_payload_error_on_every_node_is_the_setup_not_the_nodes(config):
    slurm = FakeSlurm(["n1", "n2"])
    ops = FakeOps(slurm, {"n1": FAST, "n2": FAST}, error={"n1": "no torch", "n2": "no torch"})
    result = go(config, slurm, ops, tests=["allreduce"])
    for v in result.verdicts.values():
        assert not v["failed"] and v["tests"][0].ok is None
    assert slurm.drains == []


def test_an_admins_drain_unknown_nodes_and_bad_tests_are_refused_before_anything(config):
    slurm = FakeSlurm(["n1", drained("n2", "bad fan, ticket 7", user="admin")])
    ops = FakeOps(slurm, {})
    with pytest.raises(QualifyError, match="not drained by gpugate: n2"):
        go(config, slurm, ops)
    with pytest.raises(QualifyError, match="Slurm does not know node"):
        qualify_nodes(config, slurm, ["n9"], 1, None, ops=ops)
    with pytest.raises(QualifyError, match="unknown test"):
        qualify_nodes(config, slurm, ["n1"], 1, ["nccl"], ops=ops)
    with pytest.raises(QualifyError, match="1 to 4"):
        qualify_nodes(config, slurm, ["n1"], 5, None, ops=ops)
    assert ops.submitted == [] and ops.reservations == []


def test_the_sbatch_argv_and_the_job_script_are_argument_safe(config, tmp_path):
    qc = config.qualify.replace(python="/opt/my torch/bin/python", qos="maint", partition=None)
    argv = jobs.sbatch_argv("/r/n1.sh", ["n1"], qc, 8, "/r/n1.out", "res", gpus_per_node=8)
    assert argv[:2] == ["sbatch", "--parsable"] and argv[-1] == "/r/n1.sh"
    for flag in ("--nodelist=n1", "--exclusive", "--reservation=res", "--qos=maint",
                 "--gres=gpu:8", "--ntasks-per-node=8", "--time=30", "--no-requeue"):  # fmt: skip
        assert flag in argv
    assert not any(a.startswith("--partition") for a in argv)
    with pytest.raises(ValueError):
        jobs.sbatch_argv("/r/x.sh", ["-n1"], qc, 1, "/r/x.out", None)
    script = jobs.node_script(str(tmp_path), "n1", ["dcgm", "allreduce", "h2d"], qc, 2, 8)
    assert "'/opt/my torch/bin/python'" in script and "--ntasks-per-node=8" in script
    assert "--step dcgm --level 2" in script and "MASTER_PORT" in script
    path = tmp_path / "s.sh"
    path.write_text(script)
    assert subprocess.run(["sh", "-n", str(path)], check=False).returncode == 0
    assert jobs.ntasks_for(qc.replace(ntasks_per_node=None), 4) == 4
    assert jobs.ntasks_for(qc.replace(ntasks_per_node=None), None) == 1


def test_the_job_step_runs_gpugate_from_where_this_process_found_it(config, tmp_path, monkeypatch):
    """The packaged gpugate is on no interpreter's own path (/opt/gpugate/lib, put there by its
    launcher): `python3 -m gpugate` in the job failed with "No module named gpugate"."""
    from gpugate.child import cli_command

    lib = tmp_path / "lib" / "gpugate"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (lib / "cli.py").write_text(
        "import sys\ndef main():\n    print('lib gpugate', sys.argv[1:])\n    return 0\n"
    )
    monkeypatch.setattr(sys, "path", [str(lib.parent), *sys.path])
    argv = [*cli_command(), "qualify", "--step", "dcgm"]
    done = subprocess.run(argv, cwd="/", capture_output=True, text=True, timeout=60, env={})
    assert done.stdout == "lib gpugate ['qualify', '--step', 'dcgm']\n", done.stderr
    script = jobs.node_script(str(tmp_path), "n1", ["dcgm"], config.qualify, 1, 1)
    assert shlex.join(argv[:5]) in script, script


def test_latest_pass_is_voided_by_a_later_failure_and_respects_the_level(tmp_path):
    d = str(tmp_path)
    base = QualifyEntry(node="n1", when=0, run_id="r", tests=[], job_ids=["5"], why="", by="x",
                        level=1, passed=True)  # fmt: skip
    record_qualification(d, base.replace(when=100, level=1, passed=True))
    assert latest_pass(d, "n1").when == 100 and latest_pass(d, "n1", level=2) is None
    record_qualification(d, base.replace(when=200, level=2, passed=False))
    assert latest_pass(d, "n1") is None and latest_pass(d, "n1", since=300) is None
    with open(os.path.join(d, "qualify.jsonl"), "a") as fh:
        fh.write('{"node": "n1", "when": "soon"}\n[]\n')
    assert len(qualifications(d, "n1")) == 2
    for i in range(5):
        record_qualification(d, base.replace(when=300 + i, level=1, passed=True), max_per_node=3)
    assert [e.when for e in qualifications(d, "n1")] == [302, 303, 304]


def test_the_command_is_root_only_and_prints_a_table(monkeypatch, capsys, config):
    from gpugate.commands import qualify as cmd

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cmd.main(["n1"]) == 2
    assert "root only" in capsys.readouterr().err
    slurm = FakeSlurm(NODES)
    result = go(config, slurm, FakeOps(slurm, {"n1": FAST, "n2": SLOW, "n3": FAST}))
    text = cmd.table(result)
    assert "n2           FAIL" in text and "n1           PASS" in text
    assert "pairs: " in text and "n2 is slow with every partner" in text


def test_the_config_refuses_a_level_beyond_dcgm_and_a_fraction_over_one(tmp_path):
    from gpugate.config import ConfigError

    with pytest.raises(ConfigError, match=r"qualify\.level"):
        site(tmp_path, "qualify:\n  level: 5\n")
    with pytest.raises(ConfigError, match="min_fraction_of_median"):
        site(tmp_path, "qualify:\n  min_fraction_of_median: 1.5\n")


def test_a_new_failure_over_the_drain_budget_is_recorded_not_drained(tmp_path):
    config = site(tmp_path, f"state_dir: {tmp_path}/state\nevidence_dir: {tmp_path}/ev\n"
                  "budget:\n  settle_s: 0\n  jitter_s: 0\n  max_drained_share: 0.0\n  min_drains_allowed: 0\n"
                  "  hardware_share: 0.0\n")  # fmt: skip
    slurm = FakeSlurm(NODES)
    result = go(config, slurm, FakeOps(slurm, {"n1": FAST, "n2": SLOW, "n3": FAST}))
    v = result.verdicts["n2"]
    assert v["failed"] and v["action"].startswith("not drained (budget")
    assert slurm.drains == [] and not qualifications(config.state_dir, "n2")[0].passed


def test_the_dcgm_step_writes_the_stand_ins_verdict(tmp_path, monkeypatch):
    from gpugate.commands import qualify as cmd

    standin = str(paths.DCGMI_STANDIN)
    monkeypatch.setenv("GPUGATE_DCGMI_REPLAY", os.path.join(standin, "replay"))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-memfail")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    out = tmp_path / "dcgm.json"
    argv = ["--step", "dcgm", "--level", "2", "--dcgmi", os.path.join(standin, "dcgmi"),
            "--node", "gpu-memfail", "--out", str(out), "--timeout", "60"]  # fmt: skip
    assert cmd.main(argv) == 1
    written = json.loads(out.read_text())
    assert (
        written["ok"] is False and written["job_id"] == "77" and written["nodes"] == ["gpu-memfail"]
    )
    assert cmd.main(["--step", "dcgm", "--node", "x"]) == 2  # no --out


def test_no_wait_runs_the_same_qualification_detached(tmp_path, monkeypatch, capsys):
    from gpugate.commands import qualify as cmd

    started = []

    class Popen:
        def __init__(self, argv, **kw):
            started.append((argv, kw))
            self.pid = 4242

    monkeypatch.setattr(subprocess, "Popen", Popen)
    assert cmd.background(["n1", "--no-wait", "--level", "2"], str(tmp_path)) == 0
    ((argv, kw),) = started
    assert argv[-4:] == ["qualify", "n1", "--level", "2"] and kw["start_new_session"]
    assert "pid 4242" in capsys.readouterr().out


def test_old_run_directories_are_pruned_keeping_the_newest(tmp_path):
    from gpugate.qualify.run import new_run

    state = str(tmp_path / "state")
    made = [new_run(state, keep=3)[1] for _ in range(5)]
    # A name that is not a run is never touched.
    (tmp_path / "state" / "qualify" / "notes").mkdir()
    new_run(state, keep=3)
    left = sorted(os.listdir(tmp_path / "state" / "qualify"))
    assert "notes" in left and len(left) == 4
    assert not os.path.exists(made[0]) and not os.path.exists(made[2])
    assert os.path.exists(made[4])

"""Qualification jobs a node can run, their progress, and arguments checked before anything runs
(issue 28, Deliver 2 and 5).

Slurm is FakeSlurm plus test_qualify_run's FakeOps (jobs that end at once); every refusal is
asserted to have submitted nothing and reserved nothing.
"""

from __future__ import annotations

import json
import os
import subprocess

import paths
import pytest
from factories import site
from fakes import FakeSlurm
from qualify_ops import FAST, FakeOps

from gpugate.qualify import jobs, progress
from gpugate.qualify import run as qrun
from gpugate.qualify.run import QualifyError, qualify_nodes
from gpugate.slurm.control import SlurmError
from gpugate.slurm.parse_json import parse_nodes_json, parse_sinfo_json
from gpugate.slurm.parse_text import parse_show_node_text

# The real Slurm outputs beside the checkout (../shared/reference), read by path, never copied.
REF = os.path.join(str(paths.TESTS), "..", "..", "shared", "reference")
NODES = ["n1", "n2", "n3"]


@pytest.fixture
def config(tmp_path):
    return site(tmp_path, f"state_dir: {tmp_path}/state\nevidence_dir: {tmp_path}/ev\n"
                "budget:\n  settle_s: 0\n  max_drained_share: 1.0\n  min_drains_allowed: 5\n"
                "qualify:\n  wait_s: 5\n")  # fmt: skip


def cluster(cpus: int | None = 2, gpus: int | None = None, **extra) -> FakeSlurm:
    slurm = FakeSlurm(NODES)
    slurm.infos = {n: i.replace(cpus=cpus, gres_gpus=gpus, **extra) for n, i in slurm.infos.items()}
    return slurm


def with_qualify(config, **changes):
    return config.replace(qualify=config.qualify.replace(**changes))


def go(config, slurm, ops, **kw):
    return qualify_nodes(config, slurm, list(slurm.infos), 1, None, ops=ops, **kw)


# --- the node records carry their CPUs ------------------------------------------------------


@pytest.mark.skipif(not os.path.isdir(REF), reason=f"no reference outputs at {REF} (shared/ is "
                    "not beside this checkout)")  # fmt: skip
@pytest.mark.shared("reference")
def test_the_node_records_read_the_cpus_from_text_and_json():
    with open(f"{REF}/slurm-samples/scontrol-show-node.drained.txt") as fh:
        (text,) = parse_show_node_text(fh.read())
    real = f"{REF}/real-outputs/slurm-24.11-debian13"
    with open(f"{real}/scontrol-show-node.drained.json") as fh:
        js = parse_nodes_json(fh.read())
    with open(f"{real}/sinfo.drained.json") as fh:
        si = parse_sinfo_json(fh.read())
    assert text.cpus == 2 and {n.cpus for n in js} == {2} and {n.cpus for n in si} == {2}
    (bare,) = parse_show_node_text("NodeName=x State=IDLE\n")
    assert bare.cpus is None  # not said: unknown, never 0


# --- Deliver 2: geometry refused at once ----------------------------------------------------


def test_more_ranks_than_cpus_is_refused_before_any_reservation_or_job(config):
    slurm = cluster(cpus=2)
    ops = FakeOps(slurm, dict.fromkeys(NODES, FAST))
    with pytest.raises(QualifyError, match=r"n1 has 2 CPUs; qualify.ntasks_per_node is 8: "
                       r"set qualify.ntasks_per_node to at most 2"):  # fmt: skip
        go(with_qualify(config, ntasks_per_node=8), slurm, ops)
    assert ops.submitted == [] and ops.reservations == [] and slurm.resumed == []
    assert ops.submitted == [] and ops.reservations == []


def test_one_rank_per_gpu_is_capped_at_the_node_cpus(config):
    """The default (one rank per Gres GPU) fits the node: 8 GPUs, 2 CPUs -> 2 ranks, no wait."""
    slurm = cluster(cpus=2, gpus=8)
    ops = FakeOps(slurm, dict.fromkeys(NODES, FAST))
    result = go(config, slurm, ops, wait_s=1)
    assert all(v["passed"] for v in result.verdicts.values())
    assert ops.submitted and all("--ntasks-per-node=2" in argv for argv in ops.submitted)
    assert all("--gres=gpu:8" in argv for argv in ops.submitted)  # the whole node still


def test_a_geometry_the_node_has_runs_and_asks_the_whole_node_and_its_gpus(config):
    slurm = cluster(cpus=16, gpus=8)
    ops = FakeOps(slurm, dict.fromkeys(NODES, FAST))
    result = go(config, slurm, ops, wait_s=1)
    assert all(v["passed"] for v in result.verdicts.values())
    first = ops.submitted[0]
    assert "--exclusive" in first and "--ntasks-per-node=8" in first and "--gres=gpu:8" in first


def test_a_node_slurm_cannot_start_a_job_on_or_outside_the_partition_is_refused(config):
    slurm = cluster(flags=("NOT_RESPONDING",))
    ops = FakeOps(slurm, dict.fromkeys(NODES, FAST))
    with pytest.raises(QualifyError, match=r"n1 is IDLE\+NOT_RESPONDING .*: Slurm starts no job"):
        go(config, slurm, ops)
    # Powered down by power saving: Slurm powers it up for the job.
    slurm = cluster(flags=("NOT_RESPONDING", "POWERED_DOWN"))
    assert all(v["passed"] for v in go(config, slurm, ops, wait_s=1).verdicts.values())
    ops.submitted.clear()
    ops.reservations.clear()
    slurm = cluster(partitions=("cpu",))
    with pytest.raises(QualifyError, match="n1 is not in partition gpu"):
        go(with_qualify(config, partition="gpu"), slurm, ops)
    assert ops.submitted == [] and ops.reservations == []


# --- Deliver 2: a refused job is over, a pending one times out with Slurm's reason -----------


class RefusingOps(FakeOps):
    """sbatch refuses the jobs of some nodes; asking the state of no job fails the test."""

    def __init__(self, *a, refuse=(), **kw):
        super().__init__(*a, **kw)
        self.refuse = set(refuse)

    def submit(self, argv):
        nodes = next(a for a in argv if a.startswith("--nodelist=")).split("=")[1].split(",")
        if set(nodes) & self.refuse:
            raise SlurmError("sbatch: error: Batch job submission failed: Invalid qos")
        return super().submit(argv)

    def state(self, job_id):
        assert job_id is not None, "a refused job was polled"
        return super().state(job_id)

    def cancel(self, job_id):
        assert job_id is not None, "a refused job was cancelled"
        super().cancel(job_id)


def test_a_job_sbatch_refuses_is_ended_and_its_node_not_qualified_with_sbatchs_word(config):
    slurm = cluster()
    ops = RefusingOps(slurm, dict.fromkeys(NODES, FAST), refuse=("n2",))
    said: list[str] = []
    result = go(config, slurm, ops, wait_s=2, progress=said.append)
    v = result.verdicts["n2"]
    assert not v["passed"] and not v["failed"] and not slurm.infos["n2"].drained
    assert "sbatch refused the job" in v["why"] and "Invalid qos" in v["why"]
    assert result.verdicts["n1"]["passed"] and ops.cancelled == []
    assert any(line.startswith("n2: sbatch refused the job") for line in said)


def test_progress_names_each_job_its_wait_and_the_timeout_with_slurms_reason(config, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.0)  # FakeOps polls every 0.01 s
    slurm = cluster()
    ops = FakeOps(slurm, dict.fromkeys(NODES, FAST), never=("n3",))
    said: list[str] = []
    go(with_qualify(config, tests=["dcgm"]), slurm, ops, wait_s=0.2, progress=said.append)
    assert said[:3] == ["job 101 submitted: n1", "job 102 submitted: n2", "job 103 submitted: n3"]
    waiting = [line for line in said if line.startswith("job 103 on n3: PENDING")]
    assert waiting and "(Slurm: ReqNodeNotAvail)" in waiting[0] and " s left" in waiting[0]
    assert said[-1].startswith("job 103 on n3: still PENDING after 0.2 s (qualify.wait_s) "
                               "(Slurm: ReqNodeNotAvail): cancelled; the node is not available")  # fmt: skip


def test_a_running_jobs_line_names_the_step_its_script_announced(tmp_path):
    script = jobs.node_script(str(tmp_path), "n1", ["dcgm", "allreduce", "h2d"],
                              site(tmp_path, "qualify: {}\n").qualify, 1, 2)  # fmt: skip
    assert script.index("echo 'gpugate-step: dcgm'") < script.index("'gpugate-step: allreduce'")
    out = tmp_path / "n1.out"
    job = qrun.Job(name="n1", nodes=("n1",), job_id="7", output=str(out), state="RUNNING")
    assert progress.job_line(job, 99.6) == "job 7 on n1: RUNNING, 99 s left"  # no output yet
    out.write_text("gpugate-step: dcgm\nsome dcgmi text\ngpugate-step: allreduce\nrank 0\n")
    assert progress.job_line(job, 30) == "job 7 on n1: RUNNING (step allreduce), 30 s left"
    assert progress.pending_meaning("ReqNodeNotAvail,_UnavailableNodes:n1").startswith("the node")
    assert progress.pending_meaning("QOSMaxJobsPerUserLimit").startswith("a QOS")
    assert progress.pending_meaning("SomethingNew") == ""
    fresh = job.replace(state="PENDING", note="None")  # not yet looked at by the scheduler
    assert progress.job_line(fresh, 5) == "job 7 on n1: PENDING, 5 s left"


# --- Deliver 5: usage errors before anything runs, --no-wait included -----------------------


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """The command as root with a config; any Slurm backend, run or child fails the test."""
    from gpugate.commands import qualify as cmd

    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {tmp_path}/state\nevidence_dir: {tmp_path}/ev\nqualify: {{}}\n")
    monkeypatch.setattr(os, "geteuid", lambda: 0)

    def forbidden(*a, **k):
        raise AssertionError("ran past the argument checks")

    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr(qrun, "qualify_nodes", forbidden)
    return lambda *argv: cmd.main([*argv, "--config", str(cfg)], make_slurm=forbidden)


@pytest.mark.parametrize("wait", [[], ["--no-wait"]], ids=["wait", "no-wait"])
@pytest.mark.parametrize(("argv", "said"), [
    (["n1", "--tests", ""], "--tests names no test"),
    (["n1", "--tests", ","], "--tests names no test"),
    (["n1", "--tests", "dcgm,burn"], "unknown test(s) burn"),
    (["--idle", "--max-nodes", "0"], "--max-nodes must be at least 1"),
    (["--idle", "--max-nodes", "-3"], "--max-nodes must be at least 1"),
    (["n1", "--max-nodes", "1"], "--max-nodes goes with --idle"),
    (["n[1-2],n1"], "node(s) named twice: n1"),
    (["n1", "n1"], "node(s) named twice: n1"),
    (["n1", "--level", "0"], "--level must be 1 to 4"),
    (["n1", "--level", "5"], "--level must be 1 to 4"),
    (["n1", "n2;x"], "n2;x"),
])  # fmt: skip
def test_a_usage_error_is_refused_before_any_slurm_call_or_child(cli, capsys, argv, said, wait):
    assert cli(*argv, *wait) == 2
    assert said in capsys.readouterr().err


def test_good_arguments_reach_the_background_child(cli, monkeypatch, capsys):
    started = []

    class Popen:
        def __init__(self, argv, **kw):
            started.append(argv)
            self.pid = 7

    monkeypatch.setattr(subprocess, "Popen", Popen)
    assert cli("n[1-2]", "--tests", "dcgm", "--no-wait") == 0
    assert started and started[0][-5:-2] == ["n[1-2]", "--tests", "dcgm"]


def test_json_keeps_stdout_pure_and_progress_on_stderr(tmp_path, monkeypatch, capsys):
    import types

    from gpugate.commands import qualify as cmd

    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {tmp_path}/state\nevidence_dir: {tmp_path}/ev\nqualify: {{}}\n")
    monkeypatch.setattr(os, "geteuid", lambda: 0)

    def fake(config, slurm, nodes, level, tests, progress=None, **kw):
        progress("job 5 submitted: n1")
        verdicts = {"n1": {"passed": True, "failed": False, "tests": [], "job_ids": ["5"],
                           "why": ""}}  # fmt: skip
        return types.SimpleNamespace(run_id="r", nodes=nodes, verdicts=verdicts, pairs=None,
                                     reservation=None, level=level, tests=["dcgm"],
                                     to_dict=lambda: {"run_id": "r"})  # fmt: skip

    monkeypatch.setattr(qrun, "qualify_nodes", fake)
    slurm = FakeSlurm(NODES)
    assert cmd.main(["n1", "--json", "--config", str(cfg)], make_slurm=lambda c: slurm) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"run_id": "r"} and "job 5 submitted: n1" in err
    assert cmd.main(["n1", "--config", str(cfg)]) == 0
    assert "gpugate qualify: job 5 submitted: n1" in capsys.readouterr().out

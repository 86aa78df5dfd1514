"""A missing tool is "not run", never a drain; DCGM is skipped on MIG GPUs (issue 28, D3 + D6).

Each path end to end where it can be without Slurm: the batch script's lines run by sh, the
payload by a python without torch, the DCGM step by its generated line under `env -i`, then the
judge on the files they wrote and the orchestration (FakeSlurm) that must drain nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import paths
import pytest
from factories import site
from fakes import FakeSlurm
from qualify_ops import FAST, FakeOps, go

from gpugate.qualify import dcgm, jobs, judge
from gpugate.qualify.records import Job

SYSTEM_PYTHON = "/usr/bin/python3"
STANDIN = paths.DCGMI_STANDIN / "dcgmi"


@pytest.fixture
def config(tmp_path):
    return site(tmp_path, f"state_dir: {tmp_path}/state\nevidence_dir: {tmp_path}/ev\n"
                "budget:\n  settle_s: 0\n  max_drained_share: 1.0\n  min_drains_allowed: 5\n"
                "qualify:\n  wait_s: 5\n")  # fmt: skip


def run_script(text: str, tmp_path: Path, env: dict[str, str] | None = None) -> int:
    """Run a generated batch script (or a part) with sh, as the job would; its exit status."""
    path = tmp_path / "job.sh"
    path.write_text(text)
    base = env if env is not None else {"PATH": os.environ["PATH"]}
    done = subprocess.run(["sh", str(path)], env={**base, "SLURM_JOB_ID": "7"}, cwd="/",
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    return done.returncode


def started(node: str, job_id: str = "7") -> Job:
    return Job(name=node, nodes=(node,), job_id=job_id, state="COMPLETED", started=True,
               output="/r/o.out")  # fmt: skip


# --- qualify.python that is not there ----------------------------------------------------------


def test_a_missing_qualify_python_writes_not_run_instead_of_running_srun(config, tmp_path):
    qc = config.qualify.replace(python=str(tmp_path / "no" / "python"))
    run_dir = tmp_path / "run"
    script = jobs.node_script(str(run_dir), "n1", ["allreduce", "h2d"], qc, 1, 1)
    assert run_script(script, tmp_path) == 0  # srun never ran: no failure to remember
    for test in ("allreduce", "h2d"):
        got = json.loads((run_dir / "n1" / f"{test}.json").read_text())
        assert got["test"] == test and "error" not in got
        assert got["not_run"].startswith(f"qualify.python {qc.python} is not found")
        assert "set qualify.python" in got["fix"]
    pair = jobs.pair_script(str(run_dir), ("n1", "n2"), qc, 1)
    run_script(pair, tmp_path)
    assert "not_run" in json.loads((run_dir / "pair-n1-n2" / "allreduce.json").read_text())


def test_a_qualify_python_that_is_there_is_run(config, tmp_path):
    """The guard lets an existing interpreter through (a bare name is looked up on PATH)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    srun = fake_bin / "srun"
    srun.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/srun.args\n')
    srun.chmod(0o755)
    qc = config.qualify.replace(python="sh")
    script = jobs.node_script(str(tmp_path / "run"), "n1", ["h2d"], qc, 1, 1)
    assert run_script(script, tmp_path, {"PATH": f"{fake_bin}:/usr/bin:/bin"}) == 0
    assert "h2d --out" in (tmp_path / "srun.args").read_text()


# --- the judge and the orchestration ----------------------------------------------------------


def write(run_dir: Path, node: str, test: str, obj: dict) -> None:
    (run_dir / node).mkdir(parents=True, exist_ok=True)
    (run_dir / node / f"{test}.json").write_text(json.dumps(obj))


NO_TORCH = {"not_run": "no torch in /usr/bin/python3: No module named 'torch'",
            "fix": "set qualify.python to an interpreter with PyTorch"}  # fmt: skip


def test_the_judge_makes_not_run_unjudged_and_the_node_not_qualified(config, tmp_path):
    run_dir = tmp_path / "run"
    for node in ("n1", "n2"):
        write(run_dir, node, "allreduce", {"test": "allreduce", **NO_TORCH})
        write(run_dir, node, "h2d", {"test": "h2d", **NO_TORCH})
        write(run_dir, node, "dcgm", dcgm.dcgm_step(1, str(tmp_path / "no-dcgmi"), 5, node,
                                                    nvidia_smi=str(tmp_path / "no-smi")).to_json())  # fmt: skip
    verdicts, _ = judge.judge_all(config, str(run_dir), [started("n1"), started("n2", "8")],
                                      [], ["dcgm", "allreduce", "h2d"])  # fmt: skip
    for v in verdicts.values():
        assert not v["passed"] and not v["failed"]
        assert [t.ok for t in v["tests"]] == [None, None, None]
        assert all(t.detail.split(": ")[1] == "not run" for t in v["tests"]), v["tests"]
        assert v["why"].startswith("not qualified: dcgm: not run: ")
        assert "allreduce: not run: no torch in /usr/bin/python3" in v["why"]
        assert "fix: set qualify.python" in v["why"] and "fix: install DCGM" in v["why"]
        assert "the same on every node" not in v["why"]  # not an error: a tool the site lacks


def test_a_pair_whose_python_lacks_torch_is_not_run_not_measured(config, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "pair-n1-n2").mkdir(parents=True)
    (run_dir / "pair-n1-n2" / "allreduce.json").write_text(json.dumps(NO_TORCH))
    pair = Job(
        name="pair-n1-n2",
        nodes=("n1", "n2"),
        job_id="9",
        state="COMPLETED",
        started=True,
        output="/r/p",
    )
    _, pairs = judge.judge_all(config, str(run_dir), [started("n1"), started("n2")], [pair],
                               ["pairs"])  # fmt: skip
    assert pairs == {"not_run": [{"nodes": ["n1", "n2"], "job_id": "9",
                                  "why": f"pair: not run: {NO_TORCH['not_run']}; fix: "
                                         f"{NO_TORCH['fix']}"}],
                     "text": f"no pair ran: pair: not run: {NO_TORCH['not_run']}; fix: "
                             f"{NO_TORCH['fix']}"}  # fmt: skip


class NoTorchOps(FakeOps):
    """Jobs on nodes whose qualify.python has no torch and that have no dcgmi."""

    def _node_results(self, run_dir: str, node: str, job_id: str) -> None:
        step = dcgm.dcgm_step(1, "/nonexistent/dcgmi", 5, node, job_id, nvidia_smi="/nonexistent")
        self._write(run_dir, node, "dcgm", step.to_json())
        for test in ("allreduce", "h2d"):
            self._write(run_dir, node, test, {"test": test, **NO_TORCH})

    def submit(self, argv: list[str]) -> str:
        nodes = next(a for a in argv if a.startswith("--nodelist=")).split("=")[1].split(",")
        if len(nodes) == 1:
            return super().submit(argv)
        self.submitted.append(argv)
        job_id = str(100 + len(self.submitted))
        self._write(os.path.dirname(argv[-1]), f"pair-{nodes[0]}-{nodes[1]}", "allreduce",
                    {"test": "allreduce", **NO_TORCH})  # fmt: skip
        self.states[job_id] = "COMPLETED"
        return job_id


def test_a_site_without_torch_or_dcgmi_drains_nothing(config):
    slurm = FakeSlurm(["n1", "n2", "n3"])
    ops = NoTorchOps(slurm, {"n1": FAST, "n2": FAST, "n3": FAST})
    result = go(config, slurm, ops)
    assert slurm.drains == []
    for v in result.verdicts.values():
        assert not v["passed"] and not v["failed"] and "not run" in v["why"]


# --- gpugate's own DCGM step, from the line the batch script carries ----------------------------


def dcgm_line(config, tmp_path: Path) -> tuple[str, Path]:
    qc = config.qualify.replace(dcgmi=str(tmp_path / "no-dcgmi"))
    run_dir = tmp_path / "run"
    script = jobs.node_script(str(run_dir), "n1", ["dcgm"], qc, 1, 1)
    return script, run_dir


def test_the_dcgm_step_line_imports_gpugate_with_no_environment(config, tmp_path):
    """The line carries this process's python and its absolute sys.path: it starts under
    `env -i` (no PATH, no PYTHONPATH), as from the .deb's /usr/bin/python3 + /opt/gpugate/lib."""
    script, run_dir = dcgm_line(config, tmp_path)
    assert sys.executable in script
    # The package's own path rides on the line: where this process found gpugate.
    paths = [p for p in sys.path if os.path.isabs(p)]
    assert shlex.quote(json.dumps(paths)) in script
    run_script(script, tmp_path, env={})
    got = json.loads((run_dir / "n1" / "dcgm.json").read_text())
    assert got["ok"] is None and got["error"] == "missing" and got["fix"] == dcgm.FIX_DCGMI
    assert got["detail"].startswith(f"dcgm: not run: {tmp_path}/no-dcgmi (qualify.dcgmi) not found")


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="no /usr/bin/python3")
def test_a_dcgm_step_that_cannot_import_gpugate_is_not_run_with_its_error(
    config, tmp_path, monkeypatch
):
    """A python with no gpugate on its path (the system one, isolated): the step cannot start,
    and the judge says so from its stderr instead of "no result"."""
    monkeypatch.setattr(sys, "executable", SYSTEM_PYTHON)
    bare = [p for p in sys.path if os.path.isabs(p) and "-packages" not in p
            and not os.path.isdir(os.path.join(p, "gpugate"))]  # fmt: skip
    monkeypatch.setattr(sys, "path", bare)
    monkeypatch.setattr("gpugate.child._self_contained", lambda: True)
    script, run_dir = dcgm_line(config, tmp_path)
    assert run_script(script, tmp_path, env={}) == 1
    assert not (run_dir / "n1" / "dcgm.json").exists()
    verdicts, _ = judge.judge_all(config, str(run_dir), [started("n1")], [], ["dcgm"])
    v = verdicts["n1"]
    assert not v["passed"] and not v["failed"]
    detail = v["tests"][0].detail
    assert detail.startswith("dcgm: not run: gpugate's DCGM step could not start: ")
    assert "No module named 'gpugate'" in detail and "no result" not in detail


# --- dcgmi that cannot test: no host engine, MIG -----------------------------------------------


def fake_tool(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_no_host_engine_is_not_run_with_the_fix(tmp_path):
    dcgmi = fake_tool(tmp_path, "dcgmi", "print('Error: unable to establish a connection to the "
                      "specified host: localhost'); print('Error: Unable to connect to host "
                      "engine. Host engine connection invalid/disconnected.'); sys.exit(1)")  # fmt: skip
    step = dcgm.dcgm_step(1, dcgmi, 10, "n1", nvidia_smi=str(tmp_path / "no-smi"))
    assert step.ok is None and step.error == "hostengine"
    assert step.fix == dcgm.FIX_HOSTENGINE and "nvidia-dcgm" in step.detail


def smi(tmp_path: Path, lines: str) -> str:
    return fake_tool(tmp_path, "nvidia-smi", f"assert '--query-gpu=index,mig.mode.current' in "
                     f"sys.argv\nprint({lines!r}, end='')")  # fmt: skip


@pytest.mark.parametrize(
    ("lines", "gpus"),
    [("0, Enabled\n1, Disabled\n2, Enabled\n", [0, 2]), ("0, Disabled\n", []),
     ("0, [N/A]\n1, [N/A]\n", []), ("", [])],
)  # fmt: skip
def test_mig_gpus_from_nvidia_smi(tmp_path, lines, gpus):
    assert dcgm.mig_gpus(smi(tmp_path, lines)) == gpus


def test_mig_gpus_unknown_without_nvidia_smi(tmp_path):
    assert dcgm.mig_gpus(str(tmp_path / "none")) is None
    assert dcgm.mig_gpus(fake_tool(tmp_path, "bad-smi", "sys.exit(9)")) is None


def test_on_a_mig_gpu_dcgm_is_skipped_with_the_reason_and_not_run(tmp_path):
    ran = tmp_path / "dcgmi-ran"
    dcgmi = fake_tool(tmp_path, "dcgmi", f"open({str(ran)!r}, 'w').close()")
    step = dcgm.dcgm_step(2, dcgmi, 10, "n1", "5", nvidia_smi=smi(tmp_path, "0, Enabled\n"))
    assert not ran.exists()  # dcgmi was never asked
    assert step.ok is None and step.not_tested and step.mig == [0]
    assert step.detail.startswith("dcgm: not run: GPU 0 in MIG mode: DCGM's diagnostic does "
                                     "not support MIG")  # fmt: skip
    res = judge.dcgm_result(step, "n1", "5", "")
    assert res.ok is None and res.detail.startswith("dcgm: not run: GPU 0 in MIG mode")


def test_without_mig_dcgm_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "default")
    monkeypatch.setenv("GPUGATE_DCGMI_REPLAY", str(STANDIN.parent / "replay"))
    step = dcgm.dcgm_step(1, str(STANDIN), 30, "default", nvidia_smi=smi(tmp_path, "0, Disabled\n"))
    assert step.ok is True and step.mig is None


def test_dcgmis_own_mig_refusal_is_not_run(tmp_path):
    dcgmi = fake_tool(tmp_path, "dcgmi", "print(\"GPU 0's MIG configuration is incompatible with "
                      "the diagnostic because it prevents access to the entire GPU.\")")  # fmt: skip
    step = dcgm.dcgm_step(1, dcgmi, 10, "n1", nvidia_smi=str(tmp_path / "no-smi"))
    assert step.ok is None and step.error == "mig" and step.fix == dcgm.FIX_MIG


@pytest.mark.parametrize(
    "detail",
    ["dcgm: dcgmi diag timed out after 60 s", "dcgm: no readable output from dcgmi"],
)
def test_a_dcgm_step_that_proved_nothing_keeps_the_node_from_passing(config, tmp_path, detail):
    """A timeout or unreadable output is not judged (ok None) and not a pass either."""
    run_dir = tmp_path / "run"
    write(run_dir, "n1", "dcgm", {"test": "dcgm", "nodes": ["n1"], "ok": None, "detail": detail})
    verdicts, _ = judge.judge_all(config, str(run_dir), [started("n1")], [], ["dcgm"])
    v = verdicts["n1"]
    assert not v["passed"] and not v["failed"], v
    assert v["why"] == f"not qualified: {detail}"

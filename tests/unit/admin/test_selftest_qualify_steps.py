"""`gpugate selftest` says which qualify steps this host can run (issue 28, Deliver 3)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from factories import site

from gpugate.admin import qualifysteps as Q
from gpugate.admin import selftest as S
from gpugate.commands.selftest import render
from gpugate.runner import MISSING, NONZERO, OK, CommandResult


def tool(tmp_path: Path, name: str, body: str = "") -> str:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def qc(tmp_path):
    return site(tmp_path, f"state_dir: {tmp_path}/state\nqualify:\n  wait_s: 5\n").qualify


def answer(status: str, stdout: str = "", stderr: str = "", code: int | None = 0):
    """A runner.run stand-in: the torch probe gets this answer, anything else runs for real."""
    from gpugate import runner

    def run(argv, timeout, env=None, stdin=None):
        assert timeout > 0
        if argv[1:2] == ["-c"] and "torch" in argv[2]:
            return CommandResult(argv=tuple(argv), status=status, returncode=code, stdout=stdout,
                                 stderr=stderr)  # fmt: skip
        return runner.run(argv, timeout, env, stdin)

    return run


def test_a_host_with_everything_runs_every_step(qc, tmp_path):
    qc = qc.replace(dcgmi=tool(tmp_path, "dcgmi"), python="/opt/torch/bin/python")
    checks = Q.check_qualify_steps(qc, run=answer(OK, "2.5.1+cu124 True\n"))
    assert [(c.step, c.runnable) for c in checks] == [(s, True) for s in Q.STEPS]
    assert checks[1].why == "torch 2.5.1+cu124 in /opt/torch/bin/python (NCCL)"


def test_torch_without_nccl_still_runs_on_gloo(qc, tmp_path):
    qc = qc.replace(dcgmi=tool(tmp_path, "dcgmi"))
    checks = Q.check_qualify_steps(qc, run=answer(OK, "2.5.1+cpu False\n"))
    assert all(c.runnable for c in checks) and "gloo only" in checks[1].why


@pytest.mark.parametrize(
    ("status", "stderr", "says"),
    [(NONZERO, "ModuleNotFoundError: No module named 'torch'\n", "no torch in /usr/bin/python3"),
     (MISSING, "", "qualify.python /usr/bin/python3 is not found or not executable here"),
     (NONZERO, "OSError: libcudart.so.12: cannot open\n", "cannot import torch: OSError")],
)  # fmt: skip
def test_no_torch_is_a_step_not_run_with_the_fix(qc, tmp_path, status, stderr, says):
    qc = qc.replace(dcgmi=tool(tmp_path, "dcgmi"), python="/usr/bin/python3")
    checks = Q.check_qualify_steps(qc, run=answer(status, stderr=stderr, code=1))
    assert checks[0].runnable
    for c in checks[1:]:
        assert not c.runnable and says in c.why and c.fix.startswith("set qualify.python")


def test_no_dcgmi_is_the_dcgm_step_not_run(qc, tmp_path):
    checks = Q.check_qualify_steps(qc.replace(dcgmi=str(tmp_path / "none")),
                                   run=answer(OK, "2.5.1 True\n"))  # fmt: skip
    assert not checks[0].runnable and "qualify.dcgmi" in checks[0].why
    assert "datacenter-gpu-manager" in checks[0].fix


def test_gpugate_that_cannot_start_is_the_dcgm_step_not_run(qc, tmp_path, monkeypatch):
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3")
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    monkeypatch.setattr(sys, "path", ["/nonexistent"])
    monkeypatch.setattr("gpugate.child._self_contained", lambda: True)
    why = Q.probe_dcgm_step(tool(tmp_path, "dcgmi"))
    assert why.startswith("gpugate's DCGM step cannot start (/usr/bin/python3): ")
    assert "No module named 'gpugate'" in why


def test_the_real_probe_of_an_interpreter_without_torch(tmp_path):
    """The probe really runs the interpreter (an argv list, with a timeout)."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3")
    version, _, why = Q.probe_torch("/usr/bin/python3", timeout=60)
    if version is not None:
        pytest.skip("the system python has torch")
    assert why.startswith("no torch in /usr/bin/python3")


def test_selftest_reports_the_steps_as_warnings_not_a_break(tmp_path, monkeypatch, capsys):
    conf = tmp_path / "gpugate.yaml"
    conf.write_text(f"state_dir: {tmp_path}/state\nqualify:\n  dcgmi: {tmp_path}/none\n")
    monkeypatch.setattr(
        Q, "probe_torch", lambda python, **kw: (None, False, f"no torch in {python}")
    )
    report = S.qualify_report(str(conf))
    assert report is not None and report.status == "warning"
    assert report.note == "no step runnable"
    assert [p.what.split(":")[0] for p in report.problems] == list(Q.STEPS)
    text = render([report])
    assert "qualify           (this host)     warning (no step runnable)" in text
    assert 'allreduce: would be "not run" in a qualification: no torch in' in text
    assert "fix: set qualify.python" in text
    assert "some qualify steps cannot run on this host" in text and "would break" not in text


def test_selftest_without_a_qualify_section_says_nothing_of_it(tmp_path):
    conf = tmp_path / "gpugate.yaml"
    conf.write_text(f"state_dir: {tmp_path}/state\n")
    assert S.qualify_report(str(conf)) is None

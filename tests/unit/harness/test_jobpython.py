"""The harness's Python for the job user on a fresh machine (issue 40, deliver 1).

There `python3` is pyenv's under 0700 /root and the clone is in 0700 `mktemp -d`: these tests
build that situation themselves (an interpreter reached only through a 0700 directory, a
virtualenv made from it inside another) and run what the jobs run, as the job user.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import paths
import pytest

sys.path.insert(0, str(paths.SLURM_HARNESS))

from jobpython import JobUserCannotRun, as_job_user, job_interpreter, venv_for_job_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs Python as the job user: root only")

SNAPSHOT = "h100-healthy.yaml"  # a bundled one, as the copy of gpugate holds it


@pytest.fixture
def private_python(tmp_path: Path) -> Path:
    """A Python the job user cannot reach: its only path goes through a 0700 directory."""
    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    python = home / "python3"
    python.symlink_to(job_interpreter())  # a real interpreter, as pyenv's is behind /root
    assert as_job_user([str(python), "-c", "pass"]) is not None, "the situation is not built"
    return python


@pytest.fixture
def private_venv(tmp_path: Path, private_python: Path) -> Path:
    """A virtualenv made from the private Python, in a 0700 directory (a clone in mktemp -d),
    with one module of its own in site-packages."""
    clone = tmp_path / "clone"
    clone.mkdir(mode=0o700)
    venv = clone / ".venv-torch"
    subprocess.run([str(private_python), "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120, capture_output=True)  # fmt: skip
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "only_in_this_venv.py").write_text("WHERE = 'the venv'\n")
    return venv


def test_the_job_user_runs_a_private_virtualenv_through_a_copy(private_venv: Path) -> None:
    check = ("-c", "import only_in_this_venv as m; assert m.WHERE == 'the venv'")
    own = private_venv / "bin" / "python"
    assert as_job_user([str(own), *check]) is not None  # neither the venv nor its Python
    python = venv_for_job_user(private_venv, check)
    assert not python.startswith(str(private_venv.parent))
    assert as_job_user([python, *check]) is None
    # The copy's Python is one the job user reaches, of the virtualenv's own version.
    real = os.path.realpath(python)
    assert "root-home" not in real
    version = as_job_user([python, "-c", f"import sys; assert sys.version_info[:2] == "
                           f"{sys.version_info[:2]!r}"])  # fmt: skip
    assert version is None
    # The original is untouched (the copy shares its files through hard links).
    cfg = (private_venv / "pyvenv.cfg").read_text()
    assert f"home = {private_venv.parent.parent / 'root-home'}" in cfg


def test_no_python_for_the_job_user_is_said_plainly(private_python: Path) -> None:
    with pytest.raises(JobUserCannotRun) as caught:
        job_interpreter(None, (str(private_python), "/nonexistent/python3"))
    said = str(caught.value)
    assert f"{private_python}: " in said and "/nonexistent/python3: absent" in said
    assert "apt-get install python3" in said


def test_a_virtualenv_of_a_version_nobody_else_has_is_said_plainly(private_venv: Path) -> None:
    cfg = private_venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("version = 3.", "version = 2."))
    with pytest.raises(JobUserCannotRun, match=r"can run no Python 2\.\d+ "):
        venv_for_job_user(private_venv)


def test_gpugate_runs_as_the_job_user_from_its_copy() -> None:
    from gpugate_site import gpugate_for_job_user

    python, env = gpugate_for_job_user()
    code = "import sys\nfrom gpugate.cli import main\nsys.exit(main(sys.argv[1:]))"
    snapshot = Path(env["PYTHONPATH"]) / "gpugate" / "config" / "snapshots" / SNAPSHOT
    argv = [python, "-s", "-c", code, "check", "--facts", str(snapshot), "--config", "/dev/null"]
    assert as_job_user(argv, env=env) is None
    assert not env["PYTHONPATH"].startswith(str(paths.ROOT))

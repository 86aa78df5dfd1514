"""The PyTorch the end-to-end jobs run with: `make torch`'s own virtualenv (.venv-torch).

The jobs run it as the ordinary job user (tests/slurm/localslurm.py JOB_USER), who may reach
neither this checkout (a clone in 0700 /root or `mktemp -d`) nor the Python the virtualenv was
made with (pyenv's, under 0700 /root): then a hard-linked copy of the virtualenv in a 0755
directory under /tmp, started by a Python of the same version that user can run, stands in for
it, for this test session (issues 26 and 40; tests/slurm/jobpython.py).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import paths
import pytest

sys.path.insert(0, str(paths.SLURM_HARNESS))

from jobpython import JobUserCannotRun, venv_for_job_user

ROOT = paths.ROOT
TORCH_PYTHON = ROOT / os.environ.get("TORCH_VENV", ".venv-torch") / "bin" / "python"


@functools.cache
def _torch_version() -> str | None:
    if not TORCH_PYTHON.exists():
        return None
    try:
        done = subprocess.run(
            [str(TORCH_PYTHON), "-c", "import torch, torch.distributed as d; "
             "assert d.is_gloo_available(); print(torch.__version__)"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def torch_python_or_skip() -> str:
    """The interpreter with torch (gloo), one the job user can run; or skip (CI, with
    GPUGATE_REQUIRE_TORCH=1, fails instead). Fails plainly if the job user cannot run it."""
    version = _torch_version()
    if version is None:
        why = f"no PyTorch with gloo at {TORCH_PYTHON} (make torch)"
        if os.environ.get("GPUGATE_REQUIRE_TORCH"):
            pytest.fail(why + "; GPUGATE_REQUIRE_TORCH is set", pytrace=False)
        pytest.skip(why)
    if os.geteuid() != 0:
        return str(TORCH_PYTHON)  # no job user without root: the tests run it themselves
    try:
        return _python_for_jobs()
    except JobUserCannotRun as exc:
        pytest.fail(f"{exc}; or make torch TORCH_VENV=<a directory every user can reach> and "
                    "set TORCH_VENV for the tests", pytrace=False)  # fmt: skip


@functools.cache
def _python_for_jobs() -> str:
    """TORCH_PYTHON if the job user can import torch with it, else a copy's (jobpython)."""
    return venv_for_job_user(TORCH_PYTHON.parent.parent, ("-c", "import torch"))


def torch_version() -> str | None:
    """The installed torch version string, or None."""
    return _torch_version()

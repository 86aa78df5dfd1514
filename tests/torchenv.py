"""The PyTorch the end-to-end jobs run with: `make torch`'s own virtualenv (.venv-torch).

The jobs run it as the ordinary job user (tests/slurm/localslurm.py JOB_USER), who may not
reach this checkout (a clone in 0700 /root or `mktemp -d`): then a hard-linked copy of the
virtualenv in a 0755 directory under /tmp stands in for it, for this test session (issue 26).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
    python, problem = _python_for_jobs()
    if problem:
        pytest.fail(problem, pytrace=False)
    return python


@functools.cache
def _python_for_jobs() -> tuple[str, str | None]:
    """TORCH_PYTHON if the job user can import torch with it, else a hard-linked copy's."""
    if _job_user_imports_torch(TORCH_PYTHON) is None:
        return str(TORCH_PYTHON), None
    copy = Path(tempfile.mkdtemp(prefix="gpugate-torch-"))  # root's, 0700 until filled
    atexit.register(shutil.rmtree, copy, True)
    venv = TORCH_PYTHON.parent.parent
    # Hard links: a copy of 1 GB in a second, the same read-only files; a virtualenv finds its
    # site-packages from the python it was started as, so the copy's bin/python uses its own.
    linked = subprocess.run(["cp", "-al", f"{venv}/.", str(copy)], capture_output=True,
                            text=True, timeout=300, check=False)  # fmt: skip
    copy.chmod(0o755)
    problem = linked.stderr.strip()[-300:] if linked.returncode else None
    python = copy / "bin" / "python"
    problem = problem or _job_user_imports_torch(python)
    if problem:
        return "", (f"the job user cannot run PyTorch from {TORCH_PYTHON} (a checkout in a private "
                    f"directory?), nor from a linked copy in {copy}: {problem}; make torch "
                    "TORCH_VENV=<a directory every user can reach> and set TORCH_VENV for the tests")  # fmt: skip
    return str(python), None


def _job_user_imports_torch(python: Path) -> str | None:
    """None if the job user can `import torch` with PYTHON, else why not."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "slurm"))
    from localslurm import ensure_user

    uid, gid = ensure_user()
    try:
        done = subprocess.run([str(python), "-c", "import torch"], user=uid, group=gid,
                              extra_groups=[], capture_output=True, text=True, timeout=120,
                              cwd="/", env={"PATH": "/usr/bin:/bin"}, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None if done.returncode == 0 else done.stderr.strip()[-300:] or "failed"


def torch_version() -> str | None:
    """The installed torch version string, or None."""
    return _torch_version()

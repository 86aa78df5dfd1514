"""The PyTorch the end-to-end jobs run with: `make torch`'s own virtualenv (.venv-torch)."""

from __future__ import annotations

import functools
import os
import subprocess
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
    """The interpreter with torch (gloo), or skip; CI (GPUGATE_REQUIRE_TORCH=1) fails instead."""
    version = _torch_version()
    if version is None:
        why = f"no PyTorch with gloo at {TORCH_PYTHON} (make torch)"
        if os.environ.get("GPUGATE_REQUIRE_TORCH"):
            pytest.fail(why + "; GPUGATE_REQUIRE_TORCH is set", pytrace=False)
        pytest.skip(why)
    return str(TORCH_PYTHON)


def torch_version() -> str | None:
    """The installed torch version string, or None."""
    return _torch_version()

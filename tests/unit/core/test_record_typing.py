"""Records are checked when built (issue 42, deliver 1): PEP 681's dataclass_transform on Record.

The type checker reads every Record subclass as a frozen, keyword-only dataclass, so a
misspelt field, a value of the wrong type or an assignment is an error before anything runs.
mypy runs here over a small probe that makes each mistake once, against this checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys

import paths
import pytest

REPO = str(paths.ROOT)

PROBE = """\
from gpugate.checks import findings as F
from gpugate.checks.expect import Expected

Expected(gpu_cuont=8)
Expected(board=3)
F.fail("gpu.ecc", "GPU1 uncorrected", gpuu=1)
e = Expected(board="h100-sxm")
e.board = "a100"
Expected(board="h100-sxm", gpu_count=8).replace(board="a100")
"""


def test_a_misbuilt_record_is_a_type_error(tmp_path):
    pytest.importorskip("mypy")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    argv = [sys.executable, "-m", "mypy", "--config-file", os.path.join(REPO, "pyproject.toml"),
            "--no-incremental", "--cache-dir", str(tmp_path / "cache"), "probe.py"]  # fmt: skip
    env = dict(os.environ, MYPYPATH=REPO)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    lines = [
        line
        for line in done.stdout.splitlines()
        if line.startswith("probe.py:") and ": error:" in line
    ]
    assert [line.split(":")[1] for line in lines] == ["4", "5", "6", "8"], done.stdout
    assert 'Unexpected keyword argument "gpu_cuont" for "Expected"' in lines[0]
    assert 'Argument "board" to "Expected" has incompatible type "int"' in lines[1]
    assert 'Unexpected keyword argument "gpuu" for "fail"' in lines[2]
    assert 'Property "board" defined in "Expected" is read-only' in lines[3]

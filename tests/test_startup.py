"""The start-up budget: what a warm hook run may import (it runs before every job and task).

Each of these modules costs 5-150 ms to import on the CI machine (loguru 150, pynvml 40,
yaml 20, typing/dataclasses 5-25, shutil/tempfile 5-10: README, "Performance"), more than the
whole checklist of a healthy node. A replayed healthy prolog, a TaskProlog and a replayed
`gpugate check` run in a fresh interpreter, warm (the parsed-YAML cache filled by a first run),
and list what they imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "config" / "snapshots" / "h100-healthy.yaml"
FORBIDDEN = ("yaml", "loguru", "pynvml", "shutil", "tempfile", "dataclasses", "typing")
LIST_MODULES = (
    "import sys\n"
    "from gpugate.cli import main\n"
    "main(sys.argv[1:])\n"
    "sys.stdout.write('\\n'.join(sorted(sys.modules)) + '\\n')\n"
)


@pytest.fixture
def site(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "gpugate.yaml"
    config.write_text(
        f"facts_file: {HEALTHY}\n"
        f"state_dir: {tmp_path / 'state'}\n"
        f"evidence_dir: {tmp_path / 'evidence'}\n"
        f"task_prolog:\n  nccl_debug_dir: {tmp_path / 'nccl'}\n"
        f"admin:\n  metrics_file: {tmp_path / 'metrics' / 'gpugate.prom'}\n"
    )
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GPUGATE_CONFIG": str(config),
        "GPUGATE_CACHE_DIR": str(tmp_path / "cache"),
        "SLURMD_NODENAME": "gpu-node-01",
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
    }


def imported(argv: list[str], env: dict[str, str], job: int) -> set[str]:
    """The modules a fresh `gpugate ARGV` run imported (its stdout is the list)."""
    proc = subprocess.run(
        [sys.executable, "-c", LIST_MODULES, *argv],
        env={**env, "SLURM_JOB_ID": str(job)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


@pytest.mark.parametrize(
    "argv",
    [["prolog"], ["task-prolog"], ["check", "--facts", str(HEALTHY), "--json"]],
    ids=["prolog", "task-prolog", "check"],
)
def test_a_warm_hook_run_stays_within_the_import_budget(argv: list[str], site: dict[str, str]):
    imported(argv, site, job=101)  # cold: fills the parsed-YAML cache
    modules = imported(argv, site, job=102)
    assert "gpugate.cli" in modules  # the run happened in this interpreter
    heavy = sorted(m for m in modules if m.split(".")[0] in FORBIDDEN)
    assert not heavy, f"`gpugate {argv[0]}` imported {heavy}"

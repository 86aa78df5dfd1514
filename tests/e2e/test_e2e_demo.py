"""End to end: `make demo` (examples/demo.py) tells the whole story on a real local Slurm.

The demo runs as `make demo` runs it, and its output must name each step's outcome: the
broken node refused and drained before a job, the job that died with an NCCL timeout while its
node logged an Xid, the bundle's diagnosis, the requeue from the newest complete checkpoint,
`gpugate nodes`, the report, and what to run next. Under a minute.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paths
import pytest
from e2e import slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

ROOT = paths.ROOT


@pytest.fixture(scope="module")
def demo() -> tuple[str, float]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-4000:]
    return re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout), took


def test_every_step_has_a_one_line_header(demo):
    out, _ = demo
    headers = re.findall(r"^== (\S+)", out, re.M)
    assert headers == ["1.", "1b.", "2.", "3.", "4.", "4b.", "5.", "6.", "7.", "What"], headers


def test_the_broken_node_is_refused_and_drained_and_the_job_runs_elsewhere(demo):
    out, _ = demo
    line = re.search(r"^-> gpu-node-01 refused and drained \(gpugate: gpu\.ecc: .*", out, re.M)
    assert line, out
    assert "GPU3 (serial " in line.group(0) and re.search(
        r"job \d+ ran on gpu-node-0[23]$", line.group(0)
    )


def test_the_job_dies_with_an_nccl_timeout_on_a_node_that_logged_an_xid(demo):
    out, _ = demo
    assert re.search(r"^-> job \d+ died with nccl_timeout on gpu-node-0\d, whose kernel log has "
                     r"Xid 79: category gpu_xid_hardware$", out, re.M), out  # fmt: skip
    assert "Watchdog caught collective operation timeout" in out


def test_the_bundle_is_diagnosed_and_admin_only_for_the_jobs_user(demo):
    out, _ = demo
    assert re.search(r"^job diagnosis over 1 node\(s\): gpu_xid_hardware$", out, re.M), out
    assert "root Xid 79 (GPU has fallen off the bus)" in out
    assert re.search(r"^1 evidence bundle\(s\) for \d+, newest first:$", out, re.M), out
    assert "gpugate evidence: admin-only: " in out


def test_the_job_is_requeued_and_resumes_from_the_newest_complete_checkpoint(demo):
    out, _ = demo
    found = re.search(r"^-> job \d+ requeued \(Restarts=1\) onto (gpu-node-0\d), resumed from "
                      r"step 200 \(.*/ckpt_200\.pt\)$", out, re.M)  # fmt: skip
    assert found, out
    failed_on = re.search(r"died with nccl_timeout on (gpu-node-0\d)", out).group(1)
    assert found.group(1) not in (failed_on, "gpu-node-01")


def test_nodes_report_and_what_next(demo):
    out, took = demo
    assert re.search(r"^gpu-node-0\d +IDLE\+DRAIN +kernel\.xid +gpu_xid_hardware ", out, re.M), out
    assert re.search(r"^-> report written to \S+report\.html \([1-9]\d* bytes\)$", out, re.M), out
    next_part = out.split("== What to run next", 1)[1]
    assert "gpugate evidence" in next_part and "sinfo -R" in next_part
    assert took < 60, f"the demo took {took:.0f} s"


# What a fresh clone has: no virtualenvs, caches or build output.
NOT_CLONED = (".git", ".venv*", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist",
              "*.egg-info", "bench")  # fmt: skip


def clone_with_its_own_python(private: Path) -> tuple[Path, Path]:
    """A copy of the checkout and a virtualenv with its gpugate, both inside PRIVATE, as
    `git clone` and `make venv` leave them: (the clone, the virtualenv's python)."""
    from gpugate_site import copy_gpugate

    clone = private / "gpugate"
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(*NOT_CLONED))
    venv = private / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120, capture_output=True)  # fmt: skip
    python = venv / "bin" / "python"
    (site_packages,) = venv.glob("lib/python3*/site-packages")
    copy_gpugate(site_packages)  # gpugate laid out as installed, with yaml, loguru, pynvml
    (venv / "bin" / "gpugate").write_text(
        f"#!{python}\nimport sys\nfrom gpugate.cli import main\nsys.exit(main())\n"
    )
    (venv / "bin" / "gpugate").chmod(0o755)
    return clone, python


def test_the_demo_runs_from_a_clone_in_a_private_directory():
    """A clone and its virtualenv in a 0700 directory (root's home, `mktemp -d`): the job user
    cannot reach them, and nothing above the clone is opened for them (issue 26)."""
    private = Path(tempfile.mkdtemp(prefix="gpugate-private-"))  # 0700, root's
    try:
        clone, python = clone_with_its_own_python(private)
        proc = subprocess.run(
            [str(python), str(clone / "examples" / "demo.py")], cwd=clone,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        )  # fmt: skip
        out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)
        assert proc.returncode == 0, out[-4000:]
        # The TaskProlog ran as the job user: the requeued run got GPUGATE_RESUME_FROM from it.
        assert re.search(
            r"^-> job \d+ requeued \(Restarts=1\) .* resumed from step 200", out, re.M
        ), out
        assert stat.S_IMODE(private.stat().st_mode) == 0o700  # not opened for the job user
    finally:
        shutil.rmtree(private, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

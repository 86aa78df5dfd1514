"""End to end: `make demo` (examples/demo.py) tells the whole story on a real local Slurm.

The demo runs as `make demo` runs it, and its output must name each step's outcome: the
broken node refused and drained before a job, the job that died with an NCCL timeout while its
node logged an Xid, the bundle's diagnosis, the requeue from the newest complete checkpoint,
`gpugate nodes`, the report, and what to run next. Under a minute.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e import slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

ROOT = Path(__file__).resolve().parent.parent


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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""End to end (issue 41, R6): two jobs share one node's GPUs (Gres per GPU) on the real Slurm.

Job A holds GPUs 0-1 with its CUDA contexts open (the node's snapshot shows its processes);
job B's prolog runs for two other GPUs. B must start and the node stay in service: A's
processes are A's. A real leftover on a GPU no job holds must still drain the node.
"""

from __future__ import annotations

import os
import time

import pytest
import yaml
from e2e import Site, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402 - importable once slurm_or_skip() set the path

NODE = "gpu-node-01"


def with_processes(site: Site, gpus: dict[int, int]) -> None:
    """The node's snapshot: healthy, with one process (pid) on each GPU named."""
    site.use_snapshot(NODE, "h100-healthy")
    path = site.snapshots / f"{NODE}.yaml"
    facts = yaml.safe_load(path.read_text())
    for g in facts["gpus"]:
        if g["index"] in gpus:
            g["processes"] = [{"pid": gpus[g["index"]], "name": "python", "used_memory_mib": 30000}]
            g["memory_used_mib"] = 30000
    tmp = site.snapshots / f".{NODE}.procs"
    tmp.write_text(yaml.safe_dump(facts))
    tmp.chmod(0o666)
    os.replace(tmp, path)


def test_two_jobs_on_one_node_then_a_real_leftover(tmp_path):
    site = Site(tmp_path)
    site.use_snapshot(NODE, "h100-healthy")
    with LocalSlurm(
        tmp_path / "slurm", nodes=[NODE], prolog=site.hook("prolog"), prolog_epilog_timeout=60,
        scheduler_parameters="nohold_on_prolog_fail", wrap_hooks=False,
    ) as cluster:  # fmt: skip
        started = site.base / "a-ran"
        a = cluster.submit(wrap=f"touch {started}; sleep 300", output="/dev/null", gres="gpu:2",
                           nodelist=NODE)  # fmt: skip
        try:
            # RUNNING comes before the prolog ends: A's own processes may appear only once it
            # runs (its prolog would rightly refuse them on its own GPUs).
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not started.exists():
                time.sleep(0.2)
            assert started.exists(), cluster.job_state(a)
            with_processes(site, {0: 4242, 1: 4243})  # A's own contexts, on A's GPUs
            marker = site.base / "b-ran"
            b = cluster.submit(wrap=f"echo $SLURM_JOB_GPUS > {marker}", output="/dev/null",
                               gres="gpu:2", nodelist=NODE)  # fmt: skip
            cluster.wait_job(b, "COMPLETED", timeout=60)
            assert not cluster.is_drained(NODE), cluster.node(NODE)
            assert marker.read_text().strip() not in ("0,1", "")  # B really ran beside A

            # GPU 5 is no job's: a process there is a leftover, and the next prolog drains.
            with_processes(site, {0: 4242, 1: 4243, 5: 999})
            c = cluster.submit(wrap="true", output="/dev/null", gres="gpu:2", nodelist=NODE)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not cluster.is_drained(NODE):
                time.sleep(1)
            reason = cluster.node(NODE).get("Reason", "")
            assert reason.startswith("gpugate: gpu.processes: GPU5 "), reason
            # Not C's GPU: C starts on its own (prolog.refuse_for_other_gpus is false).
            cluster.wait_job(c, "COMPLETED", timeout=60)
        finally:
            cluster.run(["scancel", str(a)], check=False)

"""End to end (issue 41, R6): two jobs share one node's GPUs (Gres per GPU) on the real Slurm.

Job A holds GPUs 0-1 with its CUDA contexts open (the node's snapshot shows its processes);
job B's prolog runs for two other GPUs. B must start and the node stay in service: A's
processes are A's. A real leftover on a GPU no job holds must still drain the node.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
import yaml
from e2e import PROLOG_ALONE, Site, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402 - importable once slurm_or_skip() set the path

NODE = "gpu-node-01"


def edit_snapshot(site: Site, edit: Callable[[dict], None]) -> None:
    """The node's snapshot: the healthy one, changed by `edit`, replaced at once."""
    site.use_snapshot(NODE, "h100-healthy")
    path = site.snapshots / f"{NODE}.yaml"
    facts = yaml.safe_load(path.read_text())
    edit(facts)
    tmp = site.snapshots / f".{NODE}.edit"
    tmp.write_text(yaml.safe_dump(facts))
    tmp.chmod(0o666)
    os.replace(tmp, path)


def with_processes(site: Site, gpus: dict[int, int]) -> None:
    """The node's snapshot: healthy, with one process (pid) on each GPU named."""

    def add(facts: dict) -> None:
        for g in facts["gpus"]:
            if g["index"] in gpus:
                g["processes"] = [{"pid": gpus[g["index"]], "name": "python",
                                   "used_memory_mib": 30000}]  # fmt: skip
                g["memory_used_mib"] = 30000

    edit_snapshot(site, add)


def with_low_memory(site: Site) -> None:
    """The node's snapshot: healthy GPUs, 4 GiB of host memory available (the floor is 8 GiB)."""
    edit_snapshot(site, lambda facts: facts["memory"].update(available_mib=4000))


def wait_for(path, cluster: LocalSlurm, job: int) -> None:
    """Until the job's script has touched `path`: it runs (its prolog is over)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.2)
    assert path.exists(), cluster.job_state(job)


def next_job_drains(cluster: LocalSlurm) -> tuple[int, str]:
    """Submit a 2-GPU job; (its id, the node's reason once its prolog has drained the node)."""
    job = cluster.submit(wrap="true", output="/dev/null", gres="gpu:2", nodelist=NODE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not cluster.is_drained(NODE):
        time.sleep(1)
    return job, cluster.node(NODE).get("Reason", "")


def test_two_jobs_on_one_node_then_a_real_leftover(slurm_site: SlurmSites):
    with slurm_site([NODE], **PROLOG_ALONE) as (site, cluster):
        started = site.base / "a-ran"
        a = cluster.submit(wrap=f"touch {started}; sleep 300", output="/dev/null", gres="gpu:2",
                           nodelist=NODE)  # fmt: skip
        try:
            # RUNNING comes before the prolog ends: A's own processes may appear only once it
            # runs (its prolog would rightly refuse them on its own GPUs).
            wait_for(started, cluster, a)
            with_processes(site, {0: 4242, 1: 4243})  # A's own contexts, on A's GPUs
            marker = site.base / "b-ran"
            b = cluster.submit(wrap=f"echo $SLURM_JOB_GPUS > {marker}", output="/dev/null",
                               gres="gpu:2", nodelist=NODE)  # fmt: skip
            cluster.wait_job(b, "COMPLETED", timeout=60)
            assert not cluster.is_drained(NODE), cluster.node(NODE)
            assert marker.read_text().strip() not in ("0,1", "")  # B really ran beside A

            # GPU 5 is no job's: a process there is a leftover, and the next prolog drains.
            with_processes(site, {0: 4242, 1: 4243, 5: 999})
            c, reason = next_job_drains(cluster)
            assert reason.startswith("gpugate: gpu.processes: GPU5 "), reason
            # Not C's GPU: C starts on its own (prolog.refuse_for_other_gpus is false).
            cluster.wait_job(c, "COMPLETED", timeout=60)
        finally:
            cluster.run(["scancel", str(a)], check=False)


def test_low_host_memory_beside_a_cpu_only_job_then_alone(slurm_site: SlurmSites):
    """A CPU-only job holds no GPU but uses host memory: B's prolog reports the low figure and B
    runs; once A has ended, the same figure is the node's own and the next prolog drains."""
    with slurm_site([NODE], **PROLOG_ALONE) as (site, cluster):
        started = site.base / "a-ran"
        a = cluster.submit(wrap=f"touch {started}; sleep 300", output="/dev/null", nodelist=NODE)
        try:
            wait_for(started, cluster, a)
            with_low_memory(site)  # A's load, as far as B's prolog can tell
            b = cluster.submit(wrap="true", output="/dev/null", gres="gpu:2", nodelist=NODE)
            cluster.wait_job(b, "COMPLETED", timeout=60)
            assert not cluster.is_drained(NODE), cluster.node(NODE)
        finally:
            cluster.run(["scancel", str(a)], check=False)
        cluster.wait_job(a, "CANCELLED", timeout=60)
        c, reason = next_job_drains(cluster)
        assert reason.startswith("gpugate: host.memory: available memory 4000 MiB"), reason
        cluster.run(["scancel", str(c)], check=False)

"""End to end: gpugate as the Prolog of a real Slurm (slurmctld, slurmd, munge from Debian).

Only the GPUs are simulated, through replayed snapshots. Each broken snapshot must drain the
node with gpugate's reason and the job must come back held (requeued, not lost, not run).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from e2e import PROLOG_ALONE, Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402 - importable once slurm_or_skip() set the path

NODE = "gpu-node-01"

# One broken snapshot per check family, and the check id its drain reason must name.
BROKEN = [
    ("h100-ecc", "gpu.ecc"),
    ("h100-gpu-lost", "gpu.lost"),
    ("h100-hot", "gpu.temperature"),
    ("h100-leftover-procs", "gpu.processes"),
    ("h100-driver-mismatch", "gpu.driver"),
    ("h100-pcie-x8", "pcie.link"),
    ("h100-nvlink-down", "nvlink.links"),
    ("h100-ib-down", "ib.ports"),
    ("h100-xid79", "kernel.xid"),
    ("h100-nofile", "host.nofile"),
    ("h100-mount-slow", "host.mounts"),
]


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site([NODE], hooks=("prolog", "task-prolog"), slurm_user="root")


@pytest.fixture(autouse=True)
def healthy_start(site: Site, cluster: LocalSlurm):
    """Every test starts from healthy, idle nodes and an empty queue."""
    site.restore(cluster, [NODE])


def submit_marker(cluster: LocalSlurm, site: Site, name: str) -> tuple[int, str]:
    """A job that leaves a marker file when (and only when) it really runs."""
    marker = str(site.base / f"ran-{name}")
    if os.path.exists(marker):
        os.unlink(marker)
    job = cluster.submit(
        wrap=f"touch {marker}; env > {marker}.env", output=str(site.base / f"{name}.out")
    )
    return job, marker


def test_healthy_node_runs_the_job_with_nccl_settings(cluster: LocalSlurm, site: Site):
    job, marker = submit_marker(cluster, site, "healthy")
    cluster.wait_job(job, "COMPLETED", timeout=30)
    assert os.path.exists(marker)
    env = Path(marker + ".env").read_text()
    assert "NCCL_DEBUG=WARN" in env and "NCCL_IB_TIMEOUT=22" in env
    assert f"NCCL_DEBUG_FILE={site.base / 'nccl'}/{job}/nccl.%h.%p.log" in env
    assert not cluster.is_drained(NODE)
    prolog = [e for e in site.events() if e["hook"] == "prolog" and e.get("job") == str(job)]
    assert prolog and prolog[-1]["action"] in ("allow", "warn")


@pytest.mark.parametrize(("snapshot", "check_id"), BROKEN)
def test_broken_node_is_drained_and_job_held(
    cluster: LocalSlurm, site: Site, snapshot: str, check_id: str
):
    site.use_snapshot(NODE, snapshot)
    job, marker = submit_marker(cluster, site, snapshot)
    state = cluster.wait_job(job, "PENDING", reason="launch failed requeued held", timeout=30)
    node = cluster.wait_node(NODE, lambda n: "DRAIN" in n.get("State", ""), timeout=10)
    assert node["Reason"].startswith(f"gpugate: {check_id}: "), node["Reason"]
    assert not os.path.exists(marker), "the job ran on a broken node"
    assert state["AdminComment"].startswith(f"gpugate: node {NODE} refused: {check_id}")
    assert int(state["Restarts"]) >= 1


def test_fixed_and_resumed_node_runs_the_held_job(cluster: LocalSlurm, site: Site):
    site.use_snapshot(NODE, "h100-ecc")
    job, marker = submit_marker(cluster, site, "fixed")
    cluster.wait_job(job, "PENDING", reason="launch failed requeued held", timeout=30)
    site.use_snapshot(NODE, "h100-healthy")
    cluster.resume(NODE)
    cluster.release(job)
    cluster.wait_job(job, "COMPLETED", timeout=30)
    assert os.path.exists(marker)


def test_an_admins_drain_reason_is_left_alone(cluster: LocalSlurm, site: Site):
    """The prolog meets a node an admin drained: it refuses the job but keeps the reason."""
    from gpugate.runner import run

    cluster.drain(NODE, "admin: fan swap ticket 4711")
    site.use_snapshot(NODE, "h100-ecc")
    env = dict(
        cluster.env(), SLURMD_NODENAME=NODE, SLURM_JOB_ID="999999", GPUGATE_CONFIG=str(site.config)
    )
    res = run([site.hook("prolog")], timeout=30, env=env)
    assert res.returncode == 1, res.describe()
    assert cluster.node(NODE)["Reason"].startswith("admin: fan swap ticket 4711")


def test_prolog_cost_is_recorded(site: Site):
    durations = [
        e["duration_s"] for e in site.events() if e["hook"] == "prolog" and "duration_s" in e
    ]
    assert durations and max(durations) < 5


@pytest.fixture
def two_nodes(slurm_site: SlurmSites):
    snapshots = {"n1": "h100-ib-down", "n2": "h100-healthy"}
    with slurm_site(["n1", "n2"], snapshots=snapshots, **PROLOG_ALONE) as (site, cluster):
        yield cluster, site


def test_two_nodes_one_broken_job_runs_on_the_healthy_one(two_nodes):
    cluster, site = two_nodes
    # Both nodes idle: Slurm tries n1 first; the prolog refuses and drains it, the job goes
    # back to the queue (nohold_on_prolog_fail) and starts on n2.
    job, marker = submit_marker(cluster, site, "two")
    cluster.wait_node("n1", lambda n: "DRAIN" in n.get("State", ""), timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and cluster.job_state(job).get("JobState") != "COMPLETED":
        # A requeue delays the job's start by 120 s (BeginTime); an impatient user clears it.
        cluster.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False)
        time.sleep(1)
    state = cluster.wait_job(job, "COMPLETED", timeout=5)
    assert state["NodeList"] == "n2"
    assert os.path.exists(marker)
    assert cluster.node("n1")["Reason"].startswith("gpugate: ib.ports: ")
    assert not cluster.is_drained("n2")


def test_a_hanging_source_is_cut_at_the_deadline(slurm_site: SlurmSites, tmp_path):
    """No snapshot: real sources, one of which (the kernel log file, a FIFO) never answers."""
    fifo = tmp_path / "kmsg-fifo"
    os.mkfifo(fifo)

    def real_sources(site: Site) -> None:
        site.config.write_text(
            f"state_dir: {site.state}\nevidence_dir: {site.evidence}\n"
            # Never the packaged /var/lib/gpugate/nccl: the host's own gpugate (a job's NCCL
            # directory was left there by this test).
            f"task_prolog:\n  nccl_debug_dir: {site.base / 'nccl'}\n"
            "prolog:\n  deadline_s: 3\n"
            f"sources:\n  kernel_log_file: {fifo}\n  timeout_s:\n    kernel_log: 30\n"
            # This CI host is no GPU node: keep its own limits and memory out of the verdict,
            # and its GPU count (the test cluster's Gres says 8 fake GPUs; NVML has none).
            "checks:\n  disabled: [host.nofile, host.memory, gpu.count]\n"
        )

    with slurm_site(["n1"], snapshots=None, prepare=real_sources, hooks=("prolog",),
                    slurm_user="root", prolog_epilog_timeout=30) as (site, cluster):  # fmt: skip
        started = time.monotonic()
        job = cluster.submit(wrap="true", output=str(site.base / "out"))  # the job user's to write
        cluster.wait_job(job, "COMPLETED", timeout=30)
        assert time.monotonic() - started < 20
    prolog = [e for e in site.events() if e["hook"] == "prolog"]
    assert prolog and prolog[-1]["duration_s"] < 6, prolog

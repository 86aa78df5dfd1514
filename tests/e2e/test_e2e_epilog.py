"""End to end: gpugate as Prolog and Epilog of a real Slurm; evidence, causes and drains.

The job itself simulates what happens to a node during a run by swapping the node's replayed
snapshot (the GPUs are the only simulated part): e.g. an Xid 79 appearing in the kernel log.
"""

from __future__ import annotations

import json
import re

import pytest
from e2e import SNAPSHOTS, Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm, slurm_version  # noqa: E402

NODE = "gpu-node-01"
NCCL_TIMEOUT = (
    "[rank3]:[E1129 11:00:01.1 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600061 milliseconds before timing out."
)
CUDA_OOM = (
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 1 has a total "
    "capacity of 79.10 GiB of which 12.73 GiB is free."
)


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site([NODE], hooks=("prolog", "epilog"), slurm_user="root")


@pytest.fixture(autouse=True)
def healthy_start(site: Site, cluster: LocalSlurm):
    """Every test starts from healthy, idle nodes and an empty queue."""
    site.restore(cluster, [NODE])


def run_job(cluster: LocalSlurm, site: Site, name: str, script: str) -> int:
    out = site.base / f"{name}.out"
    job = cluster.submit(script=f"#!/bin/sh\n{script}\n", output=str(out))
    cluster.wait_job(job, ("COMPLETED", "FAILED"), timeout=60)
    return job


def epilog_event(site: Site, job: int) -> dict:
    events = [e for e in site.events() if e["hook"] == "epilog" and e.get("job") == str(job)]
    assert events, f"no epilog event for job {job}: {site.events()[-3:]}"
    return events[-1]


def summary(event: dict) -> dict:
    with open(f"{event['bundle']}/summary.json") as fh:
        return json.load(fh)


def test_successful_job_leaves_no_bundle(cluster: LocalSlurm, site: Site):
    job = run_job(cluster, site, "ok", "echo fine")
    event = epilog_event(site, job)
    assert event["abnormal"] is False and event["bundle"] is None
    assert not (site.evidence / str(job)).exists()


def test_nccl_timeout_gets_a_bundle_with_its_category(cluster: LocalSlurm, site: Site):
    job = run_job(cluster, site, "nccl", f"echo 'step 10'; echo '{NCCL_TIMEOUT}' >&2; exit 1")
    event = epilog_event(site, job)
    assert event["category"] == "nccl_timeout" and event["drained"] is False
    s = summary(event)
    assert s["job_id"] == str(job) and s["node"] == NODE and s["category"] == "nccl_timeout"
    with open(f"{event['bundle']}/decisive.txt") as fh:
        assert "Watchdog caught collective operation timeout" in fh.read()
    assert not cluster.is_drained(NODE)


def test_a_failed_jobs_bundle_and_record_carry_the_sluid_slurm_gave_the_run(
    cluster: LocalSlurm, site: Site
):
    """Slurm 25.11+ gives each run of a job a SLUID (SLURM_JOB_SLUID in the Prolog/Epilog
    environment; 26.05 the job's own too): the bundle and the controller's record name it, as
    `scontrol -d show job` does. Before 25.11 neither names one (docs/slurm-facts.md, SLUIDs)."""
    job = run_job(
        cluster,
        site,
        "sluid",
        f"echo \"job-env=$SLURM_JOB_SLUID\"; echo '{NCCL_TIMEOUT}' >&2; exit 1",
    )
    event = epilog_event(site, job)
    s = summary(event)
    record_path = site.evidence / "controller-view" / str(job) / f"{NODE}-r0.json"
    record = json.loads(record_path.read_text())
    shown = cluster.run(["scontrol", "-d", "-o", "show", "job", str(job)]).stdout
    slurms = re.search(r"(?:^|\s)SLUID=(s[0-9A-Z]{13})(?:\s|$)", shown)
    if slurm_version() < (25, 11):
        assert slurms is None and "sluid" not in s and "sluid" not in record
        return
    assert slurms is not None, shown
    assert s["sluid"] == record["sluid"] == slurms.group(1)
    if slurm_version() >= (26, 5):  # setup_env() exports it to the job itself (26.05.0)
        job_env = (site.base / "sluid.out").read_text()
        assert f"job-env={slurms.group(1)}" in job_env


def test_hardware_xid_during_the_job_drains_with_the_bundle_named(cluster: LocalSlurm, site: Site):
    broken = site.snapshots / "xid79-during-job.yaml"
    broken.write_text((SNAPSHOTS / "h100-xid79.yaml").read_text().replace("gpu-node-01", NODE))
    target = site.snapshots / f"{NODE}.yaml"
    job = run_job(cluster, site, "xid", f"echo '{NCCL_TIMEOUT}'; cp {broken} {target}; exit 1")
    event = epilog_event(site, job)
    assert event["hardware_fault"] is True and event["drained"] is True
    node = cluster.wait_node(NODE, lambda n: "DRAIN" in n.get("State", ""), timeout=10)
    assert node["Reason"].startswith(f"gpugate: kernel.xid: evidence {job}/{NODE}-r0: "), node[
        "Reason"
    ]
    s = summary(event)
    assert s["category"] == "gpu_xid_hardware" and s["xid"] == 79 and s["suspected_node"] == NODE


def test_cuda_oom_leaves_the_node_in_service(cluster: LocalSlurm, site: Site):
    job = run_job(cluster, site, "oom", f"echo '{CUDA_OOM}'; exit 1")
    event = epilog_event(site, job)
    assert event["category"] == "cuda_oom" and event["failing_rank"] == 1
    assert event["drained"] is False and not cluster.is_drained(NODE)

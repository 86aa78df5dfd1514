"""End to end: ownership (issue 45) on a real Slurm. An admin's drain survives `gpugate
health`, `gpugate resume` and a failing epilog; a person's resume of gpugate's drain is audited
as theirs and the next drain is gpugate's own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip
from paths import ROOT

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402

NODES = ["gpu-a", "gpu-b", "gpu-c"]
ADMIN_REASON = "admin: PSU swap"


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site(NODES, hooks=("epilog",), slurm_user="root")


@pytest.fixture(autouse=True)
def fresh(site: Site, cluster: LocalSlurm):
    site.restore(cluster, NODES)
    yield
    site.restore(cluster, NODES)


def gpugate(env: dict, *args: str) -> subprocess.CompletedProcess:
    """This checkout's gpugate (not an installed one), as an admin on the site runs it."""
    argv = [sys.executable, "-m", "gpugate", *args]
    env = dict(env, PYTHONPATH=str(ROOT))
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)


def health(env: dict, node: str) -> subprocess.CompletedProcess:
    """`gpugate health` as slurmd runs it on `node` (the hook finds its node so)."""
    return gpugate(dict(env, SLURMD_NODENAME=node), "health")


def audit(site: Site) -> list[dict]:
    path = site.state / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_an_admins_drain_survives_health_resume_and_a_failing_epilog(
    e2e_site: SlurmSite, site: Site, cluster: LocalSlurm
):
    env = e2e_site.env()
    job = cluster.submit(wrap="sleep 4", output="/dev/null", nodelist="gpu-a")
    cluster.wait_job(job, "RUNNING", timeout=30)
    cluster.drain("gpu-a", ADMIN_REASON)  # DRAINING: the job runs on, its epilog will fail
    reason = cluster.node("gpu-a")["Reason"]
    assert reason.startswith(ADMIN_REASON), reason
    site.use_snapshot("gpu-a", "h100-ecc")
    cluster.wait_job(job, "COMPLETED", timeout=60)
    ran = health(env, "gpu-a")
    assert "Traceback" not in ran.stderr, ran.stderr
    refused = gpugate(env, "resume", "gpu-a", "--why", "test")
    assert refused.returncode == 1 and "drained by someone else" in refused.stderr
    node = cluster.node("gpu-a")
    assert node["Reason"] == reason and "DRAIN" in node["State"], node
    assert not node.get("Comment", "").startswith("gpugate"), node
    epilog_runs = [e for e in site.events() if e.get("hook") == "epilog"]
    assert epilog_runs, site.events()
    assert not [a for a in audit(site) if a["node"] == "gpu-a" and a.get("resumed")]


def test_a_manual_resume_of_gpugates_drain_is_the_admins_and_the_next_drain_gpugates(
    e2e_site: SlurmSite, site: Site, cluster: LocalSlurm
):
    env = e2e_site.env()
    site.use_snapshot("gpu-b", "h100-ecc")
    first = health(env, "gpu-b")
    assert cluster.node("gpu-b").get("Reason", "").startswith("gpugate: gpu.ecc: "), first
    cluster.resume("gpu-b")  # `scontrol update nodename=gpu-b state=resume`, by a person
    site.use_snapshot("gpu-b", "h100-healthy")
    said = health(env, "gpu-b")
    assert "Traceback" not in said.stderr, said.stderr
    (entry,) = [a for a in audit(site) if a["node"] == "gpu-b"]
    assert (entry["who"], entry["resumed"]) == ("admin (outside gpugate)", True), entry
    site.use_snapshot("gpu-b", "h100-ecc")
    health(env, "gpu-b")
    assert cluster.node("gpu-b")["Reason"].startswith("gpugate: gpu.ecc: ")
    assert len([a for a in audit(site) if a["node"] == "gpu-b"]) == 1

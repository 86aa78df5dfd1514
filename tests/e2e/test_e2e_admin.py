"""End to end: admins review drains and resume nodes through gpugate, on a real Slurm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e import SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()


NODES = ["gpu-a", "gpu-b"]
GPUGATE = str(Path(sys.executable).parent / "gpugate")


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site(NODES, hooks=("prolog",), slurm_user="root")


def gpugate(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([GPUGATE, *args], env=env, capture_output=True, text=True, timeout=60)


def test_drained_node_is_shown_refused_while_broken_resumed_when_fixed(e2e_site: SlurmSite):
    site, cluster = e2e_site
    env = e2e_site.env()
    site.use_snapshot("gpu-a", "h100-ecc")
    job = cluster.submit(wrap="true", output="/dev/null", nodelist="gpu-a")
    cluster.wait_job(job, "PENDING", reason="launch failed requeued held", timeout=30)
    cluster.run(["scancel", str(job)])

    listed = gpugate(env, "nodes", "--drained", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["node"]: r for r in json.loads(listed.stdout)["nodes"]}
    row = rows["gpu-a"]
    assert row["reason"].startswith("gpugate: gpu.ecc: ") and row["gpugate"] is True
    assert row["check"] == "gpu.ecc" and row["drains"] == 1 and row["action"]
    assert "gpu-b" not in rows

    refused = gpugate(env, "resume", "gpu-a", "--why", "test")
    assert refused.returncode == 1 and "still fails its checks" in refused.stderr
    assert cluster.is_drained("gpu-a")

    site.use_snapshot("gpu-a", "h100-healthy")
    resumed = gpugate(env, "resume", "gpu-a", "--why", "GPU3 replaced")
    assert resumed.returncode == 0, resumed.stderr
    cluster.wait_idle(["gpu-a"])
    audit = [json.loads(x) for x in (site.state / "audit.jsonl").read_text().splitlines()]
    assert [a["resumed"] for a in audit[-2:]] == [False, True] and audit[-1][
        "why"
    ] == "GPU3 replaced"
    prom = site.metrics.read_text()
    assert 'gpugate_drains_total{node="gpu-a",check="gpu.ecc"} 1' in prom


def test_an_admins_drain_is_not_gpugates_and_needs_force(e2e_site: SlurmSite):
    cluster = e2e_site.cluster
    env = e2e_site.env()
    cluster.drain("gpu-b", "admin: PSU swap")
    listed = gpugate(env, "nodes", "--drained", "--json")
    row = {r["node"]: r for r in json.loads(listed.stdout)["nodes"]}["gpu-b"]
    assert row["gpugate"] is False and row["reason"].startswith("admin: PSU swap")
    refused = gpugate(env, "resume", "gpu-b")
    assert refused.returncode == 1 and "drained by someone else" in refused.stderr
    assert cluster.node("gpu-b")["Reason"].startswith("admin: PSU swap")
    forced = gpugate(env, "resume", "gpu-b", "--force", "--why", "PSU replaced")
    assert forced.returncode == 0, forced.stderr
    cluster.wait_idle(["gpu-b"])


def test_html_report_names_the_drains(e2e_site: SlurmSite, tmp_path):
    env = e2e_site.env()
    out = tmp_path / "report.html"
    res = gpugate(env, "report", "--html", str(out))
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    assert "gpu-a" in html and "gpu.ecc" in html and "<script" not in html
    assert os.path.getsize(out) > 1000

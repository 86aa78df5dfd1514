"""End to end: `gpugate qualify n1 n2 n3` on a 3-node local Slurm, n2 made slow.

The real hooks are installed (Site.cluster); the qualification's jobs run the DCGM step through
the dcgmi stand-in (replaying DCGM 4.6.0 level-1 output) and the payload through .venv-torch's
PyTorch on gloo, two ranks per node. GPUGATE_QUALIFY_TEST_DELAY makes n2's ranks sleep before
every timed iteration: its own all-reduce falls below the median fraction and it is slow with
every partner. n3 is drained (by gpugate) before the run: it is resumed into gpugate's MAINT
reservation, passes, and comes out drained as before. The reservation is gone afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import paths
import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip
from torchenv import torch_python_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402

NODES = ["n1", "n2", "n3"]
ROOT = paths.ROOT
STANDIN = ROOT / "tests" / "dcgmi_standin"
N3_REASON = "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100 (before qualify)"


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    python = torch_python_or_skip()
    qualify = (
        "budget:\n  settle_s: 0\n  jitter_s: 0\n  max_drained_share: 1.0\n  min_drains_allowed: 3\n"
        "qualify:\n"
        f"  python: {python}\n  dcgmi: {STANDIN / 'dcgmi'}\n"
        "  size_mib: 1\n  iters: 5\n  ntasks_per_node: 2\n  time_limit_min: 5\n  wait_s: 120\n"
    )
    return slurm_site(NODES, config=qualify)


def qualify(site: Site, cluster: LocalSlurm, *args: str) -> subprocess.CompletedProcess:
    """`gpugate qualify` as root against this cluster, n2 slowed by the payload's test hook."""
    hooks = {
        "GPUGATE_DCGMI_REPLAY": str(STANDIN / "replay"),
        "GPUGATE_QUALIFY_TEST_DELAY": "n2:250",
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / "gpugate"), "qualify", *args, "--config", str(site.config)],
        env={**cluster.env(), **hooks}, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def test_three_nodes_the_slow_one_is_named_and_drained_a_drained_one_stays_drained(
    cluster: LocalSlurm, site: Site
):
    started = time.monotonic()
    cluster.drain("n3", N3_REASON)
    done = qualify(site, cluster, "n[1-3]", "--json")
    print(done.stdout[-6000:], done.stderr[-3000:])
    assert done.returncode == 1, done.stderr
    run = json.loads(done.stdout)
    v = run["verdicts"]
    assert v["n1"]["passed"] and v["n3"]["passed"], (v["n1"]["why"], v["n3"]["why"])
    assert not v["n2"]["passed"] and v["n2"]["failed"]
    tests = {t["test"]: t for t in v["n2"]["tests"] if t["test"] != "pair"}
    assert tests["allreduce"]["ok"] is False and "below" in tests["allreduce"]["detail"]
    assert tests["dcgm"]["ok"] is True, tests["dcgm"]  # the stand-in's passing level 1
    assert tests["h2d"]["ok"] is None  # no CUDA device: not judged
    assert run["pairs"]["suspects"] == ["n2"], run["pairs"]
    assert "n2 is slow with every partner" in run["pairs"]["text"]

    # n2 drained with the qualification's reason and job; n3 drained as before; n1 in service.
    n2 = cluster.node("n2")
    assert cluster.is_drained("n2") and n2["Reason"].startswith("gpugate: qualify: allreduce")
    assert f"(job {v['n2']['job_ids'][0]})" in n2["Reason"]
    assert cluster.is_drained("n3") and cluster.node("n3")["Reason"].startswith(N3_REASON)
    assert not cluster.is_drained("n1")
    shown = cluster.run(["scontrol", "show", "reservation"], check=False)
    assert "gpugate-qualify" not in shown.stdout, shown.stdout

    # The records: qualify.jsonl, the drain history, one bundle per node under its job id.
    lines = (site.state / "qualify.jsonl").read_text().splitlines()
    entries = {e["node"]: e for e in map(json.loads, lines)}
    assert entries["n3"]["passed"] and not entries["n2"]["passed"]
    drains = [json.loads(x) for x in (site.state / "drains.jsonl").read_text().splitlines()]
    assert [d["node"] for d in drains if d["hook"] == "qualify"] == ["n2"]
    for node in NODES:
        bundle = site.evidence / v[node]["job_ids"][0] / f"{node}-r0"
        summary = json.loads((bundle / "summary.json").read_text())
        assert summary["kind"] == "qualify" and summary["passed"] == v[node]["passed"]
        assert (bundle / "allreduce.json").exists()
    # The report keeps qualifications apart: n1 and n3 passed, n2 a qualification failure with
    # its bandwidth reason; none is a failed run.
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "gpugate"), "report", "--json", "--config", str(site.config)],
        env=cluster.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    report = json.loads(shown.stdout)
    quals = {q["node"]: q for q in report["qualifications"]}
    assert quals["n1"]["outcome"] == "passed" and quals["n1"]["label"] == "passed qualification"
    assert quals["n2"]["outcome"] == "failed" and "allreduce" in quals["n2"]["why"], quals["n2"]
    assert report["failed_runs"] == [], report["failed_runs"]
    assert time.monotonic() - started < 200


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

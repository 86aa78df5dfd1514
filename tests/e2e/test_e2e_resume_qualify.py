"""End to end: resume only after proof (issue 17, deliver 2 and its acceptance), on a real Slurm.

Two nodes. `admin.resume_qualify` asks a level-2 qualification of hardware drains. Each node in
turn is drained by gpugate's prolog for ECC (a hardware check: the other node stays in service,
as the drain budget wants), its snapshot healed, and then:
- a plain `gpugate resume` refuses and names `--qualify`;
- `gpugate resume gpu-a --qualify` submits the qualification job (gpugate's reservation, DCGM
  through the dcgmi stand-in, the gloo all-reduce and h2d through .venv-torch) and resumes the
  node only after it succeeded: the audit entry names the job, which Slurm ran to completion;
- gpu-b's stand-in replays a level-2 memory failure: `resume --qualify` leaves it drained with
  the reason naming the failed test and the job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import paths
import pytest
from e2e import Site, SlurmSites, slurm_or_skip
from torchenv import torch_python_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

NODES = ["gpu-a", "gpu-b"]
GPUGATE = str(Path(sys.executable).parent / "gpugate")
STANDIN = paths.DCGMI_STANDIN


def qualify_config(python: str) -> str:
    return (
        "  resume_qualify:\n    hardware: 2\n    transient: 0\n"  # continues `admin:`
        "qualify:\n"
        f"  python: {python}\n  dcgmi: {STANDIN / 'dcgmi'}\n"
        "  tests: [dcgm, allreduce, h2d]\n  size_mib: 1\n  iters: 3\n  wait_s: 90\n"
        # The test nodes say Gres=gpu:8 on 2 CPUs: two ranks, not one per GPU.
        "  time_limit_min: 5\n  ntasks_per_node: 2\n"
    )


def dcgm_replay(site: Site) -> None:
    """The dcgmi stand-in's replays: a clean run by default, a memory failure on gpu-b."""
    replay = site.base / "dcgm-replay"
    shutil.copytree(STANDIN / "replay" / "default", replay / "default")
    (replay / "gpu-b").mkdir()
    shutil.copy(STANDIN / "replay" / "gpu-memfail" / "diag-r2.json", replay / "gpu-b")


@pytest.fixture(scope="module")
def env_cluster(slurm_site: SlurmSites):
    python = torch_python_or_skip()
    site, cluster = e2e = slurm_site(NODES, config=qualify_config(python), prepare=dcgm_replay)
    # sbatch hands the submitter's environment to the job (--export=ALL, sbatch(1)): the
    # stand-in reads its replay directory from there.
    return site, cluster, e2e.env(GPUGATE_DCGMI_REPLAY=str(site.base / "dcgm-replay"))


def gpugate(env: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([GPUGATE, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def drain_for_ecc(site: Site, cluster: object, node: str) -> None:
    """The prolog drains `node` for ECC (the job is refused); then the GPU is 'replaced'."""
    site.use_snapshot(node, "h100-ecc")
    job = cluster.submit(wrap="true", output="/dev/null", nodelist=node)  # type: ignore[attr-defined]
    cluster.wait_job(job, "PENDING", reason="launch failed requeued held", timeout=60)  # type: ignore[attr-defined]
    cluster.run(["scancel", str(job)])  # type: ignore[attr-defined]
    assert cluster.node(node)["Reason"].startswith("gpugate: gpu.ecc: ")  # type: ignore[attr-defined]
    site.use_snapshot(node, "h100-healthy")


def audit(site: Site, node: str) -> list[dict]:
    lines = (site.state / "audit.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["node"] == node]


def test_resume_qualify_resumes_only_after_the_job_succeeded(env_cluster):
    site, cluster, env = env_cluster
    drain_for_ecc(site, cluster, "gpu-a")
    plain = gpugate(env, "resume", "gpu-a", "--why", "GPU3 replaced")
    assert plain.returncode == 1 and "gpugate resume gpu-a --qualify" in plain.stderr
    assert cluster.is_drained("gpu-a")

    done = gpugate(env, "resume", "gpu-a", "--qualify", "--why", "GPU3 replaced", timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    cluster.wait_idle(["gpu-a"])
    entry = audit(site, "gpu-a")[-1]
    assert entry["resumed"] is True and entry["why"] == "GPU3 replaced"
    proof = entry["qualification"]
    assert proof["passed"] is True and proof["level"] == 2 and proof["job_ids"]
    job = proof["job_ids"][0]
    assert f"job {job}" in entry["result"]
    # Slurm ran that job to its end, successfully, before the node went back.
    shown = cluster.run(["scontrol", "show", "job", job], check=False).stdout
    assert not shown or "JobState=COMPLETED" in shown
    assert "ExitCode=0:0" in shown or not shown
    record = [json.loads(x) for x in (site.state / "qualify.jsonl").read_text().splitlines()]
    assert [r["job_ids"] for r in record if r["node"] == "gpu-a"][-1] == proof["job_ids"]
    assert record[-1]["when"] <= entry["when"]
    # No reservation left behind.
    res = cluster.run(["scontrol", "show", "reservation"], check=False).stdout
    assert "gpugate-qualify" not in res


def test_a_failed_qualification_keeps_the_node_drained_naming_the_job(env_cluster):
    site, cluster, env = env_cluster
    drain_for_ecc(site, cluster, "gpu-b")
    done = gpugate(env, "resume", "gpu-b", "--qualify", timeout=400)
    assert done.returncode == 1, done.stdout + done.stderr
    assert cluster.is_drained("gpu-b")
    reason = cluster.node("gpu-b")["Reason"]
    entry = audit(site, "gpu-b")[-1]
    proof = entry["qualification"]
    assert entry["resumed"] is False and proof["passed"] is False and proof["job_ids"]
    job = proof["job_ids"][0]
    assert reason.startswith("gpugate: qualify: ") and f"(job {job})" in reason
    assert "dcgm" in reason.lower() or "memory" in reason.lower()
    assert f"job {job}" in done.stderr
    assert os.path.exists(site.state / "qualify.jsonl")


def test_the_metrics_and_the_report_show_both_outcomes(env_cluster, tmp_path):
    site, _cluster, env = env_cluster
    prom = (site.metrics.parent / "gpugate-qualify.prom").read_text()
    assert 'gpugate_qualify_runs_total{node="gpu-a",result="passed"} 1' in prom
    assert 'gpugate_qualify_runs_total{node="gpu-b",result="failed"} 1' in prom
    assert 'gpugate_qualify_last_pass_timestamp_seconds{node="gpu-a"}' in prom
    assert 'gpugate_qualify_bandwidth_gbps{node="gpu-a",test="allreduce"}' in prom
    page = tmp_path / "report.html"
    done = gpugate(env, "report", "--html", str(page))
    assert done.returncode == 0, done.stderr
    section = page.read_text().split('<h2 id="qualify">', 1)[1].split("<h2", 1)[0]
    assert "gpu-a" in section and "gpu-b" in section and "qualification failure" in section

"""End to end: automatic requeue from the newest complete checkpoint, on a healthy node.

Three slurmd on one host. The job's first run fails on its node with a hardware fault (an Xid
79 appears in that node's replayed kernel log); EpilogSlurmctld requeues it off that node (added
to the job's own ExcNodeList), and the second run sees GPUGATE_RESUME_FROM pointing at the
newest *complete* checkpoint. A job the prolog refuses keeps the prolog's AdminComment and
starts on a free node without Slurm's 120 s requeue delay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip
from requeue_e2e import decision, torch_zip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402

from gpugate.slurm.hostlist import hostlist_expand  # noqa: E402

NODES = ["n1", "n2", "n3"]
NCCL_TIMEOUT = "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600061 milliseconds before timing out."


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    # checkpoints.max_age_s 1: a run of a few seconds already outlives its checkpoint policy.
    yaml = "requeue:\n  wait_for_bundles_s: 45\ncheckpoints:\n  max_age_s: 1\n"
    # The install docs' recommendation: a refused job goes back to the queue, not held.
    return slurm_site(NODES, config=yaml, templates={"broken-template": "h100-xid79"},
                      scheduler_parameters="nohold_on_prolog_fail")  # fmt: skip


@pytest.fixture(autouse=True)
def healthy_nodes(site: Site, cluster: LocalSlurm):
    """Every test starts from healthy, idle nodes and an empty queue."""
    site.restore(cluster, NODES)


def job_script(site: Site, name: str, fail_with: str) -> tuple[str, Path]:
    """Run 1 fails (hardware: the node's snapshot gets an Xid 79; or the user's own OOM)."""
    log = site.base / f"{name}.runs"
    snapshots = site.snapshots
    if fail_with == "hardware":
        failure = (
            f'sed "s/gpu-node-01/$SLURMD_NODENAME/" {snapshots}/broken-template.yaml > {snapshots}/.t.$SLURMD_NODENAME; '
            f"mv {snapshots}/.t.$SLURMD_NODENAME {snapshots}/$SLURMD_NODENAME.yaml; echo '{NCCL_TIMEOUT}'; sleep 2; exit 1"
        )
    else:
        failure = (
            "echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.'; exit 1"
        )
    script = f"""#!/bin/sh
echo "run=${{SLURM_RESTART_COUNT:-0}} node=$SLURMD_NODENAME resume=$GPUGATE_RESUME_FROM" >> {log}
if [ -z "$SLURM_RESTART_COUNT" ]; then
    {failure}
fi
exit 0
"""
    return script, log


def checkpoints(site: Site, name: str) -> Path:
    ckpt = site.base / f"ckpt-{name}"
    ckpt.mkdir()
    torch_zip(ckpt / "ckpt_100.pt")
    torch_zip(ckpt / "ckpt_200.pt")
    torch_zip(ckpt / "ckpt_300.pt", truncate=True)  # the node died while it was being written
    return ckpt


def test_hardware_failure_is_requeued_to_the_healthy_node_and_resumes(
    cluster: LocalSlurm, site: Site
):
    ckpt = checkpoints(site, "hw")
    old = time.time() - 42 * 60  # the newest complete one was saved 42 minutes ago
    for path in ckpt.iterdir():
        os.utime(path, (old, old))
    script, log = job_script(site, "hw", "hardware")
    job = cluster.submit(script=script, output=str(site.base / "hw.out"),
                         comment=f"gpugate:ckpt={ckpt}", exclude="n3")  # fmt: skip
    state = cluster.wait_job(job, "COMPLETED", timeout=90)
    runs = log.read_text().splitlines()
    assert len(runs) == 2, runs
    first_node = runs[0].split()[1].split("=")[1]
    second_node = runs[1].split()[1].split("=")[1]
    assert first_node != second_node and state["Restarts"] == "1"
    assert runs[1].endswith(f"resume={ckpt}/ckpt_200.pt"), runs[1]
    assert cluster.is_drained(first_node)
    assert cluster.node(first_node)["Reason"].startswith("gpugate: kernel.xid: evidence")
    assert "requeued: infrastructure failure" in state["AdminComment"]
    # The first run's epilog measured the checkpoint as the user and told the user.
    told = "newest complete checkpoint was 42 min old at the end (policy: 1 s)"
    assert told in state["AdminComment"], state["AdminComment"]
    bundle = site.evidence / str(job) / f"{first_node}-r0"
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["checkpoint_stale"] is True and summary["checkpoint_age_s"] >= 42 * 60
    assert summary["checkpoint"]["path"] == f"{ckpt}/ckpt_200.pt"
    # The suspect is added to the user's own exclusion, not put in its place.
    assert set(hostlist_expand(state["ExcNodeList"])) == {first_node, "n3"}, state["ExcNodeList"]


def test_a_refused_job_keeps_the_prologs_comment_and_starts_elsewhere_at_once(
    cluster: LocalSlurm, site: Site
):
    site.use_snapshot("n1", "h100-ecc")
    started = time.monotonic()
    job = cluster.submit(wrap="true", output=str(site.base / "refused.out"),
                         comment="gpugate:requeue")  # fmt: skip
    state = cluster.wait_job(job, "COMPLETED", timeout=90)
    took = time.monotonic() - started
    # Slurm tried n1 first; its prolog refused and drained it; without gpugate the rerun
    # would wait out BeginTime (+120 s) with n2 and n3 idle.
    assert cluster.is_drained("n1") and state["NodeList"] in ("n2", "n3"), state
    print(f"refused on n1, ran on {state['NodeList']} {took:.1f} s after submit")
    assert took < 60, f"the refused job took {took:.0f} s to run elsewhere"
    decision(site, job, runs=2)  # both EpilogSlurmctld runs are over
    comment = cluster.job_state(job).get("AdminComment", "")
    assert comment.startswith("gpugate: node n1 refused: gpu.ecc"), comment
    assert "not requeued" not in comment, comment


def test_a_job_that_ends_well_gets_no_admin_comment(cluster: LocalSlurm, site: Site):
    job = cluster.submit(wrap="true", output=str(site.base / "ok.out"), comment="gpugate:requeue")
    cluster.wait_job(job, "COMPLETED", timeout=30)
    decision(site, job)
    assert cluster.job_state(job).get("AdminComment", "") == ""


def test_the_users_own_error_is_not_requeued(cluster: LocalSlurm, site: Site):
    ckpt = checkpoints(site, "oom")
    script, log = job_script(site, "oom", "user")
    job = cluster.submit(
        script=script, output=str(site.base / "oom.out"), comment=f"gpugate:ckpt={ckpt}"
    )
    state = cluster.wait_job(job, "FAILED", timeout=60)
    cluster.wait_job(job, "FAILED", timeout=5)
    assert state["Restarts"] == "0" and len(log.read_text().splitlines()) == 1
    assert decision(site, job)["why"] == "not an infrastructure failure (cuda_oom)"


def test_a_job_past_its_restart_limit_is_not_requeued(cluster: LocalSlurm, site: Site):
    ckpt = checkpoints(site, "limit")
    script, log = job_script(site, "limit", "hardware")
    job = cluster.submit(script=script, output=str(site.base / "limit.out"),
                         comment=f"gpugate:ckpt={ckpt} gpugate:restarts=0")  # fmt: skip
    state = cluster.wait_job(job, "FAILED", timeout=60)
    assert state["Restarts"] == "0" and len(log.read_text().splitlines()) == 1
    assert decision(site, job)["why"] == "gpu_xid_hardware, but no restarts left (0/0)"


def test_a_two_node_job_that_fails_then_completes_is_a_success_for_its_last_run(
    cluster: LocalSlurm, site: Site
):
    """Issue 26: run 0 fails (a failed step, then an Xid 79 on its batch node and a NCCL
    timeout in the log), is requeued off that node and completes. Slurm keeps run 0's derived
    exit code and the appended log keeps run 0's lines: run 1 is still a success everywhere."""
    from gpugate.store.metrics import parse_samples

    ckpt = checkpoints(site, "two")
    log = site.base / "two.runs"
    snaps = site.snapshots
    script = f"""#!/bin/sh
echo "run=${{SLURM_RESTART_COUNT:-0}} node=$SLURMD_NODENAME" >> {log}
if [ -z "$SLURM_RESTART_COUNT" ]; then
    srun -N2 --ntasks-per-node=1 false
    sed "s/gpu-node-01/$SLURMD_NODENAME/" {snaps}/broken-template.yaml > {snaps}/.t.$SLURMD_NODENAME
    mv {snaps}/.t.$SLURMD_NODENAME {snaps}/$SLURMD_NODENAME.yaml
    echo '{NCCL_TIMEOUT}'; sleep 2; exit 1
fi
srun -N2 --ntasks-per-node=1 true
echo done
"""
    job = cluster.submit(script=script, output=str(site.base / "two.out"), open_mode="append",
                         nodes=2, comment=f"gpugate:ckpt={ckpt}")  # fmt: skip
    state = cluster.wait_job(job, "COMPLETED", timeout=150)
    assert state["Restarts"] == "1" and len(log.read_text().splitlines()) == 2, state
    last = decision(site, job, runs=2)
    assert last["why"] == "the job ended well (exit 0:0)", last
    # Bundles: run 0's on both nodes; none for run 1, which ended well.
    bundles = sorted(p.name for p in (site.evidence / str(job)).iterdir())
    assert [b for b in bundles if b.endswith("-r1")] == [] and len(bundles) == 2, bundles
    ends = [e for e in site.events() if e["hook"] == "epilog" and e.get("job") == str(job)]
    assert [e["abnormal"] for e in ends] == [True, True, False, False], ends
    assert all(e.get("bundle") is None for e in ends[2:]), ends
    # Metrics: the nodes share one textfile here, and each write keeps only its own node's
    # series (metrics.apply_run), so the file holds the last writer's: one of run 1's epilogs,
    # which counted its run ok and nothing failed.
    after = parse_samples(site.metrics.read_text())
    (node,) = {dict(labels)["node"] for _, labels in after}
    assert node in hostlist_expand(state["NodeList"]), (node, state["NodeList"])
    counted = {dict(labels)["result"]: v for (name, labels), v in after.items()
            if name == "gpugate_job_ends_total"}  # fmt: skip
    assert counted == {"ok": 1}, counted
    # The report: run 0 is a failed run, run 1 is not; the requeue section says why not.
    page = site.base / "two.html"
    env = dict(cluster.env(), GPUGATE_CONFIG=str(site.config))
    gpugate = str(Path(sys.executable).parent / "gpugate")
    done = subprocess.run([gpugate, "report", "--html", str(page)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    assert f'<td>{job}</td><td class="n">0</td><td class="node">' in html
    assert f'<td>{job}</td><td class="n">1</td><td class="node">' not in html
    assert "the job ended well (exit 0:0)" in html


def test_a_job_beside_a_gpu_its_prolog_found_lost_ends_well_and_stays_ended(
    cluster: LocalSlurm, site: Site
):
    """Issue 26: n1's GPU5 is lost; the prolog drains n1 but lets a 2-GPU job run on its
    healthy GPUs. The job completes: no bundle calls the known fault the job's, no requeue."""
    site.use_snapshot("n1", "h100-gpu-lost")
    job = cluster.submit(wrap="true", output=str(site.base / "beside.out"), nodelist="n1",
                         gres="gpu:2", comment="gpugate:requeue")  # fmt: skip
    state = cluster.wait_job(job, "COMPLETED", timeout=60)
    assert state["Restarts"] == "0" and cluster.is_drained("n1"), state
    assert cluster.node("n1")["Reason"].startswith("gpugate: gpu.lost"), cluster.node("n1")
    assert decision(site, job)["why"] == "the job ended well (exit 0:0)"
    assert not (site.evidence / str(job)).exists()
    (end,) = [e for e in site.events() if e["hook"] == "epilog" and e.get("job") == str(job)]
    assert (end["abnormal"], end["hardware_fault"], end["drained"]) == (False, False, False), end


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

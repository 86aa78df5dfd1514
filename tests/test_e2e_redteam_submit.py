"""Red team, end to end: issue 25's attack 6, the checkpoint policy bypassed five ways.

gpugate is installed as the README says: the five hooks through `Site` and the job_submit.lua
that `gpugate submit-policy --lua` writes from the packaged `submit:` defaults (jobs of 16 GPUs
or 2 nodes or more must declare `--comment gpugate:ckpt=/abs/dir`), on a real 3-node Slurm
(Debian's slurmctld and its job_submit/lua). An ordinary user (localslurm's job user) tries each
way around the policy that worked before; each is refused with gpugate's message:

- `sbatch -N 1-3`: a node range (job_submit counted min_nodes, the job got 3 nodes);
- `sbatch --ntasks=2 --ntasks-per-node=1`: the node count its tasks imply (2 nodes);
- a heterogeneous job whose components are each small (2 nodes together);
- `scontrol update jobid=J Comment=nothing` on a large job that declared its checkpoints;
- `scontrol update jobid=J NumNodes=2-3` on a small job without a checkpoint directory.

Three more of the same kind are refused too (more tasks than a node has CPUs; `--spread-job`;
`scontrol update ReqNodeList=` of two nodes on a job without -N), and a het job that declares
its checkpoint directory still goes in.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e import Site, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm, cpu_layout  # noqa: E402

from gpugate.commands.submit_policy import main as submit_policy  # noqa: E402

NODES = ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
REFUSED = "gpugate: job refused"
# Slurm 22.05 sends scontrol no text from job_submit on an update, only the error code gpugate
# returns (its reason is in slurmctld.log); later releases also print the text.
DENIED = "Access/permission denied"
HET_SCRIPT = """#!/bin/sh
#SBATCH -N 1 --comment=two-small-pieces
#SBATCH hetjob
#SBATCH -N 1
true
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    site = Site(tmp_path_factory.mktemp("e2e-redteam-submit"))
    for node in NODES:
        site.use_snapshot(node, "h100-healthy")
    lua = site.base / "job_submit.lua"
    assert submit_policy(["--config", str(site.config), "--lua", "-o", str(lua)]) == 0
    with site.cluster(NODES, job_submit_lua=lua) as c:
        yield c


def sbatch(cluster: LocalSlurm, *flags: str, script: str | None = None):
    """sbatch as the ordinary user; the finished process whatever it did."""
    argv = ["sbatch", "--parsable", f"--chdir={cluster.work_dir}", *flags]
    if script is None:
        argv.append("--wrap=true")
    return cluster.run(argv, input=script, as_job_user=True, check=False)


def held_job(cluster: LocalSlurm, *flags: str) -> int:
    """A pending (user-held) job of the ordinary user, accepted by the policy."""
    proc = sbatch(cluster, "--hold", *flags)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def scontrol_update(cluster: LocalSlurm, jobid: int, change: str):
    """`scontrol update jobid=J <change>` as the job's owner."""
    argv = ["scontrol", "update", f"jobid={jobid}", change]
    return cluster.run(argv, as_job_user=True, check=False)


@pytest.mark.parametrize(
    "flags, script",
    [
        (("-N", "1-3"), None),
        (("--ntasks=2", "--ntasks-per-node=1"), None),
        ((), HET_SCRIPT),
        # beyond the five: more tasks than a node has CPUs, and --spread-job
        ((f"--ntasks={cpu_layout()['CPUs'] + 1}",), None),
        (("--ntasks=2", "--spread-job"), None),
    ],
    ids=["node-range", "tasks-imply-nodes", "het-job", "tasks-need-cpus", "spread-job"],
)
def test_a_large_job_in_disguise_is_refused_at_sbatch(
    cluster: LocalSlurm, flags: tuple, script: str | None
) -> None:
    before = cluster.queue()
    proc = sbatch(cluster, *flags, script=script)
    assert proc.returncode != 0, proc.stdout
    assert REFUSED in proc.stderr and "declares no checkpoint directory" in proc.stderr
    assert "--comment gpugate:ckpt=" in proc.stderr
    assert cluster.queue() == before  # nothing was queued


def test_a_het_job_that_declares_its_checkpoints_is_accepted(cluster: LocalSlurm) -> None:
    script = HET_SCRIPT.replace("two-small-pieces", "gpugate:ckpt=/shared/ckpt/het")
    proc = sbatch(cluster, "--hold", script=script)
    assert proc.returncode == 0, proc.stderr
    cluster.run(["scancel", proc.stdout.strip().split(";")[0]], check=False)


def test_dropping_the_checkpoint_of_a_large_job_is_refused(cluster: LocalSlurm) -> None:
    jobid = held_job(cluster, "-N", "2", "--comment=gpugate:ckpt=/shared/ckpt/run1")
    try:
        proc = scontrol_update(cluster, jobid, "Comment=nothing")
        assert proc.returncode != 0, proc.stdout
        assert DENIED in proc.stderr
        job = cluster.job_state(jobid)
        assert job["Comment"] == "gpugate:ckpt=/shared/ckpt/run1"
        assert job["NumNodes"].split("-")[0] == "2"
    finally:
        cluster.run(["scancel", str(jobid)], check=False)


def test_growing_a_small_job_past_the_threshold_is_refused(cluster: LocalSlurm) -> None:
    jobid = held_job(cluster, "-N", "1")
    try:
        before = cluster.job_state(jobid)["NumNodes"]
        proc = scontrol_update(cluster, jobid, "NumNodes=2-3")
        assert proc.returncode != 0, proc.stdout
        assert DENIED in proc.stderr
        assert cluster.job_state(jobid)["NumNodes"] == before
        assert before.split("-")[0] == "1"
    finally:
        cluster.run(["scancel", str(jobid)], check=False)


def test_naming_more_nodes_in_a_pending_job_is_refused(cluster: LocalSlurm) -> None:
    # Beyond the five: a job without -N given `ReqNodeList=` of two nodes ran on both.
    jobid = held_job(cluster)
    try:
        proc = scontrol_update(cluster, jobid, f"ReqNodeList={NODES[0]},{NODES[1]}")
        assert proc.returncode != 0 and DENIED in proc.stderr
        assert cluster.job_state(jobid)["ReqNodeList"] == "(null)"
    finally:
        cluster.run(["scancel", str(jobid)], check=False)


def test_the_refusals_are_gpugates_in_the_controller_log(cluster: LocalSlurm) -> None:
    log = (cluster.log_dir / "slurmctld.log").read_text(errors="replace")
    assert "gpugate: refused a job of uid" in log
    assert "gpugate: refused uid" in log and "update refused" in log

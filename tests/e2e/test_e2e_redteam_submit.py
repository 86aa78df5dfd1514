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

Issue 41's R1 and R2, two more that passed as small jobs (the nodes have this host's CPU layout,
one socket each):

- R1: `sbatch --ntasks=2 --ntasks-per-socket=1 --gres=gpu:8`: Slurm gives it a node per socket,
  2 nodes and 16 GPUs, and the old Lua counted one node (it read only --ntasks-per-node and
  CPUs); `-B 1:1` (--sockets-per-node, --cores-per-socket), `--threads-per-core` and
  `--mem-per-cpu` (under CR_*_Memory) do the same on other node layouts. Each is refused
  without a checkpoint directory and accepted with one (or with `-N 1`, a node bound).
- R2: `sbatch -n1 --ntasks-per-node=1 --gres=gpu:8 --hold`, then `scontrol update jobid=J
  NumTasks=2`: the record's --ntasks-per-node makes that 2 nodes, which the old Lua never saw
  (job_submit/lua does not expose it in the job record). The update is refused, and so is
  `Comment=nothing` on an R1 job accepted with its checkpoint directory (the record shows no
  --ntasks-per-socket either).
"""

from __future__ import annotations

import pytest
from e2e import SlurmSite, SlurmSites, slurm_or_skip, submit_policy_lua

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm, cpu_layout  # noqa: E402

NODES = ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
REFUSED = "gpugate: job refused"
# Slurm 22.05 sends scontrol no text from job_submit on an update, only the error code gpugate
# returns (its reason is in slurmctld.log); later releases also print the text.
DENIED = "Access/permission denied"
CKPT = "--comment=gpugate:ckpt=/shared/ckpt/r1"
# Per-unit task limits. On these nodes of one socket, --ntasks-per-socket=1 puts two tasks on two
# nodes; the others do where a node's layout (sockets, cores, threads) or CR_*_Memory make them,
# which job_submit cannot see, so it counts a node per task for each.
PER_UNIT = {
    "ntasks-per-socket": ("--ntasks-per-socket=1",),
    "sockets-and-cores": ("-B", "1:1"),
    "threads-per-core": ("--threads-per-core=1",),
    "mem-per-cpu": ("--mem-per-cpu=600",),
}
HET_SCRIPT = """#!/bin/sh
#SBATCH -N 1 --comment=two-small-pieces
#SBATCH hetjob
#SBATCH -N 1
true
"""


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site(NODES, prepare=submit_policy_lua)


def sbatch(cluster: LocalSlurm, *flags: str, script: str | None = None):
    """sbatch as the ordinary user; the finished process whatever it did."""
    argv = ["sbatch", "--parsable", f"--chdir={cluster.work_dir}", *flags]
    if script is None:
        argv.append("--wrap=true")
    return cluster.run(argv, input=script, as_job_user=True, check=False)


def jobid_of(proc) -> int:
    """The job id sbatch --parsable printed."""
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def held_job(cluster: LocalSlurm, *flags: str) -> int:
    """A pending (user-held) job of the ordinary user, accepted by the policy."""
    return jobid_of(sbatch(cluster, "--hold", *flags))


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


# ------------------------------------------------- issue 41: R1 (per-unit limits), R2


def test_the_nodes_have_one_socket() -> None:
    # The premise of the per-socket cases: a node of this host takes one task per socket.
    assert cpu_layout()["Sockets"] == 1


@pytest.mark.parametrize("limit", list(PER_UNIT.values()), ids=list(PER_UNIT))
def test_r1_a_per_unit_task_limit_without_checkpoint_is_refused(
    cluster: LocalSlurm, limit: tuple
) -> None:
    before = cluster.queue()
    proc = sbatch(cluster, "--ntasks=2", *limit, "--gres=gpu:8")
    assert proc.returncode != 0, f"accepted as job {proc.stdout.strip()}"
    assert REFUSED in proc.stderr and "declares no checkpoint directory" in proc.stderr
    assert "on 2 node(s)" in proc.stderr and "-N/--nodes" in proc.stderr
    assert cluster.queue() == before  # nothing was queued


@pytest.mark.parametrize("limit", list(PER_UNIT.values()), ids=list(PER_UNIT))
def test_r1_with_a_checkpoint_or_a_node_bound_it_goes_in(cluster: LocalSlurm, limit) -> None:
    for flags in ((CKPT,), ("-N", "1")):
        jobid = held_job(cluster, "--ntasks=2", *limit, "--gres=gpu:8", *flags)
        cluster.run(["scancel", str(jobid)], check=False)


def test_r1_the_job_it_let_through_runs_on_two_nodes(cluster: LocalSlurm) -> None:
    # What the old Lua accepted without a checkpoint directory: 2 nodes, 16 GPUs.
    jobid = jobid_of(sbatch(cluster, "--ntasks=2", "--ntasks-per-socket=1", "--gres=gpu:8", CKPT))
    job = cluster.wait_job(jobid, "COMPLETED", timeout=60)
    assert job["NumNodes"] == "2", job


def test_r2_more_tasks_on_a_job_of_one_task_per_node_is_refused(cluster: LocalSlurm) -> None:
    jobid = held_job(cluster, "-n1", "--ntasks-per-node=1", "--gres=gpu:8")
    try:
        proc = scontrol_update(cluster, jobid, "NumTasks=2")
        assert proc.returncode != 0 and DENIED in proc.stderr, (proc.stdout, proc.stderr)
        assert cluster.job_state(jobid)["NumTasks"] == "1"
    finally:
        cluster.run(["scancel", str(jobid)], check=False)


def test_r2_the_update_refusal_is_gpugates_in_the_controller_log(cluster: LocalSlurm) -> None:
    log = (cluster.log_dir / "slurmctld.log").read_text(errors="replace")
    assert "update refused" in log and "its tasks" in log


def test_r1_r2_dropping_the_checkpoint_of_a_per_socket_job_is_refused(cluster: LocalSlurm) -> None:
    # Accepted with its checkpoint directory (2 nodes), then `Comment=nothing`: the record shows
    # no --ntasks-per-socket, and the old Lua judged it one node and let the comment go.
    jobid = held_job(cluster, "--ntasks=2", "--ntasks-per-socket=1", "--gres=gpu:8", CKPT)
    try:
        proc = scontrol_update(cluster, jobid, "Comment=nothing")
        assert proc.returncode != 0 and DENIED in proc.stderr, (proc.stdout, proc.stderr)
        assert cluster.job_state(jobid)["Comment"] == CKPT.split("=", 1)[1]
    finally:
        cluster.run(["scancel", str(jobid)], check=False)

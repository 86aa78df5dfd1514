"""End to end: cross-job suspect voting on a real 3-node local Slurm.

Three failed 3-node jobs in which node B (SLURM_NODEID 1) fails first: its task writes an
NCCL system error stamped ten minutes before the watchdog timeouts the other two nodes write.
No node's evidence shows hardware. Each node epilog writes first_failure_at in its bundle; the
controller epilog votes for B each time and flags it after the third vote, naming the three
jobs. The stamps are the jobs' own output, so B is never drained: the flag waits for review
(`gpugate nodes` lists it; tests/e2e/test_e2e_redteam_suspects.py has gpugate qualify it).

The three slurmd run on one host, so the NCCL debug directory (node-local on a real cluster,
/var/tmp) is made per node here: hook.env picks a per-node config by SLURMD_NODENAME.
"""

from __future__ import annotations

import sys
import time

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402

NODES = ["n1", "n2", "n3"]
FIRST = "n2"  # SLURM_NODEID 1 of a job on n1,n2,n3
SYSTEM = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1"
TIMEOUT = "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600061 milliseconds before timing out."
# The jobs all run as the one e2e user: one distinct user is enough here (the default, 2, is
# covered by tests/unit/gate/test_suspects.py).
EXTRA = (
    "requeue:\n  wait_for_bundles_s: 45\nbudget:\n  settle_s: 0.5\nhealth:\n"
    "  suspect_users_min: 1\n  suspect_votes_per_user: 3\n  suspect_action: review\n"
)


def task_script(site: Site) -> None:
    """task.sh: one task per node, node 1 failing first, the others timing out waiting for it."""
    task = site.base / "task.sh"
    task.write_text(
        f"""#!/bin/sh
# One task per node: node 1 fails first, the others time out waiting for it. NCCL_DEBUG_FILE
# names the same path on every node (node-local on a real cluster), as srun passes the batch
# step's environment on: here each node's directory is its own (see the module docstring).
log="{site.base}/$SLURMD_NODENAME/nccl/$SLURM_JOB_ID/nccl.$SLURMD_NODENAME.$$.log"
if [ "$SLURM_NODEID" = 1 ]; then
    echo "$(date -u +%Y-%m-%d) 10:00:00,000 [rank1]: {SYSTEM}" >> "$log"
else
    echo "$(date -u +%Y-%m-%d) 10:10:00,000 [rank$SLURM_NODEID]: {TIMEOUT}" >> "$log"
fi
exit 1
"""
    )
    task.chmod(0o755)


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    # Each node its own NCCL directory (see the module docstring).
    return slurm_site(NODES, config=EXTRA, nccl_per_node=True, prepare=task_script)


def controller_done(site: Site, job: int, timeout: float = 60) -> None:
    """Wait until the controller epilog (which votes) has run for `job`."""
    site.wait_event("epilog-slurmctld", job, timeout)


def test_the_node_that_fails_first_in_three_jobs_is_flagged_never_drained(
    cluster: LocalSlurm, site: Site
):
    started = time.monotonic()
    jobs = []
    for i in range(3):
        script = f"#!/bin/sh\nsrun -N3 --ntasks-per-node=1 {site.base / 'task.sh'}\n"
        job = cluster.submit(script=script, nodes=3, output=str(site.base / f"job{i}.out"))
        cluster.wait_job(job, "FAILED", timeout=60)
        controller_done(site, job)
        jobs.append(job)
    summary = site.evidence / str(jobs[0]) / f"{FIRST}-r0" / "summary.json"
    assert '"first_failure_at": "' in summary.read_text(), summary.read_text()
    flags = site.flags()  # the controller's votes flag in controller_dir
    assert [(f["node"], f["action"]) for f in flags] == [(FIRST, "review")]
    assert f"first to fail in jobs {','.join(map(str, jobs))}" in flags[0]["detail"]
    for node in NODES:
        assert not cluster.is_drained(node), cluster.node(node)
    took = time.monotonic() - started
    print(f"three failed jobs, {FIRST} flagged after {took:.0f} s")
    assert took < 120


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

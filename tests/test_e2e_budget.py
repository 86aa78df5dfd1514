"""End to end: a bad threshold on every node must not drain the whole partition.

Four slurmd on one host, all replaying a snapshot that fails a check (as a wrong threshold or a
bad driver update would make every node fail). With a 25 % budget gpugate drains one node, then
stops: the others get a Comment saying what it would have done, and their jobs run.
"""

from __future__ import annotations

import pytest
from e2e import Site, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402

NODES = ["n1", "n2", "n3", "n4"]


def test_drains_stop_at_the_budget(tmp_path):
    site = Site(tmp_path, "budget:\n  max_drained_share: 0.25\n  min_drains_allowed: 1\n")
    for node in NODES:
        site.use_snapshot(node, "h100-driver-mismatch")
    with LocalSlurm(
        tmp_path / "slurm", nodes=NODES, prolog=site.hook("prolog"), prolog_epilog_timeout=60,
        scheduler_parameters="nohold_on_prolog_fail", wrap_hooks=False,
    ) as cluster:  # fmt: skip
        jobs = [cluster.submit(wrap="sleep 1", output="/dev/null", nodes=1) for _ in NODES]
        for job in jobs:
            # The refused job goes back to the queue with Slurm's +120 s delay: an impatient
            # user clears it; the others start at once.
            cluster.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False)
        import time

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            states = [cluster.job_state(j).get("JobState") for j in jobs]
            if all(s == "COMPLETED" for s in states):
                break
            for job, state in zip(jobs, states):
                if state == "PENDING":
                    cluster.run(
                        ["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False
                    )
            time.sleep(1)
        assert all(cluster.job_state(j)["JobState"] == "COMPLETED" for j in jobs)
        drained = [n for n in NODES if cluster.is_drained(n)]
        assert len(drained) == 1, drained
        assert cluster.node(drained[0])["Reason"].startswith("gpugate: gpu.driver: ")
        commented = [
            n for n in NODES if "would drain (budget exceeded" in cluster.node(n).get("Comment", "")
        ]
        assert commented and drained[0] not in commented
    budget = [e for e in site.events() if e.get("outcome") == "budget_exceeded"]
    assert budget and "partition debug" in budget[0]["why"]

"""Red team (issue 41, R8): with the node-local history no node counts the allowance alone.

On a real 3-node local Slurm, each node with its own state_dir (the packaged node-local
history: admin.history_dir null), two ordinary users' jobs raise Xid 31 on GPU0 of n1, then of
n2 ("illegal memory accesses on purpose"), enough for the application-Xid rule to flag each
node. With an allowance of one qualification a day, each node's epilog used to count only its
own store and started a qualification on both nodes; now neither node's count is the cluster's,
so both flags are reviews, and `gpugate selftest` says so.
"""

from __future__ import annotations

import json
import sys

import pytest
from e2e import SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from suspects_e2e import SECOND_USER, gpugate, suspects_site, xid31_job  # noqa: E402

# Two jobs of two users on one GPU flag its node; one qualification a day in all.
EXTRA = (
    "checks:\n  kernel:\n    app_xid_jobs_min: 2\n    app_xid_users_min: 2\n"
    "    app_xid_jobs_per_user: 1\n"
    "health:\n  suspect_qualify_per_day: 1\n"
)


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return suspects_site(slurm_site, EXTRA, own_state=True)


def test_application_xid_flags_on_two_nodes_start_no_qualification(cluster, site):
    for node in ("n1", "n2"):
        for k, user in ((1, None), (2, SECOND_USER)):
            job = xid31_job(cluster, site, k, user, node=node)
            site.wait_event("epilog", job, state=site.node_state(node))
        site.use_snapshot(node, "h100-healthy")
    flags = {n: site.flags(site.node_state(n)) for n in ("n1", "n2")}
    # Before: [("n1", "qualify")] and [("n2", "qualify")], one allowance a node.
    assert {n: [(f["node"], f["action"]) for f in fs] for n, fs in flags.items()} == {
        "n1": [("n1", "review")],
        "n2": [("n2", "review")],
    }
    for node, (flag,) in flags.items():
        assert flag["source"] == "app_xid" and flag["note"].startswith("node-local history: ")
        assert not (site.node_state(node) / "qualify.jsonl").exists()
        assert not cluster.is_drained(node), cluster.node(node)
    # No qualification was asked anywhere (the controller's directory neither).
    assert site.flags() == []
    done = gpugate(cluster, site, "selftest", "--hooks-dir", str(site.hooks), "--json",
                   "--node", "n1")  # fmt: skip
    note = json.loads(done.stdout)["site"]["note"]
    assert "suspect allowance: per node: application-Xid flags go to review" in note, note


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

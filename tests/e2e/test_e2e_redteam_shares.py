"""Red team (issue 41, R4): two users cannot spend the suspects' allowance a genuine suspect needs.

On a real 3-node local Slurm (every hook installed, SlurmUser=root so the controller starts
qualifications itself), with the packaged allowance (health.suspect_qualify_per_day 2) and
share (health.suspect_qualify_per_user_per_day 1), and two votes of two users flagging a node:
1. two attacker users fake failures that point at n2, then at n3: n2's flag asks for a
   qualification, charged to both; n3's is a review (both shares are spent). Before the shares,
   n3 was qualified too and the day's allowance was gone;
2. two other users' failed jobs then point at n1: its flag still asks for (and gets) its
   qualification. Both qualifications pass on the dcgmi stand-in; no node is ever drained.
"""

from __future__ import annotations

import sys
import time

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import JOB_USER, LocalSlurm, ensure_user  # noqa: E402
from suspects_e2e import (  # noqa: E402
    NODES,
    SECOND_USER,
    faked_failure,
    qualifications,
    suspects_site,
)

# Two votes from two users flag a node, each user's jobs one vote (suspect_users_min is the
# packaged 2); the allowance and the shares are the packaged ones.
EXTRA = "health:\n  suspect_votes: 2\n  suspect_votes_per_user: 1\n"
GENUINE = ("gpugate-e2e-squat", "gpugate-e2e-c")  # two more ordinary users


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return suspects_site(slurm_site, EXTRA, slurm_user="root")


def uid(user: str) -> int:
    return ensure_user(user)[0]


def wait_qualified(cluster: LocalSlurm, site: Site, nodes: set[str], timeout: float) -> None:
    """Wait until every node of `nodes` has a passed qualification; none is ever drained."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if nodes <= {q["node"] for q in qualifications(site) if q["passed"]}:
            return
        for node in NODES:
            assert not cluster.is_drained(node), cluster.node(node)
        time.sleep(1)
    raise AssertionError(f"no passed qualification of {nodes}: {qualifications(site)}")


def test_two_attackers_spend_their_shares_and_a_genuine_suspect_is_still_qualified(cluster, site):
    attackers = (JOB_USER, SECOND_USER)
    for i, user in enumerate(attackers):
        faked_failure(cluster, site, user, f"a-n2-{i}", nodes="n1,n2", first="n2")
    # The same two users again, at n3: their shares are spent, the allowance (2) is not.
    for i, user in enumerate(attackers):
        faked_failure(cluster, site, user, f"a-n3-{i}", nodes="n1,n3", first="n3")
    # Two other users' jobs fail first on n1 (a genuine suspect).
    for i, user in enumerate(GENUINE):
        faked_failure(cluster, site, user, f"g-n1-{i}", nodes="n1,n3", first="n1")
    flags = {f["node"]: f for f in site.flags()}
    # Before: n2 qualify, n3 qualify (the day's allowance gone), n1 review.
    assert {n: f["action"] for n, f in flags.items()} == {"n2": "qualify", "n3": "review",
                                                          "n1": "qualify"}  # fmt: skip
    assert "the share of every user who pointed at it is spent" in flags["n3"]["note"]
    assert flags["n2"]["uids"] == flags["n3"]["uids"] == sorted(uid(u) for u in attackers)
    assert flags["n1"]["uids"] == sorted(uid(u) for u in GENUINE)
    (said,) = [e for e in site.events() if e["hook"] == "suspect" and e["node"] == "n1"]
    assert said["note"].startswith("qualification started"), said
    wait_qualified(cluster, site, {"n1", "n2"}, timeout=300)
    assert "n3" not in {q["node"] for q in qualifications(site)}
    for node in NODES:
        assert not cluster.is_drained(node), cluster.node(node)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

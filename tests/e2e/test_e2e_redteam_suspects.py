"""Red team (issue 25, attacks 1, 2, 3 and 5): what users write may point at a node, never take it out.

On a real 3-node local Slurm with every hook installed as the README says, two ordinary users
(the e2e user and a second one) attack as in the issue:
1. three failed 2-node jobs of two users whose tasks print NCCL lines with fabricated time
   stamps (n2 "first to fail") make n2 a suspect: n2 is never drained; gpugate qualifies it in a
   reservation (DCGM through the stand-in) and clears it, and `gpugate report` shows that;
2. the drain budget stays untouched: a real NVLink fault on n3 afterwards is drained at once;
3. after the qualification closed the votes, one more faked job casts one vote and flags
   nothing (the same holds after an admin's resume: tests/unit/gate/test_suspects.py);
5. four jobs of one user raising Xid 31 on GPU0 and then one job of a second user (the "prime
   and tip" of the issue) drain nothing and flag nothing.
"""

from __future__ import annotations

import json
import sys
import time

import pytest
from e2e import SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from suspects_e2e import (  # noqa: E402
    SECOND_USER,
    faked_failure,
    gpugate,
    qualifications,
    suspects_site,
    xid31_job,
)


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    # SlurmUser=root: the controller starts a suspect's qualification itself only as root (as
    # `slurm` it flags the suspect for review, docs/flow.md); the other suspect tests run as
    # `slurm`.
    return suspects_site(slurm_site, slurm_user="root")


def test_two_users_faking_failures_get_a_qualification_never_a_drain(cluster, site):
    jobs = [
        faked_failure(cluster, site, None, "fake-a1"),
        faked_failure(cluster, site, SECOND_USER, "fake-b1"),
    ]
    assert site.flags() == []
    jobs.append(faked_failure(cluster, site, None, "fake-a2"))
    flags = site.flags()
    assert [(f["node"], f["source"], f["action"], f["users"]) for f in flags] == [
        ("n2", "votes", "qualify", 2)
    ]
    assert flags[0]["jobs"] == [str(j) for j in jobs]
    # The qualification runs in gpugate's reservation and passes; n2 is never drained.
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and not qualifications(site):
        assert not cluster.is_drained("n2"), cluster.node("n2")
        time.sleep(1)
    (q,) = qualifications(site)
    assert q["node"] == "n2" and q["passed"] and q["trigger"].startswith("suspect (votes)"), q
    assert not cluster.is_drained("n2"), cluster.node("n2")
    drains = site.state / "drains.jsonl"
    assert not drains.exists() or "n2" not in drains.read_text()
    # The report says what the jobs pointed at, and that it was qualified and cleared.
    page = site.base / "report.html"
    out = gpugate(cluster, site, "report", "--html", str(page))
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert "first to fail in jobs" in text and "qualified and cleared" in text
    # gpugate nodes no longer lists n2 as a suspect.
    nodes = gpugate(cluster, site, "nodes", "--json")
    rows = {r["node"]: r for r in json.loads(nodes.stdout)["nodes"]}
    assert rows["n2"]["action"] == "", rows["n2"]


def test_the_budget_was_untouched_a_real_fault_drains_at_once(cluster, site):
    # Attack 2: the votes above spent nothing, so an NVLink fault on n3 is drained by its prolog.
    site.use_snapshot("n3", "h100-nvlink-down")
    try:
        job = cluster.submit(wrap="true", output="/dev/null", nodelist="n3")
        cluster.wait_job(job, "PENDING", reason="launch failed requeued held", timeout=60)
        cluster.run(["scancel", str(job)])
        assert cluster.node("n3")["Reason"].startswith("gpugate: nvlink"), cluster.node("n3")
    finally:
        site.use_snapshot("n3", "h100-healthy")
        if cluster.is_drained("n3"):
            cluster.resume("n3")


def test_after_the_pass_one_more_faked_job_is_one_vote(cluster, site):
    # Attack 3: the qualification closed every vote cast before it.
    job = faked_failure(cluster, site, SECOND_USER, "fake-b2")
    event = [e for e in site.events() if e["hook"] == "vote" and e["job"] == str(job)]
    said = event[-1]["said"]
    assert "(1/3 votes, 1 user(s))" in said, said
    flags = site.flags()
    assert len(flags) == 1 and not cluster.is_drained("n2")


def test_one_user_primes_application_xids_and_a_second_cannot_tip(cluster, site):
    # Attack 5: four jobs of one user, then one of another: the GPU is no suspect.
    for k in range(1, 5):
        xid31_job(cluster, site, k, None)
    job = xid31_job(cluster, site, 5, SECOND_USER)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(e["hook"] == "epilog" and e.get("job") == str(job) for e in site.events()):
            break
        time.sleep(0.5)
    record = (site.state / "app_xids.jsonl").read_text().splitlines()
    assert len(record) == 5, record
    assert not cluster.is_drained("n1"), cluster.node("n1")
    assert all(f["node"] != "n1" for f in site.flags())
    site.use_snapshot("n1", "h100-healthy")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

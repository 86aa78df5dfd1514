"""End to end: a bad threshold on every node must not drain the whole partition.

Four slurmd on one host, all replaying a snapshot that fails a check (as a wrong threshold or a
bad driver update would make every node fail). With a 25 % budget gpugate drains one node, then
stops: the others get a Comment saying what it would have done, and their jobs run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e import PROLOG_ALONE, Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402

NODES = ["n1", "n2", "n3", "n4"]
GPUGATE = str(Path(sys.executable).parent / "gpugate")


def run_until_done(cluster: LocalSlurm, jobs: list[int], timeout: float = 90) -> None:
    """Wait for the jobs to complete; a refused job is requeued with Slurm's +120 s delay:
    an impatient user clears it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [cluster.job_state(j).get("JobState") for j in jobs]
        if all(s == "COMPLETED" for s in states):
            return
        for job, state in zip(jobs, states):
            if state == "PENDING":
                cluster.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False)
        time.sleep(1)


def gpugate(site: Site, cluster: LocalSlurm, *args: str) -> subprocess.CompletedProcess:
    env = SlurmSite(site, cluster).env()
    return subprocess.run([GPUGATE, *args], env=env, capture_output=True, text=True, timeout=60)


def test_drains_stop_at_the_budget(slurm_site: SlurmSites):
    config = "budget:\n  max_drained_share: 0.25\n  min_drains_allowed: 1\n"
    broken = "h100-driver-mismatch"
    with slurm_site(NODES, snapshots=broken, config=config, **PROLOG_ALONE) as (site, cluster):
        jobs = [cluster.submit(wrap="sleep 1", output="/dev/null", nodes=1) for _ in NODES]
        run_until_done(cluster, jobs)
        assert all(cluster.job_state(j)["JobState"] == "COMPLETED" for j in jobs)
        drained = [n for n in NODES if cluster.is_drained(n)]
        assert len(drained) == 1, drained
        assert cluster.node(drained[0])["Reason"].startswith("gpugate: gpu.driver: ")
        commented = [
            n for n in NODES if "would drain (budget exceeded" in cluster.node(n).get("Comment", "")
        ]
        assert commented and drained[0] not in commented
        # Every admin view reads the held-back drains: `gpugate nodes` ranks them first.
        listed = gpugate(site, cluster, "nodes", "--drained", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {r["node"]: r for r in json.loads(listed.stdout)["nodes"]}
        for name in commented:
            assert rows[name]["action"] == "would drain (budget)", rows[name]
            assert rows[name]["would_drain_reason"].startswith("gpugate: gpu.driver: ")
        said = gpugate(site, cluster, "resume", commented[0], "--why", "test")
        assert "would drain (budget)" in said.stdout and said.returncode == 0, said
    budget = [e for e in site.events() if e.get("outcome") == "budget_exceeded"]
    assert budget and "partition debug" in budget[0]["why"]


def test_two_gpus_off_the_bus_on_three_nodes_are_both_drained(slurm_site: SlurmSites):
    """A small partition: 10 % of 3 nodes allows one drain, but a lost GPU makes the node
    useless for any job, so a second such node is drained too; the third stays in service."""
    nodes = ["n1", "n2", "n3"]
    snapshots = {"n1": "h100-gpu-lost", "n2": "h100-gpu-lost", "n3": "h100-healthy"}
    # The packaged budget: 10 %, at least 1, hardware checks to half.
    with slurm_site(nodes, snapshots=snapshots, **PROLOG_ALONE) as (site, cluster):
        jobs = [cluster.submit(wrap="sleep 1", output="/dev/null", nodelist=n) for n in nodes[:2]]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(cluster.is_drained(n) for n in nodes[:2]):
            time.sleep(1)
        for node in nodes[:2]:
            assert cluster.is_drained(node), cluster.node(node)
            assert cluster.node(node)["Reason"].startswith("gpugate: gpu.lost: ")
        assert not cluster.is_drained(nodes[2])
        for job in jobs:
            cluster.run(["scancel", str(job)], check=False)
    assert not [e for e in site.events() if e.get("outcome") == "budget_exceeded"]


def test_a_window_full_of_transient_drains_still_drains_an_xid79_node(slurm_site: SlurmSites):
    """Issue 41: the window's one drain spent on a hot node (transient) used to leave a GPU
    off the bus (Xid 79) in service, running the next job ("would drain (budget exceeded)").
    Hardware faults count only hardware drains: it is drained and its job refused."""
    nodes = ["n1", "n2", "n3"]
    snapshots = {"n1": "h100-hot", "n2": "h100-healthy", "n3": "h100-healthy"}
    config = "budget:\n  max_drains_per_window: 1\n"
    with slurm_site(nodes, snapshots=snapshots, config=config, **PROLOG_ALONE) as (site, cluster):
        hot = cluster.submit(wrap="true", output="/dev/null", nodelist="n1")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not cluster.is_drained("n1"):
            time.sleep(1)
        assert cluster.node("n1")["Reason"].startswith("gpugate: gpu.temperature: ")
        site.use_snapshot("n2", "h100-xid79")
        job = cluster.submit(wrap="true", output="/dev/null", nodelist="n2")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not cluster.is_drained("n2"):
            time.sleep(1)
        assert cluster.node("n2")["Reason"].startswith("gpugate: kernel.xid: "), cluster.node("n2")
        deadline = time.monotonic() + 30  # the refusal is written once the drain settled
        while time.monotonic() < deadline:
            state = cluster.job_state(job)
            if "refused: kernel.xid" in state.get("AdminComment", ""):
                break
            time.sleep(0.5)
        assert "refused: kernel.xid" in state.get("AdminComment", ""), state
        assert state["JobState"] != "COMPLETED"
        for j in (hot, job):
            cluster.run(["scancel", str(j)], check=False)
    assert not [e for e in site.events() if e.get("outcome") == "budget_exceeded"]


HEALTH_INTERVAL = 2  # slurmctld asks each slurmd for a health run this often (s)
HOT = "gpugate: gpu.temperature: "


def health_runs(site: Site, node: str) -> list[dict]:
    """The health runs on `node` so far (events.jsonl), oldest first."""
    return [e for e in site.events() if e.get("hook") == "health" and e.get("node") == node]


def until(ready, what: str, timeout: float = 60) -> None:
    """Poll `ready` until it is true; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.3)


def test_a_tripped_budget_holds_new_drains_only(slurm_site: SlurmSites):
    """Issue 45: with the window spent by other drains, a node gpugate drained for heat heals
    through `gpugate health` passes and is resumed, while a new drain is held back; once the
    window empties, a node whose held fault has since passed is not drained for it."""
    nodes = ["n1", "n2", "n3", "n4"]
    config = ("budget:\n  max_drains_per_window: 2\n  max_drained_share: 1.0\n"
              "health:\n  heal_after_passes: 2\n")  # fmt: skip
    with slurm_site(nodes, config=config, hooks=("health",), slurm_user="root",
                    health_check_interval=HEALTH_INTERVAL,
                    health_check_node_state="ANY") as (site, cluster):  # fmt: skip
        for node in ("n1", "n2"):  # one after the other: the window's two drains
            site.use_snapshot(node, "h100-hot")
            until(lambda n=node: cluster.is_drained(n), f"drain of {node}")
            assert cluster.node(node)["Reason"].startswith(HOT), cluster.node(node)
        site.use_snapshot("n3", "h100-hot")  # a new drain: the window is spent
        until(lambda: any(r.get("blocked_by") == "budget" for r in health_runs(site, "n3")),
              "held drain of n3")  # fmt: skip
        assert not cluster.is_drained("n3")
        assert "would drain (budget exceeded" in cluster.node("n3").get("Comment", "")
        site.use_snapshot("n3", "h100-healthy")  # n3's held fault passes
        site.use_snapshot("n1", "h100-healthy")  # n1 cools down: healed while n2 keeps its drain
        until(lambda: not cluster.is_drained("n1"), "resume of n1")
        assert cluster.is_drained("n2") and not cluster.is_drained("n3")
        lifts = [r for r in health_runs(site, "n1") if r.get("action") == "lift"]
        assert lifts and lifts[-1]["resumed"], health_runs(site, "n1")[-3:]
        audit = [json.loads(x) for x in (site.state / "audit.jsonl").read_text().splitlines()]
        assert [a["who"] for a in audit if a["node"] == "n1" and a["resumed"]] == ["gpugate health"]
        site.use_snapshot("n2", "h100-healthy")
        until(lambda: not cluster.is_drained("n2"), "resume of n2")  # the window is empty now
        seen = len(health_runs(site, "n3"))
        until(lambda: len(health_runs(site, "n3")) >= seen + 3, "three more runs on n3")
        after = health_runs(site, "n3")[seen:]
        assert all(r["action"] == "allow" for r in after), after
        assert not cluster.is_drained("n3"), cluster.node("n3")
        # The window has room again: a fault there now is drained on its own, fresh facts.
        site.use_snapshot("n4", "h100-hot")
        until(lambda: cluster.is_drained("n4"), "drain of n4")
    assert not [e for e in site.events() if e.get("outcome") == "budget_exceeded"
                and e.get("node") != "n3"]  # fmt: skip

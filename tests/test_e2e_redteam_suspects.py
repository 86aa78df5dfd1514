"""Red team (issue 25, attacks 1, 2, 3 and 5): what users write may point at a node, never take it out.

On a real 3-node local Slurm with every hook installed as the README says, two ordinary users
(the e2e user and a second one) attack as in the issue:
1. three failed 2-node jobs of two users whose tasks print NCCL lines with fabricated time
   stamps (n2 "first to fail") make n2 a suspect: n2 is never drained; gpugate qualifies it in a
   reservation (DCGM through the stand-in) and clears it, and `gpugate report` shows that;
2. the drain budget stays untouched: a real NVLink fault on n3 afterwards is drained at once;
3. after the qualification closed the votes, one more faked job casts one vote and flags
   nothing (the same holds after an admin's resume: tests/test_suspects.py);
5. four jobs of one user raising Xid 31 on GPU0 and then one job of a second user (the "prime
   and tip" of the issue) drain nothing and flag nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from e2e import Site, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402

NODES = ["n1", "n2", "n3"]
SECOND_USER = "gpugate-e2e-b"
GPUGATE = str(Path(sys.executable).parent / "gpugate")
STANDIN = Path(__file__).resolve().parent / "dcgmi_standin"
SYSTEM = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1"
TIMEOUT = "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600061 milliseconds before timing out."
XID31 = (
    "[Tue Dec  1 0{h}:{m}0:07 2026] NVRM: Xid (PCI:0000:18:00): 31, pid=PID, name=python3, "
    "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f60_c0000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
)


def config_extra(base: Path) -> str:
    return (
        "requeue:\n  wait_for_bundles_s: 45\nbudget:\n  settle_s: 0.5\n"
        "qualify:\n"
        f"  dcgmi: {base / 'dcgmi'}\n  tests: [dcgm]\n  wait_s: 90\n  time_limit_min: 5\n"
        # The test nodes say Gres=gpu:8 on 2 CPUs: one rank, not one per GPU.
        "  ntasks_per_node: 1\n"
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    base = tmp_path_factory.mktemp("e2e-redteam-suspects")
    site = Site(base, config_extra(base))
    # The qualification job's dcgmi: the stand-in replaying a clean level-1 run. gpugate starts
    # the qualification from a hook's detached child, whose environment holds no test variable.
    dcgmi = base / "dcgmi"
    dcgmi.write_text(
        f'#!/bin/sh\nGPUGATE_DCGMI_REPLAY={STANDIN / "replay"} exec {STANDIN / "dcgmi"} "$@"\n'
    )
    dcgmi.chmod(0o755)
    for node in NODES:
        site.use_snapshot(node, "h100-healthy")
    site.nccl_dir_per_node(NODES)
    task = site.base / "task.sh"
    # Each task writes into its own NCCL debug file: node 1 of the job (n2) "fails first", ten
    # minutes before the others' timeouts. Every stamp is the user's own invention.
    task.write_text(
        f"""#!/bin/sh
log="{site.base}/$SLURMD_NODENAME/nccl/$SLURM_JOB_ID/nccl.$SLURMD_NODENAME.$$.log"
if [ "$SLURMD_NODENAME" = n2 ]; then
    echo "$(date -u +%Y-%m-%d) 10:00:00,000 [rank1]: {SYSTEM}" >> "$log"
else
    echo "$(date -u +%Y-%m-%d) 10:10:00,000 [rank$SLURM_NODEID]: {TIMEOUT}" >> "$log"
fi
exit 1
"""
    )
    task.chmod(0o755)
    # Jobs of both users stand for their own process raising Xids by swapping n1's snapshot.
    site.snapshots.chmod(0o777)
    # Xid 31 templates: the k-th job finds k lines, the last one new (its own process's).
    healthy = yaml.safe_load((site.snapshots / "n1.yaml").read_text())
    for k in range(1, 7):
        snap = dict(healthy)
        snap["kernel_log"] = [*healthy["kernel_log"],
                              *(XID31.format(h=i // 6, m=i % 6) for i in range(k))]  # fmt: skip
        path = site.snapshots / f"xid31-{k}.yaml"
        path.write_text(yaml.safe_dump(snap, width=1000))
        path.chmod(0o644)
    return site


@pytest.fixture(scope="module")
def cluster(site: Site):
    # SlurmUser=root: the controller starts a suspect's qualification itself only as root (as
    # `slurm` it flags the suspect for review, docs/flow.md); the other suspect tests run as
    # `slurm`.
    with site.cluster(NODES, slurm_user="root") as c:
        yield c


def gpugate(cluster: LocalSlurm, site: Site, *args: str) -> subprocess.CompletedProcess:
    env = dict(cluster.env(), GPUGATE_CONFIG=str(site.config))
    return subprocess.run([GPUGATE, *args], env=env, capture_output=True, text=True, timeout=60)


def controller_done(site: Site, job: int, timeout: float = 60) -> None:
    """Wait until the controller epilog (which votes) has run for `job`."""
    site.wait_event("epilog-slurmctld", job, timeout)


def faked_failure(cluster: LocalSlurm, site: Site, user: str | None, name: str) -> int:
    """A 2-node job on n1,n2 whose logs say n2 failed first; waits for the controller's vote."""
    script = f"#!/bin/sh\nsrun -N2 --ntasks-per-node=1 {site.base / 'task.sh'}\n"
    job = cluster.submit(script=script, nodes=2, nodelist="n1,n2", user=user,
                         output=str(site.base / f"{name}.out"))  # fmt: skip
    cluster.wait_job(job, "FAILED", timeout=60)
    controller_done(site, job)
    return job


def qualifications(site: Site) -> list[dict]:
    path = site.state / "qualify.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


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


def xid31_job(cluster: LocalSlurm, site: Site, k: int, user: str | None) -> int:
    """A job on n1 whose own process raises Xid 31 on GPU0 (the k-th such line in the log)."""
    snaps = site.snapshots
    script = f"""#!/bin/sh
sed "s/pid=PID/pid=$$/" {snaps}/xid31-{k}.yaml > {snaps}/.t.$$
mv {snaps}/.t.$$ {snaps}/n1.yaml
exit 1
"""
    job = cluster.submit(script=script, nodelist="n1", gres="gpu:8", user=user,
                         output=str(site.base / f"xid-{k}.out"))  # fmt: skip
    cluster.wait_job(job, "FAILED", timeout=60)
    return job


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

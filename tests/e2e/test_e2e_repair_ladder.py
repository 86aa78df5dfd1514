"""End to end: the repair ladder with proof (issue 45's acceptance) on a real local Slurm.

slurmctld, slurmd and munge from Debian; gpugate's prolog from the site's hooks; a test
RebootProgram (tests/slurm/fake_reboot.py: the node's slurmd restarts with -b, which Slurm
takes for a reboot) and `gpugate health` run as slurmd runs its HealthCheckProgram (root, no
job). The GPUs are replayed snapshots; the node's boot id lives in the site's /proc stand-in
(`sources.proc_root`), which the test changes when the node "reboots". The qualification is
gpugate's own (a reservation, a Slurm job running the dcgmi stand-in), started by the health
run in a detached child.

One node, GPU5 falling off the bus (Xid 79, h100-xid79.yaml) three times:
1. the prolog drains it while another job still runs there: the health run waits (no reboot
   while a job runs), the job ends, the health run asks `scontrol reboot ASAP nextstate=DOWN`;
   the node reboots and comes back DOWN; the check after the reboot passes, the level-1
   qualification runs and passes, and the node is resumed: every step in the ledger;
2. the same GPU fails again: the same ladder;
3. and again: the third drain of that GPU in the window is an RMA candidate, never rebooted,
   stays drained, and is on `gpugate nodes --rma`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import paths
import pytest
from e2e import Site, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import FAKE_REBOOT, LocalSlurm, state_flags  # noqa: E402

NODE = "gpu-node-01"
SPARE = "gpu-node-02"  # the drain budget never takes a partition's last node in service
PENDING = {"REBOOT_REQUESTED", "REBOOT_ISSUED"}
GPUGATE = str(Path(sys.executable).parent / "gpugate")
STANDIN = paths.DCGMI_STANDIN


def site_lines(base: Path) -> str:
    """The site file: the ladder on, the /proc stand-in, a level-1 qualification on the
    dcgmi stand-in for hardware drains."""
    return (
        "health:\n  reboot: true\n  heal_after_passes: 1\n"
        f"sources:\n  proc_root: {base / 'proc'}\n"
        "admin:\n  resume_qualify:\n    hardware: 1\n    transient: 0\n"
        "budget:\n  settle_s: 0.5\n"
        "qualify:\n"
        # wait_s: the qualification job's phase, generous: CI runs the roots side by side.
        f"  dcgmi: {base / 'dcgmi'}\n  tests: [dcgm]\n  wait_s: 240\n  time_limit_min: 5\n"
        "  ntasks_per_node: 1\n"  # the test nodes' 2 CPUs: one rank, not one per GPU
    )


def prepare(site: Site) -> None:
    """The dcgmi stand-in (a clean level-1 run) and this boot's id."""
    dcgmi = site.base / "dcgmi"
    # The qualification starts in the health run's detached child, whose environment holds
    # no test variable: the replay directory is in the wrapper.
    dcgmi.write_text(
        f'#!/bin/sh\nGPUGATE_DCGMI_REPLAY={STANDIN / "replay"} exec {STANDIN / "dcgmi"} "$@"\n'
    )
    dcgmi.chmod(0o755)
    boot(site, "boot-1")


def boot(site: Site, boot_id: str) -> None:
    """The node's boot id, as the kernel gives a new one at every boot."""
    path = site.base / "proc/sys/kernel/random"
    path.mkdir(parents=True, exist_ok=True)
    (path / "boot_id").write_text(boot_id + "\n")


@pytest.fixture(scope="module")
def cluster_and_site(slurm_site: SlurmSites):
    site, cluster = slurm_site([NODE, SPARE], config=site_lines, hooks=("prolog",),
                               slurm_user="root", reboot_program=FAKE_REBOOT,
                               prepare=prepare)  # fmt: skip
    yield cluster, site
    stop_children(cluster)


def stop_children(cluster: LocalSlurm) -> None:
    """Kill what the health runs left running for this cluster: a qualification's detached
    child outlives a failed test by up to qualify.wait_s + 600 s, and would act on the next
    cluster started from the same directory."""
    import signal

    from gpugate.child import _DETACHED

    mark = f"SLURM_CONF={cluster.conf_path}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if mark in env and any(v.startswith(f"{_DETACHED}=".encode()) for v in env):
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            continue


def health(cluster: LocalSlurm, site: Site) -> dict:
    """`gpugate health` on NODE as slurmd runs it (root, no job); its event."""
    env = dict(cluster.env(), SLURMD_NODENAME=NODE, GPUGATE_CONFIG=str(site.config))
    res = subprocess.run([GPUGATE, "health"], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return [e for e in site.events() if e["hook"] == "health"][-1]


def ledger(site: Site) -> list[dict]:
    """The node's ledger lines, oldest first."""
    path = site.state / "ledger.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in lines if e["node"] == NODE]


def steps_since(site: Site, count: int) -> list[tuple[str, str]]:
    return [(e["step"], e["outcome"]) for e in ledger(site)[count:]]


def drain_by_prolog(cluster: LocalSlurm, site: Site) -> str:
    """GPU5 falls off the bus: the next job's prolog drains the node. Its reason."""
    site.use_snapshot(NODE, "h100-xid79")
    job = cluster.submit(wrap="true", output="/dev/null", nodelist=NODE, ntasks=1)
    cluster.wait_job(job, "PENDING", reason="launch failed requeued held", timeout=60)
    cluster.run(["scancel", str(job)], check=False)
    node = cluster.wait_node(NODE, lambda n: "DRAIN" in state_flags(n.get("State", "")), 15)
    return node["Reason"]


def reboot_and_qualify(cluster: LocalSlurm, site: Site, boot_id: str) -> None:
    """The idle drained node: the health run asks the reboot (nextstate=DOWN); the node
    reboots and comes back DOWN; the check after it passes and the qualification resumes it."""
    result = health(cluster, site)
    assert "reboot requested (scontrol reboot ASAP nextstate=DOWN)" in result["message"], result
    # Slurm reboots the idle node (fake_reboot restarts slurmd with -b); it comes back DOWN,
    # gpugate's reason kept: no job may start before gpugate's check passed.
    down = cluster.wait_node(
        NODE,
        lambda n: "DOWN" in state_flags(n["State"]) and not PENDING & state_flags(n["State"]),
        timeout=60,
    )
    assert down["Reason"].startswith("gpugate: kernel.xid: reboot: "), down
    boot(site, boot_id)
    site.use_snapshot(NODE, "h100-healthy")  # the GPU is back after the reboot
    after = health(cluster, site)
    assert "level-1 qualification started" in after["message"], after
    assert after["action"] == "keep"
    # The qualification resumes the node into gpugate's reservation for its job, and for
    # everyone once it passed: its ledger line says when it is done.
    count = len(ledger(site))
    deadline = time.monotonic() + 300
    while not any(e["step"] == "resume" for e in ledger(site)[count - 1 :]):
        said = [(e["step"], e["outcome"], e["why"]) for e in ledger(site)[count - 1 :]]
        assert ("qualify", "failed") not in [(step, outcome) for step, outcome, _ in said], said
        assert time.monotonic() < deadline, (said, cluster.node(NODE), cluster.run(
            ["squeue", "-a", "-o", "%i %T %r %R"], check=False).stdout)  # fmt: skip
        time.sleep(1)
    back = cluster.node(NODE)
    assert not {"DRAIN", "DOWN"} & state_flags(back["State"]), back


def test_an_xid79_node_is_repaired_with_proof_and_the_third_failure_is_an_rma(cluster_and_site):
    cluster, site = cluster_and_site
    started = time.monotonic()
    # 1. A job runs on the node when GPU0 falls off the bus; the next job's prolog drains it.
    site.use_snapshot(NODE, "h100-healthy")
    ran = site.base / "a-ran"  # past its prolog: Slurm says RUNNING while the prolog runs
    running = cluster.submit(wrap=f"touch {ran}; sleep 300", output="/dev/null", nodelist=NODE,
                             ntasks=1)  # fmt: skip
    deadline = time.monotonic() + 30
    while not ran.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ran.exists(), cluster.job_state(running)
    reason = drain_by_prolog(cluster, site)
    assert reason.startswith("gpugate: kernel.xid: GPU5 (serial "), reason
    assert cluster.job_state(running)["JobState"] == "RUNNING"
    for _ in range(2):  # job-safe: no reboot while it runs, the wait said once
        waits = health(cluster, site)
        assert "waits for the node's jobs to end" in waits["message"], waits
        assert not PENDING & state_flags(cluster.node(NODE)["State"])
    assert [s for s, _ in steps_since(site, 0)].count("wait") == 1
    cluster.run(["scancel", str(running)])
    cluster.wait_node(NODE, lambda n: not {"ALLOCATED", "MIXED", "COMPLETING"}
                      & state_flags(n["State"]), timeout=30)  # fmt: skip
    reboot_and_qualify(cluster, site, "boot-2")
    first = steps_since(site, 0)
    for step in [("drain", "drained"), ("wait", "waiting"), ("reboot", "requested"),
                 ("recheck", "passed"), ("qualify", "started"), ("qualify", "passed"),
                 ("resume", "resumed")]:  # fmt: skip
        assert step in first, (step, first)

    # 2. The same GPU fails again: the same ladder, to the end.
    count = len(ledger(site))
    drain_by_prolog(cluster, site)
    reboot_and_qualify(cluster, site, "boot-3")
    assert ("resume", "resumed") in steps_since(site, count)

    # 3. And again: its third drain in the window. Replace the part: never rebooted again.
    count = len(ledger(site))
    reboots = (cluster.log_dir / "fake-reboot.log").read_text().count("restarted with -b")
    drain_by_prolog(cluster, site)
    for _ in range(2):
        result = health(cluster, site)
        assert result["message"].startswith("RMA candidate: GPU "), result
    time.sleep(2)
    node = cluster.node(NODE)
    assert "DRAIN" in state_flags(node["State"]) and not PENDING & state_flags(node["State"])
    assert (cluster.log_dir / "fake-reboot.log").read_text().count("restarted with -b") == reboots
    rma = [e for e in ledger(site)[count:] if e["step"] == "rma"]
    assert len(rma) == 1 and rma[0]["gpu"], rma
    listed = subprocess.run([GPUGATE, "nodes", "--rma", "--json"], capture_output=True, text=True,
                            env=dict(cluster.env(), GPUGATE_CONFIG=str(site.config)), timeout=60)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert NODE in listed.stdout and rma[0]["gpu"] in listed.stdout
    assert time.monotonic() - started < 900

"""End to end: a reboot-class fault goes through `scontrol reboot ASAP nextstate=RESUME` (the
site's choice, `health.reboot_nextstate: resume`) and comes back checked by the next prolog.
The default, nextstate=DOWN and gpugate's own check and qualification after the reboot, is
tests/e2e/test_e2e_repair_ladder.py.

A real Slurm (slurmctld, slurmd, munge from Debian) with gpugate as the Prolog and a test
RebootProgram (tests/slurm/fake_reboot.py: the node's slurmd restarts with -b, which reports
a new boot). The GPUs are replayed snapshots: Xid 79 ("fallen off the bus") drains the node;
`request_reboot` hands it to Slurm; Slurm runs the RebootProgram, sees the node boot and
resumes it (nextstate=RESUME); the next job's Prolog vets it on a healthy snapshot.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from e2e import Site, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import FAKE_REBOOT, LocalSlurm, state_flags  # noqa: E402

from gpugate.config import load_config  # noqa: E402
from gpugate.gate import repair  # noqa: E402
from gpugate.slurm.cli import CliBackend  # noqa: E402

NODE = "gpu-node-01"
# A second, healthy node: the drain budget never takes a partition's last node in service.
SPARE = "gpu-node-02"
PENDING = {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"}


@pytest.fixture
def cluster_and_site(slurm_site: SlurmSites):
    """Each test its own cluster: a reboot it asks for must not reach the next test."""
    with slurm_site([NODE, SPARE], config="health:\n  reboot: true\n  reboot_nextstate: resume\n", hooks=("prolog",),
                    slurm_user="root", reboot_program=FAKE_REBOOT) as (site, cluster):  # fmt: skip
        yield cluster, site


def drain_by_prolog(cluster: LocalSlurm, site: Site, snapshot: str) -> str:
    """A job lands on the node replaying `snapshot`; the Prolog drains it. Its reason."""
    site.use_snapshot(NODE, snapshot)
    job = cluster.submit(wrap="true", output=str(site.base / "broken.out"), nodelist=NODE)
    # Cancelled only once Slurm has requeued it held: with the job cancelled while its Prolog
    # still ran, the test's next sbatch was seen to time out (22.05, 2 runs in 6).
    cluster.wait_job(job, "PENDING", reason="launch failed requeued held", timeout=30)
    node = cluster.wait_node(NODE, lambda n: "DRAIN" in n.get("State", ""), timeout=10)
    cluster.run(["scancel", str(job)], check=False)  # not needed any more
    return node["Reason"]


def test_reboot_class_drain_is_rebooted_by_slurm_and_comes_back_checked(cluster_and_site):
    cluster, site = cluster_and_site
    started = time.monotonic()
    reason = drain_by_prolog(cluster, site, "h100-xid79")
    assert reason.startswith("gpugate: kernel.xid: "), reason
    boot_before = cluster.node(NODE).get("BootTime")

    slurm = CliBackend(slurm_conf=str(cluster.conf_path))
    config = load_config(str(site.config))
    done = repair.request_reboot(slurm, NODE, reason, config)
    assert done and "reboot requested" in done, done

    # Slurm shows the reboot pending, with gpugate's reason (same check id).
    pending = cluster.wait_node(NODE, lambda n: PENDING & state_flags(n["State"]), timeout=10)
    assert pending["Reason"].startswith("gpugate: kernel.xid: reboot: "), pending
    # Asked again for the same drain: nothing more goes to Slurm.
    assert repair.request_reboot(slurm, NODE, reason, config) is None

    # The node is repaired while it is down (the snapshot goes healthy), the RebootProgram
    # restarts slurmd with -b, and Slurm resumes it by itself (nextstate=RESUME).
    site.use_snapshot(NODE, "h100-healthy")
    back = cluster.wait_node(
        NODE,
        lambda n: (
            not (PENDING | {"DRAIN"}) & state_flags(n["State"]) and n["State"].startswith("IDLE")
        ),
        timeout=45,
    )
    assert back.get("BootTime") != boot_before, (boot_before, back)
    log = (cluster.log_dir / "fake-reboot.log").read_text()
    assert f"{NODE}: slurmd restarted with -b" in log, log

    # Comes back checked: `gpugate health` (the HealthCheckProgram) passes the node, and the
    # next job's Prolog vets it and the job runs.
    health = run_health(cluster, site)
    assert health["status"] in ("ok", "warn") and not health["drained"], health
    marker = site.base / "ran-after-reboot"
    job = cluster.submit(wrap=f"touch {marker}", output=str(site.base / "after.out"), nodelist=NODE)
    cluster.wait_job(job, "COMPLETED", timeout=30)
    assert marker.exists()
    prolog = [e for e in site.events() if e["hook"] == "prolog" and e.get("job") == str(job)]
    assert prolog and prolog[-1]["action"] in ("allow", "warn"), prolog
    assert not cluster.is_drained(NODE)
    assert time.monotonic() - started < 90


def run_health(cluster: LocalSlurm, site: Site) -> dict:
    """Run `gpugate health` on NODE as slurmd would (root, no job); its event."""
    from gpugate.runner import run

    env = dict(cluster.env(), SLURMD_NODENAME=NODE, GPUGATE_CONFIG=str(site.config))
    res = run([str(Path(sys.executable).parent / "gpugate"), "health"], timeout=30, env=env)
    assert res.returncode == 0, res.describe()
    return [e for e in site.events() if e["hook"] == "health"][-1]


def test_an_admins_drain_is_not_rebooted(cluster_and_site):
    cluster, site = cluster_and_site
    cluster.drain(NODE, "admin: PSU swap ticket 4712")
    slurm = CliBackend(slurm_conf=str(cluster.conf_path))
    config = load_config(str(site.config))
    reason = "gpugate: kernel.xid: GPU0 Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS (reboot the node)"
    assert repair.request_reboot(slurm, NODE, reason, config) is None
    time.sleep(1)
    node = cluster.node(NODE)
    assert node["Reason"].startswith("admin: PSU swap ticket 4712")
    assert not PENDING & state_flags(node["State"])
    assert not os.path.exists(cluster.log_dir / "fake-reboot.log")

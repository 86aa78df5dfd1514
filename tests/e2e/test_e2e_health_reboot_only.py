"""End to end: `HealthCheckNodeState=REBOOT_ONLY` (Slurm 26.05) as the trigger of gpugate's
post-reboot check (issue 45). slurmd runs gpugate's health check once when a node whose reboot
Slurm issued (`scontrol reboot`, here the tests' RebootProgram: slurmd restarts with -b) has
registered again, and never otherwise: not when slurmd starts, not every HealthCheckInterval.
The source behind it: docs/slurm-facts.md, "HealthCheckNodeState=REBOOT_ONLY".
"""

from __future__ import annotations

import re
import time

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import FAKE_REBOOT, LocalSlurm, slurm_version, state_flags  # noqa: E402

if slurm_version() < (26, 5):
    # 22.05 to 25.11 log "Invalid HealthCheckNodeState value REBOOT_ONLY ignored" and run ANY.
    pytest.skip("HealthCheckNodeState=REBOOT_ONLY: Slurm 26.05 and later", allow_module_level=True)

NODE = "gpu-node-01"
SPARE = "gpu-node-02"
HEALTH_INTERVAL = 2  # what a periodic run would come every (REBOOT_ONLY ignores it)
QUIET_S = 5 * HEALTH_INTERVAL  # five periodic runs' time
PENDING = {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT", "DRAIN", "NOT_RESPONDING"}


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    # health_check_report: slurmctld's verdict (SLURM_NODE_IS_HEALTHY) comes with the request.
    return slurm_site([NODE, SPARE], hooks=("health",), slurm_user="root",
                      health_check_interval=HEALTH_INTERVAL,
                      health_check_node_state="REBOOT_ONLY", reboot_program=FAKE_REBOOT,
                      extra_conf="SlurmctldParameters=health_check_report\n")  # fmt: skip


def health_runs(site: Site, node: str) -> list[dict]:
    """The health runs on `node` so far (events.jsonl), oldest first."""
    return [e for e in site.events() if e.get("hook") == "health" and e.get("node") == node]


def test_reboot_only_runs_gpugates_check_after_a_reboot_and_never_periodically(
    site: Site, cluster: LocalSlurm
):
    shown = cluster.run(["scontrol", "show", "config"]).stdout
    assert re.search(r"^HealthCheckNodeState\s+= REBOOT_ONLY$", shown, re.M), shown
    # Neither slurmd's start nor the interval runs it.
    time.sleep(QUIET_S)
    assert health_runs(site, NODE) == [] and health_runs(site, SPARE) == []

    boot_before = cluster.node(NODE).get("BootTime")
    cluster.run(["scontrol", "reboot", "nextstate=RESUME", NODE])
    deadline = time.monotonic() + 60
    while not health_runs(site, NODE) and time.monotonic() < deadline:
        time.sleep(0.2)
    (run,) = health_runs(site, NODE)
    back = cluster.wait_node(NODE, lambda n: not PENDING & state_flags(n["State"]), timeout=30)
    assert back.get("BootTime") != boot_before, (boot_before, back)
    print(f"the post-reboot run: {run}")  # what slurmctld told it (node_is_healthy), seen
    assert run["action"] == "allow", run

    # Once only, and never on the node that did not reboot.
    time.sleep(QUIET_S)
    assert len(health_runs(site, NODE)) == 1 and health_runs(site, SPARE) == []

"""End to end: the health run under a real slurmd's limit, and slurmctld's word on the node
(issue 45): HealthCheckTimeout (Slurm 26.05) read and the run's budget sized below it, the fixed
60 s where the option is absent (22.05, 24.11); SLURM_NODE_IS_HEALTHY (26.05.2+, with
SlurmctldParameters=health_check_report) read and recorded with each run. What gpugate read is
in its events.jsonl line for the run (budget_s, slurm_timeout_s, timeout_from, node_is_healthy).
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm, slurm_version  # noqa: E402

NODE = "gpu-node-01"
HEALTH_INTERVAL = 2
RUNS_TIMEOUT = 40
# Below health.deadline_s (20): the run's budget must come from it (17 - 5 s).
TIMEOUT_S = 17
ADMIN_REASON = "admin: firmware"


def patch_version() -> tuple[int, int, int]:
    """(major, minor, patch) of the local slurmd (`slurmd -V`: "slurm-wlm 26.05.5")."""
    out = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    assert match is not None, out
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


HAS_TIMEOUT = slurm_version() >= (26, 5)  # commit 74979c20b5, in slurm-26-05-0-0rc1
HAS_HINT = patch_version() >= (26, 5, 2)  # 24fc8f8dc9, 791e72e5c8: in slurm-26-05-2-1
# Slurm before 26.05 refuses a slurm.conf naming HealthCheckTimeout (an unknown key). On 26.05
# slurmctld logs "HealthCheckTimeout (17) must be less than HealthCheckInterval (2)" and goes
# on: the short interval keeps the test quick.
EXTRA = ""
if HAS_TIMEOUT:
    EXTRA += f"HealthCheckTimeout={TIMEOUT_S}\n"
if HAS_HINT:
    EXTRA += "SlurmctldParameters=health_check_report\n"


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site([NODE], hooks=("health",), slurm_user="root",
                      health_check_interval=HEALTH_INTERVAL, health_check_node_state="ANY",
                      extra_conf=EXTRA)  # fmt: skip


def health_runs(site: Site) -> list[dict]:
    """The health runs on NODE so far (events.jsonl), oldest first."""
    return [e for e in site.events() if e.get("hook") == "health" and e.get("node") == NODE]


def wait_run(site: Site, what: str, ok) -> dict:
    """The first health run from now on for which `ok(run)` holds."""
    seen = len(health_runs(site))
    deadline = time.monotonic() + RUNS_TIMEOUT
    while time.monotonic() < deadline:
        for run in health_runs(site)[seen:]:
            if ok(run):
                return run
        time.sleep(0.2)
    raise TimeoutError(f"no health run on {NODE} with {what} in {RUNS_TIMEOUT} s: "
                       f"{health_runs(site)[seen:][-3:]}")  # fmt: skip


def test_the_run_sizes_its_budget_below_slurmds_limit(site: Site, cluster: LocalSlurm):
    shown = cluster.run(["scontrol", "show", "config"]).stdout
    run = wait_run(site, "a budget", lambda r: "budget_s" in r)
    limit = (run["timeout_from"], run["slurm_timeout_s"], run["budget_s"])
    if HAS_TIMEOUT:
        assert re.search(rf"^HealthCheckTimeout\s+= {TIMEOUT_S} sec$", shown, re.M), shown
        assert limit == ("HealthCheckTimeout", TIMEOUT_S, TIMEOUT_S - 5.0), run
    else:  # 22.05, 24.11: no such option; the fixed 60 s and health.deadline_s (20)
        assert "HealthCheckTimeout" not in shown
        assert limit == ("fixed", 60, 20.0), run
    assert run["action"] == "allow", run


@pytest.mark.skipif(not HAS_HINT, reason="SLURM_NODE_IS_HEALTHY: Slurm 26.05.2 and later only")
def test_slurmctlds_word_reaches_the_run_and_is_recorded(site: Site, cluster: LocalSlurm):
    run = wait_run(site, "SLURM_NODE_IS_HEALTHY=yes", lambda r: r.get("node_is_healthy") is True)
    assert run["action"] == "allow", run
    cluster.drain(NODE, ADMIN_REASON)
    try:
        run = wait_run(site, "SLURM_NODE_IS_HEALTHY=no",
                       lambda r: r.get("node_is_healthy") is False)  # fmt: skip
        # The read still decides whose drain it is: the admin's, left alone.
        assert (run["action"], run["blocked_by"]) == ("none", "admin"), run
    finally:
        site.restore(cluster, [NODE])


@pytest.mark.skipif(HAS_HINT, reason="Slurm 26.05.2 and later set SLURM_NODE_IS_HEALTHY")
def test_without_the_word_the_run_records_none(site: Site):
    run = wait_run(site, "a budget", lambda r: "budget_s" in r)
    assert run["node_is_healthy"] is None, run

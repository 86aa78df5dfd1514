"""End to end: gpugate as the HealthCheckProgram of a real Slurm (issue 15, Acceptance 1).

slurmctld asks each slurmd to run `slurm_hooks/gpugate-health` (through the test install's
hook.env, as every hook) every HEALTH_INTERVAL seconds on nodes in any state. No job is
submitted except in the last test: the node is idle and only its replayed GPU snapshot changes.
Every assertion on a drain reads Slurm's own view (`scontrol show node`), and the runs are
counted in gpugate's events.jsonl (one line per health run, with the node).
"""

from __future__ import annotations

import json
import time
from typing import Callable

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm, state_flags  # noqa: E402

NODE = "gpu-node-01"
# A second, healthy node: the drain budget never takes a partition's last node in service.
SPARE = "gpu-node-02"
# slurm.conf(5) sets no minimum for HealthCheckInterval (0 disables it); slurmctld's
# background loop asks the nodes once this many seconds have passed.
HEALTH_INTERVAL = 2
# Long enough for a few runs whatever the load on this shared machine.
RUNS_TIMEOUT = 40
ADMIN_REASON = "admin: bios update"


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    # slurmd gives the HealthCheckProgram no SLURM_CONF (Prolog and Epilog get one): its
    # scontrol would look for /etc/slurm/slurm.conf ("Could not establish a configuration
    # source"), so hook.env names the private one (the factory does), as a site with a moved
    # slurm.conf must.
    return slurm_site([NODE, SPARE], config="health:\n  heal_after_passes: 2\n", hooks=("health",),
                      slurm_user="root", health_check_interval=HEALTH_INTERVAL,
                      health_check_node_state="ANY")  # fmt: skip


@pytest.fixture(autouse=True)
def healthy_start(site: Site, cluster: LocalSlurm):
    """Each test starts from healthy, idle, resumed nodes that one health run has seen so."""
    site.restore(cluster, [NODE, SPARE])
    wait_runs(site, NODE, 1)


def health_runs(site: Site, node: str) -> list[dict]:
    """The health runs on `node` so far (events.jsonl), oldest first."""
    return [e for e in site.events() if e.get("hook") == "health" and e.get("node") == node]


def wait_runs(site: Site, node: str, count: int, timeout: float = RUNS_TIMEOUT) -> list[dict]:
    """Wait until Slurm has run the health check `count` more times on `node`; those runs."""
    seen = len(health_runs(site, node))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = health_runs(site, node)
        if len(runs) >= seen + count:
            return runs[seen:]
        time.sleep(0.2)
    raise TimeoutError(
        f"Slurm ran the health check on {node} fewer than {count} times in {timeout} s"
    )


def until(ready: Callable[[], bool], what: str, timeout: float = RUNS_TIMEOUT) -> None:
    """Poll `ready` until it is true; TimeoutError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout} s")
        time.sleep(0.2)


def drained(node: dict) -> bool:
    """Whether `scontrol show node` shows the DRAIN flag."""
    return "DRAIN" in state_flags(node.get("State", ""))


def test_slurm_runs_the_health_program_on_every_node(site: Site, cluster: LocalSlurm):
    for node in (NODE, SPARE):
        run = wait_runs(site, node, 1)[-1]
        assert run["action"] == "allow", run
    assert not drained(cluster.node(NODE)) and not drained(cluster.node(SPARE))


def test_ecc_drains_the_idle_node_and_it_stays_drained_once_healthy(
    site: Site, cluster: LocalSlurm
):
    site.use_snapshot(NODE, "h100-ecc")
    node = cluster.wait_node(NODE, drained, timeout=RUNS_TIMEOUT)
    assert node["Reason"].startswith("gpugate: gpu.ecc: "), node
    # Slurm shows the drain before the run ends (the budget's settle wait) and logs it.
    until(lambda: any(r["drained"] for r in health_runs(site, NODE)), "the draining run's event")
    reason = node["Reason"]

    # Hardware: a healthy snapshot is no repair (same boot, no GPU reset): it stays drained.
    site.use_snapshot(NODE, "h100-healthy")
    runs = wait_runs(site, NODE, 3)
    node = cluster.node(NODE)
    assert drained(node) and node["Reason"] == reason, node
    assert runs[-1]["action"] == "keep" and "hardware fault (gpu.ecc)" in runs[-1]["message"], runs
    assert not drained(cluster.node(SPARE))


def test_hot_gpu_drains_and_gpugate_resumes_it_once_cool(site: Site, cluster: LocalSlurm):
    site.use_snapshot(NODE, "h100-hot")
    node = cluster.wait_node(NODE, drained, timeout=RUNS_TIMEOUT)
    assert node["Reason"].startswith("gpugate: gpu.temperature: "), node
    drained_at = len(health_runs(site, NODE))

    site.use_snapshot(NODE, "h100-healthy")  # cooled down
    cluster.wait_node(
        NODE, lambda n: not drained(n) and n["State"].startswith("IDLE"), timeout=RUNS_TIMEOUT
    )
    # The run resumes the node, then writes its event: the node can be seen idle first.
    until(
        lambda: any(r["action"] == "lift" for r in health_runs(site, NODE)[drained_at:]),
        "the lifting health run's event",
    )
    runs = health_runs(site, NODE)[drained_at:]
    lifts = [i for i, r in enumerate(runs) if r["action"] == "lift"]
    assert lifts and runs[lifts[0]]["resumed"], runs
    # heal_after_passes is 2: a run before the lift counted the first pass and kept the drain.
    # Events are written as runs end, and slurmd may start the next run while the draining one
    # still writes its bookkeeping: the keep can come before the drain's own event.
    before = [r["message"] for r in runs[: lifts[0]] if r["action"] == "keep"]
    assert any("passed 1 run in a row, 2 needed" in m for m in before), runs
    audit = [json.loads(line) for line in (site.state / "audit.jsonl").read_text().splitlines()]
    lift = [a for a in audit if a.get("node") == NODE and a.get("resumed")]
    assert lift and lift[-1]["who"] == "gpugate health", audit
    assert "gpu.temperature" in lift[-1]["why"], lift[-1]


def test_an_admins_drain_is_never_changed(site: Site, cluster: LocalSlurm):
    cluster.drain(NODE, ADMIN_REASON)
    # Slurm appends who set it and when ("admin: bios update [root@2026-12-01T10:27:26]").
    reason = cluster.node(NODE)["Reason"]
    assert reason.startswith(ADMIN_REASON), reason
    for snapshot in ("h100-ecc", "h100-hot", "h100-healthy"):
        site.use_snapshot(NODE, snapshot)
        runs = wait_runs(site, NODE, 2)
        node = cluster.node(NODE)
        assert drained(node) and node["Reason"] == reason, (snapshot, node)
        assert runs[-1]["action"] == "none" and runs[-1]["blocked_by"] == "admin", runs
    audit = site.state / "audit.jsonl"
    lines = audit.read_text().splitlines() if audit.exists() else []
    assert not [line for line in lines if f'"{NODE}"' in line and ADMIN_REASON in line]


# Slurm 22.05.8, untyped GPUs: `scontrol -d show node` says `GresUsed=gpu:8`, no `(IDX:0-7)`
# (only `scontrol -d show job` names the indices): health takes a count without indices as
# "which GPUs is unknown" and skips the job-changed checks on every GPU.
def test_a_hot_gpu_allocated_to_a_running_job_is_not_judged(site: Site, cluster: LocalSlurm):
    job = cluster.submit(
        wrap="sleep 60", output=str(site.base / "busy.out"), nodelist=NODE, gres="gpu:8"
    )
    try:
        cluster.wait_job(job, "RUNNING", timeout=30)
        site.use_snapshot(NODE, "h100-hot")  # every GPU is the job's: GPU6 is hot under load
        runs = wait_runs(site, NODE, 3)
        assert not drained(cluster.node(NODE)), cluster.node(NODE)
        assert runs[-1]["action"] == "allow", runs
    finally:
        # The job ends: the node is idle again and a hot GPU would be judged from now on.
        site.use_snapshot(NODE, "h100-healthy")
        cluster.run(["scancel", str(job)], check=False)
        cluster.wait_job(job, "CANCELLED", timeout=30)


def test_health_check_lines_only_when_asked(tmp_path, site: Site, cluster: LocalSlurm):
    """LocalSlurm writes HealthCheck* lines only when given (the other e2e clusters: none)."""
    plain = LocalSlurm(tmp_path / "plain", nodes=[NODE])
    plain.node_ports = {NODE: 1}
    assert "HealthCheck" not in plain.slurm_conf_text()
    conf = cluster.conf_path.read_text().splitlines()
    assert f"HealthCheckProgram={site.hook('health')}" in conf
    assert f"HealthCheckInterval={HEALTH_INTERVAL}" in conf
    assert "HealthCheckNodeState=ANY" in conf

"""End to end: `sbatch --requeue=expedite` beside gpugate's requeue (Slurm 25.11+, issue 45).

A job that opts in to gpugate's requeue (`--comment gpugate:ckpt=DIR`) and asks Slurm's
expedited requeue (`--requeue=expedite`, `SlurmctldParameters=enable_expedited_requeue`) fails
on its node with a hardware fault (an Xid 79 in that node's replayed kernel log). gpugate's
Epilog drains the node and exits 0, so for Slurm no Epilog failed: left alone, Slurm would
requeue the expedited job *held* ("job requeued in held state", batch_requeue_fini). gpugate's
EpilogSlurmctld requeues it first (the job is then PENDING when Slurm's completion cleanup asks
job_hold_requeue, which leaves a pending job alone), so it is requeued once, not held, off the
bad node, and starts on the healthy one. The source behind it: docs/slurm-facts.md, "Slurm
25.11: START_ONLY health checks and expedited requeue".
"""

from __future__ import annotations

import time

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip
from requeue_e2e import torch_zip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm, slurm_version  # noqa: E402

from gpugate.slurm.hostlist import hostlist_expand  # noqa: E402

if slurm_version() < (25, 11):
    pytest.skip("sbatch --requeue=expedite: Slurm 25.11 and later", allow_module_level=True)

NODES = ["n1", "n2"]


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site(NODES, config="requeue:\n  wait_for_bundles_s: 45\n",
                      templates={"broken-template": "h100-xid79"},
                      scheduler_parameters="nohold_on_prolog_fail",
                      extra_conf="SlurmctldParameters=enable_expedited_requeue\n")  # fmt: skip


@pytest.fixture(autouse=True)
def healthy_nodes(site: Site, cluster: LocalSlurm):
    site.restore(cluster, NODES)


def test_an_expedited_job_gpugate_requeues_is_never_held_and_runs_off_the_bad_node(
    cluster: LocalSlurm, site: Site
):
    ckpt = site.base / "ckpt-expedite"
    ckpt.mkdir()
    torch_zip(ckpt / "ckpt_100.pt")
    log = site.base / "expedite.runs"
    snapshots = site.snapshots
    script = f"""#!/bin/sh
echo "run=${{SLURM_RESTART_COUNT:-0}} node=$SLURMD_NODENAME" >> {log}
if [ -z "$SLURM_RESTART_COUNT" ]; then
    sed "s/gpu-node-01/$SLURMD_NODENAME/" {snapshots}/broken-template.yaml > {snapshots}/.t.$SLURMD_NODENAME
    mv {snapshots}/.t.$SLURMD_NODENAME {snapshots}/$SLURMD_NODENAME.yaml
    sleep 2; exit 1
fi
exit 0
"""
    job = cluster.submit(script=script, output=str(site.base / "expedite.out"),
                         comment=f"gpugate:ckpt={ckpt}", requeue="expedite")  # fmt: skip
    assert cluster.job_state(job).get("ExpeditedRequeue") == "Yes", cluster.job_state(job)
    seen: list[tuple[str, str, str, str]] = []  # (JobState, Reason, Priority, Restarts)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = cluster.job_state(job)
        now = (state["JobState"], state.get("Reason", ""), state.get("Priority", ""),
               state.get("Restarts", ""))  # fmt: skip
        if not seen or seen[-1] != now:
            seen.append(now)
        if state["JobState"] in ("COMPLETED", "FAILED", "CANCELLED") and state["Restarts"] != "0":
            break
        assert "held" not in now[1].lower() and now[2] != "0", seen  # never held
        time.sleep(0.2)
    print(f"states seen: {seen}")
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", seen
    runs = [line.split() for line in log.read_text().splitlines()]
    assert [r[0] for r in runs] == ["run=0", "run=1"], runs
    first, second = runs[0][1].removeprefix("node="), runs[1][1].removeprefix("node=")
    assert first != second, runs
    assert cluster.is_drained(first)
    assert cluster.node(first)["Reason"].startswith("gpugate: kernel.xid: evidence")
    assert set(hostlist_expand(state["ExcNodeList"])) == {first}, state["ExcNodeList"]
    assert "requeued: infrastructure failure" in state["AdminComment"], state["AdminComment"]

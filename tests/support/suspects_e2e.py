"""The red team's tools against suspicion on a real local Slurm: ordinary users' faked jobs.

Shared by tests/e2e/test_e2e_redteam_suspects.py and tests/e2e/test_e2e_redteam_shares.py (imported
once tests/support/e2e.py put tests/slurm on the path):
- faked_failure: a failed 2-node job whose NCCL lines, stamped by the job itself, say one
  node failed ten minutes before the others (what the controller's vote reads);
- xid31_job: a job whose "own process" raises Xid 31 on GPU0 of its node (its snapshot
  swapped in by the job, as the GPUs are replayed), what the epilog's application-Xid rule reads;
- a qualify: section whose dcgmi is the stand-in replaying a clean level-1 run, so a flag's
  qualification runs in gpugate's reservation and passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import paths
import yaml
from e2e import Site, SlurmSite, SlurmSites
from localslurm import LocalSlurm

NODES = ["n1", "n2", "n3"]
SECOND_USER = "gpugate-e2e-b"
GPUGATE = str(Path(sys.executable).parent / "gpugate")
STANDIN = paths.DCGMI_STANDIN
SYSTEM = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1"
TIMEOUT = "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600061 milliseconds before timing out."
XID31 = (
    "[Tue Dec  1 0{h}:{m}0:07 2026] NVRM: Xid (PCI:0000:18:00): 31, pid=PID, name=python3, "
    "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f60_c0000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
)
XID31_JOBS = 6  # templates per node: the k-th job finds k lines, the last one new


def config_extra(base: Path) -> str:
    """The site file's lines: a qualify: section on the dcgmi stand-in, short waits."""
    return (
        "requeue:\n  wait_for_bundles_s: 45\nbudget:\n  settle_s: 0.5\n"
        "qualify:\n"
        f"  dcgmi: {base / 'dcgmi'}\n  tests: [dcgm]\n  wait_s: 90\n  time_limit_min: 5\n"
        # The test nodes say Gres=gpu:8 on 2 CPUs: one rank, not one per GPU.
        "  ntasks_per_node: 1\n"
    )


def suspects_site(
    slurm_site: SlurmSites, extra: str = "", own_state: bool = False, **cluster_options: object
) -> SlurmSite:
    """A site on NODES whose jobs can fake failures and Xids, its Slurm started; `extra`: more
    site-file lines after config_extra's; `own_state`: each node its own state_dir (the
    node-local history); `cluster_options`: slurm_site's."""
    return slurm_site(NODES, config=lambda base: config_extra(base) + extra, nccl_per_node=True,
                      own_state=own_state, prepare=_fakers, **cluster_options)  # fmt: skip


def _fakers(site: Site) -> None:
    """The qualification's dcgmi stand-in, task.sh and the Xid 31 templates, in the site."""
    # The qualification job's dcgmi: the stand-in replaying a clean level-1 run. gpugate starts
    # the qualification from a hook's detached child, whose environment holds no test variable.
    dcgmi = site.base / "dcgmi"
    dcgmi.write_text(
        f'#!/bin/sh\nGPUGATE_DCGMI_REPLAY={STANDIN / "replay"} exec {STANDIN / "dcgmi"} "$@"\n'
    )
    dcgmi.chmod(0o755)
    task = site.base / "task.sh"
    # Each task writes into its own NCCL debug file: the job's FIRST node (n2 unless the job's
    # environment says) "fails first", ten minutes before the others' timeouts. Every stamp is
    # the user's own invention.
    task.write_text(
        f"""#!/bin/sh
log="{site.base}/$SLURMD_NODENAME/nccl/$SLURM_JOB_ID/nccl.$SLURMD_NODENAME.$$.log"
if [ "$SLURMD_NODENAME" = "${{FIRST:-n2}}" ]; then
    echo "$(date -u +%Y-%m-%d) 10:00:00,000 [rank1]: {SYSTEM}" >> "$log"
else
    echo "$(date -u +%Y-%m-%d) 10:10:00,000 [rank$SLURM_NODEID]: {TIMEOUT}" >> "$log"
fi
exit 1
"""
    )
    task.chmod(0o755)
    # Jobs of every user stand for their own process raising Xids by swapping their node's
    # snapshot.
    site.snapshots.chmod(0o777)
    for node in NODES:
        healthy = yaml.safe_load((site.snapshots / f"{node}.yaml").read_text())
        for k in range(1, XID31_JOBS + 1):
            lines = [XID31.format(h=i // 6, m=i % 6) for i in range(k)]
            path = site.snapshots / f"xid31-{node}-{k}.yaml"
            path.write_text(yaml.safe_dump({**healthy, "kernel_log": [*healthy["kernel_log"], *lines]},
                                           width=1000))  # fmt: skip
            path.chmod(0o644)


def gpugate(cluster: LocalSlurm, site: Site, *args: str) -> subprocess.CompletedProcess:
    """`gpugate ARGS` as an admin on the site's config and cluster."""
    env = dict(cluster.env(), GPUGATE_CONFIG=str(site.config))
    return subprocess.run([GPUGATE, *args], env=env, capture_output=True, text=True, timeout=120)


def controller_done(site: Site, job: int, timeout: float = 60) -> None:
    """Wait until the controller epilog (which votes) has run for `job`."""
    site.wait_event("epilog-slurmctld", job, timeout)


def faked_failure(
    cluster: LocalSlurm,
    site: Site,
    user: str | None,
    name: str,
    nodes: str = "n1,n2",
    first: str = "n2",
) -> int:
    """A 2-node job on `nodes` whose logs say `first` failed first; waits for the vote."""
    script = f"#!/bin/sh\nsrun -N2 --ntasks-per-node=1 {site.base / 'task.sh'}\n"
    job = cluster.submit(script=script, nodes=2, nodelist=nodes, user=user, env={"FIRST": first},
                         output=str(site.base / f"{name}.out"))  # fmt: skip
    cluster.wait_job(job, "FAILED", timeout=60)
    controller_done(site, job)
    return job


def qualifications(site: Site) -> list[dict]:
    """The qualification records (qualify.jsonl in the history, here state_dir)."""
    path = site.state / "qualify.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def xid31_job(cluster: LocalSlurm, site: Site, k: int, user: str | None, node: str = "n1") -> int:
    """A job on `node` whose own process raises Xid 31 on GPU0 (the k-th such line in the log)."""
    snaps = site.snapshots
    script = f"""#!/bin/sh
sed "s/pid=PID/pid=$$/" {snaps}/xid31-{node}-{k}.yaml > {snaps}/.t.$$
mv {snaps}/.t.$$ {snaps}/{node}.yaml
exit 1
"""
    job = cluster.submit(script=script, nodelist=node, gres="gpu:8", user=user,
                         output=str(site.base / f"xid-{node}-{k}.out"))  # fmt: skip
    cluster.wait_job(job, "FAILED", timeout=60)
    return job

"""End to end with SlurmUser=slurm, as Debian and RHEL ship Slurm: the controller's requeue.

slurmctld drops to `slurm`, so EpilogSlurmctld runs as `slurm`: it cannot read the evidence
bundles (root's), only the node epilogs' decision records, and writes only to controller_dir,
which this test gives to `slurm` as the package does (/var/lib/gpugate/controller). An ordinary
user's checkpointing job whose node turns into an Xid 79 mid-run is requeued automatically,
off the drained node, and `gpugate report` lists the decision.
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402
from redteam import ATTACKER, as_user  # noqa: E402

from gpugate.slurm.hostlist import hostlist_expand  # noqa: E402

# Exits 0 only when every path named is out of the user's reach (its text never read).
DENIED_ALL = """\
import sys
for path in sys.argv[1:]:
    try:
        open(path).read()
    except PermissionError:
        continue
    sys.exit(f"{path} is readable")
"""

NODES = ["n1", "n2"]
NCCL_TIMEOUT = "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600061 milliseconds before timing out."


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    # SlurmUser=slurm: as the package does, state and evidence root's and passable, controller/
    # slurm's (Site.controller_for).
    return slurm_site(NODES, templates={"broken-template": "h100-xid79"}, slurm_user="slurm",
                      scheduler_parameters="nohold_on_prolog_fail")  # fmt: skip


def job_script(site: Site, log: Path) -> str:
    """Run 0 turns its node's snapshot into an Xid 79 and fails; run 1 succeeds."""
    snaps = site.snapshots
    return f"""#!/bin/sh
echo "run=${{SLURM_RESTART_COUNT:-0}} node=$SLURMD_NODENAME resume=$GPUGATE_RESUME_FROM" >> {log}
if [ -z "$SLURM_RESTART_COUNT" ]; then
    sed "s/gpu-node-01/$SLURMD_NODENAME/" {snaps}/broken-template.yaml > {snaps}/.t.$SLURMD_NODENAME
    mv {snaps}/.t.$SLURMD_NODENAME {snaps}/$SLURMD_NODENAME.yaml
    echo '{NCCL_TIMEOUT}'; sleep 2; exit 1
fi
exit 0
"""


def checkpoint_dir(site: Site) -> Path:
    import zipfile

    ckpt = site.base / "ckpt"
    ckpt.mkdir()
    with zipfile.ZipFile(ckpt / "ckpt_100.pt", "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/version", b"3\n")
    os.chown(ckpt, *pwd.getpwnam("gpugate-e2e")[2:4])
    return ckpt


def controller_decision(site: Site, job: int, timeout: float = 60) -> dict:
    """The controller's first decision for `job` (its event line, in controller_dir)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in site.events() if e["hook"] == "epilog-slurmctld"
                 and e.get("job") == str(job)]  # fmt: skip
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no epilog-slurmctld decision for job {job}: {site.events()}")


def test_an_xid_79_is_requeued_off_the_drained_node_by_a_controller_running_as_slurm(
    cluster: LocalSlurm, site: Site
) -> None:
    ckpt = checkpoint_dir(site)
    log = site.base / "xid.runs"
    job = cluster.submit(script=job_script(site, log), output=str(site.base / "xid.out"),
                         comment=f"gpugate:ckpt={ckpt}")  # fmt: skip
    state = cluster.wait_job(job, "COMPLETED", timeout=120)
    runs = log.read_text().splitlines()
    assert len(runs) == 2 and state["Restarts"] == "1", (runs, state)
    first = runs[0].split()[1].split("=")[1]
    second = runs[1].split()[1].split("=")[1]
    assert first != second and runs[1].endswith(f"resume={ckpt}/ckpt_100.pt"), runs
    assert cluster.is_drained(first)
    assert cluster.node(first)["Reason"].startswith("gpugate: kernel.xid"), cluster.node(first)
    assert first in hostlist_expand(state["ExcNodeList"]), state
    decision = controller_decision(site, job)
    assert decision["requeue"] is True and decision["suspects"] == [first], decision
    # What the user reads: requeued, the excluded node, where it resumes; not what the
    # controller could not see (it cannot look into the user's directory as slurm).
    comment = state.get("AdminComment", "")
    assert "requeued: infrastructure failure" in comment, comment
    assert f"excluded {first}" in comment, comment
    assert f"the newest complete checkpoint in {ckpt}, found by the job's TaskProlog" in comment
    assert "not visible" not in comment and "uid" not in comment, comment
    # The controller wrote as slurm, into its own directory only.
    slurm_uid = pwd.getpwnam("slurm").pw_uid
    assert (site.controller / "events.jsonl").stat().st_uid == slurm_uid
    # The decision record it read: root's and slurm's group's only (issue 41), no log text.
    record = site.evidence / "controller-view" / str(job) / f"{first}-r0.json"
    # Red team (issue 41, R3): another ordinary user reads none of the job's records or digest.
    files = sorted(str(p) for p in record.parent.iterdir())
    assert len(files) >= 2, files  # the record and the digest
    as_user(ATTACKER, DENIED_ALL, *files)
    assert record.stat().st_uid == 0 and oct(record.stat().st_mode & 0o777) == "0o640"
    assert record.stat().st_gid == grp.getgrnam("slurm").gr_gid
    assert "Watchdog" not in record.read_text()
    # `gpugate report` (root) lists the requeue decision from controller_dir.
    page = site.base / "report.html"
    env = dict(os.environ, SLURM_CONF=str(cluster.conf_path))
    gpugate = str(Path(sys.executable).parent / "gpugate")
    proc = subprocess.run([gpugate, "report", "--html", str(page), "--config", str(site.config)],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    html = page.read_text()
    section = html[html.index('<h2 id="requeues">') :]
    assert f">{job}<" in section and "requeued" in section


def test_evidence_slurm_cannot_reach_is_said_plainly_never_no_fault(
    cluster: LocalSlurm, site: Site
) -> None:
    site.restore(cluster, NODES)
    hidden = site.base / "hidden"
    hidden.mkdir(mode=0o700)  # shared storage mounted root-only: slurm cannot pass
    before = site.config.read_text()
    site.config.write_text(before.replace(str(site.evidence), str(hidden / "evidence")))
    try:
        job = cluster.submit(wrap="echo 'CUDA error'; exit 3", output=str(site.base / "h.out"),
                             comment="gpugate:requeue", nodelist="n2")  # fmt: skip
        decision = controller_decision(site, job)
    finally:
        site.config.write_text(before)
    assert decision["requeue"] is False
    assert decision["why"].startswith(f"cannot read {hidden} as slurm: "), decision
    assert "chmod o+x" in decision["why"] and "not an infrastructure" not in decision["why"]
    # The user's admin reads it with `gpugate evidence JOB` (Slurm takes no AdminComment on a
    # finished job; as slurm no note can be written as the user).
    gpugate = str(Path(sys.executable).parent / "gpugate")
    proc = subprocess.run([gpugate, "evidence", str(job), "--config", str(site.config)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"not requeued: cannot read {hidden} as slurm" in proc.stdout, proc.stdout
    assert cluster.job_state(job).get("AdminComment", "") == ""

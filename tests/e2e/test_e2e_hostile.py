"""End to end: a hostile job on a real Slurm, with all four hooks installed as the README says.

An ordinary user's job does everything a user controls to fake a hardware cause or abuse root:
it prints fake `NVRM: Xid 79` lines and a secret in its stdout, raises five bursts of Xid 31
from its own process (through its node's replayed kernel log: the GPUs are the one simulated
part), leaves a 50 GB sparse file in its NCCL debug directory and declares a checkpoint directory
whose name holds a newline followed by `export LD_PRELOAD=...`. None of it may drain the node,
win a requeue, leak the secret to a file other users can read, inject an export, or drop the
job's normal stdout from its evidence bundle.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import zipfile
from pathlib import Path

import pytest
import yaml
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402

NODE = "gpu-node-01"
FAKE_XID79 = (
    "[Tue Dec  1 06:58:01 2026] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus."
)
# What the GPU logs when the job's own process faults: Xid 31 naming the job's pid. Five bursts
# (ten minutes apart, more than app_xid_repeat_max: 3 bursts used to drain the node).
XID31 = (
    "[Tue Dec  1 {hh}:{mm}:07 2026] NVRM: Xid (PCI:0000:18:00): 31, pid=PID, name=python3, "
    "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f60_c0000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
)
EVIL = "export LD_PRELOAD=/tmp/evil.so"
HARDWARE = {"gpu_xid_hardware", "ecc_error", "nvlink_error"}


def xid31_template(site: Site) -> None:
    """The healthy snapshot with five Xid 31 bursts in its kernel log, for jobs to swap in."""
    snapshot = yaml.safe_load((site.snapshots / f"{NODE}.yaml").read_text())
    bursts = [XID31.format(hh=f"{7 + i // 6:02d}", mm=f"{i % 6 * 10:02d}") for i in range(5)]
    snapshot["kernel_log"] = [*snapshot["kernel_log"], *bursts]
    template = site.snapshots / "xid31-template.yaml"
    template.write_text(yaml.safe_dump(snapshot, width=1000))
    template.chmod(0o644)


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site([NODE], config="requeue:\n  wait_for_bundles_s: 45\n", prepare=xid31_template)


def torch_zip(path: Path) -> None:
    """A complete torch.save-like zip."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/data/0", b"\x00" * 4096)
        z.writestr("archive/version", b"3\n")


def hostile_script(site: Site, secret: str) -> str:
    snapshots = site.snapshots
    return f"""#!/bin/sh
echo "step 1 loss 2.31 NORMAL-STDOUT-MARKER"
echo "wandb api key {secret}"
echo "{FAKE_XID79}"
echo "{FAKE_XID79}" >&2
# Five bursts of Xid 31 naming this job's own process appear in the node's kernel log.
sed "s/pid=PID/pid=$$/" {snapshots}/xid31-template.yaml > {snapshots}/.t.$$
mv {snapshots}/.t.$$ {snapshots}/{NODE}.yaml
# A 50 GB sparse file where NCCL writes its debug files.
truncate -s 50G "${{NCCL_DEBUG_FILE%/*}}/nccl.huge.log"
env -0 > {site.base}/hostile.env
echo "step 2 loss 2.30 NORMAL-STDOUT-END"
exit 1
"""


def wait_for_event(site: Site, hook: str, job: int, timeout: float = 60) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in site.events() if e["hook"] == hook and e.get("job") == str(job)]
        if found:
            return found[-1]
        time.sleep(0.5)
    raise AssertionError(f"no {hook} event for job {job}: {site.events()[-3:]}")


def readable_by_others(path: Path) -> bool:
    """Whether a user other than root and the file's owner could read it."""
    st = path.stat()
    return bool(st.st_mode & stat.S_IROTH)


def files_holding(root: Path, needle: bytes, skip_uid: int) -> list[Path]:
    """Regular files below root (not the job user's own) whose content holds needle."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_uid == skip_uid or st.st_size > 64 << 20:
                continue
            if needle in path.read_bytes():
                found.append(path)
    return found


def test_a_hostile_job_drains_nothing_wins_no_requeue_and_leaks_nothing(
    cluster: LocalSlurm, site: Site
):
    secret = f"SECRET-{secrets.token_hex(8)}"
    ckpt = site.base / f"ckpt\n{EVIL}"
    ckpt.mkdir(parents=True)  # ".../ckpt\nexport LD_PRELOAD=" / "tmp" / "evil.so"
    torch_zip(ckpt / "ckpt_100.pt")
    job = cluster.submit(
        script=hostile_script(site, secret),
        output=str(site.base / "hostile.out"),
        comment="gpugate:requeue",
        gres="gpu:8",
        env={"GPUGATE_CKPT_DIR": str(ckpt)},
    )
    controller = wait_for_event(site, "epilog-slurmctld", job, timeout=90)
    epilog = wait_for_event(site, "epilog", job)
    state = cluster.wait_job(job, "FAILED", timeout=60)  # past COMPLETING: no requeue came

    # It ran as the ordinary user, and its fakes reached gpugate (the epilog saw them).
    assert state["UserId"].startswith("gpugate-e2e(")
    assert (site.base / "hostile.out").read_text().count("NVRM: Xid") >= 1
    assert epilog["abnormal"] is True

    # No drain, no requeue: its own output and its own Xids are not hardware evidence.
    assert not cluster.is_drained(NODE), cluster.node(NODE)
    assert epilog["drained"] is False and epilog["hardware_fault"] is False
    assert epilog["category"] not in HARDWARE
    assert controller["requeue"] is False
    assert state["JobState"] == "FAILED" and state["Restarts"] == "0", state
    assert controller["category"] not in HARDWARE

    # The bundle still holds the job's normal stdout (the sparse file did not starve it), and
    # says the Xid 79 line was text the job printed.
    bundle = Path(epilog["bundle"])
    tails = "".join(p.read_text() for p in sorted((bundle / "logs").glob("*.tail")))
    assert "NORMAL-STDOUT-MARKER" in tails and "NORMAL-STDOUT-END" in tails
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["hardware_fault"] is False and summary["category"] not in HARDWARE
    diagnosis = (bundle / "diagnosis.json").read_text()
    assert "job" in diagnosis and "79" in diagnosis

    # No export was injected through the checkpoint directory's name.
    # (`env -0`: the job's own GPUGATE_CKPT_DIR holds a newline, so split at NULs.)
    env = dict(
        item.split("=", 1) for item in (site.base / "hostile.env").read_text().split("\0") if item
    )
    assert "LD_PRELOAD" not in env
    assert env["GPUGATE_CKPT_DIR"] == str(ckpt)  # the job's own variable, as it set it
    assert "GPUGATE_RESUME_FROM" not in env  # refused: a newline in the value
    assert env["GPUGATE_JOB_ID"] == str(job)  # the TaskProlog ran and printed the rest

    # The secret is nowhere another user could read it (the job's own files aside).
    holders = files_holding(site.base, secret.encode(), skip_uid=cluster.job_uid or -1)
    # Root's and the SlurmUser's own files (slurmctld keeps the batch script in its state
    # directory, owned by SlurmUser) are no leak; anything readable by others is.
    import pwd

    system = {0, pwd.getpwnam(cluster.slurm_user).pw_uid}
    leaks = [p for p in holders if readable_by_others(p) or p.stat().st_uid not in system]
    assert not leaks, leaks

    # The job's NCCL directory (with its 50 GB file) is gone once the epilog collected it.
    assert not (site.base / "nccl" / str(job)).exists()

    # The next job's prolog sees the same five Xid 31 bursts in the kernel log: still no drain.
    after = cluster.submit(wrap="true", output="/dev/null", gres="gpu:8")
    cluster.wait_job(after, "COMPLETED", timeout=60)
    assert not cluster.is_drained(NODE)

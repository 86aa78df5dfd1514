"""`make demo`: the whole story of gpugate, on bundled simulated nodes and a real local Slurm.

1. The checklist on a healthy HGX H100 snapshot and on a broken one.
2. With root (Slurm and munge come from Debian's packages, installed if missing): three nodes
   with gpugate as Prolog, Epilog, TaskProlog and EpilogSlurmctld; jobs run as an ordinary
   user. A node with a broken snapshot refuses a job and is drained before it runs; a training
   job that writes checkpoints dies with an NCCL timeout while its node logs an Xid (its kernel
   log, replayed from the snapshot); the epilog's evidence bundle is diagnosed; the job is
   requeued onto a healthy node and resumes from the newest complete checkpoint; then
   `gpugate nodes`, `gpugate report --html`, and what to run next.
Only the GPUs are simulated (one replayed snapshot per node); Slurm is real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:  # tests/slurm is put on sys.path below, at run time
    from collections.abc import Callable

    from gpugate_site import Site
    from localslurm import LocalSlurm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "slurm"))
GPUGATE = str(Path(sys.executable).parent / "gpugate")
SNAPSHOTS = ROOT / "config" / "snapshots"
# gpugate's drain reasons run past sinfo's 20 columns: node and time first, the reason last and
# whole (a field without a width is not cut).
SINFO_R = "%12N %19H %E"
NODES = ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
NCCL_TIMEOUT = (
    "[rank3]:[E1201 10:00:01.1 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for "
    "600061 milliseconds before timing out."
)
# The training job: run 0 saves checkpoints 100 and 200, dies while writing 300 (a half file),
# its node logs an Xid 79 and NCCL times out; a requeued run resumes from GPUGATE_RESUME_FROM.
JOB = """#!/bin/sh
echo "run=${{SLURM_RESTART_COUNT:-0}} node=$SLURMD_NODENAME resume=$GPUGATE_RESUME_FROM" >> {runs}
if [ -z "$SLURM_RESTART_COUNT" ]; then
    for step in 100 200; do echo "step $step: saved"; cp {template} {ckpt}/ckpt_$step.pt; done
    head -c 2000 {template} > {ckpt}/ckpt_300.pt
    sed "s/gpu-node-01/$SLURMD_NODENAME/" {broken} > {snapshots}/.t.$SLURMD_NODENAME
    mv {snapshots}/.t.$SLURMD_NODENAME {snapshots}/$SLURMD_NODENAME.yaml
    echo '{nccl}' >&2
    exit 1
fi
echo "resumed from $GPUGATE_RESUME_FROM"
exit 0
"""


def banner(text: str) -> None:
    """A one-line step header."""
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def outcome(text: str) -> None:
    """The step's result, in one line the test looks for."""
    print(f"-> {text}", flush=True)


def show(argv: list[str], env: dict[str, str] | None = None, user: int | None = None) -> str:
    """Print a command, run it (as `user` if given), print its output; return that output."""
    shown = " ".join(a if " " not in a else repr(a) for a in argv)
    print(f"$ {shown}", flush=True)
    extra = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120, **extra)  # fmt: skip
    print(proc.stdout.rstrip() + f"\n[exit {proc.returncode}]", flush=True)
    return proc.stdout


def checklist_part() -> None:
    """The checklist on two bundled snapshots."""
    banner("1. The preflight checklist on a healthy HGX H100 node (replayed snapshot)")
    show(
        [GPUGATE, "check", "--facts", str(SNAPSHOTS / "h100-healthy.yaml"), "--config", "/dev/null"]
    )
    banner("1b. ... and on a node whose GPU3 has uncorrectable ECC errors")
    show([GPUGATE, "check", "--facts", str(SNAPSHOTS / "h100-ecc.yaml"), "--config", "/dev/null"])


def torch_zip(path: Path) -> None:
    """A torch.save-like zip (archive/data.pkl, data/0, version): what a checkpoint looks like."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/data/0", b"\x00" * 4096)
        z.writestr("archive/version", b"3\n")
    path.chmod(0o644)


def refused_step(cluster: LocalSlurm, site: Site) -> None:
    """A broken node refuses a job before it runs and is drained; the job runs elsewhere."""
    banner("2. A node with a broken GPU (ECC) refuses a job before it starts, and is drained")
    site.use_snapshot(NODES[0], "h100-ecc")
    job = cluster.submit(wrap="echo training on $(hostname)", output=str(site.base / "job-%j.out"),
                         comment="gpugate:requeue")  # fmt: skip
    state = cluster.wait_job(job, "COMPLETED", timeout=60)
    show(["sinfo", "-R", "-o", SINFO_R], cluster.env())
    drained = cluster.is_drained(NODES[0])
    reason = cluster.node(NODES[0]).get("Reason", "")
    outcome(f"{NODES[0]} refused and drained ({reason}); job {job} ran on {state['NodeList']}"
            if drained else f"{NODES[0]} was NOT drained")  # fmt: skip


def training_job(cluster, site) -> tuple[int, Path, Path]:
    """Submit the checkpointing job that dies on its node; return (job, checkpoints, runs log)."""
    ckpt, runs, template = site.base / "ckpt", site.base / "train.runs", site.base / "template.pt"
    ckpt.mkdir()
    os.chown(ckpt, cluster.job_uid, cluster.job_gid)
    torch_zip(template)
    broken = site.base / "xid79-template.yaml"
    broken.write_text((SNAPSHOTS / "h100-xid79.yaml").read_text())
    script = JOB.format(runs=runs, template=template, ckpt=ckpt, broken=broken,
                        snapshots=site.snapshots, nccl=NCCL_TIMEOUT)  # fmt: skip
    job = cluster.submit(script=script, output=str(site.base / "train-%j.out"),
                         open_mode="append", comment=f"gpugate:ckpt={ckpt}")  # fmt: skip
    return job, ckpt, runs


def failure_step(cluster: LocalSlurm, site: Site) -> tuple[int, Path, Path]:
    """The training job dies: NCCL timeout on the job's side, Xid 79 in its node's kernel log."""
    banner("3. A training job dies with an NCCL timeout on a node whose kernel log has an Xid")
    job, ckpt, runs = training_job(cluster, site)
    bundle = wait_for(lambda: first_bundle(site, job), 60, f"job {job}'s evidence bundle")
    summary = json.loads((bundle / "summary.json").read_text())
    print((site.base / f"train-{job}.out").read_text().rstrip())
    outcome(f"job {job} died with nccl_timeout on {summary['node']}, whose kernel log has "
            f"Xid {summary.get('xid')}: category {summary['category']}")  # fmt: skip
    return job, ckpt, runs


def first_bundle(site: Site, job: int) -> Path | None:
    """The epilog's bundle for the job's first run, once its summary is written."""
    found = sorted((site.evidence / str(job)).glob("*-r0/summary.json"))
    return found[0].parent if found else None


def wait_for(get: Callable[[], object], timeout: float, what: str) -> object:
    """Poll `get()` until it returns something; exit the demo with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = get()
        if value:
            return value
        time.sleep(0.3)
    sys.exit(f"demo: no {what} after {timeout:.0f} s")


def evidence_step(cluster: LocalSlurm, site: Site, job: int) -> None:
    """The bundle, its diagnosis, and `gpugate evidence` as an admin and as the job's user."""
    banner(f"4. The epilog's evidence bundle for job {job}, diagnosed")
    bundle = first_bundle(site, job)
    assert bundle is not None
    print(f"{bundle}: {' '.join(sorted(p.name for p in bundle.iterdir()))}")
    logs = sorted(str(p) for p in (bundle / "logs").glob("*.tail"))
    node = bundle.name.rpartition("-r")[0]
    show([GPUGATE, "diagnose", "--job-output", "--node", f"{node}={bundle}/*", *logs,
          "--kernel-log", str(bundle / "kernel.log")])  # fmt: skip
    config = ["--config", str(site.config)]
    show([GPUGATE, "evidence", str(job), *config])
    banner("4b. The same question from the job's own user (bundles hold other users' logs)")
    # The site's own copy of gpugate: the user may not reach this checkout's (a clone in /root).
    show([str(site.gpugate), "evidence", str(job), *config], user=cluster.job_uid)


def requeue_step(cluster: LocalSlurm, job: int, ckpt: Path, runs: Path) -> None:
    """The job is requeued off the suspect node and resumes from the newest complete checkpoint."""
    banner(f"5. Job {job} is requeued onto a healthy node and resumes from its checkpoint")
    state = cluster.wait_job(job, "COMPLETED", timeout=90)
    lines = runs.read_text().splitlines()
    print("\n".join(lines))
    print(f"AdminComment={state.get('AdminComment', '')}")
    print(
        f"checkpoints: {', '.join(sorted(p.name for p in ckpt.iterdir()))} (ckpt_300.pt is cut short)"
    )
    resumed = lines[-1].split("resume=")[-1]
    step = Path(resumed).stem.rpartition("_")[2] or "?"
    outcome(f"job {job} requeued (Restarts={state['Restarts']}) onto {state['NodeList']}, "
            f"resumed from step {step} ({resumed})")  # fmt: skip


def admin_step(cluster: LocalSlurm, site: Site) -> Path:
    """`gpugate nodes` and the HTML report."""
    env = cluster.env()
    config = ["--config", str(site.config)]
    banner("6. gpugate nodes: what is drained, why, and what to do")
    show([GPUGATE, "nodes", *config], env)
    banner("7. gpugate report --html: the page to look at")
    page = site.base / "report.html"
    show([GPUGATE, "report", "--html", str(page), *config], env)
    outcome(f"report written to {page} ({page.stat().st_size if page.exists() else 0} bytes)")
    return page


def next_steps(site: Site, page: Path, job: int) -> None:
    """What to run next, on this demo's files or on a real cluster."""
    banner("What to run next")
    cfg = f"--config {site.config}"
    for line in (
        f"xdg-open {page}                          # the report",
        f"{GPUGATE} evidence {NODES[1]} {cfg}    # a node's bundles",
        f"{GPUGATE} diagnose {site.base}/train-{job}.out   # why a job died, from its log",
        f"{GPUGATE} check                          # this node's checklist",
        f"{GPUGATE} nodes --drained --stats        # on your cluster (SLURM_CONF set)",
        f'sinfo -R -o "{SINFO_R}"                  # drain reasons, uncut',
        "docs/guide/install.md, docs/flow.md     # wiring the hooks into slurm.conf",
    ):
        print(f"  {line}")


def slurm_part() -> None:
    """gpugate inside a real Slurm."""
    from gpugate_site import Site
    from localslurm import LocalSlurm, SlurmUnavailable, ensure_available

    try:
        ensure_available()
    except SlurmUnavailable as exc:
        banner(f"2. Skipped the Slurm part: {exc}")
        return
    base = Path(tempfile.mkdtemp(prefix="gpugate-demo-"))
    site = Site(base, "requeue:\n  wait_for_bundles_s: 45\n")
    for node in NODES:
        site.use_snapshot(node, "h100-healthy")
    print(f"\nA local Slurm (slurmctld, 3 slurmd, munge) with gpugate's hooks, in {base}")
    cluster = LocalSlurm(
        base / "slurm", nodes=NODES, prolog=site.hook("prolog"), epilog=site.hook("epilog"),
        task_prolog=site.hook("task-prolog"), epilog_slurmctld=site.hook("epilog-slurmctld"),
        prolog_epilog_timeout=60, scheduler_parameters="nohold_on_prolog_fail", wrap_hooks=False,
    )  # fmt: skip
    site.use_slurm_conf(cluster.conf_path)
    with cluster:
        cluster.wait_idle()
        refused_step(cluster, site)
        job, ckpt, runs = failure_step(cluster, site)
        evidence_step(cluster, site, job)
        requeue_step(cluster, job, ckpt, runs)
        page = admin_step(cluster, site)
    next_steps(site, page, job)


def main() -> None:
    """Run the demo."""
    started = time.monotonic()
    os.environ.setdefault("GPUGATE_CACHE_DIR", tempfile.mkdtemp(prefix="gpugate-cache-"))
    checklist_part()
    slurm_part()
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()

"""`make demo`: gpugate on bundled simulated nodes.

1. The checklist on a healthy HGX H100 snapshot and on a broken one.
2. With root (it installs Slurm and munge from Debian's packages if needed): a real local
   Slurm with gpugate as Prolog and TaskProlog. A job runs on the healthy node; a GPU fault
   is injected (an Xid 79 in the replayed kernel log); the next job is refused, the node is
   drained with gpugate's reason and the job waits, held, saying why; the node is repaired,
   resumed, and the held job runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "slurm"))
GPUGATE = str(Path(sys.executable).parent / "gpugate")
SNAPSHOTS = ROOT / "config" / "snapshots"
NODE = "gpu-node-01"


def banner(text: str) -> None:
    """A section heading."""
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def show(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Print a command, run it, print its output; return its exit code."""
    shown = " ".join(a if " " not in a else repr(a) for a in argv)
    print(f"$ {shown}", flush=True)
    proc = subprocess.run(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120
    )
    print(proc.stdout.rstrip() + f"\n[exit {proc.returncode}]", flush=True)
    return proc.returncode


def checklist_part() -> None:
    """The checklist on two bundled snapshots."""
    banner("1. The preflight checklist on a healthy HGX H100 node (replayed snapshot)")
    ok = show(
        [GPUGATE, "check", "--facts", str(SNAPSHOTS / "h100-healthy.yaml"), "--config", "/dev/null"]
    )
    banner("   ... and on a node whose GPU3 has uncorrectable ECC errors")
    bad = show(
        [GPUGATE, "check", "--facts", str(SNAPSHOTS / "h100-ecc.yaml"), "--config", "/dev/null"]
    )
    if (ok, bad) != (0, 1):
        sys.exit(f"demo: unexpected exit codes {ok}, {bad}")


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
    site = Site(base)
    site.use_snapshot(NODE, "h100-healthy")
    banner(f"2. A local Slurm (slurmctld, slurmd, munge) with gpugate as Prolog, in {base}")
    with LocalSlurm(
        base / "slurm", nodes=[NODE], prolog=site.hook("prolog"), task_prolog=site.hook("task-prolog"),
        prolog_epilog_timeout=60, wrap_hooks=False,
    ) as cluster:  # fmt: skip
        env = cluster.env()
        out = base / "job-%j.out"
        job = cluster.submit(
            wrap="echo training on $(hostname); env | grep ^NCCL_ | sort", output=str(out)
        )
        cluster.wait_job(job, "COMPLETED", timeout=60)
        banner(f"   job {job} ran on the healthy node; the TaskProlog exported the NCCL settings:")
        print((base / f"job-{job}.out").read_text().rstrip())

        banner("   A GPU falls off the bus: Xid 79 on GPU5 appears in the node's kernel log")
        site.use_snapshot(NODE, "h100-xid79")
        job = cluster.submit(wrap="echo this must not run", output=str(out))
        cluster.wait_job(job, "PENDING", reason="launch failed requeued held", timeout=60)
        show(["sinfo", "-N", "-o", "%N %T %E"], env)
        show(["squeue", "-j", str(job), "-o", "%i %T %r"], env)
        state = cluster.job_state(job)
        print(f"scontrol show job {job}: JobState={state['JobState']} Reason={state['Reason']}")
        print(f"  AdminComment={state.get('AdminComment', '')}")

        banner("   The admin reboots the node (clean snapshot), resumes it and releases the job")
        site.use_snapshot(NODE, "h100-healthy")
        cluster.resume(NODE)
        cluster.release(job)
        started = time.monotonic()
        cluster.wait_job(job, "COMPLETED", timeout=60)
        print(f"job {job} COMPLETED {time.monotonic() - started:.1f} s after release")
        show(["sinfo", "-N", "-o", "%N %T"], env)
    banner(f"Done. Hook runs were logged to {site.state / 'events.jsonl'}")


def main() -> None:
    """Run the demo."""
    os.environ.setdefault("GPUGATE_CACHE_DIR", tempfile.mkdtemp(prefix="gpugate-cache-"))
    checklist_part()
    slurm_part()


if __name__ == "__main__":
    main()

"""Benchmark: the latency gpugate's Prolog adds to every job, on a real local Slurm.

Two one-node clusters, one without a Prolog and one with gpugate's (replaying the healthy
8-GPU H100 snapshot, PrologFlags=Alloc). Each job's first command records the time; the
submit-to-start latency is compared, and the prolog's own duration is read from its events.
Needs root (it installs and starts Slurm like the end-to-end tests).

    python bench/bench_prolog.py [--jobs 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "slurm"))

from gpugate_site import Site  # noqa: E402
from localslurm import LocalSlurm, ensure_available, open_path  # noqa: E402

NODE = "gpu-node-01"


def latencies(cluster: LocalSlurm, base: Path, jobs: int) -> list[float]:
    """Submit `jobs` jobs one after another; seconds from sbatch to the job's first command."""
    out = []
    cluster.wait_job(
        cluster.submit(wrap="true", output="/dev/null"), "COMPLETED", timeout=60
    )  # warm-up
    for i in range(jobs):
        stamp = base / f"start-{i}"
        submitted = time.time()
        job = cluster.submit(wrap=f"date +%s.%N > {stamp}", output="/dev/null")
        cluster.wait_job(job, "COMPLETED", timeout=60)
        out.append(float(stamp.read_text()) - submitted)
    return out


def hook_wall_times(site: Site, cluster: LocalSlurm, runs: int) -> list[float]:
    """Wall time of the whole Prolog process (wrapper, Python start, gather, check), as slurmd runs it."""
    from gpugate.runner import run

    env = dict(cluster.env(), SLURMD_NODENAME=NODE, SLURM_JOB_UID="0", SLURM_JOB_GID="0")
    out = []
    for i in range(runs):
        env["SLURM_JOB_ID"] = str(900000 + i)
        res = run([site.hook("prolog")], timeout=60, env=env)
        if not res.ok:
            sys.exit(f"prolog failed: {res.describe()}")
        out.append(res.duration_s)
    return out


def main() -> None:
    """Run both clusters and print a Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=10)
    args = ap.parse_args()
    ensure_available()
    results: dict[str, list[float]] = {}
    prolog_runs: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        base.chmod(0o1777)  # the jobs (an ordinary user's) write their start stamps here
        open_path(base)
        with LocalSlurm(base / "plain", nodes=[NODE]) as cluster:
            results["no Prolog"] = latencies(cluster, base, args.jobs)
        site = Site(base / "site")
        site.use_snapshot(NODE, "h100-healthy")
        with LocalSlurm(
            base / "gated", nodes=[NODE], prolog=site.hook("prolog"), wrap_hooks=False
        ) as cluster:
            results["gpugate Prolog"] = latencies(cluster, base, args.jobs)
            walls = hook_wall_times(site, cluster, args.jobs)
        for line in (site.state / "events.jsonl").read_text().splitlines():
            event = json.loads(line)
            if event.get("hook") == "prolog" and "duration_s" in event:
                prolog_runs.append(event["duration_s"])
    print(f"{args.jobs} jobs each, one at a time, Slurm's scheduler pass is 1 s\n")
    print("| cluster | median submit-to-start s | min s | max s |")
    print("|---|---:|---:|---:|")
    for name, values in results.items():
        print(
            f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |"
        )
    added = statistics.median(results["gpugate Prolog"]) - statistics.median(results["no Prolog"])
    print(f"\nAdded by gpugate's Prolog (median difference): {added * 1000:.0f} ms")
    print(
        f"The Prolog process as slurmd runs it (wrapper to exit), median: {statistics.median(walls) * 1000:.0f} ms"
    )
    if prolog_runs:
        inner = statistics.median(prolog_runs) * 1000
        print(f"Of which gather, check and baseline inside the process, median: {inner:.0f} ms")


if __name__ == "__main__":
    main()

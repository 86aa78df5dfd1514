"""Benchmark: `gpugate evidence NODE` with 1,000 and with 100,000 jobs' bundles in evidence_dir.

Builds two synthetic evidence roots into bench/out/evidence/ (git-ignored; reused by later
runs): N job directories, each holding one bundle of one of 1,000 nodes, and the node under
test (`gpu-bench`) with the same 10 bundles in both. Every node has its index
(`.index/<node>.jsonl`, the lines write_bundle appends). Bundles are made directly (mkdir and a
small summary.json) rather than through write_bundle, whose fsync per file would make building
100,000 of them take minutes; the index lines are the same.

Then, with the page cache warm, interleaved, median of --runs, it times the whole command
`python -m gpugate evidence gpu-bench --json` against each root, and the same with `--scan`
(what every lookup cost before the index: a listing of every job directory). The target: the
indexed lookup as fast with 100,000 jobs as with 1,000 (ratio near 1), while the scan grows
with the number of jobs.

    python bench/bench_evidence.py [--jobs 1000,100000] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out", "evidence")
NODE = "gpu-bench"
NODES = 1000
MINE = 10  # the node under test's bundles, in both roots


def build(jobs: int) -> str:
    """An evidence root with `jobs` job directories; reused when already complete."""
    root = os.path.join(OUT, f"jobs-{jobs}")
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return root
    os.makedirs(os.path.join(root, ".index"), exist_ok=True)
    index: dict[str, list[str]] = {}
    step = max(1, jobs // MINE)
    for j in range(1, jobs + 1):
        node = NODE if j % step == 0 and len(index.get(NODE, ())) < MINE else f"gpu-{j % NODES:04d}"
        bundle = os.path.join(root, str(j), f"{node}-r0")
        os.makedirs(bundle, exist_ok=True)
        summary = {"job_id": str(j), "node": node, "restart": 0, "category": "nccl_timeout",
                   "collected_at": "2026-11-20T10:00:00Z", "files": ["summary.json"]}  # fmt: skip
        with open(os.path.join(bundle, "summary.json"), "w") as fh:
            json.dump(summary, fh)
        entry = {"path": f"{j}/{node}-r0", "job": str(j), "node": node, "restart": 0,
                 "user": f"u{j % 50}", "at": 1_790_000_000 + j, "bytes": 200}  # fmt: skip
        index.setdefault(node, []).append(json.dumps(entry, separators=(",", ":")) + "\n")
    for node, lines in index.items():
        with open(os.path.join(root, ".index", f"{node}.jsonl"), "w") as fh:
            fh.writelines(lines)
    state = os.path.join(root, ".state")
    os.makedirs(state, exist_ok=True)
    with open(os.path.join(root, ".config.yaml"), "w") as fh:
        fh.write(f"state_dir: {state}\nevidence_dir: {root}\n")
    open(done, "w").close()
    return root


def run_once(root: str, scan: bool) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one `gpugate evidence` run."""
    argv = [sys.executable, "-m", "gpugate", "evidence", NODE, "--json"] + (
        ["--scan"] if scan else []
    )
    env = dict(os.environ, GPUGATE_CONFIG=os.path.join(root, ".config.yaml"))
    before = os.times()
    start = time.monotonic()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - start
    after = os.times()
    if res.returncode != 0:
        raise SystemExit(f"gpugate evidence failed ({res.returncode}): {res.stderr.strip()}")
    found = len(json.loads(res.stdout)["bundles"])
    if found != MINE:
        raise SystemExit(f"expected {MINE} bundles of {NODE}, got {found}")
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return wall, cpu


def main() -> int:
    """Build the roots, time the lookups, print a Markdown table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", default="1000,100000", help="comma-separated job counts")
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    counts = [int(x) for x in args.jobs.split(",")]
    roots = {}
    for n in counts:
        t = time.monotonic()
        roots[n] = build(n)
        print(
            f"# root with {n} jobs: {roots[n]} ({time.monotonic() - t:.1f} s to build)",
            file=sys.stderr,
        )
    times: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    for key in [(n, s) for n in counts for s in (False, True)]:
        run_once(roots[key[0]], key[1])  # warm the page cache
    for _ in range(args.runs):
        for n in counts:
            for scan in (False, True):
                times.setdefault((n, scan), []).append(run_once(roots[n], scan))
    print("| jobs in evidence_dir | lookup | wall s (median) | cpu s (median) |")
    print("|---|---|---|---|")
    med = {}
    for (n, scan), got in times.items():
        wall = statistics.median(w for w, _ in got)
        cpu = statistics.median(c for _, c in got)
        med[(n, scan)] = wall
        print(f"| {n:,} | {'scan (--scan)' if scan else 'index'} | {wall:.3f} | {cpu:.3f} |")
    lo, hi = min(counts), max(counts)
    print(f"\nindex: {hi:,} jobs / {lo:,} jobs = {med[(hi, False)] / med[(lo, False)]:.2f}x; "
          f"scan: {med[(hi, True)] / med[(lo, True)]:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

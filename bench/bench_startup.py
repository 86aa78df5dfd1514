"""Benchmark: the installed package's `gpugate check --facts` against the bare interpreter.

The prolog runs before every job and the TaskProlog before every task, so what users pay is
the start-up of the packaged command: `/usr/bin/gpugate` is a launcher run by the system
python3 with `-Es` over the bundled lib/ (bytecode compiled by the package's postinst). An
editable install in a virtualenv hides part of the cost (its import finder slows the bare
interpreter too), so this measures the package as installed, against
`/usr/bin/python3 -Es -c pass`, pair by pair (A B A B ...): the ratio of each pair is taken, and
the median of those ratios is the figure to quote (the machine's speed drifts between pairs,
hardly within one). Whole processes: wall time around fork/exec/wait, CPU time from wait4.

    python bench/bench_startup.py --deb dist/gpugate_*_all.deb   # unpacked into a temp dir
    python bench/bench_startup.py --gpugate /usr/bin/gpugate      # an installed package
    python bench/bench_startup.py --deb ... --pairs 40 --cold     # also with the cache off

The parsed-YAML cache is a temporary directory (never /var/cache/gpugate): "warm" is the normal
case (filled by a first run), "cold" turns it off, so every run imports PyYAML and parses.
"""

from __future__ import annotations

import argparse
import glob
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAPSHOT = os.path.join(ROOT, "config", "snapshots", "h100-healthy.yaml")
PYTHON = "/usr/bin/python3"


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, cpu s) of one whole process; its output is read and dropped, its exit checked."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    # Output read through pipes, as slurmd or a terminal would, not sent to /dev/null.
    proc = subprocess.run(argv, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{argv}: exit {proc.returncode}: {proc.stderr.decode()[-500:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def unpack(deb: str, into: str) -> str:
    """Unpack a .deb under `into`, compile its lib as the postinst does; the launcher's path."""
    subprocess.run(["dpkg-deb", "-x", deb, into], check=True)
    lib = os.path.join(into, "opt", "gpugate", "lib")
    subprocess.run([PYTHON, "-s", "-E", "-m", "compileall", "-q", lib], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return os.path.join(into, "opt", "gpugate", "bin", "gpugate")


def pairs(a: list[str], b: list[str], env: dict[str, str], n: int) -> dict[str, float]:
    """Medians of A, B and of the per-pair ratios A/B (wall and cpu), after one warm-up each."""
    run_once(a, env), run_once(b, env)
    rows = []
    for _ in range(n):
        rows.append((run_once(a, env), run_once(b, env)))
    med = statistics.median
    return {
        "a_wall": med(ra[0] for ra, _ in rows),
        "b_wall": med(rb[0] for _, rb in rows),
        "a_cpu": med(ra[1] for ra, _ in rows),
        "b_cpu": med(rb[1] for _, rb in rows),
        "ratio_wall": med(ra[0] / rb[0] for ra, rb in rows),
        "ratio_cpu": med(ra[1] / rb[1] for ra, rb in rows if rb[1] > 0),
        "ratio_wall_min": min(ra[0] / rb[0] for ra, rb in rows),
        "ratio_wall_max": max(ra[0] / rb[0] for ra, rb in rows),
    }


def main() -> None:
    """Run the benchmark and print a Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--deb", help="a built .deb (dist/gpugate_*_all.deb), unpacked to a temp dir"
    )
    where.add_argument("--gpugate", help="an installed launcher, e.g. /usr/bin/gpugate")
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--cold", action="store_true", help="also measure with the cache off")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpugate-bench-") as tmp:
        if args.deb:
            (deb,) = glob.glob(args.deb) or [args.deb]
            launcher = unpack(deb, os.path.join(tmp, "root"))
        else:
            launcher = args.gpugate
        check = [launcher, "check", "--facts", SNAPSHOT, "--config", "/dev/null"]
        bare = [PYTHON, "-Es", "-c", "pass"]
        env = {"PATH": "/usr/bin:/bin", "GPUGATE_CACHE_DIR": os.path.join(tmp, "cache")}
        runs = {"warm": pairs(check, bare, env, args.pairs)}
        if args.cold:
            runs["cold"] = pairs(check, bare, dict(env, GPUGATE_CACHE_DIR=""), args.pairs)
    version = subprocess.run([PYTHON, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    print(f"{args.pairs} pairs, interleaved; {os.cpu_count()} CPUs; {PYTHON} {version}\n")
    print("| `gpugate check --facts h100-healthy.yaml` | ms | `python3 -Es -c pass` ms "
          "| ratio, wall (min-max) | ratio, cpu |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for name, r in runs.items():
        print(f"| {name} cache | {r['a_wall'] * 1000:.1f} | {r['b_wall'] * 1000:.1f} "
              f"| {r['ratio_wall']:.2f} ({r['ratio_wall_min']:.2f}-{r['ratio_wall_max']:.2f}) "
              f"| {r['ratio_cpu']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()

"""Benchmark: `gpugate check --facts <healthy 8-GPU snapshot> --json` against `python3 -c pass`.

The prolog runs before every job on every node, so its fixed cost matters. Both commands run
interleaved in the same run, same interpreter, and the medians are compared (target: ratio at
most 4). "warm" is the normal case (the parsed-YAML cache is filled after the first run);
"cold" disables that cache, so every run pays for importing PyYAML and parsing.

    python bench/bench_check.py [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAPSHOT = os.path.join(ROOT, "config", "snapshots", "h100-healthy.yaml")


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall time of one run in seconds (output discarded, exit code checked)."""
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{argv}: exit {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return took


def main() -> None:
    """Run the benchmark and print a Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    gpugate = os.path.join(os.path.dirname(sys.executable), "gpugate")
    check = [gpugate, "check", "--facts", SNAPSHOT, "--config", "/dev/null", "--json"]
    base = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory() as cache:
        warm = dict(os.environ, GPUGATE_CACHE_DIR=cache)
        cold = dict(os.environ, GPUGATE_CACHE_DIR="")
        timed(check, warm)  # fill the cache
        rows: dict[str, list[float]] = {
            "python3 -c pass": [],
            "check (warm)": [],
            "check (cold)": [],
        }
        for _ in range(args.runs):
            rows["python3 -c pass"].append(timed(base, warm))
            rows["check (warm)"].append(timed(check, warm))
            rows["check (cold)"].append(timed(check, cold))
    baseline = statistics.median(rows["python3 -c pass"])
    print(
        f"{args.runs} runs each, interleaved; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}\n"
    )
    print("| command | median ms | ratio to `python3 -c pass` |")
    print("|---|---:|---:|")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"| {name} | {med * 1000:.1f} | {med / baseline:.2f} |")


if __name__ == "__main__":
    main()

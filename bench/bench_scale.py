"""Benchmark: what gpugate costs one node, and Slurm, as the job and the cluster grow (issue 32).

Four parts, each a table for docs/performance.md:
1. `prolog`: one node's Prolog in a job of 1, 64 and 1,000 nodes (the packaged hook wrapper
   and launcher, a replayed healthy H100 snapshot, SLURM_JOB_NODELIST of that size, the peer
   probe at its defaults): the hook's wall time (median of --runs), and from one run under
   strace the Slurm commands it ran, the `ping`s it started and the files it opened. The job's
   node names do not resolve here, so each ping ends at once: part 2 times real pings.
2. `peers` (bench/scale_peers.py): whom each node probes, per node and per job, and one node's
   probe of its peers with real `ping` to localhost.
3. `controller` (bench/scale_controller.py): EpilogSlurmctld's read of an N-node job's
   decision records: time, files opened, bytes.
4. `storm` (bench/scale_storm.py, root: a real slurmctld): every node of a 64- and a 1,000-node
   partition fails its prolog at once; Slurm calls per hook, slurmctld's RPCs and latency, the
   drains left standing, before the shared view and after.

    python bench/bench_scale.py [--parts prolog peers controller storm] [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "slurm"))

SIZES = (1, 64, 1000)
SLURM_COMMANDS = ("scontrol", "sinfo", "squeue", "sacct", "sbatch")
_EXEC = re.compile(r'execve\("([^"]+)"')
_OPEN = re.compile(r'openat\([^,]+, "([^"]+)", [^)]*\) = \d+')


def prolog_env(site: Any, nodes: int, job: int) -> dict[str, str]:
    """A Prolog's environment on the first node of an N-node job."""
    names = f"sim[0001-{nodes:04d}]" if nodes > 1 else "sim0001"
    return dict(os.environ, SLURMD_NODENAME="sim0001", SLURM_JOB_ID=str(job),
                SLURM_JOB_UID="0", SLURM_JOB_GID="0", SLURM_JOB_USER="root",
                SLURM_JOB_NODELIST=names, SLURM_JOB_NUM_NODES=str(nodes),
                SLURM_NODELIST=names)  # fmt: skip


def prolog_part(runs: int) -> list[dict[str, Any]]:
    """Part 1: one node's prolog at each job size."""
    from gpugate_site import Site

    rows = []
    with tempfile.TemporaryDirectory(prefix="gpugate-scale-") as tmp:
        site = Site(Path(tmp))
        site.use_snapshot("sim0001", "h100-healthy")
        hook = site.hook("prolog")
        for n, nodes in enumerate(SIZES):
            times = []
            for i in range(runs):
                env = prolog_env(site, nodes, 700000 + 1000 * n + i)
                began = time.monotonic()
                done = subprocess.run([hook], env=env, capture_output=True, timeout=120)
                times.append(time.monotonic() - began)
                if done.returncode:
                    sys.exit(f"prolog failed ({nodes} nodes): {done.stderr.decode()[-500:]}")
            trace = Path(tmp) / f"strace-{nodes}"
            env = prolog_env(site, nodes, 790000 + n)
            subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve,openat", "-o", str(trace),
                            hook], env=env, capture_output=True, timeout=120, check=True)  # fmt: skip
            text = trace.read_text()
            execs = [os.path.basename(p) for p in _EXEC.findall(text)]
            rows.append({
                "job nodes": nodes,
                "prolog ms (median)": round(1000 * statistics.median(times), 1),
                "Slurm commands": sum(execs.count(c) for c in SLURM_COMMANDS),
                "pings": execs.count("ping"),
                "files opened": len(_OPEN.findall(text)),
            })  # fmt: skip
    return rows


def peers_part() -> list[dict[str, Any]]:
    """Part 2: bench/scale_peers.py."""
    from scale_peers import peer_scale, probe_wall_s

    rows = [dict(peer_scale(n), nodes=n) for n in SIZES]
    walls = probe_wall_s(6, 5)
    rows.append({"probe of 6 peers, s (median of 5)": round(statistics.median(walls), 3)})
    return rows


def controller_part() -> list[dict[str, Any]]:
    """Part 3: bench/scale_controller.py."""
    from scale_controller import controller_scale

    return [dict(controller_scale(n), nodes=n) for n in SIZES]


def storm_part() -> list[dict[str, Any]]:
    """Part 4: bench/scale_storm.py (root)."""
    from scale_storm import run

    return list(run([64, 1000], ["before", "after"]))


PARTS = {"prolog": prolog_part, "peers": peers_part, "controller": controller_part,
         "storm": storm_part}  # fmt: skip


def main() -> int:
    """Run the parts asked for; print each row as a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=sorted(PARTS), default=list(PARTS))
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    for part in args.parts:
        rows = prolog_part(args.runs) if part == "prolog" else PARTS[part]()  # type: ignore[operator]
        for row in rows:
            print(json.dumps({"part": part, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: what one Slurm call costs on each backend, against `scontrol` run by hand.

Starts a private 2-node Slurm (tests/slurm/localslurm.py, root, Debian's Slurm), runs one job,
then in a fresh child per backend times each read (`job`, `node`, `nodes`) `--calls` times and
prints the median and the 90th percentile per call. The yardstick is the command an admin's
script runs, `scontrol -o show job ID`, timed as a whole process. It also times what
`slurm.backend: auto` pays to choose (pyslurm's version, `scontrol --version`, a subprocess
`import pyslurm`), once per hook run that talks to Slurm.

    python bench/bench_slurm_backends.py [--calls 50]     (needs pyslurm: .ci/pyslurm .venv)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "slurm"))

from localslurm import LocalSlurm  # noqa: E402

# In the child: time each read `calls` times on one backend; JSON {call: [seconds, ...]}.
CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from gpugate.slurm.choose import backend, select_backend
kind, job, calls = sys.argv[2], sys.argv[3], int(sys.argv[4])
started = time.perf_counter()
select_backend("auto")
choose = time.perf_counter() - started
slurm = backend(kind)
slurm.nodes()  # the first call loads the library (pyslurm) or warms the page cache
out = {"auto: choose": [choose]}
for name, fn in (("job", lambda: slurm.job(job)), ("node", lambda: slurm.node("n1")),
                 ("nodes", slurm.nodes)):
    times = []
    for _ in range(calls):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    out[name] = times
json.dump(out, sys.stdout)
"""


def child(cluster: LocalSlurm, kind: str, job: int, calls: int) -> dict[str, list[float]]:
    """The child's timings for backend `kind`."""
    argv = [sys.executable, "-c", CHILD, str(ROOT), kind, str(job), str(calls)]
    done = subprocess.run(argv, env={**cluster.env(), "GPUGATE_SLURM_BACKEND": ""},
                          capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    return json.loads(done.stdout)


def scontrol_times(cluster: LocalSlurm, job: int, calls: int) -> list[float]:
    """`scontrol -o show job ID` as a whole process, `calls` times."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        cluster.run(["scontrol", "-o", "show", "job", str(job)])
        times.append(time.perf_counter() - started)
    return times


def ms(times: list[float]) -> str:
    """Median and 90th percentile in milliseconds."""
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"{statistics.median(ordered) * 1000:.1f} / {p90 * 1000:.1f}"


def main() -> None:
    """Run the benchmark; print a Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-backends-") as tmp:
        os.chmod(tmp, 0o755)
        with LocalSlurm(Path(tmp) / "slurm", nodes=["n1", "n2"], slurm_user="slurm") as cluster:
            job = cluster.submit(wrap="sleep 600", ntasks=1, nodelist="n1")
            cluster.wait_job(job, "RUNNING")
            rows = {kind: child(cluster, kind, job, args.calls) for kind in ("cli", "pyslurm")}
            yardstick = scontrol_times(cluster, job, args.calls)
    print(f"| call ({args.calls} each, ms: median / p90) | cli | pyslurm |")
    print("|---|---|---|")
    for name in ("job", "node", "nodes"):
        print(f"| `{name}` | {ms(rows['cli'][name])} | {ms(rows['pyslurm'][name])} |")
    print(f"| `scontrol -o show job` by hand (the yardstick) | {ms(yardstick)} | |")
    print(f"| `auto` choosing (once per process) | {ms(rows['cli']['auto: choose'])} | |")


if __name__ == "__main__":
    main()

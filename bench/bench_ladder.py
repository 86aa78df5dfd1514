"""Benchmark: what the repair ladder adds to a health run on a drained node, with a big history.

`gpugate health` climbs the ladder (gpugate/gate/ladder.py) on every run of a node gpugate
drained: it reads the drain history (the drain's GPU, the same part's drains in the window)
and the ledger's tail (to say each step once). This times `ladder.climb` in-process on a state
directory holding a full drain history (`admin.history_max_entries`, 20,000 drains) and a
ledger of `--ledger-mib` MiB, against the same call on empty stores, and against `json.load`
of the drain history (the outside yardstick: reading the file once). The node is busy, so the
climb ends at the job-safe wait (it writes one ledger line once, then reads only). No Slurm
call is made: the node's record is given, as the health run passes it.

    python bench/bench_ladder.py [--runs 15] [--ledger-mib 32]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpugate.checks.findings import Finding  # noqa: E402
from gpugate.config import load_config  # noqa: E402
from gpugate.gate import ladder  # noqa: E402
from gpugate.slurm.records import NodeInfo  # noqa: E402
from gpugate.store.healing import Healing  # noqa: E402

NODE = "gpu-00-001"
REASON = "gpugate: kernel.xid: GPU0 (serial 1652123000000, 0000:18:00) Xid 79 fallen off the bus"


def fill(state: str, drains: int, ledger_mib: int, now: float) -> None:
    """A drain history of `drains` entries over 30 days and a ledger of `ledger_mib` MiB."""
    with open(os.path.join(state, "drains.jsonl"), "w") as fh:
        for i in range(drains):
            node = f"gpu-{i % 100:02d}-{i % 997:03d}"
            fh.write(json.dumps({"node": node, "when": now - 86400 * 30 * (1 - i / drains),
                                 "check": "kernel.xid", "reason": REASON, "hook": "prolog",
                                 "gpu": f"16521230{i % 5000:05d}"}) + "\n")  # fmt: skip
    line = json.dumps({"node": "gpu-99-999", "when": now - 86400, "step": "wait",
                       "who": "gpugate health", "why": "x" * 200, "outcome": "waiting"}) + "\n"  # fmt: skip
    with open(os.path.join(state, "ledger.jsonl"), "w") as fh:
        fh.write(line * (ledger_mib * (1 << 20) // len(line)))
    for name in ("drains.jsonl", "ledger.jsonl"):
        os.chmod(os.path.join(state, name), 0o640)


def parse(path: str) -> list[object]:
    """The yardstick: every line of the file through json.loads."""
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def timed(fn, runs: int) -> float:
    """The median wall time of `fn()` over `runs`, in ms."""
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return statistics.median(out)


def main() -> int:
    """Print the Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--ledger-mib", type=int, default=32)
    args = ap.parse_args()
    now = time.time()
    info = NodeInfo(name=NODE, state="MIXED", flags=("DRAIN",), reason=REASON,
                    reason_time=int(now - 60))  # fmt: skip
    entry = Healing(node=NODE, check="kernel.xid", fault="hardware", since=now - 60)
    fail = [Finding(check="kernel.xid", status="fail", message=REASON[9:], gpu=0)]
    rows = []
    for label, drains, mib in (("empty stores", 0, 0),
                               (f"20,000 drains, {args.ledger_mib} MiB ledger", 20000,
                                args.ledger_mib)):  # fmt: skip
        with tempfile.TemporaryDirectory() as state:
            os.chmod(state, 0o700)
            fill(state, drains, mib, now)
            site = os.path.join(state, "site.yaml")
            with open(site, "w") as fh:
                fh.write(f"state_dir: {state}\nhealth:\n  reboot: true\n")
            config = load_config(site)
            climb = functools.partial(ladder.climb, config, None, info, entry, fail, "boot-1")
            climb()  # the one WAIT line, then reads only
            ms = timed(climb, args.runs)
            path = os.path.join(state, "drains.jsonl")
            yard = timed(functools.partial(parse, path), args.runs)
            rows.append((label, ms, yard))
    print("| stores | ladder.climb, median ms | json.loads of drains.jsonl, median ms |")
    print("|---|---:|---:|")
    for label, ms, yard in rows:
        print(f"| {label} | {ms:.1f} | {yard:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

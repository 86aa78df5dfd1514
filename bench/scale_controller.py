"""Benchmark: EpilogSlurmctld's read of a job's decision records at 1, 64 and 1,000 nodes.

Builds an N-node job's records in a temporary evidence_dir through the node epilog's own
writer (controller_view.write_record, which keeps the job's digest under its lock): every node
done, each with a flight-recorder digest of 8 ranks (about 170 KiB, a failed NCCL job's usual
record), a few nodes that failed first and one hardware fault near the end. Then, page cache
warm, median of --runs, it times the controller's read (controller_view.read_records with the
packaged requeue.max_records) and counts the files it opened and the bytes it read; beside it,
the same read of every record (max_records unset: what a job of any size cost before the
digest). It also says what one node epilog's write costs when the digest already names the
N-1 others (the digest's read-modify-write under the lock: the node side grows with the job).

    python bench/scale_controller.py [--nodes 1,64,1000] [--runs 5] [--fr-ranks 8]

bench/bench_scale.py calls controller_scale(nodes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpugate.store import controller_view as V  # noqa: E402

JOB = "4242"
MAX_RECORDS = 64  # the packaged requeue.max_records (config/gpugate.yaml)


def _at(second: int) -> str:
    return f"2026-11-29T10:{second // 60 % 60:02d}:{second % 60:02d}Z"


def _summary(i: int, n: int) -> dict[str, object]:
    """Node i of n: one hardware fault at 90 % of the job, three that failed first, timeouts."""
    node = f"n{i:04d}"
    if i == max(1, n * 9 // 10):
        return {"node": node, "hardware_fault": True, "category": "gpu_xid_hardware",
                "category_trusted": True, "first_hardware_error_at": _at(500),
                "first_failure_at": _at(500)}  # fmt: skip
    first = {max(1, n // 3): 100, max(1, n // 2): 110, max(1, n * 2 // 3): 120}
    return {"node": node, "category": "nccl_timeout", "confidence": "medium",
            "first_failure_at": _at(first.get(i, 600 + i % 50))}  # fmt: skip


def _flightrec(ranks: int) -> dict[str, object] | None:
    if ranks <= 0:
        return None
    entries = [{"seq": s, "pg_id": 0, "op": "allreduce", "sizes": [[4096, 1024]],
                "state": "completed", "is_p2p": False, "retired": True} for s in range(256)]  # fmt: skip
    return {"records": [{"rank": r, "node": None, "pgs": {}, "entries": entries}
                        for r in range(ranks)]}  # fmt: skip


def build(evidence_dir: str, nodes: int, fr_ranks: int = 8) -> tuple[tuple[str, ...], float]:
    """Every node's done record (and the digest); (node names, seconds of the last write)."""
    names = tuple(f"n{i:04d}" for i in range(1, nodes + 1))
    fr = _flightrec(fr_ranks)
    last = 0.0
    for i, node in enumerate(names, start=1):
        start = time.perf_counter()
        V.write_record(evidence_dir, JOB, node, 0, V.done(_summary(i, nodes), fr))
        last = time.perf_counter() - start
    return names, last


def _read(evidence_dir: str, names: tuple[str, ...], max_records: int | None) -> tuple:
    # Every record (max_records None) is read as before the digest: no byte budget either.
    budget = V.READ_BUDGET if max_records else 1 << 40
    start = time.perf_counter()
    summaries, _, _, account = V.read_records(
        evidence_dir, JOB, names, 0, 0, 0, max_records=max_records, budget=budget
    )
    return time.perf_counter() - start, summaries, account


def controller_scale(nodes: int, runs: int = 5, fr_ranks: int = 8) -> dict[str, object]:
    """One N-node job's controller read: wall (median), files opened, bytes read; and the
    same for a read of every record, and one node's write with the digest N-1 long."""
    tmp = tempfile.mkdtemp(prefix="gpugate-scale-ctl-")
    try:
        names, write_s = build(tmp, nodes, fr_ranks)
        _read(tmp, names, MAX_RECORDS)  # page cache warm
        walls, every = [], []
        for _ in range(runs):  # interleaved: the machine's noise hits both alike
            wall, summaries, account = _read(tmp, names, MAX_RECORDS)
            walls.append(wall)
            all_wall, _, all_account = _read(tmp, names, None)
            every.append(all_wall)
        hardware = [s.node for s in summaries if s.hardware_fault]
        return {
            "nodes": nodes,
            "read": account.read,
            "not_read": len(account.not_read),
            "opens": account.opens,
            "bytes": account.bytes_read,
            "wall_s": statistics.median(walls),
            "hardware_found": hardware == [_summary_node(nodes)],
            "all_opens": all_account.opens,
            "all_bytes": all_account.bytes_read,
            "all_wall_s": statistics.median(every),
            "digest_bytes": os.path.getsize(V.digest_path(tmp, JOB, 0)),
            "write_s": write_s,
            "said": account.describe(),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _summary_node(n: int) -> str:
    return f"n{max(1, n * 9 // 10):04d}"


def main(argv: list[str] | None = None) -> int:
    """Print the table for each node count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,64,1000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fr-ranks", type=int, default=8, help="flight-recorder ranks a node")
    args = parser.parse_args(argv)
    head = (f"{'nodes':>6} {'read':>5} {'opens':>6} {'MiB read':>9} {'ms':>7} "
            f"{'every: opens':>13} {'MiB':>7} {'ms':>7} {'digest KiB':>11} {'write ms':>9}")  # fmt: skip
    print(head)
    for n in (int(x) for x in args.nodes.split(",")):
        r = controller_scale(n, args.runs, args.fr_ranks)
        print(f"{n:>6} {r['read']:>5} {r['opens']:>6} {r['bytes'] / 2**20:>9.1f} "
              f"{r['wall_s'] * 1000:>7.1f} {r['all_opens']:>13} {r['all_bytes'] / 2**20:>7.1f} "
              f"{r['all_wall_s'] * 1000:>7.1f} {r['digest_bytes'] / 1024:>11.1f} "
              f"{r['write_s'] * 1000:>9.1f}")  # fmt: skip
        if not r["hardware_found"]:
            print(f"  the hardware fault was NOT found: {r['said']}")
        print(f"  {r['said']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

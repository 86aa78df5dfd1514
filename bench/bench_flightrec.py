"""What PyTorch's flight recorder costs a job: a gloo all_reduce loop with its buffer 0 vs N.

Run with the torch virtualenv (gpugate itself never imports torch):

    .venv-torch/bin/python bench/bench_flightrec.py                # 2 ranks, 3 runs, 0 vs 2000
    .venv-torch/bin/python bench/bench_flightrec.py --ops 5000 --sizes 0 2000 20000

Each run starts a fresh 2-rank gloo world on 127.0.0.1 (one process per rank) with
TORCH_FR_BUFFER_SIZE and TORCH_NCCL_TRACE_BUFFER_SIZE set to the size, times `--ops`
all_reduce calls of a small tensor (small: the per-call bookkeeping is what the recorder adds,
not bandwidth), and reports per call the median over runs of rank 0's time, the growth of
rank 0's peak RSS over the loop, and the size of one dump (`_dump_fr_trace()`, the bytes the
watchdog writes) once the buffer is full. Runs of the sizes interleave, in an order that flips
each round, so the machine's noise falls on every size alike.

Figures on the 2-core development VM (shared, load average 2.2; torch 2.14.1 CPU, 2026-12-01;
`--ops 2000 --runs 8`): buffer 0: 1080 us per all_reduce, 2000: 1045 us (-3.3%: no cost
this machine can tell from its noise, which is +-17% between single runs); peak RSS +2.0 MiB
per process with the ring full (2000 entries); one rank's dump 252 KiB (118 bytes with the
recorder off).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time


def worker(rank: int, port: int, ops: int, elements: int) -> None:
    """One rank: init, warm up, time `ops` all_reduces; rank 0 prints one JSON line."""
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    t = torch.ones(elements)
    for _ in range(50):
        dist.all_reduce(t)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    for _ in range(ops):
        dist.all_reduce(t)
    elapsed = time.perf_counter() - start
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    dump = torch._C._distributed_c10d._dump_fr_trace()
    dist.barrier()
    if rank == 0:
        print(json.dumps({"us_per_op": elapsed / ops * 1e6, "rss_growth_kib": rss1 - rss0,
                          "dump_bytes": len(dump)}))  # fmt: skip
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(size: int, ops: int, elements: int) -> dict:
    """A fresh 2-rank world with buffer `size`; rank 0's figures."""
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=str(size), TORCH_NCCL_TRACE_BUFFER_SIZE=str(size))
    port = _free_port()
    argv = [sys.executable, __file__, "--worker", str(port), str(ops), str(elements)]
    procs = [
        subprocess.Popen([*argv, str(r)], env=env, stdout=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed (buffer {size}): exit {[p.returncode for p in procs]}")
    return json.loads(outs[0].strip().splitlines()[-1])


def main() -> None:
    """Interleaved runs per buffer size; prints a Markdown table."""
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        port, ops, elements, rank = map(int, sys.argv[2:6])
        worker(rank, port, ops, elements)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--elements", type=int, default=256)
    ap.add_argument("--sizes", type=int, nargs="+", default=[0, 2000])
    args = ap.parse_args()
    got: dict[int, list[dict]] = {s: [] for s in args.sizes}
    for i in range(args.runs):
        # ABBA: the order flips each round, so a first-run-of-the-round effect falls on all.
        for size in args.sizes if i % 2 == 0 else args.sizes[::-1]:
            got[size].append(one_run(size, args.ops, args.elements))
    base = statistics.median(r["us_per_op"] for r in got[args.sizes[0]])
    print(f"{args.ops} all_reduce of {args.elements} float32, 2 gloo ranks, median of {args.runs}")
    print("| buffer | us/op | vs first | RSS growth KiB | dump bytes |")
    print("|---|---|---|---|---|")
    for size in args.sizes:
        us = statistics.median(r["us_per_op"] for r in got[size])
        rss = statistics.median(r["rss_growth_kib"] for r in got[size])
        dump = max(r["dump_bytes"] for r in got[size])
        print(f"| {size} | {us:.1f} | {us / base - 1:+.1%} | {rss:.0f} | {dump} |")


if __name__ == "__main__":
    main()

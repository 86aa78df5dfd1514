"""Qualification payload: all-reduce bus bandwidth and host-to-device copy bandwidth.

A standalone script (stdlib and torch only; it never imports gpugate): the site's torch
interpreter runs it by path inside a qualification job, under srun:

    python payload.py allreduce --out FILE [--size-mib 32] [--iters 20] [--warmup 3]
                                [--backend auto|nccl|gloo] [--timeout-s 300]
    python payload.py h2d --out FILE [--size-mib 256] [--iters 10] [--timeout-s 300]

Ranks come from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, the node from SLURMD_NODENAME,
the rendezvous from MASTER_ADDR / MASTER_PORT (set by the job script). Rank 0 writes one JSON
object to --out; any error (rendezvous failure, timeout) is a JSON object with "error",
written the same way, and a non-zero exit, never a hang. A tool the site lacks (no torch in
this interpreter, no NCCL where --backend nccl asked for it) is not the node's fault: the
object is {"not_run": why, "fix": the exact fix} and the exit is EXIT_NOT_RUN (issue 28).

Bandwidths are GB/s (1e9 bytes per second), as NCCL-tests reports them: algbw = size / time,
busbw = algbw * 2(n-1)/n for all_reduce (NCCL-tests doc/PERFORMANCE.md, "AllReduce").

Test hook (for CI, never for production): GPUGATE_QUALIFY_TEST_DELAY="NODE:MS[,NODE:MS]" makes
the ranks on NODE sleep MS milliseconds before every timed iteration, so a node is made slow
on gloo without a slow network; the result records it in "injected_delay".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    import torch

DELAY_ENV = "GPUGATE_QUALIFY_TEST_DELAY"
EXIT_ERROR = 2
EXIT_TIMEOUT = 3
EXIT_NOT_RUN = 4
# The fixes a "not run" result names (docs/qualify.md, "Steps that did not run").
FIX_TORCH = (
    "set qualify.python to an interpreter with PyTorch (e.g. /opt/pytorch/bin/python), "
    "or drop allreduce,h2d,pairs from --tests"
)
FIX_NCCL = (
    "set qualify.python to a PyTorch built with NCCL (a CUDA build: "
    "torch.distributed.is_nccl_available() is True), or run the payload with --backend auto"
)
GB = 1e9
MIB = 1 << 20


class PayloadError(Exception):
    """A failure the result JSON reports (its message is the "error" text)."""


class NotRun(PayloadError):
    """A tool this interpreter lacks: the test is not run (never the node's failure)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


def parse_delay(text: str | None) -> dict[str, float] | None:
    """GPUGATE_QUALIFY_TEST_DELAY's "NODE:MS[,NODE:MS]" as {node: ms}; None when unset."""
    if not text or not text.strip():
        return None
    delays: dict[str, float] = {}
    for item in text.split(","):
        node, sep, ms = item.strip().rpartition(":")
        try:
            value = float(ms)
        except ValueError:
            value = -1.0
        if not sep or not node or value < 0:
            raise PayloadError(f"{DELAY_ENV}: {item.strip()!r} is not NODE:MS (MS >= 0)")
        delays[node] = value
    return delays


def bus_bandwidth(
    size_bytes: int, seconds_per_iter: float, world_size: int
) -> tuple[float, float | None]:
    """(algbw, busbw) in GB/s for all_reduce; busbw None for one rank (no data moves)."""
    algbw = size_bytes / seconds_per_iter / GB
    if world_size < 2:
        return algbw, None
    return algbw, algbw * 2 * (world_size - 1) / world_size


class Ranks:
    """This task's place in the job, from Slurm's task environment."""

    def __init__(self, env: dict[str, str]) -> None:
        try:
            self.rank = int(env.get("SLURM_PROCID", "0"))
            self.world_size = int(env.get("SLURM_NTASKS", "1"))
            self.local_rank = int(env.get("SLURM_LOCALID", "0"))
        except ValueError as exc:
            raise PayloadError(f"bad Slurm task variable: {exc}") from None
        self.node = env.get("SLURMD_NODENAME") or os.uname().nodename
        self.master_addr = env.get("MASTER_ADDR", "127.0.0.1")
        port = env.get("MASTER_PORT")
        if self.world_size > 1 and not (port or "").isdigit():
            raise PayloadError(f"MASTER_PORT must be a port number, got {port!r}")
        self.master_port = int(port) if port and port.isdigit() else 0


def write_result(path: str, result: dict[str, Any]) -> None:
    """Write the result JSON atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def _import_torch() -> ModuleType:
    try:
        import torch
        import torch.distributed
    except ImportError as exc:
        raise NotRun(f"no torch in {sys.executable}: {exc}", FIX_TORCH) from None
    module: ModuleType = torch  # torch has no stubs where gpugate is checked
    return module


def _choose_backend(torch: ModuleType, dist: ModuleType, requested: str) -> str:
    """nccl when every rank has a CUDA device (auto), else gloo; an explicit choice is checked."""
    has_cuda = int(torch.cuda.is_available() and torch.cuda.device_count() > 0)
    if requested == "gloo":
        return "gloo"
    flag = torch.tensor([has_cuda], dtype=torch.int32)
    # The rendezvous group is gloo (it runs everywhere); MIN: every rank must have a GPU.
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    everyone = bool(flag.item())
    if requested == "nccl" and not everyone:
        raise PayloadError("--backend nccl: a rank has no CUDA device")
    if everyone and not dist.is_nccl_available():
        if requested == "nccl":
            raise NotRun(f"--backend nccl: the torch in {sys.executable} has no NCCL", FIX_NCCL)
        return "gloo"
    return "nccl" if everyone else "gloo"


def _timed_loop(
    torch: ModuleType,
    dist: ModuleType,
    tensor: torch.Tensor,
    group: torch.distributed.ProcessGroup | None,
    args: argparse.Namespace,
    delay_s: float,
    cuda: bool,
) -> float:
    """Seconds the timed iterations took on this rank (warm-up excluded)."""
    for _ in range(args.warmup):
        dist.all_reduce(tensor, group=group)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.iters):
        if delay_s:
            time.sleep(delay_s)
        dist.all_reduce(tensor, group=group)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def run_allreduce(
    args: argparse.Namespace, ranks: Ranks, delays: dict[str, float] | None
) -> dict[str, Any]:
    """All-reduce bandwidth across the job's ranks; the slowest rank's time decides."""

    torch = _import_torch()
    dist = torch.distributed
    dist.init_process_group(
        backend="gloo",
        init_method=f"tcp://{ranks.master_addr}:{ranks.master_port}",
        rank=ranks.rank,
        world_size=ranks.world_size,
        timeout=timedelta(seconds=args.timeout_s),
    )
    backend = _choose_backend(torch, dist, args.backend)
    group, device, gpu_name = None, "cpu", None
    if backend == "nccl":
        index = ranks.local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = f"cuda:{index}"
        # The model string NVML reports too: gpugate matches the board profile (its floors) by it.
        gpu_name = torch.cuda.get_device_name(index)
        group = dist.new_group(backend="nccl")
    nodes: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(nodes, ranks.node)
    size_bytes = args.size_mib * MIB
    tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    delay_s = (delays or {}).get(ranks.node, 0.0) / 1000.0
    elapsed = _timed_loop(torch, dist, tensor, group, args, delay_s, backend == "nccl")
    slowest = torch.tensor([elapsed], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    seconds = float(slowest.item())
    algbw, busbw = bus_bandwidth(tensor.numel() * 4, seconds / args.iters, ranks.world_size)
    dist.destroy_process_group()
    return {
        "test": "allreduce",
        "backend": backend,
        "world_size": ranks.world_size,
        "nodes": list(dict.fromkeys(nodes)),
        "size_bytes": tensor.numel() * 4,
        "iters": args.iters,
        "seconds": seconds,
        "algbw_gbps": algbw,
        "busbw_gbps": busbw,
        "gpu_name": gpu_name,
        "injected_delay": delays,
    }


def run_h2d(args: argparse.Namespace, ranks: Ranks) -> dict[str, Any]:
    """Pinned host-to-device copy bandwidth of every GPU this task sees, timed by CUDA events."""
    torch = _import_torch()
    result: dict[str, Any] = {"test": "h2d", "node": ranks.node, "gpus": [], "skipped": None}
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        result["skipped"] = "no CUDA device"
        return result
    size_bytes = args.size_mib * MIB
    result["gpu_name"] = torch.cuda.get_device_name(0)
    host = torch.empty(size_bytes, dtype=torch.uint8, pin_memory=True)
    for index in range(torch.cuda.device_count()):
        with torch.cuda.device(index):
            target = torch.empty(size_bytes, dtype=torch.uint8, device=f"cuda:{index}")
            target.copy_(host, non_blocking=True)  # warm-up: first-touch costs
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                target.copy_(host, non_blocking=True)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000.0  # elapsed_time is milliseconds
            result["gpus"].append({"index": index, "gbps": size_bytes * args.iters / seconds / GB})
            del target
    return result


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The payload's command line."""
    parser = argparse.ArgumentParser(prog="payload.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="test", required=True)
    allreduce = sub.add_parser("allreduce", help="all-reduce bus bandwidth across the job's ranks")
    allreduce.add_argument("--size-mib", type=_positive, default=32)
    allreduce.add_argument("--iters", type=_positive, default=20)
    allreduce.add_argument("--warmup", type=_non_negative, default=3)
    allreduce.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    h2d = sub.add_parser("h2d", help="pinned host-to-device copy bandwidth per GPU")
    h2d.add_argument("--size-mib", type=_positive, default=256)
    h2d.add_argument("--iters", type=_positive, default=10)
    for each in (allreduce, h2d):
        each.add_argument("--out", required=True, help="where rank 0 writes the result JSON")
        each.add_argument("--timeout-s", type=_positive, default=300, help="bound on the whole run")
    return parser


def _report(args: argparse.Namespace, ranks: Ranks | None, result: dict[str, Any]) -> None:
    """Rank 0 writes the result; other ranks print an error so the job's output shows it."""
    if ranks is None or ranks.rank == 0:
        write_result(args.out, result)
    elif "error" in result or "not_run" in result:
        print(json.dumps(result, sort_keys=True), file=sys.stderr)


def _watchdog(args: argparse.Namespace, ranks: Ranks | None) -> threading.Timer:
    """Bound the whole run: a stuck collective or rendezvous ends in an error JSON, not a hang."""

    def fire() -> None:
        error = f"timed out after {args.timeout_s} s (rendezvous or collective did not finish)"
        try:
            _report(args, ranks, _error(args, ranks, error))
        finally:
            os._exit(EXIT_TIMEOUT)  # the main thread may be blocked inside torch

    timer = threading.Timer(args.timeout_s, fire)
    timer.daemon = True
    timer.start()
    return timer


def _error(args: argparse.Namespace, ranks: Ranks | None, message: str) -> dict[str, Any]:
    where = {"rank": ranks.rank, "node": ranks.node} if ranks else {}
    return {"test": args.test, "error": message, **where}


def main(argv: list[str] | None = None) -> int:
    """Run one payload test; 0 on success, non-zero with an error JSON otherwise."""
    args = build_parser().parse_args(argv)
    try:
        ranks = Ranks(dict(os.environ))
    except PayloadError as exc:
        _report(args, None, _error(args, None, str(exc)))
        return EXIT_ERROR
    timer = _watchdog(args, ranks)
    try:
        if args.test == "allreduce":
            result = run_allreduce(args, ranks, parse_delay(os.environ.get(DELAY_ENV)))
        elif ranks.local_rank == 0:  # one measurement per node: tasks would share the PCIe link
            result = run_h2d(args, ranks)
        else:
            return 0
    except NotRun as exc:
        result = {"test": args.test, "not_run": str(exc), "fix": exc.fix, "rank": ranks.rank,
                  "node": ranks.node}  # fmt: skip
    except PayloadError as exc:
        result = _error(args, ranks, str(exc))
    except Exception as exc:  # torch's own failures (rendezvous, NCCL) become the error JSON
        result = _error(args, ranks, f"{type(exc).__name__}: {exc}")
    timer.cancel()
    _report(args, ranks, result)
    if "not_run" in result:
        return EXIT_NOT_RUN
    return EXIT_ERROR if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())

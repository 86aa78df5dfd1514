"""A qualification's records: the run's result (QualifyRun), each job submitted (Job), and
what the payload (payload.py) wrote in the job (PayloadResult).

Their own module, below run.py, judge.py and settle.py, which all name them: no import circle.
The TEST RESULTs and qualify.jsonl's entries are the store's (gpugate/store/qualify.py).
"""

from __future__ import annotations

from gpugate.jsonrecord import JsonRecord
from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar


class QualifyRun(Record):
    """One run: its id, the nodes, each node's verdict, the pair verdict, the reservation."""

    run_id: str
    nodes: list[Any]
    # node -> {"passed", "tests": [TEST RESULT], "job_ids", "why", "failed", "action", "bundle"}
    verdicts: dict[str, Any]
    pairs: dict[str, Any] | None  # pairs.judge_pairs' output; None: no pair test ran
    reservation: str | None
    run_dir: str = ""
    level: int = 1
    tests: list[Any] = []


class Job(Record):
    """One submitted qualification job and what became of it."""

    name: str  # the node, or pair-A-B
    nodes: tuple[str, ...]
    job_id: str | None
    output: str
    state: str = "PENDING"
    started: bool = False
    note: str = ""  # why it gave no result: sbatch refused it, never started, cancelled


class H2dGpu(JsonRecord):
    """One GPU's host-to-device copy bandwidth (an h2d PayloadResult's `gpus`)."""

    index: int
    gbps: float

    _doc: ClassVar[dict[str, str]] = {
        "index": "the GPU's CUDA index on the node",
        "gbps": "pinned host-to-device copy bandwidth, GB/s",
    }


class PayloadResult(JsonRecord):
    """The JSON object a payload step leaves in the job's directory: all-reduce or h2d.

    Written by payload.py (stdlib only: it never imports gpugate, so it writes a plain dict,
    its keys sorted), or by the job script when qualify.python is missing ({"test", "not_run",
    "fix"}). One of: a measurement, {"error": ...}, {"not_run": why, "fix": ...}.
    """

    test: str = ""  # every writer names it; a result without it is read as before
    error: str | None = None
    not_run: str | None = None
    fix: str | None = None
    rank: int | None = None
    node: str | None = None
    backend: str | None = None
    world_size: int | None = None
    nodes: list[str] | None = None
    size_bytes: int | None = None
    iters: int | None = None
    seconds: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    gpu_name: str | None = None
    injected_delay: dict[str, float] | None = None
    gpus: list[H2dGpu] | None = None
    skipped: str | None = None

    _omit = frozenset({"error", "not_run", "fix", "rank", "node", "backend", "world_size",
                       "nodes", "size_bytes", "iters", "seconds", "algbw_gbps", "busbw_gbps",
                       "gpu_name", "injected_delay", "gpus", "skipped"})  # fmt: skip
    _doc: ClassVar[dict[str, str]] = {
        "test": "`allreduce` or `h2d` (every writer names it)",
        "error": "why it failed (a rendezvous, a timeout, torch's error): no measurement",
        "not_run": "a tool the site lacks (no torch, no NCCL): never the node's failure",
        "fix": "the exact fix of a step not run",
        "rank": "the rank that wrote an error",
        "node": "the node (h2d; the rank's, with an error)",
        "backend": "`nccl` or `gloo` (all-reduce)",
        "world_size": "the ranks (all-reduce)",
        "nodes": "the nodes the ranks ran on (all-reduce)",
        "size_bytes": "the tensor's bytes (all-reduce)",
        "iters": "timed iterations (all-reduce)",
        "seconds": "the slowest rank's time for them (all-reduce)",
        "algbw_gbps": "size / time, GB/s (all-reduce)",
        "busbw_gbps": "algbw x 2(n-1)/n, GB/s; null with one rank (all-reduce)",
        "gpu_name": "the GPU model, as NVML names it (for the board's floors)",
        "injected_delay": "the CI hook's delays, ms by node (GPUGATE_QUALIFY_TEST_DELAY)",
        "gpus": "each GPU's bandwidth (h2d; H2dGpu)",
        "skipped": "why nothing was measured (h2d: no CUDA device)",
    }

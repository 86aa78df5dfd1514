"""A qualification's records: the run's result (QualifyRun) and each job submitted (Job).

Their own module, below run.py, judge.py and settle.py, which all name them: no import circle.
"""

from __future__ import annotations

from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


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

"""Past fault drills: `drills.jsonl` beside drains.jsonl in admin.history_dir, bounded like it.

`gpugate drill` (gpugate/commands/drill.py) records each drill it ran here (a DrillEntry, its
steps DrillSteps); the drill itself (its faults, overlays and window) is gpugate/drill/.
"""

from __future__ import annotations

import os
import time

from gpugate.drill import FAULTS, DrillWindow, read_drill
from gpugate.jsonrecord import JsonRecord
from gpugate.store.entries import NodeEntry
from gpugate.store.history import _add, _read_lines, history_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar

    from gpugate.config.schema import Config

RECORDS = "drills.jsonl"
MAX_RECORDS_PER_NODE = 100
MAX_RECORDS = 2000


class DrillStep(JsonRecord):
    """One step a drill saw, with its time and seconds since the drill started."""

    step: str
    at: str
    when: float
    after_s: float
    detail: str = ""
    fault: str | None = None
    job: str | None = None
    nodes: list[str] | None = None
    checkpoint: str | None = None

    _omit = frozenset({"fault", "job", "nodes", "checkpoint"})
    _doc: ClassVar[dict[str, str]] = {
        "step": "`injected`, `job_killed`, `health_check`, `drained`, `requeued`, "
        "`not_requeued`, `window_ended`, `resumed` or `error`",
        "at": "when, UTC ISO",
        "when": "when, epoch seconds",
        "after_s": "seconds since the drill's start",
        "detail": "what happened, in words",
        "fault": "the fault injected (`injected`)",
        "job": "the job killed or followed",
        "nodes": "where the requeued job ran again (`requeued`)",
        "checkpoint": "the checkpoint it resumed from; null: not known here (`requeued`)",
    }

    def _omitted(self) -> set[str]:
        # A requeue writes its checkpoint, known or not.
        keep = {"checkpoint"} if self.nodes is not None else set()
        return {f for f in self._omit if getattr(self, f) is None and f not in keep}


class DrillEntry(NodeEntry):
    """`drills.jsonl`: one drill `gpugate drill` ran, and its verdict (a history line, bounded
    per node as the others; it never wrote `at`: its steps have theirs)."""

    id: str
    fault: str
    injected: str
    drill: DrillWindow
    steps: list[DrillStep]
    passed: bool
    why: str

    _omit = frozenset({"at"})
    _doc: ClassVar[dict[str, str]] = {
        "node": "the node drilled",
        "when": "when the drill was recorded (its end), epoch seconds",
        "at": "never written (the steps have theirs)",
        "id": "the drill's id",
        "fault": "the fault simulated",
        "injected": "the fault in words",
        "drill": "the drill's window, as drill.json held it (DrillWindow)",
        "steps": "what the drill saw, in order (DrillStep)",
        "passed": "drained, requeued (where a job ran) and resumed",
        "why": "what was missing; empty when it passed",
    }


def valid_record(e: object) -> bool:
    """Whether `e` is a drill record as record_drill() writes it (its drill a known fault's;
    the record checks the types)."""
    return type(e) is dict and read_drill(e.get("drill")) is not None


def record_drill(
    config: Config, drill: DrillWindow, steps: list[DrillStep], passed: bool, why: str
) -> DrillEntry:
    """Append one drill's record to drills.jsonl (bounded like drains.jsonl); the entry."""
    entry = DrillEntry(node=drill.node, when=round(time.time(), 3), id=drill.id,
                       fault=drill.fault, injected=FAULTS[drill.fault][0], drill=drill,
                       steps=steps, passed=passed, why=why)  # fmt: skip
    _add(history_dir(config), RECORDS, valid_record, entry, lambda last: False,
         MAX_RECORDS_PER_NODE, MAX_RECORDS)  # fmt: skip
    return entry


def records_path(config: Config) -> str:
    """drills.jsonl, beside drains.jsonl in admin.history_dir."""
    return os.path.join(history_dir(config), RECORDS)


def drill_records(config: Config, node: str | None = None) -> list[DrillEntry]:
    """Past drills, oldest first (those of `node` only, if given)."""
    entries = _read_lines(records_path(config), DrillEntry, valid_record)
    return [e for e in entries if node is None or e.node == node]

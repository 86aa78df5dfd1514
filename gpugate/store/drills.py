"""Past fault drills: `drills.jsonl` beside drains.jsonl in admin.history_dir, bounded like it.

`gpugate drill` (gpugate/commands/drill.py) records each drill it ran here; the drill itself
(its faults, overlays and window) is gpugate/drill/.
"""

from __future__ import annotations

import os
import time

from gpugate.drill import FAULTS, valid_drill
from gpugate.store.history import _add, _read_dicts, history_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.config.schema import Config

RECORDS = "drills.jsonl"
MAX_RECORDS_PER_NODE = 100
MAX_RECORDS = 2000


def valid_record(e: object) -> bool:
    """Whether `e` is a drill record as record_drill() writes it."""
    if type(e) is not dict or not valid_drill(e.get("drill")) or type(e.get("passed")) is not bool:
        return False
    when, node = e.get("when"), e.get("node")
    return type(when) in (int, float) and type(node) is str and type(e.get("steps")) is list


def record_drill(
    config: Config, drill: dict[str, Any], steps: list[dict[str, Any]], passed: bool, why: str
) -> dict[str, Any]:
    """Append one drill's record to drills.jsonl (bounded like drains.jsonl); the entry."""
    entry = {"node": drill["node"], "when": round(time.time(), 3), "id": drill["id"],
             "fault": drill["fault"], "injected": FAULTS[drill["fault"]][0], "drill": drill,
             "steps": steps, "passed": passed, "why": why}  # fmt: skip
    _add(history_dir(config), RECORDS, valid_record, entry, lambda last: False,
         MAX_RECORDS_PER_NODE, MAX_RECORDS)  # fmt: skip
    return entry


def records_path(config: Config) -> str:
    """drills.jsonl, beside drains.jsonl in admin.history_dir."""
    return os.path.join(history_dir(config), RECORDS)


def drill_records(config: Config, node: str | None = None) -> list[dict[str, Any]]:
    """Past drills, oldest first (those of `node` only, if given)."""
    entries = _read_dicts(records_path(config), valid_record)
    return [e for e in entries if node is None or e["node"] == node]

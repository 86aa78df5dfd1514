"""Qualification records: `qualify.jsonl` in the state directory (`admin.history_dir`).

One entry per node per `gpugate qualify` run: {"node", "when" (epoch), "at", "run_id", "level",
"passed", "tests" (TEST RESULT dicts), "job_ids", "why", "by"}. Bounded and written like the
drain history (gpugate/store/history.py): at most `admin.history_max_per_node` entries per node
and `history_max_entries` in all, the file rewritten whole and atomically under the history's
lock, 0640 root and the admin group's; readers skip what gpugate does not write.
"""

from __future__ import annotations

import os
import time

from gpugate.store.history import (
    MAX_ENTRIES,
    MAX_PER_NODE,
    _add,
    _common_ok,
    _read_dicts,
    _select,
    iso,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

QUALIFY = "qualify.jsonl"
_TEXT = ("at", "run_id", "why", "by", "trigger")


def valid_qualification(e: object) -> bool:
    """Whether `e` is an entry as record_qualification() writes it (the types readers use)."""
    if not _common_ok(e, _TEXT):
        return False
    assert isinstance(e, dict)
    level = e.get("level")
    return (
        type(e.get("passed")) is bool
        and type(level) is int
        and type(e.get("tests")) is list
        and type(e.get("job_ids")) is list
        and all(type(t) is dict for t in e["tests"])
    )


def record_qualification(
    state_dir: str,
    entry: dict[str, Any],
    *,
    max_per_node: int = MAX_PER_NODE,
    max_entries: int = MAX_ENTRIES,
) -> dict[str, Any]:
    """Add one node's qualification outcome; the entry as written (with `when` and `at`)."""
    when = float(entry.get("when") or time.time())
    full = {
        "node": str(entry["node"]),
        "when": round(when, 3),
        "at": iso(when),
        "run_id": str(entry.get("run_id") or ""),
        "level": int(entry.get("level", 1)),
        "passed": bool(entry.get("passed")),
        "tests": list(entry.get("tests") or []),
        "job_ids": [str(j) for j in entry.get("job_ids") or []],
        "why": str(entry.get("why") or ""),
        "by": str(entry.get("by") or ""),
        # What asked for the run: an admin (empty), a sweep, or a suspect flag's detail.
        "trigger": str(entry.get("trigger") or ""),
    }
    if not valid_qualification(full):
        raise ValueError(f"not a qualification entry: {full!r}")
    # Every run is its own entry: nothing repeats (unlike two prologs seeing one fault).
    _add(state_dir, QUALIFY, valid_qualification, full, lambda last: False,
         max_per_node, max_entries)  # fmt: skip
    return full


def qualifications(
    state_dir: str, node: str | None = None, since: float | None = None
) -> list[dict[str, Any]]:
    """Qualification entries (of one node, or all; since an epoch time, or all), oldest first."""
    path = os.path.join(state_dir, QUALIFY)
    return _select(_read_dicts(path, valid_qualification), node, since)


def latest_pass(
    state_dir: str, node: str, since: float | None = None, level: int = 1
) -> dict[str, Any] | None:
    """The node's newest qualification of at least `level` (since a time), if it passed.

    A later failure voids an earlier pass: a node that passed, then failed, has no pass.
    """
    for entry in reversed(qualifications(state_dir, node, since)):
        if entry["level"] >= level:
            return entry if entry["passed"] else None
    return None

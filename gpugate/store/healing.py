"""Healing state: per node gpugate drained, what drained it and how many health runs passed since.

`state_dir/healing.json`, root's own like the rest of the state (0640, atomic writes), read
back validated: an entry that is not what this module wrote is dropped, never trusted (a
forged `passes` would lift a drain). `gpugate health` (gpugate/hooks/health.py) is the only
writer; the rules that read it are gpugate/health/heal.py.
"""

from __future__ import annotations

import json
import os

from gpugate.fsutil import read_regular
from gpugate.record import Record
from gpugate.store.state import ensure_state_dir, write_private

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HEALING_FILE = "healing.json"
# A few hundred bytes per drained node; anything far bigger is not ours.
_READ_MAX = 4 * 1024 * 1024
_FAULTS = ("transient", "hardware")


class Healing(Record):
    """One drained node: the check that drained it, its class, when, the boot then, passes since."""

    node: str
    check: str
    fault: str  # transient / hardware (gpugate/checks/registry.py)
    since: float  # epoch seconds of the drain
    boot_id: str | None = None  # /proc/sys/kernel/random/boot_id when drained
    passes: int = 0  # consecutive passing health runs since the drain

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {"check": self.check, "fault": self.fault, "since": self.since,
                "boot_id": self.boot_id, "passes": self.passes}  # fmt: skip


def healing_path(state_dir: str) -> str:
    """Where the healing state lives."""
    return os.path.join(state_dir, HEALING_FILE)


def _valid(node: object, e: object) -> Healing | None:
    """The entry as a Healing, or None when it is not one this module wrote."""
    if not isinstance(node, str) or not node or not isinstance(e, dict):
        return None
    check, fault, since = e.get("check"), e.get("fault"), e.get("since")
    boot, passes = e.get("boot_id"), e.get("passes")
    if not isinstance(check, str) or not check or fault not in _FAULTS:
        return None
    if isinstance(since, bool) or not isinstance(since, (int, float)) or not 0 <= since < 1e11:
        return None
    if boot is not None and not isinstance(boot, str):
        return None
    if isinstance(passes, bool) or not isinstance(passes, int) or not 0 <= passes < 10**9:
        return None
    return Healing(node=node, check=check, fault=fault, since=float(since), boot_id=boot,
                   passes=passes)  # fmt: skip


def load(state_dir: str) -> dict[str, Healing]:
    """Every node's healing entry; {} when the file is missing or unreadable (never raises)."""
    try:
        # Never blocks: a FIFO in its place must not hang every health check (fsutil).
        raw = read_regular(healing_path(state_dir), _READ_MAX, follow=False)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, dict):
        return {}
    out = {}
    for name, e in nodes.items():
        entry = _valid(name, e)
        if entry is not None:
            out[name] = entry
    return out


def save(state_dir: str, entries: dict[str, Healing]) -> None:
    """Replace the healing state (atomically, 0640 with the state directory's group)."""

    ensure_state_dir(state_dir)
    data = {"version": 1, "nodes": {n: e.to_json() for n, e in sorted(entries.items())}}
    write_private(healing_path(state_dir), json.dumps(data, indent=1, sort_keys=True))


def put(state_dir: str, entry: Healing) -> None:
    """Store one node's entry (the others kept)."""
    entries = load(state_dir)
    entries[entry.node] = entry
    save(state_dir, entries)


def forget(state_dir: str, node: str) -> None:
    """Drop a node's entry (its drain was lifted, or is no longer gpugate's)."""
    entries = load(state_dir)
    if entries.pop(node, None) is not None:
        save(state_dir, entries)

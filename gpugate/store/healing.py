"""Healing state: per node gpugate drained, what drained it and how many health runs passed since.

`state_dir/healing.json`, root's own like the rest of the state (0640, atomic writes), read
back validated (`HealingFile`, `HealingEntry`: gpugate/jsonrecord.py, the key at fault named):
an entry that is not what this module wrote is dropped, never trusted (a forged `passes` would
lift a drain), and a file that is not one reads as empty. `gpugate health`
(gpugate/hooks/health.py) is the only writer; the rules that read it are gpugate/health/heal.py.
"""

from __future__ import annotations

import json
import os

from gpugate.fsutil import read_regular
from gpugate.jsonrecord import JsonRecord
from gpugate.store.state import ensure_state_dir, write_private

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

HEALING_FILE = "healing.json"
# A few hundred bytes per drained node; anything far bigger is not ours.
_READ_MAX = 4 * 1024 * 1024
_FAULTS = ("transient", "hardware")


class HealingEntry(JsonRecord):
    """One drained node's entry in the file (its name is the key): the check that drained it,
    its class, when, the boot then, passes since."""

    check: str
    fault: str  # transient / hardware (gpugate/checks/registry.py)
    since: float  # epoch seconds of the drain
    boot_id: str | None = None  # /proc/sys/kernel/random/boot_id when drained
    passes: int  # consecutive passing health runs since the drain

    _doc: ClassVar[dict[str, str]] = {
        "check": "the check id of gpugate's drain (`unknown`: a reason without one)",
        "fault": "its class: `transient` (heals after passing runs) or `hardware` (waits for a "
        "repair: a new boot or an audited GPU reset)",
        "since": "when the drain was set (epoch seconds, Slurm's reason time)",
        "boot_id": "the node's boot id then; null: not known",
        "passes": "consecutive passing health runs since the drain",
    }


class Healing(HealingEntry):
    """One drained node: the check that drained it, its class, when, the boot then, passes since."""

    node: str  # the file's key, never one of the entry's
    passes: int = 0  # a new entry has seen no passing run

    def _omitted(self) -> set[str] | frozenset[str]:
        return {"node", *super()._omitted()}


class HealingFile(JsonRecord):
    """`healing.json`: the version and every drained node's entry, by node name."""

    version: int
    nodes: dict[str, Any]  # each read on its own (`_entry`): a bad one is dropped, not the file

    _doc: ClassVar[dict[str, str]] = {
        "version": "1",
        "nodes": "per node name: its entry (HealingEntry); one that does not read as one, or "
        "whose values are out of range, is dropped",
    }


def healing_path(state_dir: str) -> str:
    """Where the healing state lives."""
    return os.path.join(state_dir, HEALING_FILE)


def _entry(node: str, obj: object, where: str) -> Healing:
    """The entry as a Healing; ValueError naming the key when it is not one this module wrote
    (a forged `passes` or `since` out of range would lift a drain)."""
    if not node:
        raise ValueError(f"{where}: an empty node name")
    e = HealingEntry.from_json(obj, where)
    if not e.check:
        raise ValueError(f"{where}: key 'check': empty")
    if e.fault not in _FAULTS:
        raise ValueError(f"{where}: key 'fault': {e.fault!r} is not one of {', '.join(_FAULTS)}")
    if not 0 <= e.since < 1e11:
        raise ValueError(f"{where}: key 'since': {e.since!r} out of range")
    if not 0 <= e.passes < 10**9:
        raise ValueError(f"{where}: key 'passes': {e.passes!r} out of range")
    return Healing(node=node, check=e.check, fault=e.fault, since=float(e.since),
                   boot_id=e.boot_id, passes=e.passes, extra=e.extra)  # fmt: skip


def load(state_dir: str, problems: list[str] | None = None) -> dict[str, Healing]:
    """Every node's healing entry; {} when the file is missing or unreadable (never raises).

    What was dropped, and why (the key named), is added to `problems` when given."""
    path = healing_path(state_dir)
    try:
        # Never blocks: a FIFO in its place must not hang every health check (fsutil).
        raw = read_regular(path, _READ_MAX, follow=False)
        data = HealingFile.from_json(json.loads(raw.decode("utf-8")), path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        _note(problems, f"{path}: {exc}" if isinstance(exc, OSError) else str(exc))
        return {}
    out = {}
    for name, e in data.nodes.items():
        try:
            out[name] = _entry(name, e, f"{path}: nodes[{name!r}]")
        except ValueError as exc:
            _note(problems, str(exc))
    return out


def _note(problems: list[str] | None, message: str) -> None:
    if problems is not None:
        problems.append(message)


def save(state_dir: str, entries: dict[str, Healing]) -> None:
    """Replace the healing state (atomically, 0640 with the state directory's group)."""
    ensure_state_dir(state_dir)
    data = HealingFile(version=1, nodes={n: e.to_json() for n, e in sorted(entries.items())})
    write_private(healing_path(state_dir), json.dumps(data.to_json(), indent=1, sort_keys=True))


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

"""Each check's record: how its drains ended (pure, from the history and the audit log).

A drain ends in one of: lifted after a repair (a new boot, a GPU reset: history's
repair_evidence), lifted without any repair (the drain was false, or the fault went away by
itself: `gpugate_false_drains_total`), still drained, or lifted outside gpugate (Slurm shows
the node in service and no audited lift follows the drain: someone ran `scontrol update`).

A fault drill's drain (gpugate/drill: its history entry carries the drill id, its reason
`gpugate: DRILL <id>: ...`) is none of these: a simulated fault, drained and lifted on purpose.
It stays out of every check's record and of gpugate_false_drains_total; `drill_drains` counts
them apart.
"""

from __future__ import annotations

from gpugate.store import history
from gpugate.store.history import by_node, drill_of, lifted_without_repair
from gpugate.store.metrics import note_run

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection

    from gpugate.config.schema import Config
    from gpugate.store.entries import AuditEntry, DrainEntry

FIELDS = ("drains", "lifted_repaired", "lifted_unrepaired", "still_drained", "lifted_unaudited")
HEADERS = ("CHECK", "DRAINS", "LIFTED AFTER REPAIR", "LIFTED WITHOUT REPAIR", "STILL DRAINED",
           "LIFTED OUTSIDE GPUGATE")  # fmt: skip


def check_record(
    drains: list[DrainEntry],
    audit: list[AuditEntry],
    since: float,
    drained_now: Collection[str] | None = None,
) -> dict[str, dict[str, int]]:
    """{check: {drains, lifted_repaired, lifted_unrepaired, still_drained, lifted_unaudited}}
    for the drains since `since`. A drain's lift is the node's first audited resume after it
    and before its next drain. `drained_now`: the nodes Slurm shows drained (None: unknown,
    every unlifted drain counts as still drained)."""
    lifts = by_node(e for e in audit if e.resumed)
    out: dict[str, dict[str, int]] = {}
    for node, entries in by_node(drains).items():
        entries = sorted(entries, key=lambda e: e.when)
        for i, drain in enumerate(entries):
            if drain.when < since or drill_of(drain):
                continue  # a drill's drain still ends the drain before it (`end`)
            end = entries[i + 1].when if i + 1 < len(entries) else float("inf")
            lift = next((r for r in lifts.get(node, ()) if drain.when <= r.when < end), None)
            counts = out.setdefault(drain.check or "?", dict.fromkeys(FIELDS, 0))
            counts["drains"] += 1
            if lift is not None:
                bad = lifted_without_repair(drain, lift, audit)
                counts["lifted_unrepaired" if bad else "lifted_repaired"] += 1
            elif drained_now is None or node in drained_now or end != float("inf"):
                counts["still_drained"] += 1
            else:
                counts["lifted_unaudited"] += 1
    return dict(sorted(out.items()))


def drill_drains(drains: list[DrainEntry], since: float) -> list[DrainEntry]:
    """The drills' drains since `since` (each history entry), oldest first."""
    found = [d for d in drains if d.when >= since and drill_of(d)]
    return sorted(found, key=lambda d: d.when)


def render_record(record: dict[str, dict[str, int]], window_days: float) -> str:
    """The record as a fixed-width table, one line per check."""
    if not record:
        return f"No drains in the last {window_days:g} days.\n"
    cells = [list(HEADERS)] + [[c, *(str(v[f]) for f in FIELDS)] for c, v in record.items()]
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADERS))]
    lines = [f"Drains by check, last {window_days:g} days:"]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"


def note_lift(config: Config, node: str, lift: AuditEntry) -> bool | None:
    """After an audited lift (`lift`: its audit entry): count it in gpugate_false_drains_total
    when no repair shows since the node's newest drain. True when counted, False when repaired,
    None when no drain of the node is on record. For `gpugate resume` and for healing. A
    drill's drain is never a false drain: False."""
    where = history.history_dir(config)
    found = history.drains(where, node)
    drain = found[-1] if found else None
    if drain is None or drain.when > lift.when:
        return None
    if drill_of(drain):  # lifted on purpose when the drill ended: nothing was wrong
        return False
    if not lifted_without_repair(drain, lift, history.resumes(where, node, drain.when)):
        return False

    note_run(config, node, "resume", false_drain_check=drain.check or "unknown")
    return True

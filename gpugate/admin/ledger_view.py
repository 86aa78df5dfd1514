"""The repair ledger for admins: a node's lines (`gpugate nodes NODE`, the report) and the RMA
list (`gpugate nodes --rma`, the report's "RMA list").

A node is on the RMA list while its newest RMA line (the verdict "replace the part", written by
the repair ladder) is followed by no ADMIN or RESUME line: a person replaced the part and put
the node back (`gpugate resume`, or a resume outside gpugate that the health check audited as
the admin's). Everything shown comes from files any hook writes and from drain reasons anyone
who can drain a node writes: the text output goes through printable(), the report escapes it.
"""

from __future__ import annotations

from gpugate.gate.ladder import same_part_drains
from gpugate.record import Record
from gpugate.store import history
from gpugate.store import ledger as L
from gpugate.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gpugate.store.entries import DrainEntry, LedgerEntry

SHOWN = 30  # a node's newest lines shown: a repair loop is a handful; a flapping node, more
# The steps that end an RMA: a person's act on the node, or its return to service.
RMA_CLEARED = frozenset({L.ADMIN, L.RESUME})
FIELD_MAX = 300  # of a text line's cell: a why can be a whole drain reason


def node_lines(found: Iterable[LedgerEntry], node: str) -> list[LedgerEntry]:
    """The newest SHOWN lines of `node`, oldest first."""
    return [e for e in found if e.node == node][-SHOWN:]


def line_json(entry: LedgerEntry) -> dict[str, object]:
    """A ledger line as the JSON outputs print it: every key, null when not known."""
    return {
        "at": entry.at, "when": entry.when, "step": entry.step, "who": entry.who,
        "outcome": entry.outcome, "why": entry.why, "evidence": entry.evidence,
        "check": entry.check, "gpu": entry.gpu, "reason": entry.reason,
    }  # fmt: skip


def _text(value: object) -> str:
    """One printable line (controls and bidi overrides shown escaped), cut to FIELD_MAX."""
    text = printable("" if value is None else str(value))
    return text if len(text) <= FIELD_MAX else text[: FIELD_MAX - 3] + "..."


def render_lines(node: str, entries: Sequence[LedgerEntry]) -> str:
    """`gpugate nodes NODE`'s ledger: a heading, then one line per step, newest last."""
    if not entries:
        return f"Repair ledger of {_text(node)}: no steps recorded.\n"
    lines = [f"Repair ledger of {_text(node)} (newest last, at most {SHOWN}):"]
    for e in entries:
        tail = f"  [{_text(e.evidence)}]" if e.evidence else ""
        lines.append(f"  {e.at}  {e.step.upper():<8}  {_text(e.who)}  {_text(e.outcome)}: "
                     f"{_text(e.why)}{tail}")  # fmt: skip
    return "\n".join(lines) + "\n"


class RmaItem(Record):
    """One node on the RMA list: its newest RMA line and the drains of that GPU (or check)."""

    node: str
    when: float
    at: str
    gpu: str | None
    check: str | None
    who: str
    why: str
    evidence: str | None
    drains: int  # of its check on the node or of its GPU anywhere (same_part_drains), no drill's

    def to_json(self) -> dict[str, object]:
        """The item as `gpugate nodes --rma --json` prints it."""
        return self.to_dict()


def rma_list(
    found: Iterable[LedgerEntry], drains: Iterable[DrainEntry], since: float | None = None
) -> list[RmaItem]:
    """The nodes whose newest RMA line no ADMIN or RESUME line follows, newest RMA first;
    each with how often its part was drained since `since` (gate/ladder.py same_part_drains)."""
    open_rma: dict[str, LedgerEntry] = {}
    for e in found:  # oldest first: a later line decides
        if e.step == L.RMA:
            open_rma[e.node] = e
        elif e.step in RMA_CLEARED:
            open_rma.pop(e.node, None)
    drains = list(drains)
    items = [_item(e, same_part_drains(drains, since, e.node, e.check, e.gpu))
             for e in open_rma.values()]  # fmt: skip
    return sorted(items, key=lambda i: (-i.when, i.node))


def _item(rma: LedgerEntry, drains: int) -> RmaItem:
    return RmaItem(node=rma.node, when=rma.when, at=rma.at or history.iso(rma.when),
                   gpu=rma.gpu, check=rma.check, who=rma.who, why=rma.why,
                   evidence=rma.evidence, drains=drains)  # fmt: skip


RMA_COLUMNS = ("NODE", "GPU", "CHECK", "SINCE", "DRAINS", "WHY")


def render_rma(items: Sequence[RmaItem]) -> str:
    """`gpugate nodes --rma`: a fixed-width table, the why last and uncut (but printable)."""
    if not items:
        return "RMA list: empty (no node's last verdict is to replace a part).\n"
    cells = [list(RMA_COLUMNS)]
    cells += [[_text(i.node), _text(i.gpu or "-"), _text(i.check or "-"), i.at, str(i.drains),
               _text(i.why)] for i in items]  # fmt: skip
    widths = [max(len(c[k]) for c in cells) for k in range(len(RMA_COLUMNS) - 1)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(c, widths)) + f"  {c[-1]}" for c in cells]
    return "\n".join(line.rstrip() for line in lines) + "\n"

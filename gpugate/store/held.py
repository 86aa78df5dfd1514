"""Drains the budget held back: `held.jsonl` in the history directory, the one source of
"would drain (budget)" for `gpugate nodes`, `gpugate report`, `gpugate evidence` and `gpugate
resume`.

One entry per held-back drain (node, time, the reason gpugate wanted, why the budget
refused), written by the hooks (gpugate/gate/drain.py) beside the node Comment and the log
line. Bounded, locked and rewritten atomically like drains.jsonl (history.py), and read back
as untrusted in the same way.
"""

from __future__ import annotations

import os
import time

from gpugate import log
from gpugate.store import ledger
from gpugate.store.entries import DrainEntry, HeldEntry
from gpugate.store.history import (
    MAX_ENTRIES,
    MAX_PER_NODE,
    SAME_EVENT_S,
    _add,
    _common_ok,
    _ledger_line,
    _read_lines,
    _select,
    drains,
    history_dir,
    iso,
    reason_check,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpugate.config.schema import Config

HELD = "held.jsonl"
HELD_LABEL = "would drain (budget)"
# A held entry stands for the node's state this long: every prolog (or health check) that
# still finds the fault writes a new one; a node that passed since writes none.
HELD_FRESH_S = 86400


def valid_held(e: object) -> bool:
    """Whether `e` is an entry as record_held() writes it."""
    return _common_ok(e, ("at", "reason", "why", "check")) and type(e.get("reason")) is str


def record_held(state_dir: str, node: str, reason: str, why: str, when: float | None = None,
                *, hook: str | None = None, max_per_node: int = MAX_PER_NODE,
                max_entries: int = MAX_ENTRIES) -> HeldEntry | None:  # fmt: skip
    """Note that the budget held back gpugate's drain of `node` (and its repair ledger line);
    the entry, or None when it repeats the node's last one within SAME_EVENT_S."""
    when = time.time() if when is None else float(when)
    entry = HeldEntry(node=node, when=round(when, 3), at=iso(when), check=reason_check(reason),
                      reason=reason, why=why)  # fmt: skip
    same = lambda last: last.reason == reason and when - last.when < SAME_EVENT_S  # noqa: E731
    added = _add(state_dir, HELD, valid_held, entry, same, max_per_node, max_entries)
    if added is not None:  # a repeat is no new step
        _ledger_line(state_dir, node, ledger.HELD, who=f"gpugate {hook}" if hook else "gpugate",
                     why=why, outcome="held back", check=entry.check, reason=reason,
                     when=entry.when)  # fmt: skip
    return added


def held_entries(
    state_dir: str, node: str | None = None, since: float | None = None
) -> list[HeldEntry]:
    """Held-back drains (of one node, or all; since a time), oldest first."""
    return _select(_read_lines(os.path.join(state_dir, HELD), HeldEntry, valid_held), node, since)


def note_held(config: Config, node: str, reason: str, why: str, hook: str | None = None) -> None:
    """For the hooks: record_held() with the configured place and caps, never raising."""
    adm = config.admin
    try:
        record_held(history_dir(config), node, reason, why, hook=hook,
                    max_per_node=adm.history_max_per_node, max_entries=adm.history_max_entries)  # fmt: skip
    except Exception as exc:  # the Comment and the log line still say it
        log.error(config.state_dir, f"could not record the held drain of {node}", exc)


def current_held(
    held_entries: Iterable[HeldEntry],
    drain_entries: Iterable[DrainEntry],
    now: float | None = None,
) -> dict[str, HeldEntry]:
    """{node: its newest held entry} for nodes whose held drain still stands: fresh
    (HELD_FRESH_S) and with no drain of the node recorded since. The caller drops nodes that
    Slurm shows drained now."""
    now = time.time() if now is None else now
    last_drain: dict[str, float] = {}
    for d in drain_entries:
        last_drain[d.node] = max(last_drain.get(d.node, 0.0), d.when)
    out: dict[str, HeldEntry] = {}
    for h in held_entries:
        if now - h.when < HELD_FRESH_S and h.when > last_drain.get(h.node, -1.0):
            out[h.node] = h  # oldest first: the newest wins
    return out


def held_now(
    config: Config, node: str | None = None, now: float | None = None
) -> dict[str, HeldEntry]:
    """current_held() from the configured history (one node's, or all)."""
    where = history_dir(config)
    return current_held(held_entries(where, node), drains(where, node), now)

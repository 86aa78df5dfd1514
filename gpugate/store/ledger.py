"""The repair ledger: one line per step taken on a node, by gpugate or (as gpugate saw it) a person.

`ledger.jsonl` in the history directory (`admin.history_dir`, shared by the nodes where the
site shares it), append-only like the audit log: each line is one step of a node's repair loop
(issue 45) — the drain, a drain the budget held back, a GPU reset, the reboot asked of Slurm,
the check after the reboot, a qualification, the resume or its refusal, a wait for the node's
jobs, the RMA verdict — with who took it, why, the evidence it rests on (a bundle, a
qualification run) and what came of it. `gpugate nodes NODE` and the report show a node's
lines; `gpugate nodes --rma` the GPUs and nodes whose last verdict is "replace the part".

Writers never raise (`note`): the step already happened, and a ledger that cannot be written
is said in the daemon's log. Readers trust nothing (history._read_lines: a line that is not
one `note` writes is skipped with one warning per read; only the newest READ_MAX bytes).
"""

from __future__ import annotations

import os

from gpugate import jsonl, log

# The steps, the line and its writer live with the history (store/entries.py, history.py),
# which writes the drains' and resumes' own lines: one way between the two modules.
from gpugate.store.entries import ADMIN as ADMIN
from gpugate.store.entries import DRAIN as DRAIN
from gpugate.store.entries import HELD as HELD
from gpugate.store.entries import QUALIFY as QUALIFY
from gpugate.store.entries import REBOOT as REBOOT
from gpugate.store.entries import RECHECK as RECHECK
from gpugate.store.entries import REFUSED as REFUSED
from gpugate.store.entries import RESET as RESET
from gpugate.store.entries import RESUME as RESUME
from gpugate.store.entries import RMA as RMA
from gpugate.store.entries import WAIT as WAIT
from gpugate.store.entries import LedgerEntry
from gpugate.store.history import LEDGER as LEDGER
from gpugate.store.history import LINE_MAX, _read_lines, _select, history_dir
from gpugate.store.history import record_ledger as record
from gpugate.store.history import valid_ledger_line as valid_entry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from gpugate.config.schema import Config

# A health run looks back this far for its own step (a few thousand lines): enough for one
# drain's steps, cheap on every run of a drained node.
RECENT_MAX = 1 << 20


def ledger_path(config: Config) -> str:
    """Where the ledger lives (the history directory)."""
    return os.path.join(history_dir(config), LEDGER)


def note(config: Config, node: str, step: str, **fields: Any) -> LedgerEntry | None:
    """record() in the configured history directory, never raising: the entry, or None when
    it could not be written (said in the error log: the step it records already happened)."""
    try:
        return record(history_dir(config), node, step, **fields)
    except Exception as exc:  # the step happened; only its line is lost
        log.error(config.state_dir, f"could not write the ledger line of {node} ({step})", exc)
        return None


def entries(
    config: Config | str, node: str | None = None, since: float | None = None
) -> list[LedgerEntry]:
    """The ledger's lines (of one node, or all; since an epoch time, or all), oldest first.
    `config`: the config, or the history directory itself."""
    directory = config if isinstance(config, str) else history_dir(config)
    path = os.path.join(directory, LEDGER)
    return _select(_read_lines(path, LedgerEntry, valid_entry), node, since)


def recent(config: Config, node: str, since: float) -> list[LedgerEntry]:
    """The node's lines since `since` in the ledger's newest RECENT_MAX bytes: what a health
    run reads to say a step once (the whole ledger is never trimmed: it is the record)."""
    path = ledger_path(config)
    try:
        found, _, _ = jsonl.load(path, valid_entry, RECENT_MAX, LINE_MAX)
    except OSError:
        return []
    out = []
    for e in found:
        if e["node"] == node and e["when"] >= since:
            try:
                out.append(LedgerEntry.from_json(e, path))
            except ValueError:
                continue
    return out


def last(found: Iterable[LedgerEntry], step: str | None = None) -> LedgerEntry | None:
    """The newest of `found` (of `step`, or any), or None."""
    return next((e for e in reversed(list(found)) if step is None or e.step == step), None)

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
import time

from gpugate import jsonl, log
from gpugate.jsonl import append
from gpugate.store.entries import LedgerEntry
from gpugate.store.history import (
    LINE_MAX,
    _common_ok,
    _lock,
    _read_lines,
    _select,
    _unlocked,
    history_dir,
    iso,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from gpugate.config.schema import Config

LEDGER = "ledger.jsonl"
# A health run looks back this far for its own step (a few thousand lines): enough for one
# drain's steps, cheap on every run of a drained node.
RECENT_MAX = 1 << 20

# The steps, in the order a repair goes (gpugate/health/ladder.py decides them).
DRAIN = "drain"  # gpugate drained the node (the check, the reason, the bundle)
HELD = "held"  # the drain budget held gpugate's drain back
HEAL = "heal"  # a transient fault passed its stability window and re-check
RESET = "reset"  # nvidia-smi -r on the failing GPUs
RECHECK = "recheck"  # the checklist after a reset or a reboot
REBOOT = "reboot"  # scontrol reboot ASAP nextstate=DOWN asked of Slurm
WAIT = "wait"  # a step waits for the node's jobs to end (job-safe: IDLE+DRAIN only)
QUALIFY = "qualify"  # a qualification started, passed or failed
RESUME = "resume"  # the node went back in service
REFUSED = "refused"  # a resume that did not happen, and why
RMA = "rma"  # the same GPU or check failed again: replace the part; stays drained
ADMIN = "admin"  # a person's act on gpugate's drain (a manual resume, a drain of theirs)
STEPS = (DRAIN, HELD, HEAL, RESET, RECHECK, REBOOT, WAIT, QUALIFY, RESUME, REFUSED, RMA, ADMIN)

_TEXT = ("at", "step", "who", "why", "outcome", "evidence", "check", "gpu", "reason")
# A line longer than this is not one gpugate wrote (a reason is at most a few hundred bytes).
_FIELD_MAX = 4096


def valid_entry(e: object) -> bool:
    """Whether `e` is a line as `note` writes it (the types and the step the readers rely on)."""
    if not _common_ok(e, _TEXT):
        return False
    return e.get("step") in STEPS and all(len(e.get(k) or "") <= _FIELD_MAX for k in _TEXT)


def ledger_path(config: Config) -> str:
    """Where the ledger lives (the history directory)."""
    return os.path.join(history_dir(config), LEDGER)


def record(
    directory: str,
    node: str,
    step: str,
    *,
    who: str,
    why: str = "",
    outcome: str = "",
    evidence: str | None = None,
    check: str | None = None,
    gpu: str | None = None,
    reason: str | None = None,
    when: float | None = None,
) -> LedgerEntry:
    """Append one step to the ledger in the history directory `directory`; the entry.
    Raises ValueError for an unknown step, OSError when it cannot be written."""
    if step not in STEPS:
        raise ValueError(f"ledger: {step!r} is not a step ({', '.join(STEPS)})")
    when = time.time() if when is None else float(when)
    entry = LedgerEntry(
        node=node, when=round(when, 3), at=iso(when), step=step, who=who,
        why=why[:_FIELD_MAX], outcome=outcome[:_FIELD_MAX], evidence=evidence, check=check,
        gpu=gpu, reason=reason[:_FIELD_MAX] if reason else None,
    )  # fmt: skip
    with _lock(directory) as lock:  # an append is one O_APPEND write: the lock orders them
        _unlocked(lock, os.path.join(directory, LEDGER))
        append(os.path.join(directory, LEDGER), [entry.to_json()], sync=True)
    return entry


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

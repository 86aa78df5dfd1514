"""Drain history and the resume audit log, kept in the state directory (`admin.history_dir`).

Two files, both JSON lines (one object per line, oldest first):

- `drains.jsonl`: one entry per drain gpugate set (node, time, check, reason, category, bundle).
  Bounded: at most `admin.history_max_per_node` entries per node and `history_max_entries` in
  all (the oldest go first). Rewritten whole and atomically on every drain, so a reader never
  sees half a file and needs no lock.
- `audit.jsonl`: append-only, one line per resume or refused resume (who, when, why, the
  check's result, forced, resumed). Never trimmed: it is the audit log.
- `held.jsonl`: the drains the budget held back (gpugate/store/held.py).
- `unknown-xids.jsonl`: one entry per hook run that saw Xids NVIDIA's catalog does not list
  (node, time, the codes): they warn and never drain, so no drain entry would show them to
  `gpugate nodes`. Bounded and rewritten like drains.jsonl.

Writers (prologs and epilogs of many jobs, on many nodes when the directory is shared) take an
exclusive `fcntl.flock` on `locks/history.lock` (0600 in a 0700 directory: no user can open it,
gpugate/store/locks.py) for the read-modify-write, waiting at most locks.HISTORY_WAIT_S: past
that they write without it (an atomic rewrite, so the file is never torn; at worst an entry is
lost to the writer that held the lock) rather than lose their own entry or stall a hook. Drains
are rare, so a whole rewrite is cheap next to the Slurm call that caused it.

Both files are 0640, root and the admin group's (fsutil). Readers trust neither: an entry
that is not what gpugate writes (a torn line, `[]`, `{"node": 5}`, `{"when": "x"}`, binary,
a line of a gigabyte) is skipped with one warning per read, and only the newest READ_MAX
bytes are read, so a bad file can neither crash a hook or a listing nor stall them.
"""

from __future__ import annotations

import os
import pwd
import time

from gpugate import jsonl, log
from gpugate.checks import registry
from gpugate.checks.sources.kernel_log import boot_id
from gpugate.clock import utc
from gpugate.fsutil import (
    PRIVATE_FILE,
    STATE_DIR_MODE,
    FileLock,
    atomic_write,
    dir_group,
    lock_file,
    private_dir,
)
from gpugate.jsonl import append, dumps
from gpugate.slurm.reasons import drill_mark, reason_drill

# Drain reasons are built and read back in one place (re-exported for the history's readers:
# `name as name` says so to mypy).
from gpugate.slurm.reasons import reason_bundle as reason_bundle
from gpugate.slurm.reasons import reason_check as reason_check
from gpugate.store import locks

# Where the history lives (store/dirs.py, below the lock list that names those directories).
from gpugate.store.dirs import CONTROLLER as CONTROLLER
from gpugate.store.dirs import controller_dir as controller_dir
from gpugate.store.dirs import history_dir as history_dir
from gpugate.store.dirs import read_dirs as read_dirs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, TypeGuard, TypeVar

    from gpugate.config.schema import Config
    from gpugate.fsutil import FileLock
    from gpugate.store.entries import (
        AuditEntry,
        DrainEntry,
        LedgerEntry,
        NodeEntry,
        UnknownXidsEntry,
    )

    _R = TypeVar("_R", bound=NodeEntry)
    # A line: its record, or (the stores that have none yet: votes, flags, qualifications,
    # drills) the dict its `valid` checked.
    _E = TypeVar("_E", bound="NodeEntry | dict[str, Any]")

DRAINS = "drains.jsonl"
AUDIT = "audit.jsonl"
UNKNOWN_XIDS = "unknown-xids.jsonl"
LOCK = locks.HISTORY  # in <history_dir>/locks/
MAX_PER_NODE = 50
MAX_ENTRIES = 20000
# 20,000 entries of a few hundred bytes: a few MB. Beyond READ_MAX only the newest part is
# read (the older entries are the first dropped anyway); a line longer than LINE_MAX is not
# one gpugate wrote (Slurm cuts drain reasons far shorter).
READ_MAX = 32 * 1024 * 1024
LINE_MAX = 64 * 1024
# time.gmtime() fails past year 9999; a time before 1970 is not a drain gpugate saw.
_WHEN_MAX = 253402300799.0
# A second drain of the same node for the same check this soon after the first, with no
# resume in between, is the same event seen twice (the prologs of two jobs starting together
# on one node both find the fault).
SAME_EVENT_S = 600


def iso(when: float | None) -> str:
    """Epoch seconds as `2026-11-29T10:00:00Z` (empty for None)."""
    return "" if when is None else utc(when)


def _lock(directory: str) -> FileLock:
    """The exclusive lock of the directory's history, for one read-modify-write (bounded)."""
    if not os.path.isdir(directory):
        private_dir(directory, STATE_DIR_MODE, gid=-1)  # group: secure_state_dir
    return FileLock(lock_file(directory, LOCK), wait_s=locks.HISTORY_WAIT_S)


def _unlocked(lock: FileLock, path: str) -> None:
    """Say that `path` is written without its lock (another writer held it past the wait)."""
    if not lock.held:
        log.say(f"{path}: {LOCK} held over {locks.HISTORY_WAIT_S:g} s by another writer: "
                "written without it")  # fmt: skip


def _read_lines(
    path: str,
    kind: type[_R],
    valid: Callable[[object], bool],
    where: Callable[[dict[str, Any]], bool] | None = None,
) -> list[_R]:
    """The entries of a JSON-lines file that `valid` accepts and `kind` reads; the others are
    skipped, with one warning for the whole file (never an exception: the file may be hostile
    or torn). `where`: a cheap test of the raw line first (a node's, a GPU's): a line it
    refuses is neither checked nor read, nor counted as malformed."""
    read: list[_R] = []

    def take(e: object) -> bool:  # valid's ranges, then the record's types
        if where is not None and type(e) is dict and not _passes(where, e):
            return True  # not wanted: no cost, no warning
        if not valid(e):
            return False
        try:
            read.append(kind.from_json(e, path))
        except ValueError:
            return False
        return True

    _read_dicts(path, take)
    return read


def _passes(where: Callable[[dict[str, Any]], bool], e: dict[str, Any]) -> bool:
    """`where(e)` on a raw line; a line it cannot judge (a hostile type) goes on to `valid`."""
    try:
        return bool(where(e))
    except Exception:
        return True


def _read_dicts(path: str, valid: Callable[[object], bool]) -> list[dict[str, Any]]:
    """The entries `valid` accepts, as dicts (_read_lines' warnings)."""
    try:
        kept, skipped, size = jsonl.load(path, valid, READ_MAX, LINE_MAX)
    except OSError:
        return []
    if size > READ_MAX:
        log.say(f"{path}: {size} bytes, more than gpugate writes: read only the newest "
                f"{READ_MAX >> 20} MiB")  # fmt: skip
    if skipped:
        log.say(f"{path}: skipped {skipped} malformed entr{'y' if skipped == 1 else 'ies'}")
    return kept


def _when_ok(when: object) -> bool:
    # bool is an int: `"when": true` is not a time. NaN fails both comparisons.
    if type(when) not in (int, float) or not isinstance(when, (int, float)):  # the 2nd: mypy's
        return False
    return 0 <= when <= _WHEN_MAX


_DRAIN_TEXT = ("at", "check", "reason", "category", "bundle", "job", "hook", "boot_id", "drill",
               "gpu")  # fmt: skip
_RESUME_TEXT = ("at", "who", "why", "reason", "boot_id", "repair")


def _common_ok(e: object, texts: tuple[str, ...]) -> TypeGuard[dict[str, Any]]:
    if type(e) is not dict:
        return False
    node = e.get("node")
    if type(node) is not str or not 0 < len(node) <= 255 or not _when_ok(e.get("when")):
        return False
    return all(type(e.get(k)) in (str, type(None)) for k in texts)


def valid_drain(e: object) -> bool:
    """Whether `e` is a drain entry as record_drain() writes it (the types readers rely on)."""
    if not _common_ok(e, _DRAIN_TEXT):
        return False
    return type(e.get("xid")) in (int, type(None))


def drill_of(drain: DrainEntry) -> str | None:
    """The drill a drain entry was a drill's (its `drill` id, else its reason's DRILL mark)."""
    return drain.drill or reason_drill(drain.reason)


def valid_resume(e: object) -> bool:
    """Whether `e` is an audit entry as record_resume() writes it."""
    if not _common_ok(e, _RESUME_TEXT):
        return False
    return all(type(e.get(k, False)) is bool for k in ("forced", "resumed"))


def _node(entry: NodeEntry | dict[str, Any]) -> str:
    return str(entry["node"]) if isinstance(entry, dict) else entry.node


def _when(entry: NodeEntry | dict[str, Any]) -> float:
    return float(entry.get("when", 0)) if isinstance(entry, dict) else entry.when


def _trim(entries: list[_E], max_per_node: int, max_entries: int) -> list[_E]:
    """Keep the newest `max_per_node` of each node, then the newest `max_entries` in all."""
    seen: dict[str, int] = {}
    kept = []
    for entry in reversed(entries):  # newest first
        n = seen.get(_node(entry), 0)
        if n < max_per_node:
            seen[_node(entry)] = n + 1
            kept.append(entry)
    kept = kept[:max_entries]
    kept.reverse()
    return kept


def record_drain(
    state_dir: str,
    node: str,
    reason: str,
    check: str | None = None,
    category: str | None = None,
    bundle: str | None = None,
    when: float | None = None,
    *,
    xid: int | None = None,
    job: str | None = None,
    hook: str | None = None,
    boot_id: str | None = None,
    drill: str | None = None,
    gpu: str | None = None,
    max_per_node: int = MAX_PER_NODE,
    max_entries: int = MAX_ENTRIES,
) -> DrainEntry | None:
    """Add one drain to the node's history; the entry, or None when it repeats the last one."""
    from gpugate.store.entries import DrainEntry  # late: a healthy hook run writes no history

    when = time.time() if when is None else float(when)
    entry = DrainEntry(
        node=node, when=round(when, 3), at=iso(when), check=check or reason_check(reason),
        reason=reason, category=category, xid=xid, bundle=bundle, job=job, hook=hook,
        boot_id=boot_id,  # repair evidence: a lift after a new boot followed a reboot
        # A drill's drain (gpugate/drill): never a fault, never a false drain.
        drill=drill or reason_drill(reason),
        gpu=gpu or None,  # the failing GPU's serial (else UUID): its repeats count to its RMA
    )  # fmt: skip
    same = lambda last: _same_event(state_dir, last, entry)  # noqa: E731
    added = _add(state_dir, DRAINS, valid_drain, entry, same, max_per_node, max_entries)
    if added is not None:  # a repeat the history skips is no new step either
        # A drill's drain is a real drain of the node (its resume is a step too): written,
        # with the drill named, so the ledger never shows a resume of nothing.
        why = f"drill {entry.drill}: {reason}" if entry.drill else reason
        _ledger_line(state_dir, node, "drain", who=f"gpugate {hook}" if hook else "gpugate",
                     why=why, outcome="drained", evidence=bundle, check=entry.check,
                     gpu=entry.gpu, reason=reason, when=entry.when)  # fmt: skip
    return added


LEDGER = "ledger.jsonl"


_LEDGER_TEXT = ("at", "step", "who", "why", "outcome", "evidence", "check", "gpu", "reason")
# A line longer than this is not one gpugate wrote (a reason is at most a few hundred bytes).
_FIELD_MAX = 4096


def valid_ledger_line(e: object) -> bool:
    """Whether `e` is a ledger line as record_ledger writes it (the types and the step)."""
    from gpugate.store.entries import LEDGER_STEPS  # late: a healthy hook run reads no ledger

    if not _common_ok(e, _LEDGER_TEXT):
        return False
    return e.get("step") in LEDGER_STEPS and all(
        len(e.get(k) or "") <= _FIELD_MAX for k in _LEDGER_TEXT
    )


def record_ledger(
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
    """Append one step to the repair ledger (store/ledger.py) in the history directory
    `directory`; the entry. Raises ValueError for an unknown step, OSError when it cannot be
    written."""
    from gpugate.store.entries import LEDGER_STEPS, LedgerEntry  # late: as the other writers

    if step not in LEDGER_STEPS:
        raise ValueError(f"ledger: {step!r} is not a step ({', '.join(LEDGER_STEPS)})")
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


def _ledger_line(directory: str, node: str, step: str, **fields: Any) -> None:
    """The repair ledger's line of a step this module recorded, never raising: the step
    happened and is in the history; only its ledger line is lost (said to stderr and syslog:
    there is no config here to find the daemon's log)."""
    try:
        record_ledger(directory, node, step, **fields)
    except Exception as exc:
        log.alarm(f"could not write the ledger line of {node} ({step}): "
                  f"{type(exc).__name__}: {exc}")  # fmt: skip


def _add(
    state_dir: str,
    name: str,
    valid: Callable[[object], bool],
    entry: _E,
    repeats: Callable[[_E], bool],
    max_per_node: int,
    max_entries: int,
) -> _E | None:
    """Append `entry` to the bounded file `name` under the lock (rewritten whole, atomically);
    the entry, or None when `repeats` says it repeats its node's last one."""
    path = os.path.join(state_dir, name)
    with _lock(state_dir) as lock:
        _unlocked(lock, path)
        entries: list[Any] = (
            _read_dicts(path, valid)
            if isinstance(entry, dict)
            else _read_lines(path, type(entry), valid)
        )
        last = next((e for e in reversed(entries) if _node(e) == _node(entry)), None)
        if last and repeats(last):
            return None
        entries.append(entry)
        kept = _trim(entries, max_per_node, max_entries)
        text = dumps([e if isinstance(e, dict) else e.to_json() for e in kept])
        atomic_write(path, text, PRIVATE_FILE, gid=dir_group(state_dir))
    return entry


def _same_event(state_dir: str, last: DrainEntry, new: DrainEntry) -> bool:
    if last.check != new.check or new.when - last.when >= SAME_EVENT_S:
        return False
    if last.drill != new.drill:  # a drill's drain and a real fault's: two events
        return False
    try:
        # Any resume logged since (of any node: one stat, not a read of the audit log) makes
        # the new drain a new event.
        return bool(os.stat(os.path.join(state_dir, AUDIT)).st_mtime < last.when)
    except OSError:
        return True  # no audit log: nothing was resumed


def record_resume(
    state_dir: str,
    node: str,
    who: str | None = None,
    why: str = "",
    result: object = None,
    forced: bool = False,
    when: float | None = None,
    *,
    reason: str | None = None,
    resumed: bool = True,
    boot_id: str | None = None,
    repair: str | None = None,
    qualification: dict[str, Any] | None = None,
    step: str | None = None,
) -> AuditEntry:
    """Append one resume (or, with resumed=False, a refused one) to the audit log: who, when,
    why, the check's result; the entry. Its repair ledger line (store/ledger.py) is `step`,
    else reset (a GPU reset), resume or refused."""
    from gpugate.store.entries import AuditEntry  # late: a healthy hook run writes no history

    when = time.time() if when is None else float(when)
    entry = AuditEntry(
        node=node, when=round(when, 3), at=iso(when), who=who or current_user(), why=why,
        result=result, forced=bool(forced), resumed=bool(resumed),
        reason=reason,  # the drain reason the node had before
        # Repair evidence (repair_evidence), only when known: the node's boot when lifted,
        # and a repair audited on the drained node ("gpu reset").
        boot_id=boot_id or None, repair=repair or None,
        qualification=qualification or None,  # the lift's proof (admin/resume.py: Proof)
    )  # fmt: skip
    with _lock(state_dir) as lock:  # an append (one O_APPEND write) is safe without it, too
        _unlocked(lock, os.path.join(state_dir, AUDIT))
        append(os.path.join(state_dir, AUDIT), [entry.to_json()], sync=True)
    _ledger_line(state_dir, node, step or _audit_step(entry), who=entry.who or "", why=why,
                 outcome=_outcome(result, entry.resumed), reason=reason, when=entry.when,
                 evidence=_qualify_evidence(qualification, result))  # fmt: skip
    return entry


def _audit_step(entry: AuditEntry) -> str:
    """The ledger step of an audit entry: a GPU reset, a reboot, a resume or a refused one."""
    if entry.repair == GPU_RESET:
        return "reset"
    if entry.repair == REBOOT:
        return "reboot"
    return "resume" if entry.resumed else "refused"


_OUTCOME_MAX = 160


def _outcome(result: object, resumed: bool) -> str:
    """A short form of an audit's result: its first clause (`refused: why`, `repair: gpu
    reset`), else resumed / not resumed."""
    head = result.split(";")[0].strip() if isinstance(result, str) else ""
    if not head:
        return "resumed" if resumed else "not resumed"
    return head if len(head) <= _OUTCOME_MAX else head[: _OUTCOME_MAX - 3] + "..."


def _qualify_evidence(qualification: dict[str, Any] | None, result: object) -> str | None:
    """The qualification a resume rests on, as `qualify <run> (job <ids>)`: a resume's proof
    (admin/resume.py: Proof.to_dict) or a settled run's result (qualify/settle.py)."""
    if qualification:
        run, jobs = qualification.get("run_id"), qualification.get("job_ids")
    elif isinstance(result, dict) and result.get("qualify"):
        run, jobs = result.get("qualify"), result.get("job_ids")
    else:
        return None
    ids = ", ".join(str(j) for j in jobs or ())
    text = f"qualify {run}" if run else "qualify"
    return f"{text} (job {ids})" if ids else text


def current_user() -> str:
    """Who is running this: the sudo caller when there is one, else the login name."""
    sudo = os.environ.get("SUDO_USER")
    if sudo:
        return sudo

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _select(entries: list[_E], node: str | None, since: float | None) -> list[_E]:
    return [
        e
        for e in entries
        if (node is None or _node(e) == node) and (since is None or _when(e) >= since)
    ]


def drains(
    state_dir: str,
    node: str | None = None,
    since: float | None = None,
    where: Callable[[dict[str, Any]], bool] | None = None,
) -> list[DrainEntry]:
    """Drain entries (of one node, or all; since an epoch time, or all), oldest first.
    `where`: a cheap test of each raw line before it is checked and read (_read_lines)."""
    from gpugate.store.entries import DrainEntry  # late: a healthy hook run writes no history

    path = os.path.join(state_dir, DRAINS)
    return _select(_read_lines(path, DrainEntry, valid_drain, where), node, since)


def resumes(
    state_dir: str, node: str | None = None, since: float | None = None
) -> list[AuditEntry]:
    """Resume entries of the audit log (of one node, or all; since a time), oldest first."""
    from gpugate.store.entries import AuditEntry  # late: a healthy hook run writes no history

    path = os.path.join(state_dir, AUDIT)
    return _select(_read_lines(path, AuditEntry, valid_resume), node, since)


def window_start(window_days: float, now: float | None = None) -> float:
    """The epoch time `window_days` before now."""
    return (time.time() if now is None else now) - window_days * 86400


def count_drains(
    state_dir: str,
    node: str,
    window_days: float,
    now: float | None = None,
    check: str | None = None,
) -> int:
    """How many times gpugate drained `node` (for `check`, or any) in the last `window_days`;
    a drill's drains are simulated faults: never counted (no RMA, no repeat offender)."""
    found = drains(state_dir, node, window_start(window_days, now))
    return sum(1 for e in found if (check is None or e.check == check) and not drill_of(e))


def reaches_rma(hardware: bool, same_check_drains: int, rma_after: int) -> bool:
    """The RMA rule: a hardware check that drained the node `rma_after` times (0: never)."""
    return bool(hardware and rma_after and same_check_drains >= rma_after)


def needs_repair(check_id: str) -> bool:
    """Whether the check's faults are of the hardware class (a hot GPU is not a part to replace)."""
    return registry.fault_class(check_id) == registry.HARDWARE


def rma_candidate(config: Config, node: str, check_id: str, now: float | None = None) -> bool:
    """Whether `node` is an RMA candidate for `check_id`: drained `admin.rma_after_drains`
    times for that hardware check within `admin.history_window_days` (never lift it)."""
    adm = config.admin
    if not needs_repair(check_id) or not adm.rma_after_drains:
        return False
    same = count_drains(history_dir(config), node, adm.history_window_days, now, check_id)
    return reaches_rma(True, same, adm.rma_after_drains)


def by_node(entries: Iterable[_E]) -> dict[str, list[_E]]:
    """Entries grouped by node, each list in the order given."""
    out: dict[str, list[_E]] = {}
    for e in entries:
        out.setdefault(_node(e), []).append(e)
    return out


def note_drain(config: Config, node: str, reason: str, **fields: Any) -> DrainEntry | None:
    """For the hooks: record_drain() with the configured place and caps, never raising."""
    adm = config.admin

    if "boot_id" not in fields:  # the hooks pass their facts' boot id; others get this node's
        fields["boot_id"] = boot_id(config)  # repair evidence: a later lift after a new boot
    fields.setdefault("drill", drill_mark())  # under a drill's overlay: its drain, marked
    try:
        return record_drain(
            history_dir(config),
            node,
            reason,
            max_per_node=adm.history_max_per_node,
            max_entries=adm.history_max_entries,
            **fields,
        )
    except Exception as exc:  # the drain itself already happened: nothing here may undo it
        log.error(config.state_dir, f"could not record the drain of {node} in the history", exc)
        return None


def valid_unknown_xids(e: object) -> bool:
    """Whether `e` is an entry as record_unknown_xids() writes it (a non-empty list of codes)."""
    if not _common_ok(e, ("at", "job", "hook")):
        return False
    codes = e.get("xids")
    return type(codes) is list and 0 < len(codes) <= 64 and all(type(c) is int for c in codes)


def record_unknown_xids(
    state_dir: str,
    node: str,
    xids: Iterable[int],
    when: float | None = None,
    *,
    job: str | None = None,
    hook: str | None = None,
    max_per_node: int = MAX_PER_NODE,
    max_entries: int = MAX_ENTRIES,
) -> UnknownXidsEntry | None:
    """Note the Xids outside NVIDIA's catalog one hook run saw on `node`; the entry, or None
    when there were none or it repeats the node's last entry within SAME_EVENT_S."""
    from gpugate.store.entries import UnknownXidsEntry  # late: a healthy hook run writes no history

    codes = sorted({int(c) for c in xids})[:64]
    if not codes:
        return None
    when = time.time() if when is None else float(when)
    entry = UnknownXidsEntry(node=node, when=round(when, 3), at=iso(when), xids=codes, job=job,
                             hook=hook)  # fmt: skip
    # The prologs of jobs starting together report the same lines: one entry.
    same = lambda last: last.xids == codes and when - last.when < SAME_EVENT_S  # noqa: E731
    return _add(state_dir, UNKNOWN_XIDS, valid_unknown_xids, entry, same, max_per_node, max_entries)


def unknown_xids(
    state_dir: str, node: str | None = None, since: float | None = None
) -> list[UnknownXidsEntry]:
    """Entries of Xids outside the catalog (of one node, or all; since a time), oldest first."""
    from gpugate.store.entries import UnknownXidsEntry  # late: a healthy hook run writes no history

    path = os.path.join(state_dir, UNKNOWN_XIDS)
    return _select(_read_lines(path, UnknownXidsEntry, valid_unknown_xids), node, since)


def note_unknown_xids(config: Config, node: str, xids: Iterable[int], **fields: Any) -> None:
    """For the hooks: record_unknown_xids() with the configured place and caps, never raising."""
    adm = config.admin
    try:
        record_unknown_xids(history_dir(config), node, xids,
                            max_per_node=adm.history_max_per_node,
                            max_entries=adm.history_max_entries, **fields)  # fmt: skip
    except Exception as exc:  # a report only: the hook's verdict stands
        log.error(config.state_dir, f"could not record the unknown Xids of {node}", exc)


# ------------------------------------------------------------------- repair evidence

REBOOT = "reboot"
GPU_RESET = "gpu reset"


def record_repair(
    state_dir: str,
    node: str,
    repair: str,
    why: str = "",
    when: float | None = None,
    who: str | None = None,
) -> AuditEntry:
    """Audit a repair done on a drained node (GPU_RESET; a reboot shows by its boot id);
    `who`: the hook that did it (default: this process's user, as for a resume)."""
    return record_resume(state_dir, node, who=who, why=why or repair, result=f"repair: {repair}",
                         when=when, resumed=False, repair=repair)  # fmt: skip


def repair_evidence(
    drain: DrainEntry, lift: AuditEntry, audit: Iterable[AuditEntry] = ()
) -> str | None:
    """What repaired the node between `drain` and `lift` (a drain entry and an audit entry of
    the same node): REBOOT when their boot ids differ, the repair an audit entry between them
    (or the lift itself) names, else None. The one definition of "repaired" for the counts
    and for healing."""
    before, after = drain.boot_id, lift.boot_id
    if before and after and before != after:
        return REBOOT
    if lift.repair:
        return lift.repair
    for e in audit:
        if e.repair and e.node == drain.node and drain.when <= e.when <= lift.when:
            return e.repair
    return None


def lifted_without_repair(
    drain: DrainEntry, lift: AuditEntry, audit: Iterable[AuditEntry] = ()
) -> bool:
    """True when `lift` (an audit entry that resumed the node) shows no repair since `drain`."""
    return lift.resumed and repair_evidence(drain, lift, audit) is None

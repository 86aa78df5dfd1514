"""The node's record of application-class Xids per job: what kernel.xid's cross-job rule reads.

One JSON object a line in `<state_dir>/app_xids.jsonl` (root only, 0600): `{"t": epoch,
"gpu": "0000:38:00", "xid": 31, "job": "77", "uid": 1000, "pid": 1234, "name": "python"}`.
The epilog appends the application-class Xids (xid.APP_XIDS) seen on the job's GPUs while the
job ran, one O_APPEND write per job under an flock (the file is node-local; the lock is root's
only and waited for at most locks.APP_XIDS_WAIT_S: past that the job's lines are appended
without it and the pruning waits for the next job). Readers validate
every line and skip bad ones; the file is kept to the window and to MAX_ENTRIES lines, so a
job raising a million Xids costs one bounded file.
"""

from __future__ import annotations

import os

from gpugate import log
from gpugate.checks.xid import APP_XIDS, normalize_pci, parse_xid
from gpugate.fsutil import FileLock, atomic_write, lock_file
from gpugate.jsonl import append, dumps, read_tail
from gpugate.jsonl import parse as parse_lines
from gpugate.jsonrecord import JsonRecord
from gpugate.regex import lazy
from gpugate.store import locks

NAME = "app_xids.jsonl"
MAX_ENTRIES = 2000  # lines kept; per job at most PER_JOB_MAX
PER_JOB_MAX = 16  # one line per (GPU, Xid) is all the rule needs
MAX_LINE = 1024
_PCI = lazy(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}$")
_JOB = lazy(r"^[0-9]+(?:_[0-9]+)?$")

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import ClassVar

    from gpugate.checks.facts import Facts
    from gpugate.config.schema import Config
    from gpugate.slurm.hookenv import HookEnv


class AppXidEntry(JsonRecord):
    """`app_xids.jsonl`: one application-class Xid a job raised on one of its GPUs."""

    t: float
    gpu: str
    xid: int
    job: str
    uid: int | None = None
    pid: int | None = None
    name: str | None = None

    _doc: ClassVar[dict[str, str]] = {
        "t": "epoch seconds (the job's epilog)",
        "gpu": "the GPU's PCI address (`0000:38:00`)",
        "xid": "the Xid (13, 31, 43, ...)",
        "job": "the job that raised it",
        "uid": "the job's user (Slurm's uid)",
        "pid": "the process the kernel line names (null: `<unknown>`)",
        "name": "its name (`python`)",
    }


def job_events(
    lines: list[str],
    env: HookEnv,
    facts: Facts,
    now: float,
    holds: Callable[[int], bool] | None = None,
) -> list[AppXidEntry]:
    """One entry per (GPU, Xid) of the application-class Xids on the job's GPUs in `lines`.

    `lines` are the kernel lines since the job's prolog: an Xid raised there on one of the
    job's GPUs (the line names the process, `pid=..., name=...`) is the job's. `holds` tells
    the job's GPUs by their NVML index in `facts` (the epilog's gate.allocation.JobGpus, by
    device); without it SLURM_JOB_GPUS is read as NVML indices.
    """
    if not env.job_id or not _JOB.match(env.job_id):
        return []

    events = [e for e in map(parse_xid, lines) if e and e.pci and e.code in APP_XIDS]
    if not events:  # the common end: the job's GPUs need not be told (gres.conf unread)
        return []

    def by_index(index: int) -> bool:
        return env.gpus is None or index in env.gpus

    ours = holds or by_index
    mine = {normalize_pci(g.pci_bus_id) for g in facts.gpus or () if g.pci_bus_id and ours(g.index)}
    seen: dict[tuple[str, int], AppXidEntry] = {}
    for event in events:
        if event.pci is None or event.pci not in mine:
            continue
        key = (event.pci, event.code)
        if key not in seen and len(seen) < PER_JOB_MAX:
            seen[key] = AppXidEntry(t=round(now, 3), gpu=event.pci, xid=event.code,
                                    job=env.job_id, uid=env.uid, pid=event.pid,
                                    name=event.process)  # fmt: skip
    return list(seen.values())


def valid(entry: object) -> bool:
    """Whether one parsed line is a well-formed entry (the ranges; AppXidEntry the types)."""
    if not isinstance(entry, dict):
        return False
    t, gpu, xid, job, uid = (entry.get(k) for k in ("t", "gpu", "xid", "job", "uid"))
    return (
        isinstance(t, (int, float)) and not isinstance(t, bool)
        and isinstance(gpu, str) and bool(_PCI.match(gpu))
        and isinstance(xid, int) and not isinstance(xid, bool) and 0 < xid < 10**6
        and isinstance(job, str) and bool(_JOB.match(job))
        and (uid is None or (isinstance(uid, int) and not isinstance(uid, bool) and uid >= 0))
    )  # fmt: skip


def parse(text: str, since: float) -> tuple[list[AppXidEntry], int]:
    """(valid entries newer than `since`, number of bad lines skipped)."""
    return _select(parse_lines(text.encode(), MAX_LINE), since)


def _select(values: list[object], since: float) -> tuple[list[AppXidEntry], int]:
    good = [e for e in (_entry(v) for v in values) if e is not None]
    newer = [e for e in good if e.t >= since]
    return newer[-MAX_ENTRIES:], len(values) - len(good)


def _entry(value: object) -> AppXidEntry | None:
    """The record of one parsed line, or None for a bad one."""
    if not valid(value):
        return None
    try:
        return AppXidEntry.from_json(value, NAME)
    except ValueError:
        return None


def _read(path: str, since: float) -> tuple[list[AppXidEntry], int]:
    """parse() of the file's newest part (OSError as jsonl.read_tail raises it)."""
    data, _size = read_tail(path, MAX_ENTRIES * MAX_LINE * 2)
    return _select(parse_lines(data, MAX_LINE), since)


def load(config: Config, now: float) -> list[AppXidEntry]:
    """The entries within `checks.kernel.app_xid_window_h` of `now`; [] when there is no file."""
    path = os.path.join(config.state_dir, NAME)
    try:
        entries, bad = _read(path, now - config.checks.kernel.app_xid_window_h * 3600)
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.say(f"app-Xid history {path}: not read: {exc.strerror}")
        return []
    if bad:
        log.say(f"app-Xid history {path}: {bad} bad line(s) skipped")
    return entries


def record(config: Config, entries: list[AppXidEntry], now: float) -> bool:
    """Append this job's entries (root only), then keep the file to the window; True if written."""
    if not entries:
        return True
    path = os.path.join(config.state_dir, NAME)
    try:
        os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
        # A lock file apart from the data: pruning replaces the data file's inode.
        lock = FileLock(lock_file(config.state_dir, locks.APP_XIDS), wait_s=locks.APP_XIDS_WAIT_S)
        with lock:
            lines = [e.to_json() for e in entries]
            size = append(path, [e for e in lines if valid(e)], 0o600, gid=-1)
            if lock.held and size > MAX_ENTRIES * MAX_LINE // 4:
                _prune(path, config, now)
        if not lock.held:
            log.say(f"app-Xid history {path}: lock held over {locks.APP_XIDS_WAIT_S:g} s: "
                    "appended without it, not pruned")  # fmt: skip
        return True
    except OSError as exc:  # bookkeeping never fails the hook
        log.say(f"app-Xid history {path}: not written: {exc.strerror}")
        return False


def _prune(path: str, config: Config, now: float) -> None:
    """Rewrite the file with its valid entries within the window (the caller holds the lock)."""
    entries, _ = _read(path, now - config.checks.kernel.app_xid_window_h * 3600)
    atomic_write(path, dumps([e.to_json() for e in entries]), mode=0o600)

"""The controller's view of a job's evidence: one small decision record per node and run.

EpilogSlurmctld runs as SlurmUser (`slurm` on Debian and RHEL), which may not read the
evidence bundles (root's and the admin group's: logs can hold secrets). So each node epilog
(root) writes, beside its bundle, what the controller decides on and nothing else, no log text:

    <evidence_dir>/controller-view/<job id>/<node>-r<restarts>.json

Root's and SlurmUser's only (issue 41: a record tells another user's failure category,
times, checkpoint staleness and the shape of its collectives): `controller-view/` and the job
directories are 0750 root:<view group>, the records 0640, written atomically. The view group
is `epilog.view_group` (SlurmUser's group, `slurm` by default) where this node has it, else
the group `controller-view/` already has (the package or the admin set it; selftest checks
that SlurmUser reaches the records). evidence_dir stays passable (o+x): SlurmUser is not in
its admin group. No path of the user's is in a record (a stale checkpoint's message names
"the checkpoint directory").

The epilog writes `{"state": "running", "deadline": <epoch>}` when it starts and
`{"state": "done", ...}` when it ends, so the controller waits exactly as long as a node
epilog may still be writing (`wait_for_records`), and never longer. A normal end (no bundle:
the job ended well, or the prolog refused it here) removes the record instead, so not every
job leaves a file: the controller waits for evidence only after an abnormal end, which the
node epilog sees too (the job's exit code) and answers with a bundle. A record goes with its
bundle when the node prunes it (evidence.remove_view).

A large job (issue 32): each node epilog that writes a done record also adds its decision
fields to the job's digest, `<job id>/@digest-r<restarts>.json` beside the records ('@' is in
no node's name), under an flock on `<job id>/locks/digest-r<restarts>.lock` (0600 in a 0700
directory of root's, fsutil.FileLock: no user can hold it); about 150 bytes per node, no
flight recorder. The controller reads every record of a job of at most `requeue.max_records`
nodes, as before. For a larger one it reads the digest, and in full only the records that
matter most, at most max_records: the hardware-fault nodes, the failing rank's node, the nodes
that failed first (`read_order`); the others' decision fields come from the digest
(`partial`), and the account (`ReadAccount`) names them, unread, as a hostlist. Bytes read
in all stay under READ_BUDGET. A digest SlurmUser cannot trust (a symlink, not root's, writable
by others, torn, another job's) is refused with the reason, and every record is then read as
for a small job, within the same byte budget.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time

from gpugate.fsutil import FileLock, atomic_write, lock_file
from gpugate.record import Record
from gpugate.slurm.hostlist import HostlistError, hostlist_compress
from gpugate.store.evidence import _JOB, VIEW_DIR, bundle_name, remove_view
from gpugate.store.summary import EvidenceSummary
from gpugate.store.view_records import (
    DIGEST_FIELDS,
    DONE,
    RUNNING,
    SUMMARY_FIELDS,
    ControllerRecord,
    Digest,
    DigestEntry,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

DIR_MODE = 0o750
FILE_MODE = 0o640
MAX_BYTES = 4 << 20  # flight-recorder digests included; a record is a few KiB
# The flight recorder's compact records keep only what find_culprit reads (no stack frames).
FR_PG_KEYS = ("name", "desc", "ranks", "last_enqueued", "last_completed")
FR_ENTRY_KEYS = ("seq", "pg_id", "op", "sizes", "state", "is_p2p", "retired")
FR_ENTRIES_KEPT = 256  # per rank: the newest; a hang is at the end of the ring buffer
# The digest's size cap (about 150 bytes a node: 8 MiB holds 50,000 nodes) and the lock's
# wait (the holder rewrites a file of at most that size: milliseconds).
DIGEST_MAX_BYTES = 8 << 20
DIGEST_WAIT_S = 5.0
# All the controller reads for one job, records and digest together: 16 records at their
# 4 MiB cap, or 200 flight-recorder records of 8 ranks (about 300 KiB each). Several
# EpilogSlurmctld run at once on slurmctld's host, and json holds a record at several times
# its size in memory.
READ_BUDGET = 64 << 20
# What a poll reads of a record the digest does not name yet (a large job): a running record
# is under 100 bytes; a larger one is done, and waits for the digest to say whether it matters.
PEEK_BYTES = 4096
POLL_S = 0.5


class ViewError(OSError):
    """A record could not be written or read; the message says where."""


def view_dir(evidence_dir: str, job_id: str) -> str:
    """`<evidence_dir>/controller-view/<job id>`."""
    if not _JOB.match(job_id or ""):
        raise ViewError(f"not a Slurm job id: {job_id!r}")
    return os.path.join(evidence_dir, VIEW_DIR, job_id)


def record_path(evidence_dir: str, job_id: str, node: str, restart: int) -> str:
    """The record of one node and run of a job."""
    return os.path.join(view_dir(evidence_dir, job_id), bundle_name(node, restart) + ".json")


# ------------------------------------------------------------------------------ the node side


def _traversable(path: str) -> None:
    """Create `path` (root's), or add search for others to an existing one of ours."""
    os.makedirs(path, mode=0o711, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o011 != 0o011:
            os.fchmod(fd, (st.st_mode & 0o7777) | 0o011)
    finally:
        os.close(fd)


def _closed(path: str, gid: int) -> int:
    """Create `path` 0750 (root's), make an existing one of ours so, give it `gid` (-1: keep
    its group); its group. Others' bits go: a 0711 directory of before issue 41 closes."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            return st.st_gid  # not ours to change; the digest is refused there anyway
        if gid >= 0 and st.st_gid != gid:
            os.fchown(fd, -1, gid)
        if st.st_mode & 0o7777 != DIR_MODE:
            os.fchmod(fd, DIR_MODE)
        return gid if gid >= 0 else st.st_gid
    finally:
        os.close(fd)


def view_gid(group: str | None) -> int:
    """The gid of `group` (SlurmUser's), or -1 where it is unset or this node has no such group."""
    if not group:
        return -1
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:  # the records take controller-view/'s group; selftest says if it is wrong
        return -1


def write_record(
    evidence_dir: str,
    job_id: str,
    node: str,
    restart: int,
    record: ControllerRecord,
    group: str | None = None,
) -> str:
    """Write one record atomically, root's and `group`'s (SlurmUser's) only; its path."""
    path = record_path(evidence_dir, job_id, node, restart)
    # evidence_dir itself keeps its mode and group (0750 root:<admins>) plus search for
    # others: SlurmUser passes through to controller-view/, which is closed to others.
    _traversable(evidence_dir)
    gid = _closed(os.path.join(evidence_dir, VIEW_DIR), view_gid(group))
    gid = _closed(os.path.dirname(path), gid)
    doc = record.replace(node=node, run=int(restart), written_at=round(time.time(), 3))
    atomic_write(path, json.dumps(doc.to_json(), default=str), mode=FILE_MODE, gid=gid)
    if doc.state == DONE:
        try:
            note_done(evidence_dir, job_id, node, restart, doc, gid)
        except OSError as exc:  # the record is there: the controller reads it directly
            raise ViewError(f"{path} written, the job's digest not updated: {exc}") from None
    return path


def digest_path(evidence_dir: str, job_id: str, restart: int) -> str:
    """`<evidence_dir>/controller-view/<job id>/@digest-r<restarts>.json`."""
    return os.path.join(view_dir(evidence_dir, job_id), f"@digest-r{int(restart)}.json")


def note_done(
    evidence_dir: str, job_id: str, node: str, restart: int, record: ControllerRecord, gid: int = -1
) -> bool:
    """Add this node's done record to its job's digest; whether the lock came in time.

    Read-modify-write under the job's flock: concurrent node epilogs lose no node. Without
    the lock (a writer stuck past DIGEST_WAIT_S) it writes anyway, atomically: an entry
    another node wrote meanwhile may be lost, and the controller then reads that node's
    record directly (a node the digest does not name is polled as before).
    """
    directory = view_dir(evidence_dir, job_id)
    path = digest_path(evidence_dir, job_id, restart)
    with FileLock(lock_file(directory, f"digest-r{int(restart)}.lock"),
                  wait_s=DIGEST_WAIT_S) as lock:  # fmt: skip
        # A refused one (another run's SLUID too: a reused job id) is replaced.
        current, _ = read_digest(path, job_id, restart, sluid=record.sluid)
        nodes = dict(current.nodes) if current else {}
        nodes[node] = DigestEntry.of(record)
        doc = Digest(job_id=job_id, run=int(restart), sluid=record.sluid, done=len(nodes),
                     nodes=nodes)  # fmt: skip
        text = json.dumps(doc.to_json(), separators=(",", ":"), default=str)
        atomic_write(path, text, mode=FILE_MODE, gid=gid)
    return lock.held


def forget(evidence_dir: str, job_id: str, node: str, restart: int) -> None:
    """Remove a record with nothing to decide on (a normal end): nothing is left per job."""
    remove_view(evidence_dir, f"{job_id}/{bundle_name(node, restart)}")


def running(deadline_s: float, now: float | None = None) -> ControllerRecord:
    """The record at the epilog's start: it ends at the latest `deadline_s` from now."""
    now = time.time() if now is None else now
    return ControllerRecord(state=RUNNING, deadline=round(now + deadline_s, 3))


def done(
    summary: EvidenceSummary | dict[str, Any] | None,
    flightrec: dict[str, Any] | None = None,
    *,
    bundle: bool | None = None,
    why: str | None = None,
    category: str | None = None,
    confidence: str | None = None,
    hardware_fault: bool | None = None,
    error: str | None = None,
) -> ControllerRecord:
    """The record at the epilog's end: the summary's decision fields (none without a bundle)."""
    written = summary.to_json() if isinstance(summary, EvidenceSummary) else dict(summary or {})
    fields = {k: written[k] for k in SUMMARY_FIELDS if k in written}
    where = written.get("checkpoint")
    ckpt = where.get("ckpt_dir") if isinstance(where, dict) else None
    note = fields.get("checkpoint_message")
    if isinstance(note, str) and isinstance(ckpt, str) and ckpt:
        # No path of the user's in a record (the bundle, admins' only, keeps it).
        fields["checkpoint_message"] = note.replace(ckpt, "the checkpoint directory")
    extra = {"bundle": bundle, "why": why, "category": category, "confidence": confidence,
             "hardware_fault": hardware_fault, "error": error}  # fmt: skip
    fields.update({k: v for k, v in extra.items() if v is not None})
    digest = fr_digest(flightrec)
    if digest is not None:
        fields["flightrec"] = digest
    return ControllerRecord.from_json({"state": DONE, **fields}, "the decision record")


def fr_digest(flightrec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The flight recorder's records and refusals, cut to what the culprit needs."""
    if not isinstance(flightrec, dict):
        return None
    records = [_fr_record(r) for r in flightrec.get("records") or [] if isinstance(r, dict)]
    errors = [
        {"name": str(e.get("name"))[:256], "error": str(e.get("error"))[:512]}
        for e in (flightrec.get("errors") or [])[:32]
        if isinstance(e, dict)
    ]
    if not records and not errors:
        return None
    return {"records": records, "errors": errors}


def _fr_record(rec: dict[str, Any]) -> dict[str, Any]:
    pgs = rec.get("pgs")
    pgs = pgs if isinstance(pgs, dict) else {}
    entries = [e for e in rec.get("entries") or [] if isinstance(e, dict)][-FR_ENTRIES_KEPT:]
    return {
        "rank": rec.get("rank"),
        "node": rec.get("node"),
        "pgs": {
            str(k): {f: v.get(f) for f in FR_PG_KEYS if f in v}
            for k, v in pgs.items()
            if isinstance(v, dict)
        },
        "entries": [{f: e.get(f) for f in FR_ENTRY_KEYS if f in e} for e in entries],
    }


# ------------------------------------------------------------------------------ the controller


class ReadAccount(Record):
    """What the controller read of one run's records, and what it left unread (issue 32)."""

    nodes: int = 0  # the job's nodes
    records: int = 0  # done records known: read, or named by the digest
    read: int = 0  # done records read in full
    not_read: tuple[str, ...] = ()  # done, not read: the digest's line stands for them
    opens: int = 0  # files opened, digest included (a missing record's failed open counts)
    bytes_read: int = 0
    digest: str | None = None  # "used", why it was refused, or None (not needed or none)

    def describe(self) -> str:
        """`read 64 of 1000 records (the first failures and hardware faults); not read: ...`."""
        text = f"read {self.read} of {self.records} records"
        if self.digest == "used":
            text += " (the first failures and hardware faults)"
        elif self.digest:
            text += f" (the job's digest refused: {self.digest})"
        if self.not_read:
            text += f"; not read: {hostlist(self.not_read)} ({len(self.not_read)} nodes)"
        return text


def hostlist(nodes: tuple[str, ...]) -> str:
    """`n[0065-1000]`: the nodes as a compressed hostlist (a plain list if one cannot be)."""
    try:
        return hostlist_compress(list(nodes))
    except HostlistError:
        return ",".join(nodes)


class _Tally:
    """Files opened and bytes read by one controller read, against its byte budget."""

    def __init__(self, budget: int) -> None:
        self.budget, self.opens, self.bytes = budget, 0, 0

    def left(self) -> int:
        return max(0, self.budget - self.bytes)


def _load(
    path: str, cap: int, tally: _Tally | None
) -> tuple[bytes | None, str | None, bool, int | None]:
    """(data, why not, over `cap`, owner uid) of a regular file opened without following a
    symlink or blocking; (None, None, False, None) when there is none."""
    if tally is not None:
        tally.opens += 1
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None, False, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "a symlink; not followed", False, None
        return None, f"{exc.strerror or exc}", False, None
    try:
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                return None, "not a regular file", False, st.st_uid
            if st.st_size > cap:  # said without reading it
                return None, None, True, st.st_uid
            data = fh.read(cap + 1)
    except OSError as exc:
        return None, f"{exc.strerror or exc}", False, None
    if tally is not None:
        tally.bytes += len(data)
    if len(data) > cap:  # grew since the fstat
        return None, None, True, st.st_uid
    return data, None, False, st.st_uid


def read_record(
    path: str, cap: int = MAX_BYTES, tally: _Tally | None = None
) -> tuple[ControllerRecord | None, str | None]:
    """(record, None), (None, None) when there is none yet, or (None, why it is unreadable).

    `cap` under MAX_BYTES (a byte budget, a peek): a larger record is (None, OVER_CAP).
    """
    data, why, over, _ = _load(path, min(cap, MAX_BYTES), tally)
    if over:
        return None, OVER_CAP if cap < MAX_BYTES else f"larger than {MAX_BYTES >> 20} MiB"
    if data is None:
        return None, why
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None, "not JSON (torn or foreign)"
    if not isinstance(doc, dict) or doc.get("state") not in (RUNNING, DONE):
        return None, "not a decision record"
    try:
        return ControllerRecord.from_json(doc, "the decision record"), None
    except ValueError as exc:
        return None, f"not a decision record: {exc}"


OVER_CAP = "larger than what is left to read"


def read_digest(
    path: str, job_id: str, restart: int, tally: _Tally | None = None, sluid: str | None = None
) -> tuple[Digest | None, str | None]:
    """(the job's digest, None), (None, None) when there is none, or (None, why refused).

    With `sluid` (the run's SLURM_JOB_SLUID), a digest naming another SLUID is refused: the
    same job id and restart count of an earlier job (ids wrap, a controller's state lost).
    One naming none (an older release, a Slurm before 25.11) is read as before.

    SlurmUser trusts only what root wrote for this job and run: a regular file (no symlink
    followed) owned by its directory's owner (root's 0711), writable by nobody else, in a
    directory nobody else can write, at most DIGEST_MAX_BYTES, whole JSON naming this job.
    """
    cap = DIGEST_MAX_BYTES if tally is None else min(DIGEST_MAX_BYTES, tally.left())
    data, why, over, uid = _load(path, cap, tally)
    if why is not None:
        return None, why
    if over:
        return None, f"larger than {cap} bytes"
    if data is None:
        return None, None
    try:
        where = os.stat(os.path.dirname(path))
        mode = os.stat(path, follow_symlinks=False).st_mode
    except OSError as exc:
        return None, f"{exc.strerror or exc}"
    if uid != where.st_uid or where.st_mode & 0o022 or mode & 0o022:
        return None, (f"not its directory owner's alone (uid {uid}, mode {mode & 0o7777:04o}; "
                      f"directory uid {where.st_uid}, mode {where.st_mode & 0o7777:04o})")  # fmt: skip
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None, "not JSON (torn or foreign)"
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), dict):
        return None, "not a digest"
    if doc.get("job_id") != job_id or doc.get("run") != int(restart):
        return None, f"another job's or run's ({doc.get('job_id')!r}, run {doc.get('run')!r})"
    if other_run(doc.get("sluid"), sluid):
        return None, f"another run's (SLUID {doc.get('sluid')!r}, not {sluid})"
    try:
        digest = Digest.from_json({**doc, "nodes": {}}, "the digest")
    except ValueError as exc:
        return None, str(exc)
    entries = ((n, _entry(e)) for n, e in doc["nodes"].items())
    return digest.replace(nodes={n: e for n, e in entries if e is not None}), None


def _entry(entry: object) -> DigestEntry | None:
    """A node's digest entry, or None for one with a key or a type no entry has (dropped)."""
    try:
        read = DigestEntry.from_json(entry, "a digest entry")
    except ValueError:
        return None
    return None if read.extra else read


def other_run(written: object, sluid: str | None) -> bool:
    """Whether a record or digest that names SLUID `written` is of another run than `sluid`
    (both known and different); without either, the job id and restart count decide alone."""
    return bool(sluid) and bool(written) and written != sluid


def gather(
    evidence_dir: str,
    job_id: str,
    nodes: tuple[str, ...],
    restart: int,
    cap: int = MAX_BYTES,
    tally: _Tally | None = None,
    sluid: str | None = None,
) -> tuple[dict[str, ControllerRecord], dict[str, str]]:
    """({node: record}, {node: why unreadable}) for this run of the job, as they are now.

    A record over `cap` (a peek, the byte budget) is neither: its node is in the problems
    as OVER_CAP, for the caller to take out. A record of another SLUID (`other_run`) is
    neither: it is an earlier job's under the same id, and this run's is still to come.
    """
    found: dict[str, ControllerRecord] = {}
    problems: dict[str, str] = {}
    for node in nodes:
        try:
            path = record_path(evidence_dir, job_id, node, restart)
        except (ViewError, OSError) as exc:
            problems[node] = str(exc)
            continue
        doc, why = read_record(path, min(cap, tally.left()) if tally else cap, tally)
        if doc is not None and other_run(doc.sluid, sluid):
            continue
        if doc is not None:
            found[node] = doc
            continue
        if why == OVER_CAP:
            problems[node] = OVER_CAP
            continue
        blocked = _blocked(path)  # a directory on the way this process cannot pass
        if blocked is not None:
            problems[node] = f"cannot read {blocked[0]}: {blocked[1]}"
        elif why is not None:
            problems[node] = f"cannot read {path}: {why}"
    return found, problems


def _blocked(path: str) -> tuple[str, str] | None:
    """(directory, why) of the nearest existing directory above `path` this process cannot
    pass through; None when it can (a missing record is then just not there yet)."""
    probe = os.path.dirname(path)
    while not os.path.exists(probe):  # False also where a parent cannot be passed
        up = os.path.dirname(probe)
        if up == probe:
            return None
        probe = up
    try:
        os.stat(os.path.join(probe, "."))
    except PermissionError as exc:
        return probe, exc.strerror or "permission denied"
    except OSError:
        return None
    if probe != os.path.dirname(path) and not os.access(probe, os.X_OK):
        return probe, "no search permission"
    return None


def settled(found: dict[str, ControllerRecord], nodes: tuple[str, ...], now: float) -> bool:
    """Whether every node's epilog is over: its record done, or past its deadline."""
    return all(node in found and _over(found[node], now) for node in nodes)


def _over(record: ControllerRecord, now: float) -> bool:
    if record.state == DONE or record.deadline is None:
        return True
    return now >= float(record.deadline)


def still_running(found: dict[str, ControllerRecord], now: float) -> bool:
    """Whether a node epilog may still be writing (a running record before its deadline)."""
    return any(not _over(r, now) for r in found.values())


def wait_for_records(
    *args: Any, **kwargs: Any
) -> tuple[list[ControllerRecord], dict[str, str], dict[str, ControllerRecord]]:
    """read_records' (done records, problems, every record found), its arguments the same."""
    summaries, problems, found, _ = read_records(*args, **kwargs)
    return summaries, problems, found


def read_records(
    evidence_dir: str,
    job_id: str,
    nodes: tuple[str, ...],
    restart: int,
    wait_s: float,
    cap_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    max_records: int | None = None,
    budget: int = READ_BUDGET,
    sluid: str | None = None,
) -> tuple[list[ControllerRecord], dict[str, str], dict[str, ControllerRecord], ReadAccount]:
    """Wait until every node's epilog is over; (done records, problems, every record found,
    what was read and what not).

    A missing record is waited for up to `wait_s` (that node's epilog has not started yet);
    a running one until its deadline, however late, up to `cap_s` in all (a node clock far
    off, say). An unreadable directory is not waited for: nothing will come. A done record
    is final: read once, never opened again; each poll opens only the nodes still missing or
    running. A job of more than `max_records` nodes is read through its digest (the module's
    docstring); bytes read in all stay under `budget`. With `sluid` (EpilogSlurmctld's
    SLURM_JOB_SLUID), records and a digest of another SLUID are not this run's (`gather`).
    """
    tally = _Tally(budget)
    digest = None
    if max_records is not None and len(nodes) > max_records:
        digest = _Digest(digest_path(evidence_dir, job_id, restart), job_id, restart, tally)
        digest.sluid = sluid
    final: dict[str, ControllerRecord] = {}  # done records read in full
    named: dict[str, DigestEntry] = {}  # the digest's entries of done nodes, not opened
    over: set[str] = set()  # done records over the peek or the budget: read at the end, or not
    wanted = set(nodes)
    start = clock()
    while True:
        now = clock()
        if digest is not None:
            named = {n: e for n, e in digest.poll().items() if n in wanted}
        pending = tuple(n for n in nodes if n not in final and n not in named and n not in over)
        cap = PEEK_BYTES if digest is not None and digest.why is None else MAX_BYTES
        got, problems = gather(evidence_dir, job_id, pending, restart, cap, tally, sluid)
        over |= {n for n, why in problems.items() if why == OVER_CAP}
        problems = {n: why for n, why in problems.items() if why != OVER_CAP}
        final.update((n, r) for n, r in got.items() if r.state == DONE)
        placeholder = ControllerRecord(state=DONE)  # known done (the digest, a size), not read yet
        found = {**dict.fromkeys(over | set(named), placeholder), **got, **final}
        waited = now - start
        if len(problems) == len(nodes):  # nothing will come that this process can read
            break
        if settled(found, nodes, now) or waited >= cap_s:
            break
        if waited >= wait_s and not still_running(found, now):
            break
        if tally.left() == 0:  # said in the account: the rest is not read
            break
        sleep(POLL_S)
    used = digest is not None and digest.why is None and digest.seen is not None
    unread = set(named) | over
    limit = max(0, max_records - len(final)) if used and max_records is not None else None
    # The digest vouches only for the nodes it names: a done record it does not name (its
    # writer's update lost or refused) is read whatever the limit, after the most telling.
    unnamed = [n for n in nodes if n in over and n not in named]
    for node in read_order(nodes, named)[:limit] + unnamed:
        doc, _ = read_record(
            record_path(evidence_dir, job_id, node, restart), min(MAX_BYTES, tally.left()), tally
        )
        if doc is not None and doc.state == DONE and not other_run(doc.sluid, sluid):
            final[node] = doc
            unread.discard(node)
    stubs = {n: stub(named[n], n, restart) for n in named if n not in final}
    found = {**found, **stubs, **final}
    summaries = [found[n] for n in nodes if n in final or n in stubs]
    account = ReadAccount(
        nodes=len(nodes), records=len(final) + len(unread), read=len(final),
        not_read=tuple(n for n in nodes if n in unread), opens=tally.opens,
        bytes_read=tally.bytes, digest="used" if used else (digest.why if digest else None),
    )  # fmt: skip
    return summaries, problems, found, account


def stub(entry: DigestEntry, node: str, restart: int) -> ControllerRecord:
    """The stand-in for a done record the digest speaks for, not read (`partial`)."""
    fields = {k: getattr(entry, k) for k in DIGEST_FIELDS}
    return ControllerRecord(state=DONE, node=node, run=int(restart), partial=True, **fields)


def read_order(nodes: tuple[str, ...], named: dict[str, DigestEntry]) -> list[str]:
    """The digest's done nodes, most telling first: hardware faults (earliest error first),
    the failing rank's node, then by first failure time, the rest in the job's order."""
    place = {n: i for i, n in enumerate(nodes)}
    failing = {e.failing_node for e in named.values()}

    def key(node: str) -> tuple[int, str, int]:
        entry = named[node]
        if entry.hardware_fault:
            return 0, str(entry.first_hardware_error_at or "~"), place[node]
        if node in failing:
            return 1, "", place[node]
        if entry.first_failure_at:
            return 2, str(entry.first_failure_at), place[node]
        return 3, "", place[node]

    return sorted(named, key=key)


class _Digest:
    """The job's digest as a large job's polls see it: read again only when it changed."""

    def __init__(self, path: str, job_id: str, restart: int, tally: _Tally) -> None:
        self.path, self.job_id, self.restart, self.tally = path, job_id, restart, tally
        self.seen: tuple[int, int, int] | None = None
        self.nodes: dict[str, DigestEntry] = {}
        self.why: str | None = None  # refused: every record is then read as for a small job
        self.sluid: str | None = None  # the run's SLUID: a digest of another is refused

    def poll(self) -> dict[str, DigestEntry]:
        """The done nodes' entries ({} once refused, or while there is no digest)."""
        if self.why is not None:
            return {}
        try:  # lstat opens nothing: an unchanged digest costs no open and no byte
            st = os.lstat(self.path)
        except FileNotFoundError:
            return self.nodes
        except OSError as exc:
            st = None
            self.why = f"{exc.strerror or exc}"
        if st is not None and (st.st_ino, st.st_size, st.st_mtime_ns) == self.seen:
            return self.nodes
        doc, why = (None, self.why) if st is None else read_digest(
            self.path, self.job_id, self.restart, self.tally, self.sluid)  # fmt: skip
        if doc is None and why is None:  # replaced between the lstat and the open: next poll
            return self.nodes
        if doc is None or st is None:
            self.why = why or self.why
            self.nodes = {}
            return {}
        self.seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        self.nodes = doc.nodes
        return self.nodes

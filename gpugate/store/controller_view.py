"""The controller's view of a job's evidence: one small decision record per node and run.

EpilogSlurmctld runs as SlurmUser (`slurm` on Debian and RHEL), which may not read the
evidence bundles (root's and the admin group's: logs can hold secrets). So each node epilog
(root) writes, beside its bundle, what the controller decides on and nothing else, no log text:

    <evidence_dir>/controller-view/<job id>/<node>-r<restarts>.json

Directories 0711 root's (anyone may pass, nobody but root may list), files 0644, written
atomically. The epilog writes `{"state": "running", "deadline": <epoch>}` when it starts and
`{"state": "done", ...}` when it ends, so the controller waits exactly as long as a node
epilog may still be writing (`wait_for_records`), and never longer. A normal end (no bundle:
the job ended well, or the prolog refused it here) removes the record instead, so not every
job leaves a file: the controller waits for evidence only after an abnormal end, which the
node epilog sees too (the job's exit code) and answers with a bundle. A record goes with its
bundle when the node prunes it (evidence.remove_view).
"""

from __future__ import annotations

import json
import os
import stat
import time

from gpugate.fsutil import atomic_write
from gpugate.store.evidence import _JOB, VIEW_DIR, bundle_name, remove_view

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

DIR_MODE = 0o711
FILE_MODE = 0o644
RUNNING, DONE = "running", "done"
MAX_BYTES = 4 << 20  # flight-recorder digests included; a record is a few KiB
# What the controller decides on (gpugate/gate/requeue.py cause, suspicion.vote, tell_stale),
# copied from the bundle's summary. No log line, no path of the user's, no kernel line.
SUMMARY_FIELDS = (
    "job_id", "node", "restart", "category", "category_trusted", "confidence", "xid",
    "hardware_fault", "first_hardware_error_at", "first_failure_at", "checkpoint_age_s",
    "checkpoint_stale", "checkpoint_message", "flightrec_dumps", "job_start", "job_end",
    "failing_node",  # the failing rank's node (the suspect vote points at it when known)
    "kind", "drill",  # a drill's run: the controller marks what it writes DRILL <id> too
)  # fmt: skip
# The flight recorder's compact records keep only what find_culprit reads (no stack frames).
FR_PG_KEYS = ("name", "desc", "ranks", "last_enqueued", "last_completed")
FR_ENTRY_KEYS = ("seq", "pg_id", "op", "sizes", "state", "is_p2p", "retired")
FR_ENTRIES_KEPT = 256  # per rank: the newest; a hang is at the end of the ring buffer


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
    """Create `path` 0711 (root's), or add search for others to an existing one of ours."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o011 != 0o011:
            os.fchmod(fd, (st.st_mode & 0o7777) | 0o011)
    finally:
        os.close(fd)


def write_record(
    evidence_dir: str, job_id: str, node: str, restart: int, record: dict[str, Any]
) -> str:
    """Write one record atomically (directories made traversable on the way); its path."""
    path = record_path(evidence_dir, job_id, node, restart)
    # evidence_dir itself keeps its mode and group (0750 root:<admins>) plus search for
    # others: SlurmUser passes through to controller-view/, lists nothing.
    for directory in (evidence_dir, os.path.join(evidence_dir, VIEW_DIR), os.path.dirname(path)):
        _traversable(directory)
    doc = dict(record, node=node, run=int(restart), written_at=round(time.time(), 3))
    atomic_write(path, json.dumps(doc, default=str), mode=FILE_MODE)
    return path


def forget(evidence_dir: str, job_id: str, node: str, restart: int) -> None:
    """Remove a record with nothing to decide on (a normal end): nothing is left per job."""
    remove_view(evidence_dir, f"{job_id}/{bundle_name(node, restart)}")


def running(deadline_s: float, now: float | None = None) -> dict[str, Any]:
    """The record at the epilog's start: it ends at the latest `deadline_s` from now."""
    now = time.time() if now is None else now
    return {"state": RUNNING, "deadline": round(now + deadline_s, 3)}


def done(
    summary: dict[str, Any] | None, flightrec: dict[str, Any] | None = None, **extra: object
) -> dict[str, Any]:
    """The record at the epilog's end: the summary's decision fields (none without a bundle)."""
    fields = {k: (summary or {}).get(k) for k in SUMMARY_FIELDS if k in (summary or {})}
    fields.update({k: v for k, v in extra.items() if v is not None})
    digest = fr_digest(flightrec)
    if digest is not None:
        fields["flightrec"] = digest
    return {"state": DONE, **fields}


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


def read_record(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None), (None, None) when there is none yet, or (None, why it is unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{exc.strerror or exc}"
    try:
        with os.fdopen(fd, "rb") as fh:
            if not _regular(fh.fileno()):
                return None, "not a regular file"
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        return None, f"{exc.strerror or exc}"
    if len(data) > MAX_BYTES:
        return None, f"larger than {MAX_BYTES >> 20} MiB"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None, "not JSON (torn or foreign)"
    if not isinstance(doc, dict) or doc.get("state") not in (RUNNING, DONE):
        return None, "not a decision record"
    return doc, None


def _regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def gather(
    evidence_dir: str, job_id: str, nodes: tuple[str, ...], restart: int
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """({node: record}, {node: why unreadable}) for this run of the job, as they are now."""
    found: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    for node in nodes:
        try:
            path = record_path(evidence_dir, job_id, node, restart)
        except (ViewError, OSError) as exc:
            problems[node] = str(exc)
            continue
        doc, why = read_record(path)
        if doc is not None:
            found[node] = doc
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


def settled(found: dict[str, dict[str, Any]], nodes: tuple[str, ...], now: float) -> bool:
    """Whether every node's epilog is over: its record done, or past its deadline."""
    return all(node in found and _over(found[node], now) for node in nodes)


def _over(record: dict[str, Any], now: float) -> bool:
    if record.get("state") == DONE:
        return True
    deadline = record.get("deadline")
    if not isinstance(deadline, (int, float)) or isinstance(deadline, bool):
        return True
    return now >= float(deadline)


def still_running(found: dict[str, dict[str, Any]], now: float) -> bool:
    """Whether a node epilog may still be writing (a running record before its deadline)."""
    return any(not _over(r, now) for r in found.values())


def wait_for_records(
    evidence_dir: str,
    job_id: str,
    nodes: tuple[str, ...],
    restart: int,
    wait_s: float,
    cap_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, dict[str, Any]]]:
    """Wait until every node's epilog is over; (done records, problems, every record found).

    A missing record is waited for up to `wait_s` (that node's epilog has not started yet);
    a running one until its deadline, however late, up to `cap_s` in all (a node clock far
    off, say). An unreadable directory is not waited for: nothing will come.
    """
    start = clock()
    while True:
        now = clock()
        found, problems = gather(evidence_dir, job_id, nodes, restart)
        waited = now - start
        if len(problems) == len(nodes):  # nothing will come that this process can read
            break
        if settled(found, nodes, now) or waited >= cap_s:
            break
        if waited >= wait_s and not still_running(found, now):
            break
        sleep(0.5)
    summaries = [r for r in found.values() if r.get("state") == DONE]
    return summaries, problems, found

"""Evidence bundles: one directory per job, node and run, written atomically, admins only.

Layout: `<evidence_dir>/<job id>/<node>-r<restart count>/` holding `summary.json` (job, node,
times, category, xid, failing rank, suspected node, action taken) and the raw evidence. The
bundle is assembled in a hidden temporary directory and renamed into place, so a reader never
sees half of one. Directories are 0750 and files 0640, owned by root and by the configured
admin group: readable by admins, not by other users (logs can hold secrets). The evidence
directory itself is 0751: SlurmUser passes through it to the decision records beside the
bundles (`controller-view/`, gpugate/store/controller_view.py), and lists nothing.

Each node also keeps an index of its own bundles, `<evidence_dir>/.index/<node>.jsonl`: one
line appended (one O_APPEND write) per bundle, so `gpugate evidence NODE` reads that node's
lines instead of listing every job directory, and retention knows each bundle's size, age and
user without walking the tree. Only the node writes its index, under a lock in its own local
`state_dir/locks/` (root's only; flock on NFS or Lustre is slow or unreliable, docs/flow.md:
never beside the evidence, which may be shared), waited for at most locks.EVIDENCE_WAIT_S; past
that the bundle is indexed without it and pruning waits a run. Only the node
prunes its own bundles: oldest first, by age, by one user's share and by the node's total.
"""

from __future__ import annotations

import json
import os
import stat
import time

from gpugate import jsonl
from gpugate.fstree import remove_tree, tree_bytes
from gpugate.fsutil import FileLock, atomic_write, fresh_dir, lock_file
from gpugate.jsonl import NOT_JSON, append, dumps
from gpugate.jsonrecord import JsonRecord
from gpugate.log import say
from gpugate.record import Record
from gpugate.regex import lazy
from gpugate.store import locks
from gpugate.store.summary import EvidenceSummary, QualifySummary, bundle_kind, summary_from_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

    from gpugate.config.schema import Config
    from gpugate.fsutil import FileLock

_NAME = lazy(r"^[A-Za-z0-9._-]+$")
_JOB = lazy(r"^[0-9]+(?:_[0-9]+)?$")
INDEX_DIR = ".index"  # job directories are digits: no job can be named this
VIEW_DIR = "controller-view"  # the decision records (controller_view.py); no job is named so
LOCK = locks.EVIDENCE  # in the node's local state_dir/locks/
# What an index line may name: `<job>/<node>-r<n>`, or an older copy kept beside it.
_ENTRY_PATH = lazy(r"[0-9]+(?:_[0-9]+)?/[A-Za-z0-9_][A-Za-z0-9._-]*-r[0-9]+(?:\.old-[0-9]+)?")
EVIDENCE_DIR_MODE = 0o751  # the controller's records below it (store/controller_view.py)
LOCK_WAIT_S = locks.EVIDENCE_WAIT_S  # past it: indexed without the lock, pruned next run


class EvidenceError(OSError):
    """A bundle could not be written; the message says where and why."""


def bundle_name(node: str, restart: int) -> str:
    """The bundle directory's name for one node and run of a job."""
    if not _NAME.match(node):
        raise EvidenceError(f"unsafe node name for a path: {node!r}")
    return f"{node}-r{int(restart)}"


def _group_id(group: str | None) -> int:
    if not group:
        return -1
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise EvidenceError(f"evidence_group {group!r} does not exist") from None


def _private_dir(path: str, gid: int, mode: int = 0o750) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)
    if os.path.islink(path) or not os.path.isdir(path):
        raise EvidenceError(f"{path}: not a plain directory")
    os.chmod(path, mode)
    if gid >= 0:
        os.chown(path, -1, gid)


class IndexEntry(JsonRecord):
    """A line of `<evidence_dir>/.index/<node>.jsonl`: one bundle of the node, as written."""

    path: str
    job: str | None = None
    node: str | None = None
    restart: int | None = None
    sluid: str | None = None
    user: str | None = None
    at: float
    bytes: int
    hw: bool | None = None
    kind: str | None = None

    # Every release wrote path to bytes; the reader needs only path, at and bytes. hw and kind
    # came later: a line without them is written back without them (so are job, node, restart).
    _omit = frozenset({"job", "node", "restart", "sluid", "hw", "kind"})
    _doc: ClassVar[dict[str, str]] = {
        "path": "the bundle, `<job>/<node>-r<n>` (or an older copy's, `.old-<pid>` added)",
        "job": "the job",
        "node": "the node (the index's own)",
        "restart": "the run",
        "sluid": "its summary's `sluid` (absent where Slurm gave none)",
        "user": "the job's user (retention's per-user share)",
        "at": "when it was indexed (epoch)",
        "bytes": "the bundle's size",
        "hw": "its summary's `hardware_fault` (retention spares the newest such bundle)",
        "kind": "`job`, `qualify` or `drill`",
    }


class Retention(Record):
    """How much evidence one node keeps of its own (None: no limit of that kind)."""

    days: float | None = None  # bundles older than this go
    max_bytes: int | None = None  # the node's bundles together
    user_share: float | None = None  # of max_bytes, for one user's bundles on this node
    lock_dir: str | None = None  # node-local base for the lock: its locks/ (state_dir)
    lock_wait_s: float = LOCK_WAIT_S  # past it: indexed without the lock, pruned next run


def retention_for(config: Config) -> Retention:
    """The configured retention (`epilog.retention_days`, `evidence_max_mib`, `evidence_user_share`)."""
    ep = config.epilog
    mib = ep.evidence_max_mib
    return Retention(
        days=ep.retention_days,
        max_bytes=None if mib is None else int(mib * 1024 * 1024),
        user_share=ep.evidence_user_share,
        lock_dir=config.state_dir,
    )


def write_bundle(
    evidence_dir: str,
    job_id: str,
    node: str,
    restart: int,
    files: dict[str, str | bytes],
    summary: EvidenceSummary | QualifySummary | dict[str, Any],
    group: str | None = None,
    retention: Retention | None = None,
    now: float | None = None,
) -> str:
    """Write the bundle atomically, index it, prune this node's old ones; return its path.

    The index line is written after the rename, so the index never names a bundle that is not
    there; pruning never removes the bundle just written (a drain reason may name it). A plain
    `summary` (a script's, a test's) is read as a summary of this job and node first.
    """
    if isinstance(summary, dict):
        names = "job" if bundle_kind(summary) == "qualify" else "job_id"
        summary = summary_from_json({names: job_id, "node": node, **summary})
    if not _JOB.match(job_id or ""):
        raise EvidenceError(f"not a Slurm job id: {job_id!r}")
    gid = _group_id(group)
    job_dir = os.path.join(evidence_dir, job_id)
    # Others may pass through evidence_dir (SlurmUser to controller-view/), list nothing.
    _private_dir(evidence_dir, gid, EVIDENCE_DIR_MODE)
    _private_dir(job_dir, gid)
    name = bundle_name(node, restart)
    final = os.path.join(job_dir, name)

    tmp = fresh_dir(job_dir, f".{name}.")
    older = None
    try:
        os.chmod(tmp, 0o750)  # noqa: S103 - as above
        if gid >= 0:
            os.chown(tmp, -1, gid)
        summary = summary.replace(bundle=final, files=sorted([*files, "summary.json"]))
        size = 0
        for member, content in {
            **files,
            "summary.json": json.dumps(summary.to_json(), indent=1, default=str),
        }.items():
            size += _write_member(tmp, member, content, gid)
        if os.path.isdir(final):
            # An epilog that runs twice for the same run keeps the older bundle beside.
            older = f"{name}.old-{os.getpid()}"
            os.replace(final, os.path.join(job_dir, older))
        os.rename(tmp, final)
    except BaseException:
        from gpugate.fstree import remove_tree

        try:
            remove_tree(tmp)
        except OSError:
            pass
        raise
    at = round(time.time() if now is None else now, 3)
    entry = IndexEntry(path=f"{job_id}/{name}", job=job_id, node=node, restart=int(restart),
                       sluid=summary.sluid if isinstance(summary, EvidenceSummary) else None,
                       user=summary.user, at=at, bytes=size, hw=summary.hardware_fault,
                       kind=bundle_kind(summary))  # fmt: skip
    _index_and_prune(evidence_dir, node, entry, older, gid, retention)
    return final


def _index_and_prune(
    evidence_dir: str,
    node: str,
    entry: IndexEntry,
    older: str | None,
    gid: int,
    retention: Retention | None,
) -> None:
    # The bundle is written: nothing here may turn that into a failure (the epilog's drain
    # reason names it). Index and retention problems are said and left for the next run.

    try:
        with _node_lock(retention) as lock:
            if older:
                old_path = f"{entry.job}/{older}"
                old_bytes = tree_bytes(os.path.join(evidence_dir, old_path))
                append_index(evidence_dir, node, entry.replace(path=old_path, bytes=old_bytes), gid)
            append_index(evidence_dir, node, entry, gid)
            if retention and lock.held:
                prune(evidence_dir, node, retention, keep={entry.path}, now=entry.at, gid=gid)
    except (OSError, ValueError, RecursionError) as exc:
        say(f"evidence {entry.path}: written, but indexing or pruning failed: {exc}")


def _write_member(directory: str, name: str, content: str | bytes, gid: int) -> int:
    parts = name.split("/")
    if any(not _NAME.match(p) or p in (".", "..") for p in parts):
        raise EvidenceError(f"unsafe bundle member name: {name!r}")
    if len(parts) > 1:
        sub = os.path.join(directory, *parts[:-1])
        _private_dir(sub, gid)
    path = os.path.join(directory, *parts)
    data = content.encode() if isinstance(content, str) else content
    atomic_write(path, data, mode=0o640)
    if gid >= 0:
        os.chown(path, -1, gid)
    return len(data)


# ------------------------------------------------------------------------------ the index


def index_path(evidence_dir: str, node: str) -> str:
    """The node's index file, `<evidence_dir>/.index/<node>.jsonl`."""
    if not _NAME.match(node) or node.startswith("."):
        raise EvidenceError(f"unsafe node name for a path: {node!r}")
    return os.path.join(evidence_dir, INDEX_DIR, f"{node}.jsonl")


def append_index(evidence_dir: str, node: str, entry: IndexEntry, gid: int = -1) -> None:
    """Append one entry to the node's index in one write (O_APPEND: no torn interleaving)."""
    path = index_path(evidence_dir, node)
    _private_dir(os.path.dirname(path), gid)
    append(path, [entry.to_json()], 0o640, gid)


class IndexRead(Record):
    """What a node's index holds: valid entries (newest line per bundle), warnings, line count."""

    entries: list[IndexEntry]
    warnings: list[str]
    lines: int


def read_index(evidence_dir: str, node: str) -> IndexRead | None:
    """The node's index, validated (bad lines are skipped with a warning); None if it has none."""
    path = index_path(evidence_dir, node)
    try:
        data, _size = jsonl.read_tail(path)  # the newest 32 MiB: some 100,000 bundles
    except FileNotFoundError:
        return None
    except OSError as exc:
        return IndexRead(
            entries=[], warnings=[f"{path}: unreadable ({exc.strerror or exc})"], lines=0
        )
    found: dict[str, IndexEntry] = {}
    bad: list[str] = []
    lines = jsonl.parse(data)
    for number, value in enumerate(lines, 1):
        got = _entry_problem(value, node)
        if isinstance(got, str):
            bad.append(f"line {number}: {got}")
            continue
        found.pop(got.path, None)  # a later line about the same bundle wins
        found[got.path] = got
    warnings = [f"{path}: {b}; skipped" for b in bad[:5]]
    if len(bad) > 5:
        warnings.append(f"{path}: {len(bad) - 5} more bad line(s) skipped")
    return IndexRead(entries=list(found.values()), warnings=warnings, lines=len(lines))


def _entry_problem(line: object, node: str) -> IndexEntry | str:
    # The entry when the line is a well-formed entry of this node, else what is wrong with it.

    if line is NOT_JSON:
        return "not JSON (torn or foreign line)"
    if not isinstance(line, dict):
        return "not a JSON object"
    path = line.get("path")
    if not isinstance(path, str) or not _ENTRY_PATH.fullmatch(path):
        return "no valid bundle path"
    if not path.split("/", 1)[1].startswith(f"{node}-r"):
        return f"names another node's bundle ({path})"
    try:
        entry = IndexEntry.from_json(line, "line")
    except ValueError as exc:
        return str(exc).removeprefix("line: ")
    if entry.bytes < 0:
        return "bytes is not a size"
    if entry.at != entry.at:
        return "at is not a time"
    return entry


def _is_bundle(path: str) -> bool:
    # A real directory, not a symlink someone put in its place.

    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def scan_node(evidence_dir: str, node: str) -> list[str]:
    """The node's bundles found by listing every job directory (slow: for unindexed bundles)."""
    import glob

    pattern = os.path.join(glob.escape(evidence_dir), "*", f"{glob.escape(node)}-r*")
    return [p for p in glob.glob(pattern) if ".old-" not in p and _is_bundle(p)]


def node_bundle_paths(
    evidence_dir: str, node: str, scan: bool = False
) -> tuple[list[str], list[str]]:
    """The node's bundles (from its index; by a scan where it has none, or also when asked), and notes."""
    read = read_index(evidence_dir, node)
    notes = list(read.warnings) if read else []
    paths: set[str] = set()
    if read is not None:
        for e in read.entries:
            full = os.path.join(evidence_dir, e.path)
            if ".old-" not in e.path and _is_bundle(full):
                paths.add(full)  # an entry whose bundle is gone (pruned, removed) is skipped
    if read is None or scan:
        if read is None:
            notes.append(f"no index for {node} ({index_path(evidence_dir, node)}): listed every "
                         f"job directory under {evidence_dir} instead (bundles written before "
                         "the index existed)")  # fmt: skip
        paths.update(scan_node(evidence_dir, node))
    return sorted(paths), notes


# ------------------------------------------------------------------------------ retention


def _node_lock(retention: Retention | None) -> FileLock:
    """The lock on `<lock_dir>/locks/evidence.lock` (node-local), waited for at most the
    retention's lock_wait_s; none without a lock_dir."""
    lock_dir = retention.lock_dir if retention else None
    if lock_dir:
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    # Past the wait, another epilog is pruning: this one indexes and goes on.
    path = lock_file(lock_dir, LOCK) if lock_dir else None
    return FileLock(path, wait_s=retention.lock_wait_s if retention else LOCK_WAIT_S)


def prune(
    evidence_dir: str,
    node: str,
    retention: Retention,
    keep: set[str] | frozenset[str] = frozenset(),
    now: float | None = None,
    gid: int = -1,
) -> list[str]:
    """Remove this node's bundles beyond the retention, oldest first; return what was removed.

    Three limits, each oldest first: age, then each user's share of the node's total (so one
    user's failing jobs cannot push everyone else's evidence out), then the node's total.
    Bundles in `keep` stay, and so does the node's newest bundle with a hardware fault (the
    one a standing drain reason names, while the node's running jobs still end and write).
    The index is rewritten without what is gone. Call under the lock.
    """
    read = read_index(evidence_dir, node)
    if read is None:
        return []
    live = sorted(
        (e for e in read.entries if _is_bundle(os.path.join(evidence_dir, e.path))),
        key=lambda e: (e.at, e.path),
    )
    hardware = [e.path for e in live if e.hw is True]
    keep = set(keep) | set(hardware[-1:])
    now = time.time() if now is None else now
    drop: set[str] = set()
    if retention.days is not None:
        cutoff = now - retention.days * 86400
        drop.update(e.path for e in live if e.at < cutoff and e.path not in keep)
    if retention.max_bytes is not None and retention.user_share is not None:
        share = int(retention.max_bytes * min(1.0, retention.user_share))
        users: dict[str, list[IndexEntry]] = {}
        for e in live:
            users.setdefault(e.user or "?", []).append(e)
        for mine in users.values():
            _drop_oldest(mine, share, drop, keep)
    if retention.max_bytes is not None:
        _drop_oldest(live, retention.max_bytes, drop, keep)
    removed = []
    for e in live:
        if e.path in drop and _remove_bundle(evidence_dir, e.path):
            removed.append(e.path)
    kept = [e for e in live if e.path not in removed]
    if removed or read.lines != len(kept):
        # Compact: gone bundles, superseded and bad lines out (atomic: readers see old or new).
        path = index_path(evidence_dir, node)

        atomic_write(path, dumps(e.to_json() for e in kept), mode=0o640)
        if gid >= 0:
            os.chown(path, -1, gid)
    return removed


def _drop_oldest(
    entries: list[IndexEntry], limit: int, drop: set[str], keep: set[str] | frozenset[str]
) -> None:
    # entries: oldest first. Mark the oldest for removal until what is left fits in `limit`.
    total = sum(e.bytes for e in entries if e.path not in drop)
    for e in entries:
        if total <= limit:
            return
        if e.path in drop or e.path in keep:
            continue
        drop.add(e.path)
        total -= e.bytes


def _remove_bundle(evidence_dir: str, rel: str) -> bool:
    full = os.path.join(evidence_dir, rel)
    if not remove_tree(full):
        return False
    try:
        os.rmdir(os.path.dirname(full))  # the job's directory, once no node's bundle is left
    except OSError:
        pass
    remove_view(evidence_dir, rel)
    return True


def remove_view(evidence_dir: str, rel: str) -> None:
    """Remove the decision record of bundle `<job>/<node>-r<n>` (and its emptied job dir)."""
    job, _, name = rel.partition("/")
    record = os.path.join(evidence_dir, VIEW_DIR, job, name.split(".old-")[0] + ".json")
    try:
        if ".old-" not in name:
            os.unlink(record)
        _drop_digest(os.path.dirname(record))
        os.rmdir(os.path.dirname(record))
    except OSError:  # none, or the job's other nodes still have theirs
        pass


def _drop_digest(job_dir: str) -> None:
    """Remove a job's digest and its lock (controller_view.note_done) once no record is left:
    a record is always written before its node's digest entry, so none is being added."""
    names = os.listdir(job_dir)
    if not all(n.startswith("@digest-r") or n == "locks" for n in names):
        return
    for n in names:
        if n == "locks":
            locks_dir = os.path.join(job_dir, n)
            for lock in os.listdir(locks_dir):
                if lock.startswith("digest-r"):
                    os.unlink(os.path.join(locks_dir, lock))
            os.rmdir(locks_dir)
        else:
            os.unlink(os.path.join(job_dir, n))


# ------------------------------------------------------------------------------ reading


def list_bundles(evidence_dir: str, job_id: str) -> list[str]:
    """The bundle directories of one job (all nodes and runs), oldest run first."""
    job_dir = os.path.join(evidence_dir, job_id)
    try:
        names = [n for n in os.listdir(job_dir) if not n.startswith(".") and ".old-" not in n]
    except OSError:
        return []
    return sorted(
        os.path.join(job_dir, n) for n in names if os.path.isdir(os.path.join(job_dir, n))
    )


SUMMARY_MAX = 16 << 20  # a summary is a few KiB; far bigger is not the epilog's


def read_summary(bundle: str) -> EvidenceSummary | QualifySummary | None:
    """A bundle's summary.json, or None when missing, unreadable or not a valid summary."""
    path = os.path.join(bundle, "summary.json")
    try:
        from gpugate.fsutil import read_regular

        # Never blocks (a FIFO in its place is refused), never follows a symlink, capped.
        return summary_from_json(json.loads(read_regular(path, SUMMARY_MAX, False)), path)
    except (OSError, ValueError, RecursionError):  # RecursionError: "[[[[..." 100k deep
        return None


def read_job_summary(bundle: str) -> EvidenceSummary | None:
    """A job's (or a drill's) bundle summary; None for a qualification's or an unreadable one."""
    summary = read_summary(bundle)
    return summary if isinstance(summary, EvidenceSummary) else None

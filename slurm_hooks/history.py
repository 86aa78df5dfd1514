"""Drain history and the resume audit log, kept in the state directory (`admin.history_dir`).

Two files, both JSON lines (one object per line, oldest first):

- `drains.jsonl`: one entry per drain gpugate set (node, time, check, reason, category, bundle).
  Bounded: at most `admin.history_max_per_node` entries per node and `history_max_entries` in
  all (the oldest go first). Rewritten whole and atomically on every drain, so a reader never
  sees half a file and needs no lock.
- `audit.jsonl`: append-only, one line per resume or refused resume (who, when, why, the
  check's result, forced, resumed). Never trimmed: it is the audit log.

Writers (prologs and epilogs of many jobs, on many nodes when the directory is shared) take an
exclusive `fcntl.flock` on `.history.lock` for the read-modify-write. Drains are rare, so a
whole rewrite is cheap next to the Slurm call that caused it.
"""

from __future__ import annotations

import json
import os
import re
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpugate.config.schema import Config

DRAINS = "drains.jsonl"
AUDIT = "audit.jsonl"
LOCK = ".history.lock"
MAX_PER_NODE = 50
MAX_ENTRIES = 20000
# A second drain of the same node for the same check this soon after the first, with no
# resume in between, is the same event seen twice (the prologs of two jobs starting together
# on one node both find the fault).
SAME_EVENT_S = 600

# `gpugate: <check>: <detail>` (slurm.drain_reason); the epilog's detail starts with
# `evidence <job>/<node>-r<n>:` (collect.drain_for_hardware).
_REASON = re.compile(r"^gpugate:\s*([A-Za-z0-9_.\-]+)(?::\s*(.*))?$", re.S)
_EVIDENCE = re.compile(r"\bevidence ([0-9]+(?:_[0-9]+)?/[A-Za-z0-9._-]+-r[0-9]+)\b")


def history_dir(config: Config) -> str:
    """Where the history and the audit log live: `admin.history_dir`, else `state_dir`."""
    return config.admin.history_dir or config.state_dir


def reason_check(reason: str | None) -> str | None:
    """The check id of a gpugate drain reason (`gpugate: gpu.ecc: ...` -> `gpu.ecc`)."""
    m = _REASON.match((reason or "").strip())
    return m.group(1) if m else None


def reason_bundle(reason: str | None) -> str | None:
    """`<job>/<node>-r<n>` when the reason names an evidence bundle (epilog drains)."""
    m = _EVIDENCE.search(reason or "")
    return m.group(1) if m else None


def iso(when: float | None) -> str:
    """Epoch seconds as `2026-11-29T10:00:00Z` (empty for None)."""
    if when is None:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


class _Lock:
    """An exclusive flock on the directory's lock file, for one read-modify-write."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LOCK)
        self.fd = -1

    def __enter__(self) -> _Lock:
        import fcntl

        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing releases the lock


def _read_lines(path: str) -> list[dict]:
    """The JSON objects of a JSON-lines file; a torn or foreign line is skipped, not fatal."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read()
    except OSError:
        return []
    lines = data.splitlines()
    try:
        # One parse for the whole file (20,000 entries take a tenth of the time of 20,000
        # parses); line by line only when some line is torn.
        entries = json.loads(b"[" + b",".join(line for line in lines if line.strip()) + b"]")
    except ValueError:
        entries = []
        for line in lines:
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("node"), str)]


def _dump(entries: Iterable[dict]) -> str:
    return "".join(json.dumps(e, separators=(",", ":"), default=str) + "\n" for e in entries)


def _trim(entries: list[dict], max_per_node: int, max_entries: int) -> list[dict]:
    """Keep the newest `max_per_node` of each node, then the newest `max_entries` in all."""
    seen: dict[str, int] = {}
    kept = []
    for entry in reversed(entries):  # newest first
        n = seen.get(entry["node"], 0)
        if n < max_per_node:
            seen[entry["node"]] = n + 1
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
    max_per_node: int = MAX_PER_NODE,
    max_entries: int = MAX_ENTRIES,
) -> dict | None:
    """Add one drain to the node's history; the entry, or None when it repeats the last one."""
    when = time.time() if when is None else float(when)
    entry = {
        "node": node,
        "when": round(when, 3),
        "at": iso(when),
        "check": check or reason_check(reason),
        "reason": reason,
        "category": category,
        "xid": xid,
        "bundle": bundle,
        "job": job,
        "hook": hook,
    }
    from gpugate.fsutil import atomic_write  # only writers pay for tempfile's import

    path = os.path.join(state_dir, DRAINS)
    with _Lock(state_dir):
        entries = _read_lines(path)
        last = next((e for e in reversed(entries) if e["node"] == node), None)
        if last and _same_event(state_dir, last, entry):
            return None
        entries.append(entry)
        atomic_write(path, _dump(_trim(entries, max_per_node, max_entries)))
    return entry


def _same_event(state_dir: str, last: dict, new: dict) -> bool:
    if last.get("check") != new["check"] or new["when"] - last.get("when", 0) >= SAME_EVENT_S:
        return False
    try:
        # Any resume logged since (of any node: one stat, not a read of the audit log) makes
        # the new drain a new event.
        return os.stat(os.path.join(state_dir, AUDIT)).st_mtime < last.get("when", 0)
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
) -> dict:
    """Append one resume (or, with resumed=False, a refused one) to the audit log: who, when,
    why, the check's result; the entry."""
    when = time.time() if when is None else float(when)
    entry = {
        "node": node,
        "when": round(when, 3),
        "at": iso(when),
        "who": who or current_user(),
        "why": why,
        "result": result,
        "forced": bool(forced),
        "resumed": bool(resumed),
        "reason": reason,  # the drain reason the node had before
    }
    line = _dump([entry]).encode()
    with _Lock(state_dir):
        fd = os.open(
            os.path.join(state_dir, AUDIT),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
            0o644,
        )
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
    return entry


def current_user() -> str:
    """Who is running this: the sudo caller when there is one, else the login name."""
    sudo = os.environ.get("SUDO_USER")
    if sudo:
        return sudo
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _select(entries: list[dict], node: str | None, since: float | None) -> list[dict]:
    return [
        e
        for e in entries
        if (node is None or e["node"] == node) and (since is None or e.get("when", 0) >= since)
    ]


def drains(state_dir: str, node: str | None = None, since: float | None = None) -> list[dict]:
    """Drain entries (of one node, or all; since an epoch time, or all), oldest first."""
    return _select(_read_lines(os.path.join(state_dir, DRAINS)), node, since)


def resumes(state_dir: str, node: str | None = None, since: float | None = None) -> list[dict]:
    """Resume entries of the audit log (of one node, or all; since a time), oldest first."""
    return _select(_read_lines(os.path.join(state_dir, AUDIT)), node, since)


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
    """How many times gpugate drained `node` (for `check`, or any) in the last `window_days`."""
    found = drains(state_dir, node, window_start(window_days, now))
    return sum(1 for e in found if check is None or e.get("check") == check)


def by_node(entries: Iterable[dict]) -> dict[str, list[dict]]:
    """Entries grouped by node, each list in the order given."""
    out: dict[str, list[dict]] = {}
    for e in entries:
        out.setdefault(e["node"], []).append(e)
    return out


def note_drain(config: Config, node: str, reason: str, **fields: object) -> dict | None:
    """For the hooks: record_drain() with the configured place and caps, never raising."""
    from gpugate import log

    adm = config.admin
    try:
        return record_drain(
            history_dir(config),
            node,
            reason,
            max_per_node=adm.history_max_per_node,
            max_entries=adm.history_max_entries,
            **fields,  # type: ignore[arg-type]
        )
    except (OSError, ValueError) as exc:  # the drain itself already happened
        log.error(config.state_dir, f"could not record the drain of {node} in the history", exc)
        return None

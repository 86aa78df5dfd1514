"""Required filesystems: mounted (per mountinfo), writable, and a timed 4 KiB write + fsync.

A stale NFS (or Lustre, GPFS...) mount can leave open(), write() or fsync() stuck in the kernel,
in a state no signal ends until the server answers. So the probe never runs in this process:
each one runs in a child process (`gpugate.child`: a fresh interpreter, never a fork of this
threaded one) that only creates, writes, fsyncs, closes and unlinks a hidden file and reports
the time. The parent waits on all probes at once (so the limit holds however many mounts
there are), SIGKILLs the children still out at the limit and leaves them behind instead of
waiting on them; they hold none of the hook's descriptors.
"""

from __future__ import annotations

import os
import time

from gpugate import child
from gpugate.checks.sources import proc_path
from gpugate.checks.sources.host import read_text
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpugate.child import Child
    from gpugate.config.schema import Config

PROBE_SIZE = 4096
# The probes get this share of the source's timeout, so that the source answers with its
# per-mount "probe timed out" before the gatherer gives up on the whole source.
_PROBE_SHARE = 0.8
_ANSWER_MAX = 4096  # a probe answers a number or one error line
_OCTAL_RE = lazy(r"\\([0-7]{3})")


def read_mounts(
    config: Config, probe: Callable[[str], tuple[str, dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """Status of each `sources.required_mounts` entry; `probe` names another child task (tests)."""
    required = config.sources.required_mounts
    if not required:
        return {"mounts": []}
    info_path = proc_path(config, "self", "mountinfo")
    text = read_text(info_path)
    if text is None:
        raise OSError(f"cannot read {info_path}")
    table = parse_mountinfo(text)
    mounts = [mount_status(m.path, table) for m in required]
    todo = [m for m in mounts if m["mounted"] and m["writable"] is None]
    limit = config.sources.timeout_s.mounts * _PROBE_SHARE
    results = run_probes([m["path"] for m in todo], limit, probe or probe_task)
    for mount, (fsync_ms, error) in zip(todo, results):
        mount.update(writable=error is None, fsync_ms=fsync_ms, error=error)
    return {"mounts": mounts}


def parse_mountinfo(text: str) -> dict[str, dict[str, Any]]:
    """`/proc/self/mountinfo` -> {mount point: {fstype, source, options, super_options}}.

    Fields per proc(5): id, parent, major:minor, root, mount point, mount options, optional
    fields, "-", fstype, source, super options. Space, tab, newline and backslash in paths are
    octal escapes (`\\040`). A later line for the same mount point is mounted over the earlier
    one, so the last one wins.
    """
    table: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        fields = line.split()
        dash = fields.index("-", 6) if "-" in fields[6:] else 0
        if not dash or len(fields) < dash + 4:
            continue  # not a mountinfo line
        table[_unescape(fields[4])] = {
            "fstype": fields[dash + 1],
            "source": _unescape(fields[dash + 2]),
            "options": fields[5].split(","),
            "super_options": fields[dash + 3].split(","),
        }
    return table


def mount_status(path: str, table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A `mounts` entry from mountinfo alone: writable None means "probe it"."""
    # The path as configured is the key the checks match on; normpath() only for the lookup,
    # never realpath(): that would stat a possibly hung mount.
    where = os.path.normpath(path)
    entry = table.get(where)
    status: dict[str, Any] = {"path": path, "mounted": entry is not None, "fstype": None,
                    "writable": None, "fsync_ms": None, "error": None}  # fmt: skip
    if entry is None:
        status["error"] = f"not a mount point{_inside(where, table)}"
        return status
    status["fstype"] = entry["fstype"]
    # The superblock can be read-only while the mount says rw (ext4 errors=remount-ro).
    if "rw" not in entry["options"] or "ro" in entry["super_options"]:
        status.update(writable=False, error="mounted read-only")
    return status


def write_probe(path: str) -> None:
    """Create `path` (never through a symlink), write 4 KiB, fsync, close and unlink it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        view = memoryview(bytes(PROBE_SIZE))
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(path)


def timed_probe(path: str) -> int:
    """The write probe, timed: nanoseconds (a child's task; see `gpugate.child`)."""
    started = time.monotonic_ns()
    write_probe(path)
    return time.monotonic_ns() - started


def probe_task(path: str) -> tuple[str, dict[str, Any]]:
    """The child task that probes `path`: the real write probe."""
    return "gpugate.checks.sources.mounts:timed_probe", {"path": path}


def run_probes(
    dirs: list[str], limit_s: float, probe: Callable[[str], tuple[str, dict[str, Any]]] = probe_task
) -> list[tuple[float | None, str | None]]:
    """Probe each directory in a child process, all at once: (fsync_ms, error) for each.

    `probe` names the child's task for a probe file's path (tests replace it).
    """
    deadline = time.monotonic() + limit_s
    started: list[tuple[int, child.Child]] = []
    results: dict[int, tuple[float | None, str | None]] = {}
    for i, directory in enumerate(dirs):
        task, kwargs = probe(_probe_path(directory))
        try:
            started.append((i, child.start(task, kwargs, limit_s)))
        except child.ChildError as exc:
            results[i] = (None, f"cannot start probe: {exc}")
    child.wait([c for _, c in started], deadline, _ANSWER_MAX)
    for i, c in started:
        results[i] = _result(c, limit_s)
    return [results[i] for i in range(len(dirs))]


def _probe_path(directory: str) -> str:
    # Unique and hidden; the host name tells whose file it is if a killed probe leaves it.
    name = f".gpugate-probe.{os.uname().nodename}.{os.getpid()}.{os.urandom(4).hex()}"
    return os.path.join(directory, name)


def _result(c: Child, limit_s: float) -> tuple[float | None, str | None]:
    if c.failure == "timed out":
        return None, f"probe timed out after {limit_s:g} s"
    try:
        ns = child.answer(c)
    except child.ChildError as exc:
        if str(exc).startswith("the child died without an answer"):
            return None, "probe process exited without a result"
        return None, f"probe failed: {exc.strerror or exc}"
    if isinstance(ns, int) and not isinstance(ns, bool) and ns >= 0:
        return round(ns / 1e6, 3), None
    return None, "probe process sent no time"


def _inside(path: str, table: dict[str, dict[str, Any]]) -> str:
    """`, on / (ext4)`: the mount that holds a path that is not a mount point itself."""
    parent = path
    while parent not in table and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    entry = table.get(parent)
    return f", on {parent} ({entry['fstype']})" if entry else ""


def _unescape(field: str) -> str:
    return _OCTAL_RE.sub(lambda m: chr(int(m.group(1), 8)), field)

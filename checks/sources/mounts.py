"""Required filesystems: mounted (per mountinfo), writable, and a timed 4 KiB write + fsync.

A stale NFS (or Lustre, GPFS...) mount can leave open(), write() or fsync() stuck in the kernel,
in a state no signal ends until the server answers. So the probe never runs in this process:
each one runs in a forked child that only creates, writes, fsyncs, closes and unlinks a hidden
file and reports the time through a pipe. The parent waits on the pipes (all probes at once,
so the limit holds however many mounts there are), SIGKILLs the children still out at the
limit and leaves them behind instead of waiting on them.
"""

from __future__ import annotations

import os
import re
import select
import signal
import time

from gpugate.checks.sources import proc_path
from gpugate.checks.sources.host import read_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.config.schema import Config

PROBE_SIZE = 4096
# The probes get this share of the source's timeout, so that the source answers with its
# per-mount "probe timed out" before the gatherer gives up on the whole source.
_PROBE_SHARE = 0.8
_REAP_GRACE_S = 0.05
_OCTAL_RE = re.compile(r"\\([0-7]{3})")


def read_mounts(config: Config, probe: Callable[[str], None] | None = None) -> dict:
    """Status of each `sources.required_mounts` entry; `probe` replaces the write (tests)."""
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
    results = run_probes([m["path"] for m in todo], limit, probe or write_probe)
    for mount, (fsync_ms, error) in zip(todo, results):
        mount.update(writable=error is None, fsync_ms=fsync_ms, error=error)
    return {"mounts": mounts}


def parse_mountinfo(text: str) -> dict[str, dict]:
    """`/proc/self/mountinfo` -> {mount point: {fstype, source, options, super_options}}.

    Fields per proc(5): id, parent, major:minor, root, mount point, mount options, optional
    fields, "-", fstype, source, super options. Space, tab, newline and backslash in paths are
    octal escapes (`\\040`). A later line for the same mount point is mounted over the earlier
    one, so the last one wins.
    """
    table: dict[str, dict] = {}
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


def mount_status(path: str, table: dict[str, dict]) -> dict:
    """A `mounts` entry from mountinfo alone: writable None means "probe it"."""
    # The path as configured is the key the checks match on; normpath() only for the lookup,
    # never realpath(): that would stat a possibly hung mount.
    where = os.path.normpath(path)
    entry = table.get(where)
    status: dict = {"path": path, "mounted": entry is not None, "fstype": None,
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


def run_probes(
    dirs: list[str], limit_s: float, probe: Callable[[str], None] = write_probe
) -> list[tuple[float | None, str | None]]:
    """Probe each directory in a child process, all at once: (fsync_ms, error) for each."""
    children = [_start(d, probe) for d in dirs]
    deadline = time.monotonic() + limit_s
    results: dict[int, tuple[float | None, str | None]] = {}
    poller = select.poll()  # poll, not select(): fd numbers may pass FD_SETSIZE (1024)
    waiting: dict[int, int] = {}
    for i, (_pid, fd, error) in enumerate(children):
        if error:
            results[i] = (None, error)
        else:
            poller.register(fd, select.POLLIN)
            waiting[fd] = i
    while waiting:
        left_ms = (deadline - time.monotonic()) * 1000
        if left_ms <= 0:
            break
        for fd, _ in poller.poll(left_ms):
            poller.unregister(fd)
            i = waiting.pop(fd)
            results[i] = _result(os.read(fd, 512))
    for i, (pid, fd, _) in enumerate(children):
        if pid:
            _finish(pid, deadline)
            os.close(fd)
        results.setdefault(i, (None, f"probe timed out after {limit_s:g} s"))
    return [results[i] for i in range(len(children))]


def _start(directory: str, probe: Callable[[str], None]) -> tuple[int, int, str | None]:
    """Fork one probe child: (pid, read end of its pipe, None), or (0, -1, why not)."""
    # Unique and hidden; the host name tells whose file it is if a killed probe leaves it.
    name = f".gpugate-probe.{os.uname().nodename}.{os.getpid()}.{os.urandom(4).hex()}"
    target = os.path.join(directory, name)
    max_fd = os.sysconf("SC_OPEN_MAX")
    try:
        rfd, wfd = os.pipe()
    except OSError as exc:
        return 0, -1, f"cannot start probe: {exc}"
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(rfd)
        os.close(wfd)
        return 0, -1, f"cannot start probe: {exc}"
    if pid == 0:
        _child(wfd, target, probe, max_fd)  # never returns
    os.close(wfd)
    return pid, rfd, None


def _child(wfd: int, target: str, probe: Callable[[str], None], max_fd: int) -> None:
    try:
        # Hold none of the parent's descriptors: a child stuck in the kernel must not keep
        # slurmd's pipes (or anything else) open after the prolog has exited.
        os.closerange(0, wfd)
        os.closerange(wfd + 1, max_fd)
        started = time.monotonic_ns()
        try:
            probe(target)
            message = f"ok {time.monotonic_ns() - started}"
        except OSError as exc:
            message = f"err {exc.strerror or exc}"
        except BaseException as exc:
            message = f"err {type(exc).__name__}: {exc}"
        os.write(wfd, message.encode("utf-8", "replace")[:512])
    finally:
        os._exit(0)


def _result(data: bytes) -> tuple[float | None, str | None]:
    status, _, detail = data.decode("utf-8", "replace").partition(" ")
    if status == "ok" and detail.isdigit():
        return round(int(detail) / 1e6, 3), None
    if status == "err":
        return None, f"probe failed: {detail}"
    return None, "probe process exited without a result"


def _finish(pid: int, deadline: float) -> None:
    """Reap a child that is done; SIGKILL one that is not and leave it (never block on it)."""
    if _reaped(pid, deadline):
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reaped(pid, time.monotonic() + _REAP_GRACE_S)  # a child in D state stays; init reaps it


def _reaped(pid: int, until: float) -> bool:
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done or time.monotonic() >= until:
            return bool(done)
        time.sleep(0.002)


def _inside(path: str, table: dict[str, dict]) -> str:
    """`, on / (ext4)`: the mount that holds a path that is not a mount point itself."""
    parent = path
    while parent not in table and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    entry = table.get(parent)
    return f", on {parent} ({entry['fstype']})" if entry else ""


def _unescape(field: str) -> str:
    return _OCTAL_RE.sub(lambda m: chr(int(m.group(1), 8)), field)

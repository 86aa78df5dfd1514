"""One read of Slurm's nodes, shared by every hook that counts the drain budget at the same time.

The budget (gpugate/gate/budget.py) counts from Slurm's node records: once before a drain and
once after it settles. Slurm has no server-side filter for "the drained nodes": `scontrol show
node`, sinfo and pyslurm all have slurmctld pack every node record, so each count costs
slurmctld O(nodes). In a fleet-wide false alarm (a bad driver roll-out, a wrong threshold) every
node's prolog fails at once and counts twice: N prologs, 2N whole-cluster reads, O(N^2) for the
slurmctld that must also schedule the requeued jobs.

So the read is shared. A hook that needs the nodes as Slurm had them at or after time T uses the
view another hook read at or after T; otherwise it claims the refresh (one marker file created
with O_EXCL), reads Slurm, and leaves its read for the others. While one refresh runs the others
wait for it (as long as its read may take: `wait_s`, the adapter's timeout and a little more;
then the marker is a dead hook's and the next one reads), so under a storm slurmctld sees about
one whole-cluster read per read's duration, whatever the number of nodes, and no node makes more
than one per count.

The view lives in `<history_dir>/fleet/` (admin.history_dir is shared storage: every node shares
it; without one it is the node's state_dir, shared by that node's hooks only). Root writes it;
a directory or file that is not root's own and private is never trusted (a user who could write
the view could keep a broken node in service or drain a healthy one): the hook reads Slurm
itself. The freshness is the writer's clock: `budget.settle_s` must exceed the nodes' clock skew
(NTP keeps it to milliseconds); a view stamped in the future is refused.
"""

from __future__ import annotations

import json
import os
import random
import stat
import threading
import time

from gpugate.fsutil import FileRefused, atomic_write, private_dir, read_regular
from gpugate.jsonrecord import JsonRecord
from gpugate.slurm.records import NodeInfo
from gpugate.store.dirs import history_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import ClassVar

    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl

FLEET_DIR = "fleet"
VIEW = "nodes.json"
MARKER = "refresh"  # exists while one hook reads Slurm for everyone
DIR_MODE = 0o700
MAX_BYTES = 64 << 20  # ~200 bytes a node: a 100,000-node cluster fits
POLL_S = 0.2  # a waiting hook looks for the refreshed view this often (jittered +-50 %)
FUTURE_S = 1.0  # a view stamped further ahead than this is a clock gone wrong: not used
SHARED, READ = "shared", "read"
# The fields a view keeps: what the budget counts (gpugate/gate/budget.py) and nothing else.
_FIELDS = ("state", "flags", "reason", "reason_user", "reason_time", "partitions", "gres_gpus",
           "comment")  # fmt: skip


class FleetNode(JsonRecord):
    """One node of the view: its name, and each kept field only where it differs from a plain
    node's (a 1,000-node view of healthy nodes is ~60 KB)."""

    name: str
    state: str | None = None
    flags: list[str] | None = None
    reason: str | None = None
    reason_user: str | None = None
    reason_time: int | None = None
    partitions: list[str] | None = None
    gres_gpus: int | None = None
    comment: str | None = None

    _omit = frozenset(_FIELDS)
    _doc: ClassVar[dict[str, str]] = {
        "name": "the node's Slurm name",
        "state": "its base state (IDLE, MIXED, DOWN, ...); absent: empty",
        "flags": "its state flags (DRAIN, NOT_RESPONDING, ...); absent: none",
        "reason": "its reason, without Slurm's `[user@time]`; absent: none",
        "reason_user": "who set the reason; absent: none",
        "reason_time": "when the reason was set (epoch); absent: not known",
        "partitions": "its partitions (the budget counts per partition); absent: none",
        "gres_gpus": "the GPUs slurm.conf gives it; absent: not known",
        "comment": "its Comment (isolated GPUs); absent: none",
    }

    @classmethod
    def of(cls, n: NodeInfo) -> FleetNode:
        """The row of a node: the fields that differ from a plain node's."""
        return cls(name=n.name, state=n.state or None, flags=list(n.flags) or None,
                   reason=n.reason or None, reason_user=n.reason_user or None,
                   reason_time=n.reason_time, partitions=list(n.partitions) or None,
                   gres_gpus=n.gres_gpus, comment=n.comment or None)  # fmt: skip

    def node(self) -> NodeInfo:
        """The node as the budget reads it (an absent field: a plain node's)."""
        return NodeInfo(name=self.name, state=self.state or "", flags=tuple(self.flags or ()),
                        reason=self.reason or "", reason_user=self.reason_user or "",
                        reason_time=self.reason_time, partitions=tuple(self.partitions or ()),
                        gres_gpus=self.gres_gpus, comment=self.comment or "")  # fmt: skip


class FleetView(JsonRecord):
    """`<history_dir>/fleet/nodes.json`: one hook's read of Slurm's nodes, for the others."""

    read_at: float
    nodes: list[FleetNode]

    _doc: ClassVar[dict[str, str]] = {
        "read_at": "when the read began, the writer's clock (epoch)",
        "nodes": "every node Slurm reported (FleetNode)",
    }


def view_dir(config: Config) -> str:
    """`<history_dir>/fleet`: shared storage when admin.history_dir is set."""
    return os.path.join(history_dir(config), FLEET_DIR)


def share_note(config: Config) -> str:
    """selftest's line: where the budget's read of Slurm is shared, and by whom."""
    if config.admin.history_dir:
        return (f"drain budget: a storm's counts share one read of Slurm through "
                f"{view_dir(config)} (admin.history_dir: every node that mounts it)")  # fmt: skip
    return (f"drain budget: only this node's hooks share a read of Slurm ({view_dir(config)}); "
            "set admin.history_dir to shared storage so a storm's failing prologs share one")  # fmt: skip


def nodes_since(
    slurm: SlurmControl,
    config: Config,
    since: float,
    wait_s: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[dict[str, NodeInfo], str]:
    """Slurm's nodes as read at or after `since` (this clock): (nodes, SHARED or READ).

    SHARED: another hook's read, from the view; READ: this hook read Slurm (and shared it).
    Waits for another hook's read while it may still come (`wait_s`: its read's timeout and a
    little more), never longer: a hook that read itself as soon as a read ran late would pile
    onto a slurmctld already slow (measured: bench/scale_storm.py).
    """
    try:
        directory = private_dir(view_dir(config), DIR_MODE, gid=-1)
        _trusted_dir(directory)
    except OSError:  # no private place to share through: each hook reads for itself
        return slurm.nodes(), READ
    deadline = clock() + wait_s
    seen: tuple[int, ...] | None = None
    while True:
        now = clock()
        # A waiting hook opens the view only to see whether it changed (on NFS an open
        # revalidates, a stat may not); it parses it only when it did: a storm's thousand
        # waiting hooks must not each read the whole view ten times a second.
        mark = _mark(directory)
        if mark is not None and mark != seen:
            seen = mark
            view = load_view(directory)
            if view is not None and since <= view[0] <= now + FUTURE_S:
                return view[1], SHARED
        token = _claim(directory, now, stale_s=wait_s)
        if token is not None:
            try:
                read_at = clock()
                nodes = slurm.nodes()
                save_view(directory, read_at, nodes)
            finally:
                _unclaim(directory, token)
            return nodes, READ
        if now >= deadline:  # the refresh is late: read for ourselves, share nothing
            return slurm.nodes(), READ
        sleep(POLL_S * random.uniform(0.5, 1.5))  # noqa: S311 (a spread, no secret)


def last_view(config: Config) -> tuple[float, dict[str, NodeInfo]] | None:
    """The last shared read, however old (read_at, nodes); None when there is none to trust."""
    try:
        directory = view_dir(config)
        _trusted_dir(directory)
    except OSError:
        return None
    return load_view(directory)


def load_view(directory: str) -> tuple[float, dict[str, NodeInfo]] | None:
    """(read_at, nodes) of the shared view; None when there is none or it is not trusted."""
    path = os.path.join(directory, VIEW)
    try:
        data = read_regular(path, MAX_BYTES, follow=False)
        st = os.lstat(path)
    except (FileRefused, OSError):
        return None
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None  # not root's own: a user's file is never budget evidence
    try:
        view = FleetView.from_json(json.loads(data), path)
    except (ValueError, RecursionError):
        return None  # torn or foreign: read Slurm instead
    return float(view.read_at), {n.name: n.node() for n in view.nodes}


def _mark(directory: str) -> tuple[int, ...] | None:
    """What tells one version of the view from the next (inode, size, mtime); None: none."""
    try:
        fd = os.open(os.path.join(directory, VIEW), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_ino, st.st_size, st.st_mtime_ns


def save_view(directory: str, read_at: float, nodes: dict[str, NodeInfo]) -> None:
    """Share a read (atomically: readers see the old view or the new one)."""
    view = FleetView(read_at=read_at, nodes=[FleetNode.of(n) for n in nodes.values()])
    text = json.dumps(view.to_json(), separators=(",", ":"))
    try:
        atomic_write(os.path.join(directory, VIEW), text, mode=0o600)
    except OSError:
        pass  # not shared: the next hook reads Slurm itself, which is today's cost


def _trusted_dir(directory: str) -> None:
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{directory}: not a private directory of this user's")


def _claim(directory: str, now: float, stale_s: float) -> str | None:
    """Take the refresh: create the marker, holding a token of ours (None: another hook holds
    it). A marker older than `stale_s` is a dead or stuck hook's and is taken over."""
    path = os.path.join(directory, MARKER)
    token = f"{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            try:
                if now - os.lstat(path).st_mtime <= stale_s:
                    return None
                os.unlink(path)
            except FileNotFoundError:
                pass  # its holder just finished: try again
            continue
        except OSError:
            return None
        try:
            os.write(fd, token.encode())
        finally:
            os.close(fd)
        return token
    return None


def _unclaim(directory: str, token: str) -> None:
    """Remove the marker if it is still ours: a slow read's marker another hook took over
    (stale) is the new holder's, and removing it would let a third read start beside it."""
    path = os.path.join(directory, MARKER)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            held = os.read(fd, 128).decode(errors="replace")
        finally:
            os.close(fd)
        if held == token:
            os.unlink(path)
    except OSError:
        pass

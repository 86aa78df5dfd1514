"""One in-memory Slurm for the unit tests: a real `SlurmControl` whose storage is two dicts.

The rules are the adapter's own (SlurmControl.drain/resume refuse to touch an admin's drain,
add_admin_comment keeps what others wrote, exclude_nodes leaves a `-w` pin alone); only the
reads and raw writes are faked. `nodes()` serves the drain budget, so a drain in a hook test
runs the real budget check and settle. The hooks' own tests use it; the adapter's tests fake
Slurm one level lower, at the runner (slurm_recorded.FakeRunner).
"""

from __future__ import annotations

import time

from gpugate.slurm.control import JobNotFound, NodeNotFound, SlurmControl, SlurmError
from gpugate.slurm.records import JobInfo, NodeInfo

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

NODE = "gpu-node-01"
PARTITION = "gpu"


def idle(name: str, partition: str = PARTITION) -> NodeInfo:
    """A node in service, in one partition."""
    return NodeInfo(name=name, state="IDLE", partitions=(partition,))


def drained(name: str, reason: str, when: float | None = None, user: str = "root") -> NodeInfo:
    """A node drained with `reason` (an admin's, or `gpugate: ...`)."""
    return idle(name).replace(
        flags=("DRAIN",),
        reason=reason,
        reason_user=user,
        reason_time=None if when is None else int(when),
    )


class FakeSlurm(SlurmControl):
    """Nodes with states and reasons, jobs, and a record of every write.

    `nodes`: names (idle, in partition `gpu`) or NodeInfo records; by default the one node the
    hook tests run on. `errors`: method name -> exception it raises (a dead slurmctld): "drain",
    "resume", "reboot", "nodes", "node", "job", "admin_comment", "node_comment", "config". Writes to a
    job the fake does not hold are recorded only (the hooks' jobs are Slurm's; not every test
    sets one up).
    """

    kind = "fake"

    def __init__(
        self,
        nodes: Iterable[str | NodeInfo] = (NODE,),
        jobs: Iterable[JobInfo] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(nodes, str):
            raise TypeError("FakeSlurm(nodes=...) takes names or NodeInfo records, not one string")
        self.infos: dict[str, NodeInfo] = {}
        for n in nodes:
            info = idle(n) if isinstance(n, str) else n
            self.infos[info.name] = info
        self.jobs: dict[str, JobInfo] = {str(j.job_id): j for j in jobs}
        self.clock = clock
        self.errors: dict[str, BaseException] = {}
        self.drains: list[tuple[str, str]] = []  # (node, reason) written
        self.resumed: list[str] = []
        self.reboots: list[tuple[str, str, str]] = []  # (node, reason, nextstate) asked for
        self.comments: list[tuple[str, str]] = []  # (job id, AdminComment written)
        self.node_comments: list[tuple[str, str]] = []  # (node, Comment written)
        self.calls: list[tuple] = []  # job writes, in order: requeue, exclude, comment, ...
        self.listings = 0  # nodes() calls: what the drain budget reads
        # `scontrol show config`: none of its lines by default (the health run's older path:
        # no HealthCheckTimeout, as before Slurm 26.05); errors["config"] fails the read.
        self.shown_config = ""
        # Slurm's (major, minor) as `scontrol --version` would say (None: unknown); 22.05 has
        # no ResumeAfter, so drains are never timed unless a test says otherwise.
        self.version: tuple[int, int] | None = (22, 5)
        self.timed_drains: list[tuple[str, str, int]] = []  # (node, reason, ResumeAfter seconds)

    def _fail(self, what: str) -> None:
        if what in self.errors:
            raise self.errors[what]

    # ------------------------------------------------------------------------------- reads

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeInfo]:
        """Every node (or those named), keyed by name."""
        self._fail("nodes")
        self.listings += 1
        wanted = None if names is None else set(names)
        return {k: v for k, v in self.infos.items() if wanted is None or k in wanted}

    def node(self, name: str) -> NodeInfo:
        """One node; NodeNotFound when the fake does not hold it."""
        self._fail("node")
        if name not in self.infos:
            raise NodeNotFound(f"node {name!r} not found")
        return self.infos[name]

    def job(self, job_id: int | str) -> JobInfo:
        """One job; JobNotFound when the fake does not hold it."""
        self._fail("job")
        if str(job_id) not in self.jobs:
            raise JobNotFound(f"job {job_id} not found")
        return self.jobs[str(job_id)]

    # -------------------------------------------------------------------------- raw writes

    def _write_drain(self, node: str, reason: str) -> None:
        self._fail("drain")
        flags = tuple(dict.fromkeys([*self.infos[node].flags, "DRAIN"]))
        self.infos[node] = self.infos[node].replace(
            flags=flags, reason=reason, reason_user="root", reason_time=int(self.clock())
        )
        self.drains.append((node, reason))

    def slurm_version(self) -> tuple[int, int] | None:
        """The version a test set (`version`)."""
        return self.version

    def _write_timed_drain(self, node: str, reason: str, resume_after: int) -> None:
        self._write_drain(node, reason)
        self.timed_drains.append((node, reason, resume_after))

    def _write_resume(self, node: str) -> None:
        self._fail("resume")
        flags = tuple(f for f in self.infos[node].flags if f != "DRAIN")
        self.infos[node] = self.infos[node].replace(
            flags=flags, reason="", reason_user="", reason_time=None
        )
        self.resumed.append(node)

    def _write_reboot(self, node: str, reason: str, nextstate: str) -> None:
        # As `scontrol reboot ASAP`: DRAIN and REBOOT_REQUESTED set, the reason replaced.
        self._fail("reboot")
        flags = tuple(dict.fromkeys([*self.infos[node].flags, "DRAIN", "REBOOT_REQUESTED"]))
        self.infos[node] = self.infos[node].replace(
            flags=flags, reason=reason, reason_user="root", reason_time=int(self.clock())
        )
        self.reboots.append((node, reason, nextstate))

    def _write_node_comment(self, node: str, comment: str) -> None:
        self._fail("node_comment")
        self.node_comments.append((node, comment))

    def _write_admin_comment(self, job_id: int | str, comment: str) -> None:
        self._fail("admin_comment")
        self._update_job(job_id, admin_comment=comment)
        self.comments.append((str(job_id), comment))
        self.calls.append(("comment", job_id, comment))

    def requeue(self, job_id: int | str, hold: bool = False) -> None:
        """Recorded; a held requeue as `requeuehold`."""
        self.calls.append(("requeuehold" if hold else "requeue", job_id))

    def release(self, job_id: int | str) -> None:
        """Recorded."""
        self.calls.append(("release", job_id))

    def start_now(self, job_id: int | str) -> None:
        """Recorded (the CLI backend's StartTime=now)."""
        self.calls.append(("start_now", job_id))

    def set_excluded(self, job_id: int | str, nodes: Iterable[str]) -> None:
        """Recorded, and kept on the job when the fake holds it."""
        names = tuple(nodes)
        self._update_job(job_id, excluded_nodes=names)
        self.calls.append(("exclude", job_id, names))

    def _update_job(self, job_id: int | str, **changes: object) -> None:
        if str(job_id) in self.jobs:
            self.jobs[str(job_id)] = self.jobs[str(job_id)].replace(**changes)

    @property
    def cli(self) -> FakeSlurm:  # type: ignore[override]
        """Itself: what only scontrol does (start_now) is recorded here too."""
        return self

    def show_config(self) -> str:
        """`shown_config`, as `scontrol show config` would print it."""
        self._fail("config")
        return self.shown_config

    def scontrol(self, *args: str) -> str:
        """No scontrol in the unit tests: a hook that needs one is a bug in the test."""
        raise AssertionError(f"FakeSlurm runs no scontrol: {args}")


class SharedSlurm(FakeSlurm):
    """A node whose GPUs jobs hold: `scontrol -d -o show node` answers with `gres_used` as its
    GresUsed (None: the call fails, as a controller that does not answer), `squeue -w` with
    `jobs` (the prolog's own job 42 by default; None: the call fails); calls recorded."""

    def __init__(
        self, gres_used: str | None, jobs: tuple[str, ...] | None = ("42",), **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.gres_used = gres_used
        self.jobs_here = jobs
        self.scontrols: list[tuple[str, ...]] = []
        self.calls: list[tuple[str, ...]] = []

    def call(self, *argv: str) -> str:
        """`squeue -h -w NODE ... -o %A`: the ids of the jobs on the node."""
        self.calls.append(argv)
        assert argv[:3] == ("squeue", "-h", "-w"), argv
        if self.jobs_here is None:
            raise SlurmError("squeue: timed out after 10 s")
        return "".join(f"{job}\n" for job in self.jobs_here)

    def scontrol(self, *args: str) -> str:
        """The node's record with its GresUsed (`gpu:h100:4(IDX:0-3)`)."""
        self.scontrols.append(args)
        if self.gres_used is None:
            raise SlurmError("scontrol: timed out after 10 s")
        return f"NodeName={args[-1]} Gres=gpu:h100:8 GresUsed={self.gres_used} State=MIXED"

"""The optional backend: libslurm through pyslurm's 22.5+ API.

Used only when `choose.py` finds pyslurm's X.Y equal to the site's Slurm and a subprocess can
import it. What pyslurm cannot do goes to the CLI backend. (This module's name does not hide
the real `pyslurm`: imports are absolute.)
"""

from __future__ import annotations

from gpugate.slurm import records
from gpugate.slurm.cli import CliBackend
from gpugate.slurm.control import (
    JobNotFound,
    NodeNotFound,
    SlurmControl,
    SlurmError,
    valid_node_name,
)
from gpugate.slurm.jobid import JobId, parse_job_id
from gpugate.slurm.records import (
    JobInfo,
    NodeInfo,
    ended_at,
    job_reason,
    mixed_if_partly_allocated,
    node_reason,
    split_state,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any  # pyslurm has no stubs, and must match each site's Slurm


class PyslurmBackend(SlurmControl):
    """pyslurm's 22.5+ API (Node.modify, Nodes.load, Job.load, requeue, release, modify).

    pyslurm cannot be built on the project's machines (no matching libslurm; see
    docs/slurm-facts.md, pyslurm), so this class is tested only against a fake `pyslurm` module; the
    one live check was pyslurm 22.5.3 on Slurm 22.05.8, by hand. Use it through
    select_backend(), which never imports pyslurm in-process to probe: a failing `slurm_init()`
    exits the interpreter. What pyslurm cannot do goes to the CLI: clearing ExcNodeList (an
    empty list reads as "unchanged"), StartTime=now, and every call on an array task (`14_1`)
    or het component (`14+1`): pyslurm's Job(...)/Job.load(...) take a plain integer id only.
    """

    kind = "pyslurm"

    def __init__(self, cli: CliBackend | None = None, module: Any = None) -> None:
        self._cli = cli or CliBackend()
        self._module = module

    @property
    def cli(self) -> CliBackend:
        """The CLI backend used for what pyslurm cannot do."""
        return self._cli

    @property
    def _ps(self) -> Any:  # the pyslurm module
        if self._module is None:
            import pyslurm  # only after select_backend()'s subprocess probe passed

            self._module = pyslurm
        return self._module

    def _rpc(self, what: str, fn: Callable[..., Any], *args: object, **kwargs: object) -> Any:
        try:
            return fn(*args, **kwargs)
        except self._ps.RPCError as e:
            text = str(e)
            lower = text.lower()
            # Node.load: "Node 'x' does not exist"; slurm_strerror: "Invalid node name
            # specified", "Invalid job id specified" (ESLURM_INVALID_JOB_ID, every job RPC).
            if "does not exist" in lower or "invalid node name" in lower:
                raise NodeNotFound(f"{what}: {text}") from e
            if "invalid job id" in lower:
                raise JobNotFound(f"{what}: {text}") from e
            raise SlurmError(f"pyslurm {what}: {text}") from e

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeInfo]:
        """Every node (or those named; unknown names are left out), keyed by name."""
        loaded = self._rpc("Nodes.load()", self._ps.Nodes.load)
        wanted = None if names is None else set(names)
        infos = (_node_from_pyslurm(n) for n in loaded.values())
        return {n.name: n for n in infos if wanted is None or n.name in wanted}

    def node(self, name: str) -> NodeInfo:
        """One node; NodeNotFound when Slurm does not know it."""
        return _node_from_pyslurm(self._rpc(f"Node.load({name})", self._ps.Node.load, name))

    def job(self, job_id: int | str) -> JobInfo:
        """One job; JobNotFound when Slurm does not know it."""
        jid = parse_job_id(job_id)
        if jid.plain is None:  # pyslurm's Job.load takes a plain id only: scontrol reads it
            return self._cli.job(str(jid))
        j = self._rpc(f"Job.load({jid})", self._ps.Job.load, jid.plain)
        code, sig = j.exit_code or 0, j.exit_code_signal or 0
        return JobInfo(
            job_id=int(j.id),
            user=j.user_name or "",
            uid=j.user_id,
            state=j.state or "",
            reason=job_reason(j.state_reason),
            nodes=tuple(self.expand_hostlist(j.allocated_nodes or "")),
            batch_host=j.batch_host or "",
            stdout=j.standard_output or "",
            stderr=j.standard_error or "",
            work_dir=j.working_directory or "",
            exit_code=code,
            exit_signal=sig,
            restarts=j.requeue_count or 0,
            comment=j.comment or "",
            admin_comment=j.admin_comment or "",
            excluded_nodes=tuple(self.expand_hostlist(j.excluded_nodes or "")),
            requeue=bool(j.is_requeueable),
            partition=j.partition or "",
            required_nodes=tuple(self.expand_hostlist(getattr(j, "required_nodes", None) or "")),
            end_time=ended_at(_pyslurm_epoch(getattr(j, "end_time", None))),
            start_time=ended_at(_pyslurm_epoch(getattr(j, "start_time", None))),
        )

    def _job(self, jid: JobId) -> Any:
        # Callers send array tasks and het components to the CLI first; this is the guard.
        if jid.plain is None:
            raise ValueError(f"pyslurm's Job takes a plain job id, not {str(jid)!r}")
        return self._ps.Job(jid.plain)

    def _modify_job(self, jid: JobId, **changes: object) -> None:
        desc = self._ps.JobSubmitDescription(**changes)
        self._rpc(f"Job({jid}).modify", self._job(jid).modify, desc)

    def _write_drain(self, node: str, reason: str) -> None:
        changes = self._ps.Node(state="DRAIN", reason=reason)
        self._rpc(f"Node({node}).modify", self._ps.Node(node).modify, changes)

    def _write_resume(self, node: str) -> None:
        changes = self._ps.Node(state="RESUME")
        self._rpc(f"Node({node}).modify", self._ps.Node(node).modify, changes)

    # Each job write below sends an array task (`14_1`) or het component (`14+1`) to
    # scontrol, which addresses it itself: pyslurm's Job(...) holds a plain uint32 job id only.

    def requeue(self, job_id: int | str, hold: bool = False) -> None:
        """Requeue a running job, held if asked (so the exclusion can be set first)."""
        jid = parse_job_id(job_id)
        if jid.plain is None:
            self._cli.requeue(str(jid), hold=hold)
            return
        self._rpc(f"Job({jid}).requeue", self._job(jid).requeue, hold=hold)

    def _write_release(self, job_id: int | str) -> None:
        jid = parse_job_id(job_id)
        if jid.plain is None:
            self._cli._write_release(str(jid))
            return
        self._rpc(f"Job({jid}).release", self._job(jid).release)

    def set_excluded(self, job_id: int | str, nodes: Iterable[str]) -> None:
        """Set a pending job's excluded nodes; an empty list clears them (through scontrol)."""
        jid = parse_job_id(job_id)
        names = [valid_node_name(n) for n in nodes]
        # pyslurm turns [] or "" into NULL, which Slurm reads as "unchanged".
        if not names or jid.plain is None:
            self._cli.set_excluded(str(jid), names)
            return
        self._modify_job(jid, excluded_nodes=names)

    def _write_admin_comment(self, job_id: int | str, comment: str) -> None:
        jid = parse_job_id(job_id)
        if jid.plain is None:
            self._cli._write_admin_comment(str(jid), comment)
            return
        self._modify_job(jid, admin_comment=comment)

    def _write_node_comment(self, node: str, comment: str) -> None:
        if not comment:
            # An empty comment is "no change" to pyslurm's Node.modify (seen on 24.11.0 with
            # pyslurm 24.11.0: a put-back GPU kept its isolation Comment); scontrol's
            # `Comment=` empties it.
            self.cli.scontrol("update", f"NodeName={node}", "Comment=")
            return
        # Node.comment is settable in pyslurm 22.5.3 and 24.11.0 alike (core/node.pyx).
        changes = self._ps.Node(comment=comment)
        self._rpc(f"Node({node}).modify", self._ps.Node(node).modify, changes)


def _pyslurm_epoch(value: object) -> int | None:
    # pyslurm's Job.end_time is epoch seconds; be lenient with None or odd types.
    try:
        return int(value) if value else None  # type: ignore[call-overload]  # what int() refuses: None
    except (TypeError, ValueError):
        return None


def _pyslurm_count(value: object) -> int | None:
    # pyslurm's Node.total_cpus (23.x API); None or odd types read as unknown.
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _node_from_pyslurm(n: Any) -> NodeInfo:
    state, flags = split_state(getattr(n, "state", None) or "UNKNOWN")  # "IDLE+DRAIN"
    # pyslurm 22.5 prints a partly used node ALLOCATED, where scontrol (and pyslurm 24.11)
    # say MIXED; the CPU counts tell which (core/node.pyx: allocated_cpus, idle_cpus).
    state = mixed_if_partly_allocated(
        state,
        _pyslurm_count(getattr(n, "allocated_cpus", None)),
        _pyslurm_count(getattr(n, "idle_cpus", None)),
    )
    reason, user, when = node_reason(
        getattr(n, "reason", None),
        getattr(n, "reason_user", None),
        getattr(n, "reason_time", None) or None,
    )
    return NodeInfo(
        name=n.name,
        state=state,
        flags=flags,
        reason=reason,
        reason_user=user,
        reason_time=when,
        partitions=tuple(getattr(n, "partitions", None) or ()),
        gres_gpus=records.gres_gpu_count(getattr(n, "configured_gres", None)),
        gpu_type=records.gres_gpu_type(getattr(n, "configured_gres", None)),
        cpus=_pyslurm_count(getattr(n, "total_cpus", None)),
        # Node.comment: the node's Comment (core/node.pyx, 22.5.3 and 24.11.0); None when unset.
        comment=_pyslurm_text(getattr(n, "comment", None)),
    )


def _pyslurm_text(value: object) -> str:
    # pyslurm returns None for an unset char* field; anything but a string reads as unset.
    return value if isinstance(value, str) else ""

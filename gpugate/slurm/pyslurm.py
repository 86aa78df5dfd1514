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
    valid_job_id,
    valid_node_name,
)
from gpugate.slurm.records import JobInfo, NodeInfo, ended_at, job_reason, split_state

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
    empty list reads as "unchanged") and StartTime=now.
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
            if "does not exist" in text:
                raise NodeNotFound(f"{what}: {text}") from e
            if "invalid job id" in text.lower():
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
        j = self._rpc(f"Job.load({job_id})", self._ps.Job.load, int(valid_job_id(job_id)))
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

    def _job(self, job_id: int | str) -> Any:
        return self._ps.Job(int(valid_job_id(job_id)))

    def _modify_job(self, job_id: int | str, **changes: object) -> None:
        desc = self._ps.JobSubmitDescription(**changes)
        self._rpc(f"Job({job_id}).modify", self._job(job_id).modify, desc)

    def _write_drain(self, node: str, reason: str) -> None:
        changes = self._ps.Node(state="DRAIN", reason=reason)
        self._rpc(f"Node({node}).modify", self._ps.Node(node).modify, changes)

    def _write_resume(self, node: str) -> None:
        changes = self._ps.Node(state="RESUME")
        self._rpc(f"Node({node}).modify", self._ps.Node(node).modify, changes)

    def requeue(self, job_id: int | str, hold: bool = False) -> None:
        """Requeue a running job, held if asked (so the exclusion can be set first)."""
        self._rpc(f"Job({job_id}).requeue", self._job(job_id).requeue, hold=hold)

    def release(self, job_id: int | str) -> None:
        """Release a held job and let it start now (a requeue delays it by 120 s)."""
        self._rpc(f"Job({job_id}).release", self._job(job_id).release)
        self._cli.start_now(job_id)

    def set_excluded(self, job_id: int | str, nodes: Iterable[str]) -> None:
        """Set a pending job's excluded nodes; an empty list clears them (through scontrol)."""
        names = [valid_node_name(n) for n in nodes]
        if not names:
            # pyslurm turns [] or "" into NULL, which Slurm reads as "unchanged".
            self._cli.set_excluded(job_id, [])
            return
        self._modify_job(job_id, excluded_nodes=names)

    def _write_admin_comment(self, job_id: int | str, comment: str) -> None:
        self._modify_job(job_id, admin_comment=comment)


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
    return NodeInfo(
        name=n.name,
        state=state,
        flags=flags,
        reason=(getattr(n, "reason", None) or "").strip(),
        reason_user=getattr(n, "reason_user", None) or "",
        reason_time=getattr(n, "reason_time", None) or None,
        partitions=tuple(getattr(n, "partitions", None) or ()),
        gres_gpus=records.gres_gpu_count(getattr(n, "configured_gres", None)),
        cpus=_pyslurm_count(getattr(n, "total_cpus", None)),
    )

"""Every JSON shape Slurm prints for nodes and jobs, 21.08 to 25.11 (pure, no I/O).

Shapes covered (all recorded under `tests/fixtures/slurm/`):

- `nodes` records: `sinfo --json` 21.08/22.05 (`state` a lower-case string plus
  `state_flags`), `scontrol show node --json` and slurmrestd 23.11+ (`state` an upper-case
  list, times as `{set, infinite, number}`).
- `sinfo` records: `sinfo --json` 23.02+ (aggregated: `node.state`, `nodes.nodes`, `reason`
  an object).
- `jobs` records: `squeue --json` 22.05 (`job_state` a string, `exit_code` an int) and
  `squeue`/`scontrol show job --json`/slurmrestd 23.11+ (lists and objects).

A new version's shape goes here, with its recording under `tests/fixtures/slurm/<version>/`.
"""

from __future__ import annotations

import json

from gpugate.slurm.hostlist import expand_lenient
from gpugate.slurm.records import (
    JobInfo,
    NodeInfo,
    ended_at,
    gres_gpu_count,
    gres_gpu_type,
    job_reason,
    node_reason,
    split_state,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, Concatenate, ParamSpec, TypeVar

    _P = ParamSpec("_P")
    _T = TypeVar("_T")


def _json_shape(parse: Callable[Concatenate[str, _P], _T]) -> Callable[Concatenate[str, _P], _T]:
    """`parse`, raising ValueError (as for text that is not JSON) on JSON of another shape."""

    def wrapped(text: str, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return parse(text, *args, **kwargs)
        except (AttributeError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            raise ValueError(f"not Slurm's JSON: {type(exc).__name__}: {exc}") from None

    wrapped.__doc__ = parse.__doc__
    return wrapped


@_json_shape
def parse_nodes_json(text: str) -> list[NodeInfo]:
    """Parse any JSON with node records: `nodes` (scontrol/slurmrestd, 21.08-22.05 sinfo) or
    `sinfo` (23.02+ sinfo)."""
    doc = json.loads(text)
    if isinstance(doc.get("sinfo"), list):
        return _dedupe(_nodes_from_sinfo_record(r) for r in doc["sinfo"])
    return _dedupe([_node_from_record(r)] for r in doc.get("nodes") or [])


def parse_sinfo_json(text: str) -> list[NodeInfo]:
    """Parse `sinfo --json` of any version (21.08-25.11) into one NodeInfo per node."""
    return parse_nodes_json(text)


def _dedupe(groups: Iterable[list[NodeInfo]]) -> list[NodeInfo]:
    # sinfo repeats a node once per partition; the first record wins.
    seen: dict[str, NodeInfo] = {}
    for group in groups:
        for node in group:
            seen.setdefault(node.name, node)
    return list(seen.values())


def _node_from_record(rec: dict[str, Any]) -> NodeInfo:
    state, flags = split_state(rec.get("state"), rec.get("state_flags") or ())
    reason = rec.get("reason") or ""
    partitions = tuple(p for p in rec.get("partitions") or () if isinstance(p, str))
    if isinstance(reason, dict):  # defensive: the sinfo-record shape
        return _with_reason_object(rec["name"], state, flags, reason, partitions)
    text, user, when = node_reason(
        reason, rec.get("reason_set_by_user"), _epoch(rec.get("reason_changed_at"))
    )
    return NodeInfo(
        name=rec["name"],
        state=state,
        flags=flags,
        reason=text,
        reason_user=user,
        reason_time=when,
        partitions=partitions,
        gres_gpus=gres_gpu_count(rec.get("gres")),
        gpu_type=gres_gpu_type(rec.get("gres")),
        cpus=_number(rec.get("cpus")) or None,
        comment=_string(rec.get("comment")),
    )


def _nodes_from_sinfo_record(rec: dict[str, Any]) -> list[NodeInfo]:
    state, flags = split_state((rec.get("node") or {}).get("state"))
    names = (rec.get("nodes") or {}).get("nodes") or []
    reason = rec.get("reason") or {}
    if isinstance(reason, str):
        reason = {"description": reason}
    partition = (rec.get("partition") or {}).get("name")
    partitions = (partition,) if isinstance(partition, str) and partition else ()
    gres = rec.get("gres")
    gres = gres.get("total") if isinstance(gres, dict) else gres
    gpus, gpu_type = gres_gpu_count(gres), gres_gpu_type(gres)
    # sinfo groups nodes: `cpus.minimum` is the fewest any node of the group has (24.11).
    cpus_rec = rec.get("cpus")
    cpus = _number(cpus_rec.get("minimum")) if isinstance(cpus_rec, dict) else None
    # sinfo merges nodes only on the fields of its output format (sinfo.c, MATCH_FLAG_COMMENT
    # only with a Comment field): as with the reason, measured on 24.11, a record's Comment is
    # its first node's (read from the source, not measured). A node's own only when alone.
    comment = _string(rec.get("comment")) if len(names) == 1 else ""
    return [
        _with_reason_object(name, state, flags, reason, partitions).replace(
            gres_gpus=gpus, gpu_type=gpu_type, cpus=cpus or None, comment=comment
        )
        for name in names
    ]


def _with_reason_object(
    name: str,
    state: str,
    flags: tuple[str, ...],
    reason: dict[str, Any],
    partitions: tuple[str, ...] = (),
) -> NodeInfo:
    text, user, when = node_reason(
        reason.get("description"), reason.get("user"), _epoch(reason.get("time"))
    )
    return NodeInfo(
        name=name,
        state=state,
        flags=flags,
        reason=text,
        reason_user=user,
        reason_time=when,
        partitions=partitions,
    )


@_json_shape
def parse_jobs_json(text: str, expand: Callable[[str], list[str]] | None = None) -> list[JobInfo]:
    """Parse `squeue --json`, `scontrol show job --json` or slurmrestd `/jobs` (22.05-25.11)."""
    expand = expand or expand_lenient
    return [_job_from_record(r, expand) for r in json.loads(text).get("jobs") or []]


def _job_from_record(rec: dict[str, Any], expand: Callable[[str], list[str]]) -> JobInfo:
    state = rec.get("job_state") or ""
    if isinstance(state, list):
        state = state[0] if state else ""
    code, sig = _json_exit(rec.get("exit_code"))
    reason = rec.get("state_description") or rec.get("state_reason") or ""
    return JobInfo(
        job_id=int(rec["job_id"]),
        user=rec.get("user_name") or "",
        uid=_number(rec.get("user_id")),
        state=state,
        reason=job_reason(reason),
        nodes=tuple(expand(rec.get("nodes") or "")),
        batch_host=rec.get("batch_host") or "",
        stdout=rec.get("stdout_expanded") or rec.get("standard_output") or "",
        stderr=rec.get("stderr_expanded") or rec.get("standard_error") or "",
        work_dir=rec.get("current_working_directory") or "",
        exit_code=code,
        exit_signal=sig,
        restarts=_number(rec.get("restart_cnt")) or 0,
        comment=rec.get("comment") or "",
        admin_comment=rec.get("admin_comment") or "",
        excluded_nodes=tuple(expand(rec.get("excluded_nodes") or "")),
        requeue=bool(rec.get("requeue")),
        partition=rec.get("partition") or "",
        required_nodes=tuple(expand(rec.get("required_nodes") or "")),
        end_time=ended_at(_epoch(rec.get("end_time"))),
        start_time=ended_at(_epoch(rec.get("start_time"))),  # a pending job's is a forecast
    )


def _json_exit(value: object) -> tuple[int, int]:
    """(exit code, signal) from 23.11+'s object or 22.05's integer."""
    if isinstance(value, dict):
        rc = value.get("return_code")
        sig = (value.get("signal") or {}).get("id")
        return _number(rc) or 0, _number(sig) or 0
    raw = _number(value) or 0
    # 22.05 prints a plain integer (only 0 seen in the recorded samples); a raw wait status
    # (>255) is decoded the way scontrol prints ExitCode=code:signal.
    return ((raw >> 8) & 0xFF, raw & 0x7F) if raw > 255 else (raw, 0)


def _number(value: object) -> int | None:
    """An int from a plain number or 23.11+'s {set, infinite, number}; None when unset."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    try:
        number: int = int(value)  # type: ignore[call-overload]  # JSON: what int() refuses is None below
    except (TypeError, ValueError):
        return None
    return number


def _string(value: object) -> str:
    """A JSON string field; "" for null or another type."""
    return value if isinstance(value, str) else ""


def _epoch(value: object) -> int | None:
    n = _number(value)
    return n if n else None  # Slurm writes 0 for "never"

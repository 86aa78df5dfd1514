"""Evidence bundles: one directory per job, node and run, written atomically, admins only.

Layout: `<evidence_dir>/<job id>/<node>-r<restart count>/` holding `summary.json` (job, node,
times, category, xid, failing rank, suspected node, action taken) and the raw evidence. The
bundle is assembled in a hidden temporary directory and renamed into place, so a reader never
sees half of one. Directories are 0750 and files 0640, owned by root and by the configured
admin group: readable by admins, not by other users (logs can hold secrets).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

from gpugate.fsutil import atomic_write

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_JOB = re.compile(r"^[0-9]+(?:_[0-9]+)?$")


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


def _private_dir(path: str, gid: int) -> None:
    os.makedirs(path, mode=0o750, exist_ok=True)
    if os.path.islink(path) or not os.path.isdir(path):
        raise EvidenceError(f"{path}: not a plain directory")
    os.chmod(path, 0o750)  # noqa: S103 - group read is the point: the admins' group
    if gid >= 0:
        os.chown(path, -1, gid)


def write_bundle(
    evidence_dir: str,
    job_id: str,
    node: str,
    restart: int,
    files: dict[str, str | bytes],
    summary: dict,
    group: str | None = None,
) -> str:
    """Write the bundle atomically; return its final path."""
    if not _JOB.match(job_id or ""):
        raise EvidenceError(f"not a Slurm job id: {job_id!r}")
    gid = _group_id(group)
    job_dir = os.path.join(evidence_dir, job_id)
    _private_dir(evidence_dir, gid)
    _private_dir(job_dir, gid)
    final = os.path.join(job_dir, bundle_name(node, restart))
    tmp = tempfile.mkdtemp(prefix=f".{bundle_name(node, restart)}.", dir=job_dir)
    try:
        os.chmod(tmp, 0o750)  # noqa: S103 - as above
        if gid >= 0:
            os.chown(tmp, -1, gid)
        summary = dict(summary, bundle=final, files=sorted([*files, "summary.json"]))
        for name, content in {
            **files,
            "summary.json": json.dumps(summary, indent=1, default=str),
        }.items():
            _write_member(tmp, name, content, gid)
        if os.path.isdir(final):
            # An epilog that runs twice for the same run keeps the older bundle beside.
            os.replace(final, final + f".old-{os.getpid()}")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write_member(directory: str, name: str, content: str | bytes, gid: int) -> None:
    parts = name.split("/")
    if any(not _NAME.match(p) or p in (".", "..") for p in parts):
        raise EvidenceError(f"unsafe bundle member name: {name!r}")
    if len(parts) > 1:
        sub = os.path.join(directory, *parts[:-1])
        _private_dir(sub, gid)
    path = os.path.join(directory, *parts)
    atomic_write(path, content, mode=0o640)
    if gid >= 0:
        os.chown(path, -1, gid)


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


def read_summary(bundle: str) -> dict | None:
    """A bundle's summary.json, or None when missing or unreadable."""
    try:
        fd = os.open(os.path.join(bundle, "summary.json"), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, RecursionError):  # RecursionError: "[[[[..." 100k deep
        return None
    return data if isinstance(data, dict) else None


def suspect_node(summaries: list[dict]) -> str | None:
    """The node whose evidence shows the first hardware error (earliest time), if any.

    In a multi-node job every rank times out; the node that failed first is the cause.
    """
    hardware = [s for s in summaries if s.get("hardware_fault")]
    if not hardware:
        return None
    hardware.sort(key=lambda s: (s.get("first_hardware_error_at") or "~", s.get("node") or ""))
    return hardware[0].get("node")

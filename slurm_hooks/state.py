"""The node-local state directory: per-job baselines of the counters the epilog compares.

Layout under `state_dir` (root-owned, 0755; files 0644):
  jobs/<job id>/baseline.json   counters at prolog time (ECC, remapped rows, NVLink, PCIe, IB)
  kernel-log.pos                the kernel-log position the last check reached (boot id, seq)
  events.jsonl                  one line per hook run (gpugate.log)
Several jobs share a node, so everything is keyed by job id and written atomically.
"""

from __future__ import annotations

import json
import os
import re

from gpugate.fsutil import atomic_write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.facts import Facts

_JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+)?$")


class StateError(RuntimeError):
    """The state directory or a state file is unusable."""


def job_dir(state_dir: str, job_id: str) -> str:
    """The directory of one job's state (the id is checked: it becomes a path)."""
    if not _JOB_ID.match(job_id or ""):
        raise StateError(f"not a Slurm job id: {job_id!r}")
    return os.path.join(state_dir, "jobs", job_id)


def ensure_dir(path: str, mode: int = 0o755) -> str:
    """Create a root-owned directory (and parents); refuse a symlink in its place."""
    os.makedirs(path, mode=mode, exist_ok=True)
    if os.path.islink(path) or not os.path.isdir(path):
        raise StateError(f"{path}: not a plain directory")
    return path


def counters(facts: Facts) -> dict:
    """The monotonic counters and states the epilog compares against (per GPU and IB port)."""
    gpus = {}
    for g in facts.gpus or ():
        rr = g.remapped_rows
        gpus[str(g.index)] = {
            "uuid": g.uuid,
            "ecc_volatile_uncorrected": g.ecc_volatile_uncorrected,
            "ecc_volatile_corrected": g.ecc_volatile_corrected,
            "ecc_aggregate_uncorrected": g.ecc_aggregate_uncorrected,
            "ecc_aggregate_corrected": g.ecc_aggregate_corrected,
            "remapped_uncorrected": rr.uncorrected if rr else None,
            "remapped_corrected": rr.corrected if rr else None,
            "remap_pending": rr.pending if rr else None,
            "retired_pages_pending": g.retired_pages_pending,
            "pcie_replay_errors": g.pcie.replay_errors if g.pcie else None,
            "nvlink_errors": dict(g.nvlink_errors or {}),
            "nvlink_active": sum(1 for a in g.nvlink_active or () if a),
            "throttle_reasons": list(g.throttle_reasons or ()),
            "error": g.error,
        }
    ib = {
        f"{p.device}/{p.port}": dict(p.counters or {}, state=p.state)
        for p in facts.infiniband or ()
    }
    return {
        "gpus": gpus,
        "infiniband": ib,
        "boot_id": facts.boot_id,
        "kernel_log_seq": facts.kernel_log_seq,
        # The last lines seen, so that a replayed or re-read log can be compared line by line.
        "kernel_log_tail": list(facts.kernel_log or ())[-200:],
    }


def load_kernel_pos(state_dir: str) -> tuple[str | None, int | None]:
    """(boot id, sequence number) the last check reached, or (None, None)."""
    try:
        fd = os.open(os.path.join(state_dir, "kernel-log.pos"), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="utf-8") as fh:
            data = json.load(fh)
        return data.get("boot_id"), int(data["seq"])
    # OverflowError: `"seq": Infinity`; RecursionError: `[[[[...` 100k deep.
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        OverflowError,
        RecursionError,
    ):
        return None, None


def save_kernel_pos(state_dir: str, boot_id: str | None, seq: int | None) -> None:
    """Remember how far the kernel log has been checked (atomically)."""
    if seq is None:
        return
    ensure_dir(state_dir)
    atomic_write(
        os.path.join(state_dir, "kernel-log.pos"), json.dumps({"boot_id": boot_id, "seq": seq})
    )


def save_baseline(state_dir: str, job_id: str, facts: Facts, extra: dict | None = None) -> str:
    """Write the job's baseline atomically; returns its path."""
    directory = ensure_dir(job_dir(state_dir, job_id))
    data = {"job_id": job_id, "node": facts.node, "collected_at": facts.collected_at}
    data.update(counters(facts))
    data.update(extra or {})
    path = os.path.join(directory, "baseline.json")
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True))
    return path


def load_baseline(state_dir: str, job_id: str) -> dict | None:
    """The job's baseline, or None when there is none (or it is unreadable)."""
    path = os.path.join(job_dir(state_dir, job_id), "baseline.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, RecursionError):  # RecursionError: "[[[[..." 100k deep
        return None
    return data if isinstance(data, dict) else None

"""The job's baseline (`jobs/<job id>/baseline.json`): what its prolog saw and recorded of its
run, for its epilog (store/state.save_baseline, load_baseline; store/runs.py).

Every release wrote `job_id` (and the node) with the counters; the run's own fields came later
(`restart_count`, `known_faults`, `job_gpus`, `started_at`, `log_offsets`), and an absent one
reads as its default: an epilog after an upgrade reads its prolog's older baseline. Releases
before the TaskProlog's own file kept the job's `ckpt_dir` here; it is read, never written.
`docs/interfaces.md` shows the table (`field_table`).
"""

from __future__ import annotations

from gpugate.jsonrecord import JsonRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar


class KnownFault(JsonRecord):
    """A failing finding the prolog itself reported: not new since the prolog."""

    check: str
    gpu: int | None = None

    _doc: ClassVar[dict[str, str]] = {"check": "the check id", "gpu": "its GPU, or null"}


class RunRecord(JsonRecord):
    """What the prolog keeps of this run beside the counters (store/runs.py)."""

    restart_count: int = 0
    known_faults: list[KnownFault] = []
    job_gpus: list[int] | None = None
    started_at: float | None = None
    log_offsets: dict[str, int] | None = None

    _omit = frozenset({"log_offsets"})
    _doc: ClassVar[dict[str, str]] = {
        "restart_count": "the run (SLURM_JOB_RESTART_COUNT)",
        "known_faults": "the prolog's failing findings (`check`, `gpu`)",
        "job_gpus": "the job's GPUs here (SLURM_JOB_GPUS); null: not known",
        "started_at": "the prolog's clock (epoch)",
        "log_offsets": "a rerun's StdOut/StdErr sizes as it started (path -> bytes)",
    }


class Baseline(RunRecord):
    """The counters and kernel position at the prolog, with its run's record."""

    job_id: str
    node: str | None = None
    collected_at: str | None = None
    gpus: dict[str, dict[str, Any]] = {}
    infiniband: dict[str, dict[str, Any]] = {}
    boot_id: str | None = None
    kernel_log_seq: int | None = None
    kernel_log_tail: list[str] = []
    ckpt_dir: str | None = None

    _omit = frozenset({"log_offsets", "ckpt_dir"})
    _doc: ClassVar[dict[str, str]] = {
        **RunRecord._doc,
        "job_id": "the job",
        "node": "the node",
        "collected_at": "the facts' time",
        "gpus": "per GPU index: its counters (ECC, remapped rows, NVLink, PCIe replays, ...)",
        "infiniband": "per `device/port`: its counters and state",
        "boot_id": "the node's boot",
        "kernel_log_seq": "the kernel log's sequence number the prolog reached",
        "kernel_log_tail": "the last 200 kernel lines it saw",
        "ckpt_dir": "releases before the TaskProlog's file: the job's checkpoint directory "
        "(read, never written)",
    }

"""What Slurm tells gpugate about a node or a job, whatever the source (text, JSON, pyslurm).

The parsers (`parse_text.py`, `parse_json.py`) and the pyslurm backend all build these
records; `split_state` reads every version's way of writing a node state.
"""

from __future__ import annotations

import re
import time

from gpugate.record import Record
from gpugate.slurm.reasons import GPUGATE_PREFIX

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

# A node is out of service when its base state or a flag says so; never because it has a
# reason: 24.11 keeps the reason on a resumed, idle node (docs/slurm-facts.md).
_OUT_OF_SERVICE = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})
_BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
_BASE_STATES = frozenset(
    {"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "END"}
    | {"DRAINED", "DRAINING", "FAIL", "FAILING", "COMPLETING"}  # sinfo's combined names
)
# sinfo's short suffixes on a state (`idle*`, `down~`), as flag names.
_STATE_SUFFIX = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "!": "POWER_DOWN",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "$": "MAINTENANCE",
    "-": "PLANNED",
}
# The job reason after a failed prolog when Slurm holds the job (the default; job_mgr.c
# `_job_requeue_op`, JOB_LAUNCH_FAILED): "launch failed requeued held", as scontrol prints it.
LAUNCH_FAILED_REASONS = frozenset({"launch_failed_requeued_held"})
# 24.11 stores the prolog's failure as the job's exit code (job_mgr.c `prolog_complete`:
# exit_code = prolog_rc = ESLURMD_PROLOG_FAILED, 4022 in slurm_errno.h), which scontrol and
# SLURM_JOB_EXIT_CODE2 print as `0:54` (4022 & 0x7f). 22.05 leaves `0:0`.
PROLOG_FAILED_SIGNAL = 54


class NodeInfo(Record):
    """One node as Slurm reports it: base state, flags and the drain reason."""

    name: str
    state: str  # base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, ...
    flags: tuple[str, ...] = ()  # upper case: ("DRAIN",), ("RESERVED", "DRAIN", "NOT_RESPONDING")
    reason: str = ""  # without the `[user@time]` that `scontrol show node` appends
    reason_user: str = ""
    reason_time: int | None = None  # epoch seconds
    partitions: tuple[
        str, ...
    ] = ()  # the partitions the node is in (the drain budget counts per partition)
    gres_gpus: int | None = None  # GPUs slurm.conf gives the node (`Gres=gpu:8`); None: unknown
    gpu_type: str = ""  # the GPU type slurm.conf names in its Gres (`gpu:h100:8`: h100); "": none
    cpus: int | None = None  # CPUs Slurm counts on the node (`CPUTot=`, JSON `cpus`); None: unknown
    comment: str = ""  # the node's Comment (gpugate/isolate/comment.py records isolated GPUs)

    @property
    def drained(self) -> bool:
        """True when DRAIN/DOWN/FAIL is set (the state or a flag), whatever the reason says."""
        return self.state in _OUT_OF_SERVICE or any(f in _OUT_OF_SERVICE for f in self.flags)

    @property
    def state_reason(self) -> str:
        """The reason while the node is out of service (DRAIN/DOWN/FAIL); "" once it is back.

        A resumed node may still carry its last reason: Slurm 23.02 to 25.11 clear it on a
        resume only where an accounting storage plugin is configured (src/interfaces/
        accounting_storage.c `clusteracct_storage_g_node_up` returns before its xfree when
        the plugin is a no-op), else only when they next allocate the node a job (node_mgr.c
        `make_node_alloc`); `scontrol update reason=` cannot (update_node sets non-empty
        reasons only). 22.05 and 26.05 clear it (docs/slurm-facts.md, "A resumed node's
        reason"). That leftover says nothing about the node now: views show this instead."""
        return self.reason if self.drained else ""

    @property
    def busy(self) -> bool:
        """Whether a job runs on the node or is still ending there (ALLOCATED, MIXED or
        COMPLETING, as the state or a flag): no repair acts then (issue 45, job-safe)."""
        return self.state in _BUSY or any(f in _BUSY for f in self.flags)

    @property
    def gpugate_owned(self) -> bool:
        """True when the reason is one gpugate wrote."""
        return self.reason.startswith(GPUGATE_PREFIX)


class JobInfo(Record):
    """The parts of a job that gpugate reads: who, where, its files, how it ended."""

    job_id: int
    user: str = ""
    uid: int | None = None
    state: str = ""  # PENDING, RUNNING, COMPLETED, ...
    reason: str = ""  # Slurm's state reason, spaces as underscores (as scontrol prints it)
    nodes: tuple[str, ...] = ()  # expanded host names
    batch_host: str = ""
    stdout: str = ""
    stderr: str = ""
    work_dir: str = ""
    exit_code: int = 0
    exit_signal: int = 0
    restarts: int = 0
    comment: str = ""
    admin_comment: str = ""
    excluded_nodes: tuple[str, ...] = ()  # expanded host names
    requeue: bool = False
    partition: str = ""
    required_nodes: tuple[str, ...] = ()  # `-w`/ReqNodeList, expanded host names
    end_time: int | None = None  # epoch; None while the job has not ended (or was requeued)
    start_time: int | None = None  # epoch; this run's start (None: not started, unknown)

    @property
    def back_in_queue(self) -> bool:
        """Slurm has put the job back in the queue itself (a failed prolog or launch, a node
        failure with --requeue, an admin's requeue).

        Seen on 22.05 from EpilogSlurmctld: such a job prints JobState=COMPLETING (the
        PENDING|COMPLETING bits; the PENDING comes once the hook is done) and EndTime=Unknown,
        where a job that ended prints COMPLETING with its EndTime.
        """
        state = self.state.upper()
        return state in ("PENDING", "REQUEUED", "REQUEUE_HOLD") or (
            state == "COMPLETING" and self.end_time is None
        )

    @property
    def launch_failed(self) -> bool:
        """Slurm's own word that the job's prolog (or launch) failed on a node."""
        return self.reason in LAUNCH_FAILED_REASONS or (self.exit_code, self.exit_signal) == (
            0,
            PROLOG_FAILED_SIGNAL,
        )


# ----------------------------------------------------------------------------------- states


def split_state(
    state: str | list[str] | tuple[str, ...] | None, extra_flags: Iterable[str] = ()
) -> tuple[str, tuple[str, ...]]:
    """("IDLE", ("DRAIN",)) from "IDLE+DRAIN", ["IDLE", "DRAIN"], "idle*" or "idle" + flags."""
    parts = state.split("+") if isinstance(state, str) else list(state or [])
    names: list[str] = []
    for part in [*parts, *extra_flags]:
        word = str(part).strip().upper()
        trailing: list[str] = []
        while word and word[-1] in _STATE_SUFFIX:
            trailing.insert(0, _STATE_SUFFIX[word[-1]])
            word = word[:-1]
        names.extend(([word] if word else []) + trailing)
    names = list(dict.fromkeys(names))  # drop repeats, keep order
    if not names:
        return "UNKNOWN", ()
    base = next((n for n in names if n in _BASE_STATES), names[0])
    return base, tuple(n for n in names if n != base)


def gres_gpu_count(gres: object) -> int | None:
    """GPUs in a node's configured Gres: `gpu:8(S:0-1)`, `gpu:h100:4,gpu:a100:2,nic:1` -> 6.

    None when the text names no GPU gres (`(null)`, a CPU-only node: the caller cannot tell
    "none configured" from "not said", so gpu.count falls back to the PCI bus).
    """
    if isinstance(gres, dict):  # pyslurm's configured_gres: {"gpu:h100": 4} or {"gpu": 8}
        gres = ",".join(f"{k}:{v}" for k, v in gres.items())
    if not isinstance(gres, str):
        return None
    total, seen = 0, False
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = parts[-1].strip()
        if count.isdecimal() and len(count) <= 6:
            total, seen = total + int(count), True
    return total if seen else None


def gres_gpu_type(gres: object) -> str:
    """The GPU type(s) a node's configured Gres names: `gpu:h100:8(S:0-1)` -> `h100`,
    `gpu:h100:4,gpu:a100:2` -> `a100+h100`; "" when no GPU gres names a type (`gpu:8`)."""
    if isinstance(gres, dict):  # pyslurm's configured_gres, as gres_gpu_count reads it
        gres = ",".join(f"{k}:{v}" for k, v in gres.items())
    if not isinstance(gres, str):
        return ""
    types = set()
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = [p.strip() for p in item.strip().split(":")]
        # gpu:<type>:<count>; a type is a name (slurm.conf), never a number.
        if len(parts) >= 3 and parts[0] == "gpu" and parts[1] and not parts[1].isdecimal():
            types.add(parts[1][:64])
    return "+".join(sorted(types))


def ended_at(epoch: int | None) -> int | None:
    """A job's end time, None while it has not ended.

    JSON and pyslurm give a pending or running job its expected end (start + time limit);
    scontrol prints `EndTime=Unknown` for it, and 0 for a job put back in the queue.
    """

    return epoch if epoch and epoch <= time.time() else None


def job_reason(text: str | None) -> str:
    """A job's state reason as scontrol prints it: whitespace as underscores (info_job.c)."""
    text = (text or "").strip()
    # pyslurm gives "None" (Slurm's WAIT_NO_REASON string) where scontrol's record has none.
    if text.lower() in ("none", "(null)"):
        return ""
    return re.sub(r"\s", "_", text)


def node_reason(
    reason: str | None, user: str | None, when: int | None
) -> tuple[str, str, int | None]:
    """(reason, user, time), the user and time blank when there is no reason.

    pyslurm 24.11 names `root` as the reason's user on a node that has no reason; scontrol
    prints nothing. Who set no reason is nobody.
    """
    reason = (reason or "").strip()
    return (reason, user or "", when) if reason else ("", "", None)


def mixed_if_partly_allocated(state: str, allocated_cpus: int | None, idle_cpus: int | None) -> str:
    """MIXED for an ALLOCATED node with some CPUs allocated and some idle, as scontrol says.

    pyslurm 22.5.3 prints the node's base state, ALLOCATED, where scontrol (node_info.c) and
    pyslurm 24.11 say MIXED; unknown counts leave the state alone.
    """
    if state == "ALLOCATED" and (allocated_cpus or 0) > 0 and (idle_cpus or 0) > 0:
        return "MIXED"
    return state

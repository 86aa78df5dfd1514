"""Sweeps: qualify idle nodes on a schedule as low-priority jobs (`gpugate qualify --idle`).

A sweep takes only nodes Slurm shows IDLE with no flag that takes them out of normal use
(drained, down, reserved, rebooting, powered down, completing a job): a drained node is an
admin's or gpugate's business (`gpugate resume NODE --qualify`), never a sweep's. Of those it
takes the suspects first (flagged by users' votes or application Xids and not yet cleared:
gpugate/gate/suspicion.py), then the ones qualified longest ago, so a weekly sweep of a few
nodes comes round the whole cluster. Its jobs go in at a low priority (`qualify.sweep_nice`, `qualify.sweep_qos`):
waiting user jobs start first. docs/qualify.md shows the scrontab line that runs it.
"""

from __future__ import annotations

from gpugate.store.history import history_dir, read_dirs
from gpugate.store.suspects import open_flags

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.records import NodeInfo

# Flags (upper case, as NodeInfo holds them) of a node a sweep leaves alone, beside the drain
# ones NodeInfo.drained reads. Names as `scontrol show node` / `sinfo --json` print them in
# 22.05-24.11 (docs/slurm-facts.md): RESERVED (in a reservation), MAINT, REBOOT_REQUESTED /
# REBOOT_ISSUED (scontrol reboot), POWER*/POWERED_DOWN (power saving), COMPLETING (a job's
# epilog still runs), NOT_RESPONDING, PLANNED (the backfill scheduler holds it for a job).
_BUSY_FLAGS = frozenset(
    {"RESERVED", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERED_DOWN", "POWERING_DOWN",
     "POWER_DOWN", "POWERING_UP", "POWER_UP", "COMPLETING", "NOT_RESPONDING", "PLANNED"}
)  # fmt: skip


def sweepable(info: NodeInfo, partition: str | None = None) -> bool:
    """Whether a sweep may take the node: IDLE (no job), in service, no busy flag."""
    if info.state != "IDLE" or info.drained or _BUSY_FLAGS.intersection(info.flags):
        return False
    return partition is None or partition in info.partitions


def last_qualified(directory: str) -> dict[str, float]:
    """{node: when its newest qualification ran} from the records (gpugate/store/qualify.py)."""
    from gpugate.store.qualify import qualifications

    return {e.node: float(e.when) for e in qualifications(directory)}


def select_idle(config: Config, slurm: SlurmControl, max_nodes: int | None) -> list[str]:
    """The idle nodes to qualify now, the longest unqualified first, at most `max_nodes`."""

    if max_nodes is not None and max_nodes < 1:
        raise ValueError(f"--max-nodes must be at least 1, got {max_nodes}")
    partition = config.qualify.partition if config.qualify is not None else None
    idle = [info for info in slurm.nodes().values() if sweepable(info, partition)]
    where = history_dir(config)
    last, flagged = last_qualified(where), open_flags(read_dirs(config))
    # Suspects first, then never qualified, then the longest ago.
    idle.sort(key=lambda info: (info.name not in flagged, last.get(info.name, 0.0), info.name))
    return [info.name for info in idle[:max_nodes]]


def sweep_config(config: Config, nice: int | None, idle: bool) -> Config:
    """The run's config: a sweep's jobs under qualify.sweep_qos (else qos) at sweep_nice;
    `--nice N` for any run. ValueError for a negative nice."""
    if nice is not None and nice < 0:
        # sbatch(1): only privileged users may raise a priority; a qualification never does.
        raise ValueError(f"--nice must be 0 or more, got {nice}")
    qc = config.qualify
    if qc is None:
        return config
    changes: dict[str, object] = (
        {"qos": qc.sweep_qos or qc.qos, "nice": qc.sweep_nice} if idle else {}
    )
    if nice is not None:
        changes["nice"] = nice
    return config.replace(qualify=qc.replace(**changes)) if changes else config

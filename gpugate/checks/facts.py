"""The node-facts snapshot: one immutable value gathered once, read by every check.

Field names and units are the snapshot contract in docs/snapshot.md. `None` means "not known" (the
key was absent or the source could not say), never zero: a check treats it as unknown.
"""

from __future__ import annotations

from gpugate.record import Record
from gpugate.yamlio import load_yaml

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeVar

    _R = TypeVar("_R", bound=Record)


class Pcie(Record):
    """Current and maximum PCIe link of one GPU."""

    gen: int | None = None
    max_gen: int | None = None
    width: int | None = None
    max_width: int | None = None
    replay_errors: int | None = None


class RemappedRows(Record):
    """Row-remapper state (Ampere and newer)."""

    corrected: int | None = None
    uncorrected: int | None = None
    pending: bool | None = None
    failure: bool | None = None


class GpuProcess(Record):
    """A compute process holding a GPU."""

    pid: int | None = None
    name: str | None = None
    used_memory_mib: int | None = None


class Gpu(Record):
    """One GPU as NVML saw it. `error` is set (e.g. `gpu_is_lost`) when it could not be read."""

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    serial: str | None = None
    # The GPU's device file is /dev/nvidia<minor_number> (NVML nvmlDeviceGetMinorNumber): what
    # a device cgroup allows or denies. NVML index order and minor numbers can differ.
    minor_number: int | None = None
    error: str | None = None
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: tuple[str, ...] | None = None
    ecc_mode_enabled: bool | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_volatile_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows: RemappedRows | None = None
    pcie: Pcie | None = None
    nvlink_active: tuple[bool, ...] | None = None
    nvlink_errors: dict[str, int] | None = (
        None  # summed over links: replay, recovery, crc_flit, ...
    )
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    persistence_mode: bool | None = None
    fabric_state: str | None = None  # completed / in_progress / not_started; None: not applicable
    fabric_status: str | None = None  # the fabric's own NVML return code name, "success" when fine
    recovery_action: str | None = (
        None  # none / gpu_reset / node_reboot / drain_p2p / drain_and_reset
    )


class IbPort(Record):
    """One InfiniBand/RoCE port from /sys/class/infiniband."""

    device: str
    port: int
    state: str | None = None  # ACTIVE, DOWN, INIT, ARMED, ...
    phys_state: str | None = None  # LinkUp, Polling, Disabled, ...
    rate_gbps: float | None = None
    link_layer: str | None = None  # InfiniBand / Ethernet
    counters: dict[str, int] | None = None  # symbol_error, link_downed, port_rcv_errors, ...


class Limits(Record):
    """Resource limits that jobs inherit from slurmd."""

    nofile_soft: int | None = None
    nofile_hard: int | None = None


class Memory(Record):
    """Host memory."""

    total_mib: int | None = None
    available_mib: int | None = None
    swap_total_mib: int | None = None
    swap_used_mib: int | None = None


class Mount(Record):
    """A required filesystem: mounted, writable, and how long a small write+fsync took."""

    path: str
    mounted: bool | None = None
    writable: bool | None = None
    fsync_ms: float | None = None
    fstype: str | None = None
    error: str | None = None


class PeerProbe(Record):
    """Unfragmented pings to another node of the job's allocation."""

    node: str
    sent: int | None = None
    received: int | None = None
    avg_ms: float | None = None
    error: str | None = None
    prober: str | None = None  # the node that sent the pings (the prolog's SLURMD_NODENAME)
    skipped: str | None = None  # why no ping went out, not a link fault (name unresolved, no ping)


class KernelLogLoss(Record):
    """Kernel records overwritten in the ring buffer before any check read them (issue 41, R9).

    /dev/kmsg says so exactly (EPIPE, then the oldest record left): a flood of messages (a
    user's OOM-kill loop) between two checks. What they said, an Xid among it, is unknown.
    """

    records: int | None = None  # how many were lost
    after_seq: int | None = None  # the newest record seen before them (the last check's position)
    resumed_seq: int | None = None  # the first record read after them
    after_at: str | None = None  # UTC: when the record before them was logged, or the last check
    resumed_at: str | None = None  # UTC: when the first record after them was logged


class Facts(Record):
    """Everything the checklist needs to know about one node."""

    node: str | None = None
    collected_at: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: tuple[Gpu, ...] | None = None  # None: NVML could not be asked at all
    pci_gpu_count: int | None = None  # NVIDIA GPUs on the PCI bus, whatever NVML says
    slurm_gres_gpus: int | None = None  # the node's configured Gres=gpu:N, as Slurm was told
    nvidia_module_version: str | None = None  # /sys/module/nvidia/version: the loaded nvidia.ko
    nvml_error: str | None = None  # why NVML could not start: lib_rm_version_mismatch, ...
    nvml_library_version: str | None = None  # the libnvidia-ml.so loaded when NVML failed
    infiniband: tuple[IbPort, ...] | None = None
    kernel_log: tuple[str, ...] | None = None
    kernel_log_seq: int | None = None  # /dev/kmsg sequence number reached (with boot_id)
    kernel_log_lost: KernelLogLoss | None = None  # records lost unread since the position
    boot_id: str | None = None
    kernel_modules: tuple[str, ...] | None = None
    limits: Limits | None = None
    memory: Memory | None = None
    mounts: tuple[Mount, ...] | None = None
    peers: tuple[PeerProbe, ...] | None = None  # only in a multi-node job's prolog
    source_errors: dict[str, str] | None = None  # source name -> why it failed or timed out


class SnapshotError(ValueError):
    """A snapshot does not have the shape of the contract; the message names the key."""


# Nested record types per field; everything else is taken as it is (after a type check).
_NESTED: dict[str, tuple[type[Record], bool]] = {
    "gpus": (Gpu, True),
    "remapped_rows": (RemappedRows, False),
    "pcie": (Pcie, False),
    "processes": (GpuProcess, True),
    "infiniband": (IbPort, True),
    "limits": (Limits, False),
    "memory": (Memory, False),
    "mounts": (Mount, True),
    "peers": (PeerProbe, True),
    "kernel_log_lost": (KernelLogLoss, False),
}
_LISTS = {"throttle_reasons", "nvlink_active", "kernel_log", "kernel_modules"}
_STR_LISTS = {"throttle_reasons", "kernel_log", "kernel_modules"}  # the checks match text in them
_INTS = {
    "index", "port", "gen", "max_gen", "width", "max_width", "replay_errors", "corrected",
    "uncorrected", "pid", "used_memory_mib", "ecc_volatile_uncorrected", "ecc_volatile_corrected",
    "ecc_aggregate_uncorrected", "ecc_aggregate_corrected", "memory_used_mib", "memory_total_mib",
    "pci_gpu_count", "nofile_soft", "nofile_hard", "total_mib", "available_mib", "swap_total_mib",
    "swap_used_mib", "sent", "received", "kernel_log_seq", "slurm_gres_gpus", "minor_number",
    "records", "after_seq", "resumed_seq",
}  # fmt: skip
_FLOATS = {"temperature_c", "power_draw_w", "power_limit_w", "rate_gbps", "fsync_ms", "avg_ms"}
_STRS = {"node", "collected_at", "driver_version", "cuda_driver_version", "uuid", "name",
         "pci_bus_id", "serial", "error", "fabric_state", "fabric_status", "recovery_action",
         "device", "state", "phys_state", "link_layer", "path", "fstype", "boot_id",
         "nvidia_module_version", "nvml_error", "nvml_library_version", "after_at",
         "resumed_at"}  # fmt: skip
# Mappings the checks read with .get(): a scalar there would crash them, so it is refused here.
_MAPS = {"source_errors", "nvlink_errors", "counters"}
_BOOLS = {"pending", "failure", "retired_pages_pending", "persistence_mode", "mounted",
          "writable", "ecc_mode_enabled"}  # fmt: skip


def facts_from_dict(data: object, where: str = "snapshot") -> Facts:
    """Build `Facts` from a parsed snapshot, refusing wrong shapes with the key path."""
    return _build(Facts, data, where)


def _build(cls: type[_R], data: object, path: str) -> _R:
    if not isinstance(data, dict):
        raise SnapshotError(f"{path}: expected a mapping, got {type(data).__name__}")
    values = {}
    for key, value in data.items():
        if key not in cls._fields:
            continue  # newer writers may add keys; unknown keys are ignored, not fatal
        values[key] = _convert(key, value, f"{path}.{key}")
    try:
        return cls(**values)
    except TypeError as exc:
        raise SnapshotError(f"{path}: {exc}") from None


def _convert(key: str, value: object, path: str) -> object:
    if value is None:
        return None
    if key in _NESTED:
        cls, many = _NESTED[key]
        if not many:
            return _build(cls, value, path)
        if not isinstance(value, list):
            raise SnapshotError(f"{path}: expected a list")
        return tuple(_build(cls, item, f"{path}[{i}]") for i, item in enumerate(value))
    if key in _LISTS:
        if not isinstance(value, list):
            raise SnapshotError(f"{path}: expected a list")
        if key in _STR_LISTS and not all(isinstance(v, str) for v in value):
            raise SnapshotError(f"{path}: expected a list of strings")
        return tuple(value)
    if key in _MAPS and not isinstance(value, dict):
        raise SnapshotError(f"{path}: expected a mapping, got {value!r}")
    if key in _BOOLS and not isinstance(value, bool):
        raise SnapshotError(f"{path}: expected true or false, got {value!r}")
    if key in _INTS and (isinstance(value, bool) or not isinstance(value, int)):
        raise SnapshotError(f"{path}: expected an integer, got {value!r}")
    if key in _FLOATS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SnapshotError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if key in _STRS:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # an unquoted 550.54 in a hand-written file
        if not isinstance(value, str):
            raise SnapshotError(f"{path}: expected a string, got {value!r}")
    if isinstance(value, dict):
        return dict(value)
    return value


def load_snapshot(path: str) -> Facts:
    """Read a YAML snapshot written by `gpugate facts` (or by hand)."""

    return facts_from_dict(load_yaml(path), path)

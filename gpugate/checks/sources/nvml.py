"""NVML source: the GPUs as the driver sees them, read through the `pynvml` module.

`read_nvml(config)` returns the snapshot keys `driver_version`, `cuda_driver_version` and `gpus`
(every per-GPU field of `facts.Gpu`). The pynvml module itself is the interface: tests pass a
fake module as `nvml=`, and the real one is imported only inside `read_nvml`, because importing
it costs about 40 ms, more than the whole checklist.

NVML errors become values here (docs/gpu-facts.md, section 3.12):
- NotSupported / FunctionNotFound, or a call the binding lacks: that key is None ("absent").
- A code meaning the GPU itself is broken (GpuIsLost, ResetRequired, Unknown, ...): the GPU stays
  in the list with `error` set to the code's snake_case name (`gpu_is_lost`) and is not read
  further. One broken GPU never stops the others.
- Any other code on one call (NoPermission, Timeout, ...): that key is None and the call is noted
  in the GPU's `read_errors` ({nvml function: code name}).
- `nvmlInit` failing: `NvmlUnavailable`, naming the cause; the gatherer records it as the
  source's error, and keeps the keys it carries: `nvml_error` (the code's name,
  `lib_rm_version_mismatch`) and, on a version mismatch, `nvml_library_version` (the version
  of the libnvidia-ml.so that was loaded), which gpu.driver puts in its one message.
"""

from __future__ import annotations

import ctypes
from contextlib import suppress

from gpugate.checks.facts import Gpu
from gpugate.checks.sources import nvml_fields as FI
from gpugate.checks.sources import proc_path
from gpugate.checks.sources.host import loaded_library_version

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from gpugate.config.schema import Config

# nvmlReturn_t values (nvml.h). They are the C ABI, stable across driver branches.
_SUCCESS = 0
_INVALID_ARGUMENT = 2
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13  # the binding is newer than the driver
_LIB_RM_VERSION_MISMATCH = 18
_ARGUMENT_VERSION_MISMATCH = 25  # a versioned struct the driver does not know yet

_ABSENT = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
# The GPU itself is unusable (docs/gpu-facts.md 3.12: each of these means "drain"):
# INSUFFICIENT_POWER 8, DRIVER_NOT_LOADED 9, IRQ_ISSUE 11, CORRUPTED_INFOROM 14, GPU_IS_LOST 15,
# RESET_REQUIRED 16, LIB_RM_VERSION_MISMATCH 18, GPU_NOT_FOUND 28, INVALID_STATE 29, UNKNOWN 999
# (what a dead GPU most often answers: "Unknown Error" in nvidia-smi).
_GPU_BROKEN = frozenset({8, 9, 11, 14, 15, 16, 18, 28, 29, 999})

# Why nvmlInit failed, in an admin's words.
_INIT_HINTS = {
    _LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 not found: the NVIDIA driver is not installed",
    _DRIVER_NOT_LOADED: "the nvidia kernel module is not loaded",
    _LIB_RM_VERSION_MISMATCH: "the NVML library and the loaded nvidia kernel module differ "
    "(driver updated without a reboot)",
    _NO_PERMISSION: "no permission to open the GPU device files (/dev/nvidia*)",
}

_ENABLED = 1  # NVML_FEATURE_ENABLED
_TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU: the GPU die sensor
_MIB = 1024 * 1024

# nvmlClocksEventReason* bits (same values as the deprecated nvmlClocksThrottleReason*).
_CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),  # only throttle-named constants exist for these two (13.x binding)
    (0x400, "reliability"),
)
_KNOWN_REASON_BITS = sum(bit for bit, _ in _CLOCK_EVENT_REASONS)

# key -> (NVML_MEMORY_ERROR_TYPE_*, counter): UNCORRECTED 1 / CORRECTED 0; VOLATILE_ECC 0 (since
# the last driver load or reset) / AGGREGATE_ECC 1 (lifetime, kept in the InfoROM).
# The field id of the same count follows (nvml_fields: double-bit = uncorrected).
_ECC_COUNTERS = {
    "ecc_volatile_uncorrected": (1, 0, FI.ECC_DBE_VOL),
    "ecc_volatile_corrected": (0, 0, FI.ECC_SBE_VOL),
    "ecc_aggregate_uncorrected": (1, 1, FI.ECC_DBE_AGG),
    "ecc_aggregate_corrected": (0, 1, FI.ECC_SBE_AGG),
}

_PCIE_CALLS = {
    "gen": "nvmlDeviceGetCurrPcieLinkGeneration",
    # The Max* calls give the maximum of GPU and slot together: what this link can train to.
    "max_gen": "nvmlDeviceGetMaxPcieLinkGeneration",
    "width": "nvmlDeviceGetCurrPcieLinkWidth",
    "max_width": "nvmlDeviceGetMaxPcieLinkWidth",
}

# NVML_GPU_FABRIC_STATE_*; NOT_SUPPORTED means the GPU has no fabric: the keys stay None.
_FABRIC_NOT_SUPPORTED = 0
_FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}

# Drivers that predate a field id answer it, in the field's own return code, with NotSupported
# or InvalidArgument.
_FIELD_ABSENT = _ABSENT | {_INVALID_ARGUMENT}
# NVML_GPU_RECOVERY_ACTION_*: the driver's own verdict on what the GPU needs (pairs with Xid 154).
_RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}


class NvmlUnavailable(RuntimeError):
    """NVML could not be started or could not count the GPUs; the message names the cause.

    `facts`: the snapshot keys that say why (`nvml_error`, ...), kept by the gatherer.
    """

    def __init__(self, message: str, facts: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.facts = facts or {}


class _Broken(Exception):
    """A GPU answered a code that means it is unusable; ends the reading of that GPU."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Reader:
    """The pynvml module with gpugate's error rules, for one GPU (or the system calls)."""

    def __init__(self, module: ModuleType, config: Config, names: dict[int, str]) -> None:
        self.module = module
        self.config = config
        self.names = names
        self.notes: dict[str, str] = {}
        self.answers: dict[tuple[int, int], tuple[int, object]] = {}  # the GPU's field values
        # Raised by the binding's unversioned aliases when the driver lacks the versioned call.
        self.mismatch = getattr(module, "NVMLLibraryMismatchError", ())

    def optional(self, fn_name: str, *args: object, absent: frozenset[Any] = _ABSENT) -> Any:
        """`fn_name(*args)`, or None when NVML says the feature is absent (or another code)."""
        fn = getattr(self.module, fn_name, None)
        if fn is None:
            return None  # the binding predates this call
        try:
            return fn(*args)
        except self.mismatch:
            return None
        except self.module.NVMLError as exc:
            return self.absorb(fn_name, exc.value, absent)

    def field(self, fid: int, scope: int = 0, group: tuple[int, ...] = ()) -> Any:
        """Field `fid`'s value; None if it answered an error (noted); `ASK`: use its call.

        A field answered absent is the GPU's true answer (None) when another field of `group`
        answered, else `ASK`: the driver may not know the field.
        """
        code, value = self.answers.get((fid, scope), (None, None))
        if code == _SUCCESS:
            return value
        if code is None or code in _FIELD_ABSENT:
            vouched = any(self.answers.get((g, 0), (None,))[0] == _SUCCESS for g in group)
            return None if vouched else FI.ASK
        return self.absorb(f"field {fid}", code, _FIELD_ABSENT)

    def absorb(self, what: str, code: int, absent: frozenset[Any] = _ABSENT) -> None:
        """Apply the error rules to one failed call: None, a note, or `_Broken`."""
        if code in absent:
            return None
        if code in _GPU_BROKEN:
            raise _Broken(code)
        self.notes[what] = self.name(code)
        return None

    def name(self, code: int) -> str:
        """`gpu_is_lost` for NVML_ERROR_GPU_IS_LOST, `success` for 0."""
        if code == _SUCCESS:
            return "success"
        return self.names.get(code, f"nvml_error_{code}")


def read_nvml(config: Config, nvml: ModuleType | None = None) -> dict[str, Any]:
    """Read the driver, CUDA and per-GPU facts through NVML (`nvml`: the pynvml module)."""
    module = _import_pynvml() if nvml is None else nvml
    _start(module, config)
    try:
        names = _error_names(module)
        facts = _read_system(_Reader(module, config, names))
        count = _count(module, names)
        facts["gpus"] = [_read_gpu(_Reader(module, config, names), i) for i in range(count)]
    finally:
        _stop(module)
    return facts


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the bits set in a clocks-event (throttle) reasons mask, lowest bit first."""
    names = [name for bit, name in _CLOCK_EVENT_REASONS if mask & bit]
    unknown = mask & ~_KNOWN_REASON_BITS
    names += [f"unknown_{1 << i:#x}" for i in range(64) if unknown >> i & 1]
    return names


def cuda_version_text(version: int) -> str:
    """`12.4` for NVML's CUDA driver version 12040 (major * 1000 + minor * 10)."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(
            f"the pynvml module (PyPI package nvidia-ml-py) cannot be imported: {exc}"
        ) from exc
    module: ModuleType = pynvml  # nvidia-ml-py ships no stubs
    return module


def _error_names(module: ModuleType) -> dict[int, str]:
    prefix = "NVML_ERROR_"
    return {
        getattr(module, attr): attr[len(prefix) :].lower()
        for attr in dir(module)
        if attr.startswith(prefix)
    }


def _start(module: ModuleType, config: Config) -> None:
    try:
        module.nvmlInit()
    except module.NVMLError as exc:
        name = _error_names(module).get(exc.value, f"nvml_error_{exc.value}")
        hint = _INIT_HINTS.get(exc.value, str(exc))
        facts: dict[str, str | None] = {"nvml_error": name}
        if exc.value == _LIB_RM_VERSION_MISMATCH:
            facts["nvml_library_version"] = loaded_library_version(
                proc_path(config, "self", "maps")
            )
        raise NvmlUnavailable(f"nvmlInit failed: {name}: {hint}", facts) from exc


def _stop(module: ModuleType) -> None:
    # The facts are read; a failed shutdown only leaves NVML's reference count up.
    with suppress(module.NVMLError):
        module.nvmlShutdown()


def _count(module: ModuleType, names: dict[int, str]) -> int:
    try:
        return int(module.nvmlDeviceGetCount())
    except module.NVMLError as exc:
        name = names.get(exc.value, f"nvml_error_{exc.value}")
        raise NvmlUnavailable(f"nvmlDeviceGetCount failed: {name}", {"nvml_error": name}) from exc


def _read_system(r: _Reader) -> dict[str, Any]:
    cuda = r.optional("nvmlSystemGetCudaDriverVersion_v2")
    if cuda is None:
        cuda = r.optional("nvmlSystemGetCudaDriverVersion")
    return {
        "driver_version": _text(r.optional("nvmlSystemGetDriverVersion")),
        "cuda_driver_version": None if cuda is None else cuda_version_text(int(cuda)),
    }


def _read_gpu(r: _Reader, index: int) -> dict[str, Any]:
    gpu: dict[str, Any] = dict.fromkeys(Gpu._fields)
    gpu["index"] = index
    try:
        handle = r.module.nvmlDeviceGetHandleByIndex(index)
    except r.module.NVMLError as exc:
        # No handle at all: lost, needs a reset, no permission... NVML cannot reach this GPU.
        gpu["error"] = r.name(exc.value)
        return gpu
    try:
        for reader in _READERS:
            reader(r, handle, gpu)
    except _Broken as exc:
        # Not read further: every later call fails the same way, and calls to a GPU that fell
        # off the bus can take seconds each, which would time out the source for all GPUs.
        gpu["error"] = r.name(exc.code)
    if r.notes:
        gpu["read_errors"] = dict(r.notes)
    return gpu


# Each reader below fills one group of keys in `gpu`, key by key, so that what a GPU answered
# before it broke is kept as evidence.


def _identity(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    # PCI first: the bus id often still answers on a GPU that is lost, and names it in reasons.
    pci = r.optional("nvmlDeviceGetPciInfo", h)
    gpu["pci_bus_id"] = None if pci is None else _text(pci.busId)
    # NVML: "The minor number for the device is such that the Nvidia device node file for
    # each GPU will have the form /dev/nvidia[minor number]." Not the NVML index: the two
    # orders can differ, and isolating a GPU denies exactly this device file. Read early: a
    # lost GPU is the one to isolate, and its first refused call ends its reading.
    gpu["minor_number"] = _int(r.optional("nvmlDeviceGetMinorNumber", h))
    gpu["uuid"] = _text(r.optional("nvmlDeviceGetUUID", h))
    gpu["name"] = _text(r.optional("nvmlDeviceGetName", h))
    gpu["serial"] = _text(r.optional("nvmlDeviceGetSerial", h))


def _field_values(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    """One nvmlDeviceGetFieldValues call for the counters the readers below use."""
    ids = FI.field_ids(min(FI.max_links(r.module), FI.MAX_FIELD_LINKS))
    # A driver refusing the whole batch (InvalidArgument: a field or scope it cannot take) is
    # read call by call, as one without the function.
    values = r.optional("nvmlDeviceGetFieldValues", h, ids, absent=_FIELD_ABSENT)
    if values:  # None or empty: every reader falls back to its own calls
        r.answers = FI.decode(values)


def _thermal_power(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    # NVML 13 deprecates nvmlDeviceGetTemperature (removed with CUDA 14): the V call replaces it.
    temperature = r.optional("nvmlDeviceGetTemperature", h, _TEMPERATURE_GPU)
    if temperature is None:
        temperature = r.optional("nvmlDeviceGetTemperatureV", h, _TEMPERATURE_GPU)
    gpu["temperature_c"] = None if temperature is None else float(temperature)
    gpu["power_draw_w"] = _watts(r.optional("nvmlDeviceGetPowerUsage", h))
    # The enforced limit is the lowest of all limits set (admin, board, thermal).
    gpu["power_limit_w"] = _watts(r.optional("nvmlDeviceGetEnforcedPowerLimit", h))
    mask = r.optional("nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None:  # older drivers only have the deprecated name (same bits)
        mask = r.optional("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    gpu["throttle_reasons"] = None if mask is None else decode_throttle_reasons(int(mask))


def _ecc(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    mode = r.field(FI.ECC_CURRENT, group=FI.ECC_GROUP)
    if mode is FI.ASK:
        modes = r.optional("nvmlDeviceGetEccMode", h)  # [current, pending]
        mode = None if modes is None else modes[0]
    gpu["ecc_mode_enabled"] = None if mode is None else int(mode) == _ENABLED
    for key, (error_type, counter, fid) in _ECC_COUNTERS.items():
        count = r.field(fid, group=FI.ECC_GROUP)
        if count is FI.ASK:
            count = r.optional("nvmlDeviceGetTotalEccErrors", h, error_type, counter)
        gpu[key] = _int(count)
    # Volta and older only; NotSupported ("N/A") on A100/H100, which remap rows instead.
    pending = r.field(FI.RETIRED_PENDING, group=FI.MEMORY_REPAIR_GROUP)
    if pending is FI.ASK:
        pending = r.optional("nvmlDeviceGetRetiredPagesPendingStatus", h)
    gpu["retired_pages_pending"] = None if pending is None else bool(pending)


def _remapped_rows(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    # Ampere and newer; NotSupported on Volta and on MIG GPUs with active instances.
    rows = [r.field(fid, group=FI.MEMORY_REPAIR_GROUP) for fid in FI.REMAPPED]
    if FI.ASK in rows:  # (corrected, uncorrected, pending, failure)
        rows = r.optional("nvmlDeviceGetRemappedRows", h)
    if rows is None or None in rows:
        return
    corrected, uncorrected, pending, failure = rows
    gpu["remapped_rows"] = {
        "corrected": int(corrected),
        "uncorrected": int(uncorrected),
        "pending": bool(pending),  # a GPU reset is needed for the remap to take effect
        "failure": bool(failure),  # no spare row was left: an RMA criterion
    }


def _pcie(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    link = {key: _int(r.optional(fn_name, h)) for key, fn_name in _PCIE_CALLS.items()}
    replays = r.field(FI.PCIE_REPLAY)
    link["replay_errors"] = _int(
        r.optional("nvmlDeviceGetPcieReplayCounter", h) if replays is FI.ASK else replays
    )
    gpu["pcie"] = link if any(v is not None for v in link.values()) else None


def _memory(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    info = None
    version = getattr(r.module, "nvmlMemory_v2", None)
    if version is not None:
        # v2 reports the driver's reserved memory apart; v1's `used` includes it (nvml.h).
        absent = _ABSENT | {_ARGUMENT_VERSION_MISMATCH}
        info = r.optional("nvmlDeviceGetMemoryInfo", h, version, absent=absent)
    if info is None:
        info = r.optional("nvmlDeviceGetMemoryInfo", h)
    if info is not None:
        gpu["memory_used_mib"] = _mib(info.used)
        gpu["memory_total_mib"] = _mib(info.total)


def _processes(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    procs = r.optional("nvmlDeviceGetComputeRunningProcesses", h)
    if procs is not None:
        gpu["processes"] = [_process(r.config, p) for p in procs]


def _process(config: Config, proc: Any) -> dict[str, Any]:
    pid = int(proc.pid)
    return {
        "pid": pid,
        "name": _comm(config, pid),
        # None where NVML cannot say (the binding maps NVML_VALUE_NOT_AVAILABLE to None).
        "used_memory_mib": _mib(proc.usedGpuMemory),
    }


def _comm(config: Config, pid: int) -> str | None:
    try:
        with open(proc_path(config, str(pid), "comm"), "rb") as f:
            return _text(f.read().rstrip(b"\n")) or None
    except OSError:
        return None  # gone already, or in a PID namespace we cannot see


def _persistence(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    mode = r.optional("nvmlDeviceGetPersistenceMode", h)
    gpu["persistence_mode"] = None if mode is None else mode == _ENABLED


def _fabric(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    info = _fabric_info(r, h)
    if info is None or int(info.state) == _FABRIC_NOT_SUPPORTED:
        return  # no NVSwitch fabric here: both keys stay None
    state = int(info.state)
    gpu["fabric_state"] = _FABRIC_STATES.get(state, f"state_{state}")
    # The fabric's own nvmlReturn_t: why probing failed, "success" when it did not.
    gpu["fabric_status"] = r.name(int(info.status))


def _fabric_info(r: _Reader, h: object) -> Any:
    # The V call fills a versioned struct (newer drivers); the plain one is its deprecated form.
    for fn_name, struct_name in (
        ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
        ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
    ):
        struct = getattr(r.module, struct_name, None)
        if struct is None:
            continue
        info = struct()
        if r.optional(fn_name, h, ctypes.byref(info)) is not None:
            return info
    return None


def _recovery_action(r: _Reader, h: object, gpu: dict[str, Any]) -> None:
    action = r.field(FI.RECOVERY_ACTION)
    if action is None or action is FI.ASK:
        return
    action = int(action)
    gpu["recovery_action"] = _RECOVERY_ACTIONS.get(action, f"action_{action}")


# The field groups, in reading order: identity first, so a lost GPU keeps what answered.
_READERS: tuple[Callable[[_Reader, object, dict[str, Any]], None], ...] = (
    _identity,
    _field_values,
    _thermal_power,
    _ecc,
    _remapped_rows,
    _pcie,
    FI.read_nvlink,
    _memory,
    _processes,
    _persistence,
    _fabric,
    _recovery_action,
)


def _text(value: object) -> str | None:
    """A string from NVML: current bindings return str, old ones bytes (NUL-padded)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else int(milliwatts) / 1000.0


def _mib(size_bytes: Any) -> int | None:
    return None if size_bytes is None else int(size_bytes) // _MIB

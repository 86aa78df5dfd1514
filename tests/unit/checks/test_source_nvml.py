"""The NVML source against a fake pynvml module driven by per-GPU scenario tables.

`FakeNvml` is a stand-in for the `pynvml` module: its constants, NVMLError classes and ctypes
structs are the real binding's (so codes cannot drift), its functions answer from tables. A GPU's
table maps an NVML function name to what that call returns; a call not in the table raises
NotSupported, as NVML does for a feature the GPU lacks. A value may be an NVMLError (raised), or
a callable taking the call's arguments (after the handle).
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from types import SimpleNamespace

import paths
import pynvml
import pytest
from factories import default_config

from gpugate.checks.facts import Gpu, facts_from_dict
from gpugate.checks.run import run_checks
from gpugate.checks.sources import gather_dict
from gpugate.checks.sources.host import loaded_library_version
from gpugate.checks.sources.nvml import (
    NvmlUnavailable,
    decode_throttle_reasons,
    read_nvml,
)
from gpugate.cli import main

MIB = 1024 * 1024
FIXTURES = paths.FIXTURES


def err(name: str) -> pynvml.NVMLError:
    """The exception pynvml raises for NVML_ERROR_<name>."""
    return pynvml.NVMLError(getattr(pynvml, f"NVML_ERROR_{name}"))


NOT_SUPPORTED = err("NOT_SUPPORTED")


def per_arg(values: dict, default: object = NOT_SUPPORTED):
    """A call whose answer depends on its argument(s): {arg or (args...): value}."""

    def call(*args: object) -> object:
        return values.get(args[0] if len(args) == 1 else args, default)

    return call


def memory(total_mib: int, used_mib: int, reserved_mib: int):
    """nvmlDeviceGetMemoryInfo: v2 reports `reserved` apart; v1's `used` includes it."""

    def call(version: object = None) -> SimpleNamespace:
        used = used_mib if version else used_mib + reserved_mib
        return SimpleNamespace(total=total_mib * MIB, used=used * MIB, reserved=reserved_mib * MIB)

    return call


def processes(*procs: tuple[int, int | None]):
    """nvmlDeviceGetComputeRunningProcesses: (pid, used bytes or None) each."""
    return lambda: [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs]


def fabric(state: int, status: int = 0):
    """nvmlDeviceGetGpuFabricInfo[V]: fills the struct passed by reference, as the C call does."""

    def call(ref: object) -> int:
        info = ref._obj  # ctypes.byref(x)._obj is x
        info.state, info.status = state, status
        return 0

    return call


class fields(dict):  # lower case: it reads as a helper like the ones above
    """nvmlDeviceGetFieldValues answers that override what the fake derives from the calls:
    {field id or (field id, scope id): unsigned value, or an NVMLError for that field}."""


# field id -> (the per-call function answering the same, its arguments after the handle, and
# how to pick the value from its answer); (fid, "link") fields take the link as scope id.
_FIELD_CALLS = {
    1: ("nvmlDeviceGetEccMode", (), lambda v: v[0]),
    3: ("nvmlDeviceGetTotalEccErrors", (0, 0), None),
    4: ("nvmlDeviceGetTotalEccErrors", (1, 0), None),
    5: ("nvmlDeviceGetTotalEccErrors", (0, 1), None),
    6: ("nvmlDeviceGetTotalEccErrors", (1, 1), None),
    31: ("nvmlDeviceGetRetiredPagesPendingStatus", (), None),
    94: ("nvmlDeviceGetPcieReplayCounter", (), None),
    142: ("nvmlDeviceGetRemappedRows", (), lambda v: v[0]),
    143: ("nvmlDeviceGetRemappedRows", (), lambda v: v[1]),
    144: ("nvmlDeviceGetRemappedRows", (), lambda v: v[2]),
    145: ("nvmlDeviceGetRemappedRows", (), lambda v: v[3]),
    161: ("nvmlDeviceGetNvLinkErrorCounter", ("link", 0), None),
    162: ("nvmlDeviceGetNvLinkErrorCounter", ("link", 1), None),
    163: ("nvmlDeviceGetNvLinkErrorCounter", ("link", 2), None),
    165: ("nvmlDeviceGetNvLinkState", ("link",), None),
}


def _crc_data_total(fake: FakeNvml, table: dict) -> object:
    """Field 45: the driver's sum of every link's CRC-data counter."""
    values = []
    for link in range(18):
        value = fake.quietly(table, "nvmlDeviceGetNvLinkErrorCounter", (link, 3))
        if isinstance(value, BaseException):
            break
        values.append(value)
    return sum(values) if values else NOT_SUPPORTED


class FakeHandle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    """A fake `pynvml` module: real constants and errors, answers from per-GPU tables."""

    _COPIED = ("NVML", "c_nvml", "nvmlClocks", "nvmlMemory_v2")

    def __init__(
        self,
        gpus: list[dict],
        system: dict | None = None,
        init_error: Exception | None = None,
        missing: tuple[str, ...] = (),
        field_values: bool = True,
    ) -> None:
        for name, value in vars(pynvml).items():
            if name.startswith(self._COPIED) and name not in missing:
                setattr(self, name, value)
        self.gpus = gpus
        self.system = {
            "nvmlSystemGetDriverVersion": "550.54.15",
            "nvmlSystemGetCudaDriverVersion_v2": 12040,
            "nvmlDeviceGetCount": len(gpus),
            **(system or {}),
        }
        self.init_error = init_error
        self.missing = set(missing)
        self.initialized = 0
        self.shutdowns = 0
        self.calls: list[tuple[str, int, tuple]] = []
        self.field_values = field_values  # False: a driver that answers no field but 230

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        self.initialized -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._answer(self.gpus[index], "nvmlDeviceGetHandleByIndex", index, ())
        return FakeHandle(index)

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, ids: list) -> object:
        """One call; each field answers what its per-call function answers (or the override)."""
        table = self.gpus[handle.index]
        self._answer(table, "nvmlDeviceGetFieldValues", handle.index, (ids,), fields())
        overrides = table.get("nvmlDeviceGetFieldValues", fields())
        out = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for slot, (fid, scope) in zip(out, ids):
            slot.fieldId, slot.scopeId = fid, scope
            value = overrides.get((fid, scope), overrides.get(fid, None))
            if value is None:
                value = self._field(table, fid, scope)
            if isinstance(value, pynvml.NVMLError):
                slot.nvmlReturn = value.value
            else:
                slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                slot.value.ullVal = int(value)
        return out

    def _field(self, table: dict, fid: int, scope: int) -> object:
        if not self.field_values:
            return NOT_SUPPORTED
        if fid == 45:
            return _crc_data_total(self, table)
        if fid not in _FIELD_CALLS:
            return NOT_SUPPORTED
        name, args, pick = _FIELD_CALLS[fid]
        value = self.quietly(table, name, tuple(scope if a == "link" else a for a in args))
        if isinstance(value, BaseException):
            return value if isinstance(value, pynvml.NVMLError) else NOT_SUPPORTED
        return pick(value) if pick else value

    def quietly(self, table: dict, name: str, args: tuple) -> object:
        """What `name(*args)` answers, without counting it as a call."""
        value = table.get(name, NOT_SUPPORTED)
        if callable(value):
            value = value(*args)
        return value

    def __getattr__(self, name: str) -> object:
        if name in self.missing or not name.startswith(("nvmlDevice", "nvmlSystem")):
            raise AttributeError(name)
        if name.startswith("nvmlSystem") or name == "nvmlDeviceGetCount":
            return lambda *args: self._answer(self.system, name, -1, args)
        return lambda handle, *args, **kwargs: self._answer(
            self.gpus[handle.index], name, handle.index, args, kwargs
        )

    def _answer(
        self, table: dict, name: str, index: int, args: tuple, kwargs=None, default=NOT_SUPPORTED
    ) -> object:
        assert self.initialized > 0, f"{name} called outside nvmlInit/nvmlShutdown"
        if name in self.missing:
            raise AttributeError(name)
        self.calls.append((name, index, args))
        value = table.get(name, default)
        if isinstance(value, fields):
            return None
        if callable(value):
            value = value(*args, **(kwargs or {}))
        if isinstance(value, BaseException):
            raise value
        return value


def h100(index: int) -> dict:
    """What NVML answers for one healthy, idle H100 SXM5 80GB of an HGX board."""
    return {
        "nvmlDeviceGetHandleByIndex": None,
        "nvmlDeviceGetPciInfo": SimpleNamespace(busId=f"00000000:{0x18 + 0x11 * index:02X}:00.0"),
        "nvmlDeviceGetUUID": f"GPU-8f2c000{index}-1d2e-4c3b-9a7f-0c5e2b7a000{index}",
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetSerial": f"165212300000{index}",
        "nvmlDeviceGetMinorNumber": index,  # /dev/nvidia<index> on this board
        "nvmlDeviceGetTemperature": per_arg({pynvml.NVML_TEMPERATURE_GPU: 33 + index}),
        "nvmlDeviceGetPowerUsage": 71_500 + 1000 * index,  # mW
        "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        "nvmlDeviceGetCurrentClocksEventReasons": pynvml.nvmlClocksEventReasonGpuIdle,
        "nvmlDeviceGetEccMode": [1, 1],
        "nvmlDeviceGetTotalEccErrors": per_arg({(1, 0): 0, (0, 0): 2, (1, 1): 0, (0, 1): 7}),
        "nvmlDeviceGetRetiredPagesPendingStatus": NOT_SUPPORTED,  # Volta and older only
        "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
        "nvmlDeviceGetCurrPcieLinkGeneration": 1,  # idle GPUs train the link down
        "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetPcieReplayCounter": 0,
        # 18 links; the driver answers InvalidArgument for link 18 and up.
        "nvmlDeviceGetNvLinkState": per_arg(dict.fromkeys(range(18), 1), err("INVALID_ARGUMENT")),
        "nvmlDeviceGetNvLinkErrorCounter": per_arg(
            {(link, c): 0 for link in range(18) for c in range(5)}, err("INVALID_ARGUMENT")
        ),
        "nvmlDeviceGetMemoryInfo": memory(total_mib=81559, used_mib=0, reserved_mib=536),
        "nvmlDeviceGetComputeRunningProcesses": processes(),
        "nvmlDeviceGetPersistenceMode": 1,
        "nvmlDeviceGetGpuFabricInfoV": fabric(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED),
        "nvmlDeviceGetFieldValues": fields({230: pynvml.NVML_GPU_RECOVERY_ACTION_NONE}),
    }


def node(changes: dict[int, dict] | None = None, count: int = 8) -> list[dict]:
    """An HGX H100 node's tables; `changes={3: {call: answer}}` changes single GPUs."""
    tables = [h100(i) for i in range(count)]
    for index, table_changes in (changes or {}).items():
        tables[index].update(table_changes)
    return tables


def read(fake: FakeNvml, config: object = None) -> dict:
    return read_nvml(config or default_config(), nvml=fake)


def healthy_gpu(index: int) -> dict:
    """What read_nvml makes of `h100(index)`."""
    return {
        "index": index,
        "uuid": f"GPU-8f2c000{index}-1d2e-4c3b-9a7f-0c5e2b7a000{index}",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{0x18 + 0x11 * index:02X}:00.0",
        "serial": f"165212300000{index}",
        "minor_number": index,
        "error": None,
        "temperature_c": 33.0 + index,
        "power_draw_w": 71.5 + index,
        "power_limit_w": 700.0,
        "throttle_reasons": ["gpu_idle"],
        "ecc_mode_enabled": True,
        "ecc_volatile_uncorrected": 0,
        "ecc_volatile_corrected": 2,
        "ecc_aggregate_uncorrected": 0,
        "ecc_aggregate_corrected": 7,
        "retired_pages_pending": None,
        "remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False},
        "pcie": {"gen": 1, "max_gen": 5, "width": 16, "max_width": 16, "replay_errors": 0},
        "nvlink_active": [True] * 18,
        "nvlink_errors": {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0},
        "memory_used_mib": 0,
        "memory_total_mib": 81559,
        "processes": [],
        "persistence_mode": True,
        "fabric_state": "completed",
        "fabric_status": "success",
        "recovery_action": "none",
    }


# --- a healthy node ---------------------------------------------------------------------------


def test_healthy_h100_node_reads_every_field_in_snapshot_units() -> None:
    fake = FakeNvml(node())
    data = read(fake)
    assert data["driver_version"] == "550.54.15"
    assert data["cuda_driver_version"] == "12.4"
    assert data["gpus"] == [healthy_gpu(i) for i in range(8)]
    assert set(data["gpus"][0]) == set(Gpu._fields)
    # Every field of the facts model is read; only page retirement is pre-Ampere.
    unread = {k for k, v in data["gpus"][0].items() if v is None} - {"error"}
    assert unread == {"retired_pages_pending"}
    assert fake.initialized == 0 and fake.shutdowns == 1


def test_an_8_gpu_18_link_snapshot_costs_at_most_160_nvml_calls() -> None:
    fake = FakeNvml(node())
    data = read(fake)
    assert data["gpus"] == [healthy_gpu(i) for i in range(8)]
    # ~940 before the counters were batched (576 of them per-link NVLink error counters); 150,
    # and one more per GPU since issue 31 (nvmlDeviceGetMinorNumber: no field value has it).
    assert len(fake.calls) <= 160, len(fake.calls)
    per_link = {"nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter"}
    assert not [name for name, _, _ in fake.calls if name in per_link]
    batches = [args for name, _, args in fake.calls if name == "nvmlDeviceGetFieldValues"]
    assert len(batches) == 8  # one per GPU


def test_a_driver_without_the_fields_is_read_call_by_call_with_the_same_facts() -> None:
    fake = FakeNvml(node(), field_values=False)
    assert read(fake)["gpus"] == [healthy_gpu(i) for i in range(8)]
    names = [name for name, _, _ in fake.calls]
    assert names.count("nvmlDeviceGetNvLinkErrorCounter") == 8 * 18 * 4
    assert names.count("nvmlDeviceGetTotalEccErrors") == 8 * 4


def test_a_driver_refusing_the_whole_batch_is_read_call_by_call() -> None:
    changes = {"nvmlDeviceGetFieldValues": err("INVALID_ARGUMENT")}
    gpu = read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]
    assert "read_errors" not in gpu
    assert gpu == {**healthy_gpu(0), "recovery_action": None}  # 230 is a field only


def test_a_field_the_gpu_answers_with_an_error_is_noted_not_asked_again() -> None:
    changes = {"nvmlDeviceGetFieldValues": fields({4: err("NO_PERMISSION")})}
    fake = FakeNvml(node({0: changes}, count=1))
    gpu = read(fake)["gpus"][0]
    assert gpu["ecc_volatile_uncorrected"] is None
    assert gpu["read_errors"] == {"field 4": "no_permission"}
    assert "nvmlDeviceGetTotalEccErrors" not in [name for name, _, _ in fake.calls]


def test_a_field_answered_absent_inside_an_answered_group_is_the_gpus_answer() -> None:
    # H100: the row remapper answers, page retirement (Volta) does not: no per-call retry.
    fake = FakeNvml(node(count=1))
    assert read(fake)["gpus"][0]["retired_pages_pending"] is None
    assert "nvmlDeviceGetRetiredPagesPendingStatus" not in [name for name, _, _ in fake.calls]


@pytest.mark.parametrize("how", ["binding_lacks_it", "driver_lacks_it", "not_supported"])
def test_temperature_falls_back_to_the_versioned_call(how: str) -> None:
    # NVML 13 deprecates nvmlDeviceGetTemperature; CUDA 14 removes it (nvml.h, pynvml 13.615).
    changes: dict = {"nvmlDeviceGetTemperatureV": per_arg({pynvml.NVML_TEMPERATURE_GPU: 47})}
    missing: tuple[str, ...] = ()
    if how == "binding_lacks_it":
        missing = ("nvmlDeviceGetTemperature",)
    elif how == "driver_lacks_it":
        changes["nvmlDeviceGetTemperature"] = err("FUNCTION_NOT_FOUND")
    else:
        changes["nvmlDeviceGetTemperature"] = NOT_SUPPORTED
    gpu = read(FakeNvml(node({0: changes}, count=1), missing=missing))["gpus"][0]
    assert gpu["temperature_c"] == 47.0


def test_the_versioned_temperature_call_matches_the_binding() -> None:
    assert pynvml.nvmlDeviceGetTemperatureV.__code__.co_varnames[:2] == ("handle", "sensor")


def test_healthy_node_is_accepted_by_the_facts_model() -> None:
    facts = facts_from_dict(read(FakeNvml(node())))
    gpu = facts.gpus[3]
    assert gpu.power_draw_w == 74.5 and gpu.memory_total_mib == 81559
    assert gpu.remapped_rows.pending is False and gpu.pcie.max_width == 16
    assert len(gpu.nvlink_active) == 18


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(12040, "12.4"), (12020, "12.2"), (11080, "11.8"), (13000, "13.0"), (12090, "12.9")],
)
def test_cuda_driver_version_as_text(raw: int, expected: str) -> None:
    fake = FakeNvml(node(count=1), system={"nvmlSystemGetCudaDriverVersion_v2": raw})
    assert read(fake)["cuda_driver_version"] == expected


def test_cuda_version_falls_back_to_the_unversioned_call() -> None:
    fake = FakeNvml(
        node(count=1),
        system={
            "nvmlSystemGetCudaDriverVersion_v2": err("FUNCTION_NOT_FOUND"),
            "nvmlSystemGetCudaDriverVersion": 12020,
        },
    )
    assert read(fake)["cuda_driver_version"] == "12.2"


# --- optional features: NotSupported means absent, nothing else changes ---------------------

FEATURES_ABSENT = {
    # A consumer GPU has no ECC memory.
    "ecc_on_consumer_gpu": (
        {"nvmlDeviceGetEccMode": NOT_SUPPORTED, "nvmlDeviceGetTotalEccErrors": NOT_SUPPORTED},
        {
            "ecc_mode_enabled": None,
            "ecc_volatile_uncorrected": None,
            "ecc_volatile_corrected": None,
            "ecc_aggregate_uncorrected": None,
            "ecc_aggregate_corrected": None,
        },
    ),
    # V100 retires pages and has no row remapper.
    "remapped_rows_on_v100": (
        {
            "nvmlDeviceGetRemappedRows": NOT_SUPPORTED,
            "nvmlDeviceGetRetiredPagesPendingStatus": 0,
        },
        {"remapped_rows": None, "retired_pages_pending": False},
    ),
    # A100 HGX: the fabric call is not supported.
    "fabric_call_on_a100": (
        {"nvmlDeviceGetGpuFabricInfoV": NOT_SUPPORTED, "nvmlDeviceGetGpuFabricInfo": NOT_SUPPORTED},
        {"fabric_state": None, "fabric_status": None},
    ),
    # ... or it answers with the state NOT_SUPPORTED.
    "fabric_state_not_supported": (
        {"nvmlDeviceGetGpuFabricInfoV": fabric(pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)},
        {"fabric_state": None, "fabric_status": None},
    ),
    # A driver that predates the recovery-action field answers it NotSupported.
    "recovery_action_field": (
        {"nvmlDeviceGetFieldValues": fields({230: NOT_SUPPORTED})},
        {"recovery_action": None},
    ),
    "recovery_action_field_unknown_to_driver": (
        {"nvmlDeviceGetFieldValues": fields({230: err("INVALID_ARGUMENT")})},
        {"recovery_action": None},
    ),
    # The binding is newer than the driver: the C symbol is missing.
    "field_values_function_missing": (
        {"nvmlDeviceGetFieldValues": err("FUNCTION_NOT_FOUND")},
        {"recovery_action": None},
    ),
    "serial_pcie_replay_power": (
        {
            "nvmlDeviceGetSerial": NOT_SUPPORTED,
            "nvmlDeviceGetPcieReplayCounter": NOT_SUPPORTED,
            "nvmlDeviceGetPowerUsage": NOT_SUPPORTED,
        },
        {
            "serial": None,
            "pcie": {"gen": 1, "max_gen": 5, "width": 16, "max_width": 16, "replay_errors": None},
            "power_draw_w": None,
        },
    ),
    "no_processes_call": (
        {"nvmlDeviceGetComputeRunningProcesses": NOT_SUPPORTED},
        {"processes": None},
    ),
    # Unknown, never assumed to be the index: isolating the GPU needs its own device file.
    "minor_number": ({"nvmlDeviceGetMinorNumber": NOT_SUPPORTED}, {"minor_number": None}),
    "minor_number_function_missing": (
        {"nvmlDeviceGetMinorNumber": err("FUNCTION_NOT_FOUND")},
        {"minor_number": None},
    ),
}


@pytest.mark.parametrize("case", FEATURES_ABSENT, ids=list(FEATURES_ABSENT))
def test_unsupported_feature_is_absent_and_nothing_else_changes(case: str) -> None:
    table_changes, expected_changes = FEATURES_ABSENT[case]
    gpus = read(FakeNvml(node({2: table_changes})))["gpus"]
    assert gpus[2] == {**healthy_gpu(2), **expected_changes}
    assert "read_errors" not in gpus[2]
    assert all(gpus[i] == healthy_gpu(i) for i in range(8) if i != 2)


def test_the_minor_number_is_the_gpus_own_not_its_index() -> None:
    # NVML orders GPUs by PCI bus id; the driver numbers /dev/nvidiaN as it probed them, which
    # need not agree (nvidia-smi lists them as `Minor Number`): here GPU 0 is /dev/nvidia3.
    minors = {0: 3, 1: 0, 2: 1, 3: 2}
    fake = FakeNvml(node({i: {"nvmlDeviceGetMinorNumber": m} for i, m in minors.items()}, 4))
    gpus = read(fake)["gpus"]
    assert [(g["index"], g["minor_number"]) for g in gpus] == list(minors.items())
    facts = facts_from_dict(read(FakeNvml(node({0: {"nvmlDeviceGetMinorNumber": 3}}, 1))))
    assert (facts.gpus[0].index, facts.gpus[0].minor_number) == (0, 3)


def test_a_binding_without_the_minor_number_call_reads_everything_else() -> None:
    fake = FakeNvml(node(count=1), missing=("nvmlDeviceGetMinorNumber",))
    gpu = read(fake)["gpus"][0]
    assert gpu == {**healthy_gpu(0), "minor_number": None}


def test_fabric_falls_back_to_the_deprecated_call_on_older_drivers() -> None:
    changes = {
        "nvmlDeviceGetGpuFabricInfoV": err("FUNCTION_NOT_FOUND"),
        "nvmlDeviceGetGpuFabricInfo": fabric(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED),
    }
    gpu = read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]
    assert (gpu["fabric_state"], gpu["fabric_status"]) == ("completed", "success")


def test_fabric_manager_not_finished_is_reported_with_its_own_status() -> None:
    changes = {
        "nvmlDeviceGetGpuFabricInfoV": fabric(
            pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_ERROR_NOT_READY
        )
    }
    gpu = read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]
    assert (gpu["fabric_state"], gpu["fabric_status"]) == ("in_progress", "not_ready")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, "none"), (1, "gpu_reset"), (2, "node_reboot"), (3, "drain_p2p"), (4, "drain_and_reset"),
     (7, "system_reboot"), (42, "action_42")],
)  # fmt: skip
def test_recovery_action_names(value: int, expected: str) -> None:
    changes = {"nvmlDeviceGetFieldValues": fields({230: value})}
    assert read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]["recovery_action"] == expected


def test_remapped_rows_pending_and_failure() -> None:
    changes = {"nvmlDeviceGetRemappedRows": (3, 1, 1, 1)}
    gpu = read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]
    expected = {"corrected": 3, "uncorrected": 1, "pending": True, "failure": True}
    assert gpu["remapped_rows"] == expected


# --- broken GPUs: listed with an error, never dropped, the others complete ------------------

BROKEN = {
    "lost_at_handle": ({"nvmlDeviceGetHandleByIndex": err("GPU_IS_LOST")}, "gpu_is_lost"),
    "lost_at_name": ({"nvmlDeviceGetName": err("GPU_IS_LOST")}, "gpu_is_lost"),
    "reset_required_at_handle": (
        {"nvmlDeviceGetHandleByIndex": err("RESET_REQUIRED")},
        "reset_required",
    ),
    "reset_required_at_uuid": ({"nvmlDeviceGetUUID": err("RESET_REQUIRED")}, "reset_required"),
    "unknown_error": ({"nvmlDeviceGetHandleByIndex": err("UNKNOWN")}, "unknown"),
    "gpu_not_found": ({"nvmlDeviceGetHandleByIndex": err("GPU_NOT_FOUND")}, "gpu_not_found"),
    "invalid_state": ({"nvmlDeviceGetName": err("INVALID_STATE")}, "invalid_state"),
    "irq_issue": ({"nvmlDeviceGetHandleByIndex": err("IRQ_ISSUE")}, "irq_issue"),
    "no_permission_at_handle": (
        {"nvmlDeviceGetHandleByIndex": err("NO_PERMISSION")},
        "no_permission",
    ),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_broken_gpu_is_listed_with_its_error_and_the_others_are_complete(case: str) -> None:
    table_changes, error = BROKEN[case]
    gpus = read(FakeNvml(node({5: table_changes})))["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert gpus[5]["error"] == error
    assert gpus[5]["temperature_c"] is None and gpus[5]["nvlink_active"] is None
    assert all(gpus[i] == healthy_gpu(i) for i in range(8) if i != 5)
    facts = facts_from_dict({"gpus": gpus})
    assert facts.gpus[5].error == error


def test_lost_gpu_keeps_what_answered_before_and_is_not_read_further() -> None:
    fake = FakeNvml(node({1: {"nvmlDeviceGetName": err("GPU_IS_LOST")}}, count=2))
    gpu = read(fake)["gpus"][1]
    assert gpu["pci_bus_id"] == "00000000:29:00.0"  # the bus id names it in the drain reason
    assert gpu["uuid"].startswith("GPU-8f2c0001")
    assert gpu["name"] is None
    calls_after = [name for name, index, _ in fake.calls if index == 1]
    assert calls_after[-1] == "nvmlDeviceGetName"


def test_a_gpu_lost_after_its_bus_id_keeps_its_device_minor() -> None:
    # The lost GPU is the one isolation takes out: its /dev/nvidiaN is read right after PCI.
    changes = {"nvmlDeviceGetMinorNumber": 5, "nvmlDeviceGetUUID": err("GPU_IS_LOST")}
    gpu = read(FakeNvml(node({1: changes}, count=2)))["gpus"][1]
    assert (gpu["error"], gpu["pci_bus_id"], gpu["minor_number"]) == (
        "gpu_is_lost",
        "00000000:29:00.0",
        5,
    )
    assert gpu["uuid"] is None


def test_gpu_lost_in_the_middle_of_the_reading() -> None:
    changes = {"nvmlDeviceGetTotalEccErrors": err("UNKNOWN")}
    gpu = read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]
    assert gpu["error"] == "unknown"
    assert gpu["temperature_c"] == 33.0  # read before the failure
    assert gpu["ecc_volatile_uncorrected"] is None
    assert gpu["memory_total_mib"] is None  # not read after it


def test_lost_gpu_during_the_nvlink_walk_is_an_error_not_a_short_link_list() -> None:
    states = per_arg({0: 1, 1: 1, 2: err("GPU_IS_LOST")})
    gpu = read(FakeNvml(node({0: {"nvmlDeviceGetNvLinkState": states}}, count=1)))["gpus"][0]
    assert gpu["error"] == "gpu_is_lost"
    assert gpu["nvlink_active"] is None


def test_other_error_on_one_call_leaves_that_key_unknown_and_is_noted() -> None:
    changes = {
        "nvmlDeviceGetSerial": err("NO_PERMISSION"),
        "nvmlDeviceGetPowerUsage": err("TIMEOUT"),
    }
    gpu = read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]
    assert gpu["error"] is None
    assert gpu["serial"] is None and gpu["power_draw_w"] is None
    assert gpu["read_errors"] == {
        "nvmlDeviceGetSerial": "no_permission",
        "nvmlDeviceGetPowerUsage": "timeout",
    }
    assert gpu["temperature_c"] == 33.0 and gpu["recovery_action"] == "none"
    assert facts_from_dict({"gpus": [gpu]}).gpus[0].serial is None  # extra key is ignored


def test_recovery_field_broken_code_marks_the_gpu() -> None:
    changes = {"nvmlDeviceGetFieldValues": fields({230: err("GPU_IS_LOST")})}
    gpu = read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]
    assert gpu["error"] == "gpu_is_lost" and gpu["recovery_action"] is None


# --- NVML not there at all ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("LIBRARY_NOT_FOUND", "libnvidia-ml.so.1 not found"),
        ("DRIVER_NOT_LOADED", "kernel module is not loaded"),
        ("LIB_RM_VERSION_MISMATCH", "driver updated without a reboot"),
        ("NO_PERMISSION", "/dev/nvidia"),
        ("UNKNOWN", "unknown"),
    ],
)
def test_init_failure_raises_a_clear_error(code: str, words: str) -> None:
    fake = FakeNvml(node(), init_error=err(code))
    with pytest.raises(NvmlUnavailable) as info:
        read(fake)
    message = str(info.value)
    assert message.startswith(f"nvmlInit failed: {code.lower()}: ")
    assert words in message
    assert fake.calls == [] and fake.shutdowns == 0


def test_init_failure_carries_the_code_and_the_loaded_library_version(tmp_path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "maps").write_text(
        "7f00-7f01 r--p 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f10-7f11 r-xp 00000000 08:01 43 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.90.07\n"
    )
    config = default_config()
    config = config.replace(sources=config.sources.replace(proc_root=str(tmp_path)))
    fake = FakeNvml(node(), init_error=err("LIB_RM_VERSION_MISMATCH"))
    with pytest.raises(NvmlUnavailable) as info:
        read(fake, config)
    assert info.value.facts == {
        "nvml_error": "lib_rm_version_mismatch",
        "nvml_library_version": "550.90.07",
    }


@pytest.mark.parametrize("code", ["DRIVER_NOT_LOADED", "LIBRARY_NOT_FOUND"])
def test_init_failure_names_its_code_as_a_snapshot_key(code: str) -> None:
    with pytest.raises(NvmlUnavailable) as info:
        read(FakeNvml(node(), init_error=err(code)))
    assert info.value.facts == {"nvml_error": code.lower()}


def test_loaded_library_version_without_nvml_in_the_maps(tmp_path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f10-7f11 r-xp 00000000 08:01 43 /opt/stub/libnvidia-ml.so.1\n")
    assert loaded_library_version(str(maps)) is None
    assert loaded_library_version(str(tmp_path / "missing")) is None


def test_count_failure_raises_and_still_shuts_down() -> None:
    fake = FakeNvml(node(), system={"nvmlDeviceGetCount": err("UNKNOWN")})
    with pytest.raises(NvmlUnavailable, match="nvmlDeviceGetCount failed: unknown"):
        read(fake)
    assert fake.shutdowns == 1


def test_shutdown_even_when_reading_raises_something_unexpected() -> None:
    fake = FakeNvml(node({0: {"nvmlDeviceGetRemappedRows": RuntimeError("binding bug")}}))
    with pytest.raises(RuntimeError, match="binding bug"):
        read(fake)
    assert fake.shutdowns == 1


def test_failing_shutdown_does_not_lose_the_facts() -> None:
    fake = FakeNvml(node(count=2))

    def failing_shutdown() -> None:
        raise err("UNINITIALIZED")

    fake.nvmlShutdown = failing_shutdown
    assert len(read(fake)["gpus"]) == 2


def test_missing_pynvml_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py"):
        read_nvml(default_config())


def test_zero_gpus_is_an_empty_list() -> None:
    assert read(FakeNvml([]))["gpus"] == []


# --- clock-event (throttle) reasons ---------------------------------------------------------


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0x0, []),
        (0x1, ["gpu_idle"]),
        (0x4, ["sw_power_cap"]),
        (0x48, ["hw_slowdown", "hw_thermal_slowdown"]),
        (0x88, ["hw_slowdown", "hw_power_brake_slowdown"]),
        (0x122, ["applications_clocks_setting", "sw_thermal_slowdown", "display_clock_setting"]),
        (0x10, ["sync_boost"]),
        (0x1000, ["unknown_0x1000"]),
    ],
)
def test_decode_throttle_reasons(mask: int, names: list[str]) -> None:
    assert decode_throttle_reasons(mask) == names


def test_every_named_bit_matches_the_binding() -> None:
    for attr in dir(pynvml):
        if attr.startswith("nvmlClocksEventReason") and attr[21:] not in ("None", "All"):
            if attr.endswith("UserDefinedClocks"):  # deprecated alias of ApplicationsClocks
                continue
            assert len(decode_throttle_reasons(getattr(pynvml, attr))) == 1, attr


def test_throttle_reasons_through_nvml() -> None:
    changes = {"nvmlDeviceGetCurrentClocksEventReasons": 0x48}
    gpu = read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]
    assert gpu["throttle_reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]


@pytest.mark.parametrize("how", ["binding_lacks_it", "driver_lacks_it"])
def test_throttle_reasons_fall_back_to_the_deprecated_call(how: str) -> None:
    changes: dict = {"nvmlDeviceGetCurrentClocksThrottleReasons": 0x40}
    missing: tuple[str, ...] = ()
    if how == "binding_lacks_it":
        missing = ("nvmlDeviceGetCurrentClocksEventReasons",)
    else:
        changes["nvmlDeviceGetCurrentClocksEventReasons"] = err("FUNCTION_NOT_FOUND")
    gpu = read(FakeNvml(node({0: changes}, count=1), missing=missing))["gpus"][0]
    assert gpu["throttle_reasons"] == ["hw_thermal_slowdown"]


# --- NVLink ---------------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [True, False], ids=["fields", "per_call"])
@pytest.mark.parametrize("stop", [NOT_SUPPORTED, err("INVALID_ARGUMENT")], ids=["ns", "inval"])
def test_nvlink_counting_stops_at_the_first_link_nvml_refuses(stop: Exception, batched) -> None:
    states = per_arg({0: 1, 1: 1, 2: 0, 3: stop, 4: 1, 5: 1})
    counters = per_arg({(0, 0): 2, (1, 0): 3, (2, 1): 1, (4, 0): 100}, default=0)
    changes = {"nvmlDeviceGetNvLinkState": states, "nvmlDeviceGetNvLinkErrorCounter": counters}
    fake = FakeNvml(node({0: changes}, count=1), field_values=batched)
    gpu = read(fake)["gpus"][0]
    assert gpu["nvlink_active"] == [True, True, False]
    assert gpu["nvlink_errors"] == {"replay": 5, "recovery": 1, "crc_flit": 0, "crc_data": 0}
    asked = {args[0] for name, _, args in fake.calls if name == "nvmlDeviceGetNvLinkState"}
    # Not past the first refused link; through the fields, not one per-link call.
    assert asked == (set() if batched else {0, 1, 2, 3})
    assert "read_errors" not in gpu


def test_pcie_gpu_without_nvlink_has_no_links() -> None:
    gpu = read(FakeNvml(node({0: {"nvmlDeviceGetNvLinkState": NOT_SUPPORTED}}, count=1)))["gpus"][0]
    assert gpu["nvlink_active"] == []
    assert gpu["nvlink_errors"] is None


def test_nvlink_counter_the_architecture_lacks_stays_out() -> None:
    counters = per_arg({(link, c): 1 for link in range(18) for c in (0, 1, 2)})  # no CRC data
    changes = {"nvmlDeviceGetNvLinkErrorCounter": counters}
    gpu = read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]
    assert gpu["nvlink_errors"] == {"replay": 18, "recovery": 18, "crc_flit": 18}


def test_nvlink_walk_is_bounded_by_the_binding() -> None:
    always = {"nvmlDeviceGetNvLinkState": lambda link: 1}
    gpu = read(FakeNvml(node({0: always}, count=1)))["gpus"][0]
    assert len(gpu["nvlink_active"]) == pynvml.NVML_NVLINK_MAX_LINKS


def test_one_inactive_link() -> None:
    states = per_arg({**dict.fromkeys(range(18), 1), 7: 0}, err("INVALID_ARGUMENT"))
    gpu = read(FakeNvml(node({0: {"nvmlDeviceGetNvLinkState": states}}, count=1)))["gpus"][0]
    assert gpu["nvlink_active"].count(False) == 1 and len(gpu["nvlink_active"]) == 18


# --- strings, memory, processes -------------------------------------------------------------


def test_old_bindings_returning_bytes_are_decoded() -> None:
    changes = {
        "nvmlDeviceGetName": b"Tesla V100-SXM2-32GB",
        "nvmlDeviceGetUUID": b"GPU-0d3c1f0e-aaaa-bbbb-cccc-000000000000",
        "nvmlDeviceGetSerial": b"0323617000000\x00\x00",
        "nvmlDeviceGetPciInfo": SimpleNamespace(busId=b"00000000:1A:00.0"),
    }
    fake = FakeNvml(
        node({0: changes}, count=1), system={"nvmlSystemGetDriverVersion": b"470.82.01"}
    )
    data = read(fake)
    gpu = data["gpus"][0]
    assert data["driver_version"] == "470.82.01"
    assert gpu["name"] == "Tesla V100-SXM2-32GB"
    assert gpu["uuid"] == "GPU-0d3c1f0e-aaaa-bbbb-cccc-000000000000"
    assert gpu["serial"] == "0323617000000"
    assert gpu["pci_bus_id"] == "00000000:1A:00.0"
    assert all(isinstance(gpu[k], str) for k in ("name", "uuid", "serial", "pci_bus_id"))


def test_memory_prefers_v2_which_keeps_reserved_memory_apart() -> None:
    changes = {"nvmlDeviceGetMemoryInfo": memory(total_mib=81559, used_mib=1200, reserved_mib=536)}
    gpu = read(FakeNvml(node({0: changes}, count=1)))["gpus"][0]
    assert (gpu["memory_used_mib"], gpu["memory_total_mib"]) == (1200, 81559)


def test_memory_v1_on_bindings_without_the_versioned_struct() -> None:
    changes = {"nvmlDeviceGetMemoryInfo": memory(total_mib=81559, used_mib=1200, reserved_mib=536)}
    fake = FakeNvml(node({0: changes}, count=1), missing=("nvmlMemory_v2",))
    assert read(fake)["gpus"][0]["memory_used_mib"] == 1736


def test_processes_with_names_from_proc(tmp_path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "comm").write_bytes(b"python3\n")
    config = default_config()
    config = config.replace(sources=config.sources.replace(proc_root=str(tmp_path)))
    changes = {"nvmlDeviceGetComputeRunningProcesses": processes((4242, 2048 * MIB), (77, None))}
    gpu = read(FakeNvml(node({0: changes}, count=1)), config)["gpus"][0]
    assert gpu["processes"] == [
        {"pid": 4242, "name": "python3", "used_memory_mib": 2048},
        {"pid": 77, "name": None, "used_memory_mib": None},  # gone, and memory not available
    ]
    assert facts_from_dict({"gpus": [gpu]}).gpus[0].processes[0].name == "python3"


def test_processes_call_missing_from_the_driver_is_absent() -> None:
    def mismatch() -> None:
        raise pynvml.NVMLLibraryMismatchError("unversioned function")

    fake = FakeNvml(node({0: {"nvmlDeviceGetComputeRunningProcesses": mismatch}}, count=1))
    fake.NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    assert read(fake)["gpus"][0]["processes"] is None


def test_persistence_mode_off() -> None:
    gpu = read(FakeNvml(node({0: {"nvmlDeviceGetPersistenceMode": 0}}, count=1)))["gpus"][0]
    assert gpu["persistence_mode"] is False


def test_ecc_mode_off() -> None:
    gpu = read(FakeNvml(node({0: {"nvmlDeviceGetEccMode": [0, 1]}}, count=1)))["gpus"][0]
    assert gpu["ecc_mode_enabled"] is False


# --- through the gatherer -------------------------------------------------------------------


def test_lost_gpu_flows_through_gather_into_the_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(node({3: {"nvmlDeviceGetHandleByIndex": err("GPU_IS_LOST")}}))
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # what read_nvml's lazy import finds
    snapshot = gather_dict(default_config(), "gpu-node-01", only=["nvml"])
    assert snapshot["source_errors"] == {}
    assert [g["error"] for g in snapshot["gpus"]] == [None, None, None, "gpu_is_lost"] + [None] * 4
    facts = facts_from_dict(snapshot)
    assert facts.gpus[3].error == "gpu_is_lost" and facts.gpus[3].index == 3
    assert facts.gpus[0] == facts_from_dict({"gpus": [healthy_gpu(0)]}).gpus[0]
    assert facts.driver_version == "550.54.15"


def test_missing_driver_is_a_source_error_in_the_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_error=err("LIBRARY_NOT_FOUND")))
    snapshot = gather_dict(default_config(), "gpu-node-01", only=["nvml"])
    assert "library_not_found" in snapshot["source_errors"]["nvml"]
    assert "NvmlUnavailable" in snapshot["source_errors"]["nvml"]
    assert facts_from_dict(snapshot).gpus is None  # not known, not "zero GPUs"


def test_nvml_that_cannot_start_beside_gpus_on_the_bus_fails_the_node_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "maps").write_text(
        "0-1 r-xp 0 0:0 1 /usr/lib64/libnvidia-ml.so.550.90.07\n"
    )
    config = default_config()
    sources = config.sources.replace(proc_root=str(tmp_path), sysfs_root=str(FIXTURES / "sys-pci"))
    config = config.replace(sources=sources)
    monkeypatch.setitem(
        sys.modules, "pynvml", FakeNvml([], init_error=err("LIB_RM_VERSION_MISMATCH"))
    )
    facts = facts_from_dict(gather_dict(config, "gpu-node-01", only=["nvml", "host"]))
    assert "lib_rm_version_mismatch" in facts.source_errors["nvml"] and facts.gpus is None
    findings = run_checks(facts, config)
    fails = [f for f in findings if f.status == "fail" and f.check.startswith("gpu.")]
    driver = [f for f in fails if f.check == "gpu.driver"]
    assert [f.message for f in driver] == [
        "gpu.driver: NVML cannot start (driver/library version mismatch, library 550.90.07 vs kernel module "
        "550.54.15) while 4 NVIDIA GPUs are on the PCI bus: reboot the node (or reload the nvidia "
        "kernel modules) to run the installed driver"
    ]
    # The other GPU checks do not each repeat the cause: they point at gpu.driver.
    others = [f for f in findings if f.status == "unknown" and f.check.startswith("gpu.")]
    assert others and all(f.message.endswith("(see gpu.driver)") for f in others)


@pytest.mark.parametrize(
    ("changes", "failed"),
    [
        ({}, True),
        ({"pci_gpu_count": 0}, False),  # no NVIDIA GPU on the bus: not a broken GPU node
        ({"pci_gpu_count": None}, False),  # the bus not read: not known
        ({"nvml_error": None}, False),  # NVML hung or the binding is missing: not its verdict
    ],
)
def test_gpu_driver_fails_only_for_nvml_refusing_beside_gpus_on_the_bus(changes, failed) -> None:
    snapshot = {"nvml_error": "driver_not_loaded", "pci_gpu_count": 8, **changes}
    snapshot["source_errors"] = {"nvml": "NvmlUnavailable: nvmlInit failed: driver_not_loaded"}
    findings = run_checks(facts_from_dict(snapshot), default_config())
    driver = [f for f in findings if f.check == "gpu.driver"]
    assert [f.status == "fail" for f in driver] == [failed]
    if failed:
        assert driver[0].message == (
            "gpu.driver: NVML cannot start (the nvidia kernel module is not loaded) while 8 NVIDIA "
            "GPUs are on the PCI bus: load it (modprobe nvidia) or reinstall the driver for the running kernel"
        )


def test_the_packaged_nvml_mismatch_snapshot_fails_gpu_driver_alone(capsys) -> None:
    path = paths.SNAPSHOTS / "h100-nvml-mismatch.yaml"
    code = main(["check", "--facts", str(path), "--config", "/dev/null", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert (code, out["status"]) == (1, "fail")
    fails = [f for f in out["findings"] if f["status"] == "fail"]
    assert [f["check"] for f in fails] == ["gpu.driver"]
    assert (
        "library 550.90.07 vs kernel module 550.54.15) while 8 NVIDIA GPUs" in fails[0]["message"]
    )
    unknown = {f["check"] for f in out["findings"] if f["status"] == "unknown"}
    assert {"gpu.count", "gpu.lost", "nvlink.links"} <= unknown


def test_importing_the_source_does_not_import_pynvml() -> None:
    code = "import sys, gpugate.checks.sources.nvml; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_fake_fills_real_ctypes_structs() -> None:
    # The source passes ctypes.byref(struct); the fake must see the same object.
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    fabric(3, 0)(ctypes.byref(info))
    assert info.state == 3


# --- the real thing -------------------------------------------------------------------------


@pytest.mark.gpu
def test_real_nvml_on_this_node() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no usable NVML here: {exc}")
    try:
        expected = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    data = read_nvml(default_config())
    facts = facts_from_dict(data)
    assert len(facts.gpus) == expected
    assert facts.driver_version and facts.cuda_driver_version
    for gpu in facts.gpus:
        assert gpu.error or (gpu.uuid.startswith(("GPU-", "MIG-")) and gpu.memory_total_mib > 0)

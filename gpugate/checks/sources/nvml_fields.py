"""NVML field values: the per-link and per-GPU counters of one GPU in one call.

One `nvmlDeviceGetFieldValues` call per GPU reads what used to take ~100 calls (the NVLink
state and three error counters of every link, the ECC totals, the memory repair state, the
PCIe replay counter, the recovery action). On a real driver each NVML call costs time, and the
prolog runs before every job. Each field carries its own return code: a field the GPU or the
driver does not know answers NotSupported (or InvalidArgument on drivers older than the field),
and the reader falls back to the per-call function for it (`ASK`), unless another field of the
same group answered, which shows the driver knows the group and the GPU really lacks the feature.

Field ids: nvml.h as shipped in nvidia-ml-py 13.615 (NVML_FI_DEV_*). The per-link NVLink fields
(161-165) take the link index in `scopeId` (nvmlFieldValue_t, NVML API reference,
docs.nvidia.com/deploy/nvml-api, read 2026-12).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Protocol

    class Reader(Protocol):
        """What these functions ask of nvml.py's _Reader (named here, not imported: no circle)."""

        @property
        def module(self) -> ModuleType: ...  # the pynvml module

        @property
        def answers(self) -> dict[tuple[int, int], tuple[int, object]]: ...  # field values

        def optional(self, fn_name: str, *args: object, absent: frozenset[Any] = ...) -> Any: ...

        def field(self, fid: int, scope: int = 0, group: tuple[int, ...] = ()) -> Any: ...


ECC_CURRENT = 1  # NVML_FI_DEV_ECC_CURRENT: 1 active, 0 inactive
# Single-bit = corrected, double-bit = uncorrected (the same counts nvmlDeviceGetTotalEccErrors
# gives for NVML_MEMORY_ERROR_TYPE_CORRECTED/UNCORRECTED).
ECC_SBE_VOL, ECC_DBE_VOL, ECC_SBE_AGG, ECC_DBE_AGG = 3, 4, 5, 6
RETIRED_PENDING = 31  # NVML_FI_DEV_RETIRED_PENDING
NVLINK_CRC_DATA_TOTAL = 45  # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, summed by the driver
PCIE_REPLAY = 94  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
REMAPPED = (142, 143, 144, 145)  # NVML_FI_DEV_REMAPPED_COR, _UNC, _PENDING, _FAILURE
NVLINK_DL_REPLAY, NVLINK_DL_RECOVERY, NVLINK_DL_CRC = 161, 162, 163  # per link (scopeId)
NVLINK_GET_STATE = 165  # per link: NVML_NVLINK_STATE_INACTIVE 0, ACTIVE 1, SLEEP 2, ...
RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

# The groups whose members vouch for each other: one answered, the others' NotSupported is true.
ECC_GROUP = (ECC_CURRENT, ECC_SBE_VOL, ECC_DBE_VOL, ECC_SBE_AGG, ECC_DBE_AGG)
MEMORY_REPAIR_GROUP = (RETIRED_PENDING, *REMAPPED)

# NVML_NVLINK_ERROR_DL_*: REPLAY 0, RECOVERY 1, CRC_FLIT 2, CRC_DATA 3; and the per-link field
# of each (CRC data has none per link past link 11: the driver's total is read instead).
_NVLINK_COUNTERS = (
    ("replay", 0, NVLINK_DL_REPLAY),
    ("recovery", 1, NVLINK_DL_RECOVERY),
    ("crc_flit", 2, NVLINK_DL_CRC),
    ("crc_data", 3, None),
)
# Past a device's last link nvmlDeviceGetNvLinkState answers NotSupported or InvalidArgument.
# (NOT_SUPPORTED 3, FUNCTION_NOT_FOUND 13, INVALID_ARGUMENT 2: nvmlReturn_t, nvml.h)
_NO_SUCH_LINK = frozenset({3, 13, 2})
_DEFAULT_MAX_LINKS = 18  # bindings without NVML_NVLINK_MAX_LINKS; H100/H200 SXM have 18 links


_PER_GPU = (*ECC_GROUP, *MEMORY_REPAIR_GROUP, NVLINK_CRC_DATA_TOTAL, PCIE_REPLAY, RECOVERY_ACTION)
_PER_LINK = (NVLINK_GET_STATE, NVLINK_DL_REPLAY, NVLINK_DL_RECOVERY, NVLINK_DL_CRC)
# NVLink 5 (B200/B300, GB200/GB300) has 18 links per GPU, as have H100/H200 SXM. The batch asks
# one link more, so that its own answers show where the device's links end; the binding's bound
# (NVML_NVLINK_MAX_LINKS, 36 in 13.x) would only make it longer.
MAX_FIELD_LINKS = 19

_SUCCESS = 0
_ENABLED = 1  # NVML_FEATURE_ENABLED: what nvmlDeviceGetNvLinkState answers for an active link
# NVML_NVLINK_STATE_* of field 165: ACTIVE 1 and SLEEP 2 (a link in low power) are up.
_LINK_UP = (1, 2)
# c_nvmlValue_t member for each NVML_VALUE_TYPE_* (0..6).
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class Ask:
    """The field gave no answer to trust: read it through its own NVML function."""

    def __repr__(self) -> str:
        return "ASK"


ASK = Ask()


def field_ids(links: int) -> list[tuple[int, int]]:
    """The (field id, scope id) pairs one GPU is asked for: per-GPU fields, then per link."""
    ids = [(fid, 0) for fid in _PER_GPU]
    ids += [(fid, link) for link in range(links) for fid in _PER_LINK]
    return ids


def decode(values: Any) -> dict[tuple[int, int], tuple[int, object]]:
    """The call's answer as {(field id, scope id): (nvmlReturn, value or None)}."""
    out = {}
    for slot in values:
        code = int(slot.nvmlReturn)
        value = None
        if code == _SUCCESS:
            value = getattr(slot.value, _VALUE_MEMBERS[int(slot.valueType)])
        out[(int(slot.fieldId), int(slot.scopeId))] = (code, value)
    return out


def link_states(
    answers: dict[tuple[int, int], tuple[int, Any]], links: int, absent: frozenset[int]
) -> list[int] | Ask:
    """NVML_NVLINK_STATE_* per link up to the first link the driver refuses; ASK if unknown."""
    states: list[int] = []
    value: Any  # NVML's raw answer, read only on success
    for link in range(links):
        code, value = answers.get((NVLINK_GET_STATE, link), (None, None))
        if code == _SUCCESS:
            states.append(int(value))
        elif code in absent and states:
            return states  # past the device's last link
        else:
            return ASK  # link 0 not answered (no NVLink, or a driver without the field)
    return states


def read_nvlink(r: Reader, h: object, gpu: dict[str, Any]) -> None:
    if getattr(r.module, "nvmlDeviceGetNvLinkState", None) is None and not r.answers:
        return  # a binding without NVLink calls: not known
    links = min(max_links(r.module), MAX_FIELD_LINKS)
    states = link_states(r.answers, links, _NO_SUCH_LINK)
    if isinstance(states, Ask):  # the one instance, ASK
        active = _links_per_call(r, h, 0)
    else:
        active = [state in _LINK_UP for state in states]
        if len(active) == MAX_FIELD_LINKS:  # a device with more links than the batch asked
            active += _links_per_call(r, h, len(active))
    gpu["nvlink_active"] = active
    gpu["nvlink_errors"] = _nvlink_errors(r, h, len(active))


def max_links(module: Any) -> int:
    # NVML_NVLINK_MAX_LINKS is the binding's array bound (6, 12, 18, now 36), not the device's
    # link count: links exist up to the first one NVML refuses.
    return getattr(module, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_LINKS)


def _links_per_call(r: Reader, h: object, first: int) -> list[bool]:
    active = []
    for link in range(first, max_links(r.module)):
        state = r.optional("nvmlDeviceGetNvLinkState", h, link, absent=_NO_SUCH_LINK)
        if state is None:
            break
        active.append(state == _ENABLED)
    return active


def _nvlink_errors(r: Reader, h: object, links: int) -> dict[str, int] | None:
    if not links:
        return None
    totals = {}
    for key, counter, fid in _NVLINK_COUNTERS:
        if fid is None:
            total = r.field(NVLINK_CRC_DATA_TOTAL)
            values = [total] if total is not ASK else _counter_per_call(r, h, counter, links)
        else:
            values = [r.field(fid, link) for link in range(links)]
            if values and all(v is ASK for v in values):
                values = _counter_per_call(r, h, counter, links)
        known = [int(v) for v in values if v is not None and v is not ASK]
        if known:  # a counter the architecture lacks stays out rather than reading as 0
            totals[key] = sum(known)
    return totals or None


def _counter_per_call(r: Reader, h: object, counter: int, links: int) -> list[Any]:
    """One counter of every link through nvmlDeviceGetNvLinkErrorCounter."""
    values = []
    for link in range(links):
        value = r.optional("nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
        if value is None and link == 0:
            break  # the architecture lacks this counter: asking every link costs a call each
        values.append(value)
    return values

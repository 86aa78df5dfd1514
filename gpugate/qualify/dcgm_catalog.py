"""DCGM's own error catalog, and the verdict gpugate draws from it for one failed diag test.

Source: NVIDIA/DCGM `dcgmlib/dcgm_errors.h` (dcgmError_t ids, dcgmErrorCategory_t,
dcgmErrorSeverity_t, the *_MSG formats) and `dcgmlib/src/dcgm_errors.c` (`dcgmErrorMeta`: each
id's severity and category), read at commit 0d22068 (DCGM 4.x; ids 0-111 are the same in 3.3).
Three verdicts, each a `kind` of DcgmFinding:
- "hardware": the GPU failed a test DCGM ran (categories 1-2 performance, 9-15 hardware, and
  the software-category errors DCGM rates ISOLATE: Xid 95, NVSwitch SXID, a failed EUD): drain.
- "software" / "config": a node problem that is not the GPU (categories 3-8): `cause` names it
  (fabric manager, persistence mode, CUDA environment, ...). "config" is a setting DCGM rates
  CONFIG ("this error can be configured"): reported, the node is not failed for it.
- "not_tested": DCGM could not test (category 16 "Internal Other", a test skipped or disabled,
  a plugin that could not start): never a drain, reported with the reason.
"""

from __future__ import annotations

# dcgmErrorSeverity_t
NONE, MONITOR, ISOLATE, UNKNOWN, TRIAGE, CONFIG, RESET = range(7)

# dcgmErrorCategory_t
CATEGORIES = (
    "None", "Performance Threshold", "Performance Violation", "Software Configuration",
    "Software Library", "Software XID", "Software Cuda", "Software EUD", "Software Other",
    "Hardware Thermal", "Hardware Memory", "Hardware NvLink", "Hardware NvSwitch",
    "Hardware PCIe", "Hardware Power", "Hardware Other", "Internal Other",
)  # fmt: skip
INTERNAL = 16
_KIND_BY_CATEGORY = {1: "hardware", 2: "hardware", **dict.fromkeys(range(3, 9), "software"),
                     **dict.fromkeys(range(9, 16), "hardware"), INTERNAL: "not_tested"}  # fmt: skip

# dcgmErrorMeta: error id -> (name without DCGM_FR_, severity, category). The table is indexed by
# id, in this order (dcgm_errors.c); 112-117 are DCGM 4.x additions.
CATALOG: dict[int, tuple[str, int, int]] = dict(enumerate((
    ("OK", UNKNOWN, 0), ("UNKNOWN", UNKNOWN, 0), ("UNRECOGNIZED", UNKNOWN, 0),
    ("PCI_REPLAY_RATE", ISOLATE, 13), ("VOLATILE_DBE_DETECTED", ISOLATE, 10),
    ("VOLATILE_SBE_DETECTED", MONITOR, 10), ("PENDING_PAGE_RETIREMENTS", RESET, 10),
    ("RETIRED_PAGES_LIMIT", ISOLATE, 10), ("RETIRED_PAGES_DBE_LIMIT", ISOLATE, 10),
    ("CORRUPT_INFOROM", TRIAGE, 15), ("CLOCKS_EVENT_THERMAL", MONITOR, 9),
    ("POWER_UNREADABLE", MONITOR, 14), ("CLOCKS_EVENT_POWER", MONITOR, 14),
    ("NVLINK_ERROR_THRESHOLD", ISOLATE, 11), ("NVLINK_DOWN", TRIAGE, 11),
    ("NVSWITCH_FATAL_ERROR", ISOLATE, 12), ("NVSWITCH_NON_FATAL_ERROR", MONITOR, 12),
    ("NVSWITCH_DOWN", MONITOR, 12), ("NO_ACCESS_TO_FILE", CONFIG, 8), ("NVML_API", MONITOR, 4),
    ("DEVICE_COUNT_MISMATCH", CONFIG, 8), ("BAD_PARAMETER", UNKNOWN, 16),
    ("CANNOT_OPEN_LIB", TRIAGE, 4), ("DENYLISTED_DRIVER", CONFIG, 3), ("NVML_LIB_BAD", ISOLATE, 4),
    ("GRAPHICS_PROCESSES", RESET, 8), ("HOSTENGINE_CONN", MONITOR, 16),
    ("FIELD_QUERY", MONITOR, 16), ("BAD_CUDA_ENV", CONFIG, 6), ("PERSISTENCE_MODE", CONFIG, 8),
    ("LOW_BANDWIDTH", TRIAGE, 13), ("HIGH_LATENCY", TRIAGE, 13),
    ("CANNOT_GET_FIELD_TAG", MONITOR, 16), ("FIELD_VIOLATION", ISOLATE, 15),
    ("FIELD_THRESHOLD", MONITOR, 2), ("FIELD_VIOLATION_DBL", ISOLATE, 2),
    ("FIELD_THRESHOLD_DBL", ISOLATE, 2), ("UNSUPPORTED_FIELD_TYPE", TRIAGE, 16),
    ("FIELD_THRESHOLD_TS", ISOLATE, 1), ("FIELD_THRESHOLD_TS_DBL", ISOLATE, 1),
    ("THERMAL_VIOLATIONS", MONITOR, 9), ("THERMAL_VIOLATIONS_TS", MONITOR, 9),
    ("TEMP_VIOLATION", MONITOR, 9), ("CLOCKS_EVENT_VIOLATION", MONITOR, 15),
    ("INTERNAL", TRIAGE, 16), ("PCIE_GENERATION", TRIAGE, 13), ("PCIE_WIDTH", CONFIG, 13),
    ("ABORTED", CONFIG, 8), ("TEST_DISABLED", CONFIG, 3), ("CANNOT_GET_STAT", TRIAGE, 16),
    ("STRESS_LEVEL", TRIAGE, 1), ("CUDA_API", MONITOR, 6), ("FAULTY_MEMORY", ISOLATE, 10),
    ("CANNOT_SET_WATCHES", MONITOR, 16), ("CUDA_UNBOUND", TRIAGE, 6),
    ("ECC_DISABLED", CONFIG, 10), ("MEMORY_ALLOC", TRIAGE, 8), ("CUDA_DBE", ISOLATE, 10),
    ("MEMORY_MISMATCH", ISOLATE, 10), ("CUDA_DEVICE", TRIAGE, 6),
    ("ECC_UNSUPPORTED", CONFIG, 10), ("ECC_PENDING", MONITOR, 10),
    ("MEMORY_BANDWIDTH", TRIAGE, 1), ("TARGET_POWER", TRIAGE, 14), ("API_FAIL", TRIAGE, 8),
    ("API_FAIL_GPU", TRIAGE, 8), ("CUDA_CONTEXT", TRIAGE, 6), ("DCGM_API", TRIAGE, 16),
    ("CONCURRENT_GPUS", CONFIG, 3), ("TOO_MANY_ERRORS", MONITOR, 8),
    ("NVLINK_CRC_ERROR_THRESHOLD", ISOLATE, 11), ("NVLINK_ERROR_CRITICAL", ISOLATE, 11),
    ("ENFORCED_POWER_LIMIT", CONFIG, 14), ("MEMORY_ALLOC_HOST", TRIAGE, 8),
    ("GPU_OP_MODE", MONITOR, 3), ("NO_MEMORY_CLOCKS", MONITOR, 10),
    ("NO_GRAPHICS_CLOCKS", MONITOR, 15), ("HAD_TO_RESTORE_STATE", TRIAGE, 8),
    ("L1TAG_UNSUPPORTED", CONFIG, 8), ("L1TAG_MISCOMPARE", ISOLATE, 10),
    ("ROW_REMAP_FAILURE", ISOLATE, 10), ("UNCONTAINED_ERROR", ISOLATE, 5),
    ("EMPTY_GPU_LIST", CONFIG, 3), ("DBE_PENDING_PAGE_RETIREMENTS", RESET, 10),
    ("UNCORRECTABLE_ROW_REMAP", RESET, 10), ("PENDING_ROW_REMAP", RESET, 10),
    ("BROKEN_P2P_MEMORY_DEVICE", ISOLATE, 15), ("BROKEN_P2P_WRITER_DEVICE", ISOLATE, 15),
    ("NVSWITCH_NVLINK_DOWN", ISOLATE, 11), ("EUD_BINARY_PERMISSIONS", TRIAGE, 7),
    ("EUD_NON_ROOT_USER", TRIAGE, 7), ("EUD_SPAWN_FAILURE", TRIAGE, 7),
    ("EUD_TIMEOUT", TRIAGE, 7), ("EUD_ZOMBIE", TRIAGE, 7), ("EUD_NON_ZERO_EXIT_CODE", TRIAGE, 7),
    ("EUD_TEST_FAILED", ISOLATE, 7), ("FILE_CREATE_PERMISSIONS", CONFIG, 3),
    ("PAUSE_RESUME_FAILED", TRIAGE, 16), ("PCIE_H_REPLAY_VIOLATION", ISOLATE, 13),
    ("GPU_EXPECTED_NVLINKS_UP", TRIAGE, 11), ("NVSWITCH_EXPECTED_NVLINKS_UP", TRIAGE, 11),
    ("XID_ERROR", TRIAGE, 5), ("SBE_VIOLATION", ISOLATE, 10), ("DBE_VIOLATION", ISOLATE, 10),
    ("PCIE_REPLAY_VIOLATION", ISOLATE, 13), ("SBE_THRESHOLD_VIOLATION", ISOLATE, 10),
    ("DBE_THRESHOLD_VIOLATION", ISOLATE, 10), ("PCIE_REPLAY_THRESHOLD_VIOLATION", ISOLATE, 13),
    ("CUDA_FM_NOT_INITIALIZED", MONITOR, 6), ("SXID_ERROR", ISOLATE, 5),
    ("GFLOPS_THRESHOLD_VIOLATION", TRIAGE, 2), ("NAN_VALUE", ISOLATE, 10),
    ("FABRIC_MANAGER_TRAINING_ERROR", CONFIG, 6), ("BROKEN_P2P_PCIE_MEMORY_DEVICE", ISOLATE, 13),
    ("BROKEN_P2P_PCIE_WRITER_DEVICE", ISOLATE, 13), ("BROKEN_P2P_NVLINK_MEMORY_DEVICE", ISOLATE, 11),
    ("BROKEN_P2P_NVLINK_WRITER_DEVICE", ISOLATE, 11), ("TEST_SKIPPED", CONFIG, 3),
)))  # fmt: skip

# Ids whose category alone would say "node software problem" but that mean DCGM could not test:
# the test was aborted, disabled, skipped or given no GPU, the EUD plugin could not start its
# binary, DCGM could not write its files.
_NOT_TESTED = {47: "test aborted", 48: "test disabled", 68: "test needs several GPUs",
               82: "no GPU given to the test", 117: "test skipped",
               89: "EUD plugin could not start", 90: "EUD plugin could not start",
               91: "EUD plugin could not start", 92: "EUD plugin timed out",
               93: "EUD plugin could not start", 96: "DCGM could not create its files"}  # fmt: skip
# Named causes for the node problems that are not the GPU.
_CAUSES = {108: "fabric manager", 112: "fabric manager", 29: "persistence mode",
           28: "CUDA environment variables", 23: "denylisted driver (nouveau)",
           25: "graphics processes", 22: "a library DCGM needs", 60: "ECC (unsupported)",
           55: "ECC disabled", 46: "PCIe link width", 72: "enforced power limit"}  # fmt: skip
# What DCGM's message says when the text output carries no error id (dcgm_errors.h *_MSG), and
# CUDA's own words: cuInit's CUDA_ERROR_SYSTEM_NOT_READY (802) "system not yet initialized" is
# what a stopped or untrained nvidia-fabricmanager gives on an NVSwitch node (CUDA driver API
# docs: "verify ... all required driver daemons are actively running").
_MESSAGES = (
    ("There was an internal error during the test", 44),
    ("Error using CUDA API", 51),  # its cause may still be the fabric manager: verdict() reads it
    ("system not yet initialized", 108),
    ("Persistence mode for GPU", 29),
)


def error_id_from_message(message: str) -> int | None:
    """The DCGM error id a message was formatted from, where its words show it; else None."""
    return next((eid for words, eid in _MESSAGES if words.lower() in message.lower()), None)


def describe(error_id: int | None, category: int | None) -> str:
    """'DCGM_FR_INTERNAL, category 16 Internal Other' (what is known of the two)."""
    parts = []
    if error_id is not None and error_id in CATALOG:
        parts.append(f"DCGM_FR_{CATALOG[error_id][0]}")
        category = CATALOG[error_id][2] if category is None else category
    if category is not None and 0 <= category < len(CATEGORIES):
        parts.append(f"category {category} {CATEGORIES[category]}")
    return ", ".join(parts)


def verdict(
    error_id: int | None, category: int | None, severity: int | None, message: str = ""
) -> tuple[str | None, str]:
    """(kind, cause) by DCGM's catalog: kind None when neither id nor category is known."""
    known = CATALOG.get(error_id) if error_id is not None else None
    if known is not None:
        severity = known[1] if severity is None else severity
        category = known[2] if category is None else category
    cause = _CAUSES.get(error_id, "") if error_id is not None else ""
    if "system not yet initialized" in message.lower():
        cause = "fabric manager"
    if error_id is not None and error_id in _NOT_TESTED:
        return "not_tested", _NOT_TESTED[error_id]
    if category == INTERNAL:
        return "not_tested", "DCGM internal error"
    if cause == "fabric manager":
        return "software", cause  # FM training (112) is rated CONFIG, yet no CUDA job can start
    if severity == CONFIG:  # "can be configured": ECC off (memory category) too, a setting
        return "config", cause
    if category in range(3, 9) and severity in (ISOLATE, RESET) and error_id not in (24, 25):
        return "hardware", cause  # DCGM says isolate the GPU: Xid 95, NVSwitch SXID, EUD failed
    kind = _KIND_BY_CATEGORY.get(category) if category is not None else None
    return kind, cause

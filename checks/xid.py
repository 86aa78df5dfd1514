"""The Xid catalog: what each NVIDIA Xid means and what gpugate does about it.

Source: NVIDIA "Analyzing Xid Errors with the Xid Catalog" (Ampere and newer) and the legacy
per-cause table, as summarised in section 1 of docs/gpu-facts.md. Actions:
- ``none``: informational; log it.
- ``restart_app``: the application's own fault or a job-level error; the node stays in service
  (unless the same GPU repeats it, see ``kernel.app_xid_repeat_max``).
- ``reset_gpu``: the GPU must be reset before the next job: drain.
- ``reboot``: the node must be rebooted (Xid 79 fallen off the bus): drain.
Categories are the diagnosis' closed set (corpus labelling rules).
"""

from __future__ import annotations

import re

from gpugate.record import Record


class XidInfo(Record):
    """One catalog entry."""

    code: int
    mnemonic: str
    meaning: str
    action: str  # none / restart_app / reset_gpu / reboot
    category: str  # diagnosis category: ecc_error, nvlink_error, gpu_xid_hardware, ...


def _entries() -> dict[int, XidInfo]:
    rows = [
        # code, mnemonic, meaning, action, category
        (8, "FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "restart_app", "gpu_xid_hardware"),
        (11, "GR_ERROR_MISSING_HW", "invalid or corrupted push buffer", "restart_app", "gpu_xid_hardware"),
        (13, "GR_EXCEPTION", "graphics engine exception (out-of-range address, illegal instruction)", "restart_app", "gpu_xid_user_app"),
        (25, "GR_ILLEGAL_NOTIFY", "invalid push buffer", "restart_app", "gpu_xid_user_app"),
        (31, "FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (MMU fault)", "restart_app", "gpu_xid_user_app"),
        (32, "PBDMA_ERROR", "push-buffer DMA fault on the PCIe stream", "restart_app", "gpu_xid_hardware"),
        (38, "FECS_ERR_WATCHDOG_TIMEOUT", "driver firmware error", "none", "gpu_xid_hardware"),
        (43, "RESETCHANNEL_VERIF_ERROR", "application hit a software-induced fault; GPU healthy", "restart_app", "gpu_xid_user_app"),
        (44, "GR_FAULT_DURING_CTXSW", "engine fault during context switch", "none", "gpu_xid_hardware"),
        (45, "PREEMPTIVE_REMOVAL", "channel torn down after the app aborted (a consequence)", "none", "other"),
        (46, "GPU_TIMEOUT_ERROR", "GPU stopped processing", "reset_gpu", "gpu_xid_hardware"),
        (48, "GPU_ECC_DBE", "double-bit (uncorrectable) ECC error", "reset_gpu", "ecc_error"),
        (54, "PWR_REDUCED_CLOCKING", "auxiliary power not connected", "reset_gpu", "gpu_xid_hardware"),
        (61, "PMU_BREAKPOINT", "internal micro-controller breakpoint", "reset_gpu", "gpu_xid_hardware"),
        (62, "PMU_HALT_ERROR", "internal micro-controller halt", "reset_gpu", "gpu_xid_hardware"),
        (63, "DRAM_RETIREMENT_EVENT", "row remap / page retirement recorded; reset to activate", "none", "ecc_error"),
        (64, "DRAM_RETIREMENT_FAILURE", "row remap / page retirement failure", "reset_gpu", "ecc_error"),
        (74, "NVLINK_ERROR", "NVLink connection error", "reset_gpu", "nvlink_error"),
        (79, "GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "reboot", "gpu_xid_hardware"),
        (80, "PUSHBUFFER_CRC_MISMATCH", "corrupted data sent to GPU", "restart_app", "gpu_xid_hardware"),
        (92, "EXCESSIVE_SBE_INTERRUPTS", "high rate of correctable ECC errors", "none", "ecc_error"),
        (94, "CONTAINED_ERROR", "contained uncorrectable memory error", "restart_app", "ecc_error"),
        (95, "UNCONTAINED_ERROR", "uncontained uncorrectable memory error", "reset_gpu", "ecc_error"),
        (109, "CTXSW_TIMEOUT_ERROR", "context-switch timeout", "reset_gpu", "gpu_xid_hardware"),
        (110, "SEC_FAULT_ERROR", "security fault (hardware)", "reboot", "gpu_xid_hardware"),
        (119, "GSP_RPC_TIMEOUT", "GSP firmware RPC timeout", "reset_gpu", "gpu_xid_hardware"),
        (120, "GSP_ERROR", "error in GSP firmware", "reset_gpu", "gpu_xid_hardware"),
        (136, "ALI_TRAINING_FAIL", "NVLink link training failed", "reset_gpu", "nvlink_error"),
        (137, "NVLINK_PRIV_ERR", "illegal NVLink peer access", "restart_app", "nvlink_error"),
        (140, "ECC_ERROR_ESCAPE", "uncorrectable memory error escaped containment", "reset_gpu", "ecc_error"),
        (143, "GPU_INIT_ERROR", "GPU initialisation failure", "reset_gpu", "gpu_xid_hardware"),
        (154, "GPU_RECOVERY_ACTION_CHANGED", "the driver's recovery action changed", "none", "gpu_xid_hardware"),
        (155, "NVLINK_SW_DEFINED_ERROR", "NVLink taken down by software", "reset_gpu", "nvlink_error"),
        (156, "RESOURCE_RETIREMENT_EVENT", "repair resource retired", "reset_gpu", "ecc_error"),
        (157, "RESOURCE_RETIREMENT_FAILURE", "no repair resources left", "reset_gpu", "ecc_error"),
        (158, "GPU_FATAL_TIMEOUT", "fatal GPU timeout", "reset_gpu", "gpu_xid_hardware"),
        (167, "PCIE_FATAL_TIMEOUT", "PCIe fatal timeout", "reboot", "gpu_xid_hardware"),
        (168, "REDUCED_GPU_MEMORY_CAPACITY", "errors in a write-protected region (ECC off?)", "reset_gpu", "ecc_error"),
        (171, "UNCORRECTABLE_DRAM_ERROR", "uncorrectable DRAM error (with Xid 48)", "reset_gpu", "ecc_error"),
        (172, "UNCORRECTABLE_SRAM_ERROR", "uncorrectable SRAM error (with Xid 48)", "reset_gpu", "ecc_error"),
    ]  # fmt: skip
    for code in (144, 145, 146, 147, 148, 149, 150):
        # NVLink-5 subsystem errors: the line says Fatal or Nonfatal (see nvlink5_fatal()).
        rows.append(
            (code, "NVLINK5_ERROR", "NVLink-5 subsystem error", "reset_gpu", "nvlink_error")
        )
    for code in (39, 40, 41, 70, 71, 72, 75, 76, 77, 85):
        rows.append((code, "CE_ERROR", "copy-engine exception", "restart_app", "gpu_xid_hardware"))
    for code in (60, 68, 69):
        rows.append((code, "ENGINE_ERROR", "engine exception", "restart_app", "gpu_xid_hardware"))
    for code in (37, 66, 67, 93, 121, 159):
        rows.append((code, "INFORMATIONAL", "informational or driver-internal", "none", "other"))
    return {
        c: XidInfo(code=c, mnemonic=m, meaning=t, action=a, category=k) for c, m, t, a, k in rows
    }


CATALOG: dict[int, XidInfo] = _entries()

# Application faults per NVIDIA: they say nothing about the node unless the same GPU repeats.
APP_XIDS = frozenset({13, 31, 43})
DRAIN_ACTIONS = frozenset({"reset_gpu", "reboot"})


def lookup(code: int) -> XidInfo:
    """The catalog entry, or a conservative entry for an unknown code (hardware, reset)."""
    info = CATALOG.get(code)
    if info is not None:
        return info
    return XidInfo(
        code=code,
        mnemonic="UNKNOWN",
        meaning="not in gpugate's catalog",
        action="reset_gpu",
        category="gpu_xid_hardware",
    )


class XidEvent(Record):
    """One Xid line from the kernel log."""

    code: int
    pci: str | None  # normalised "dddd:bb:dd" lower-case, or None when redacted
    text: str  # the message after the code
    line: str  # the whole line as read
    caused_by: int | None = None  # Xid 45 "caused by previous Xid N"
    pid: int | None = None  # the process that raised it (`pid=1234`); None when `<unknown>`
    process: str | None = None  # its name (`name=python`)


# `NVRM: Xid (PCI:0000:18:00): 79, pid=..., name=..., text`. Some drivers omit "PCI:", some
# posters redact the address, so anything inside the parentheses is accepted. A code of ten
# digits or more is no Xid (and int() refuses numbers past 4300 digits).
_XID_RE = re.compile(r"NVRM: Xid \(([^)]*)\): (\d{1,9})(?!\d),?\s*(.*)")
_PCI_RE = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})")
_CAUSED_RE = re.compile(r"caused by previous Xid (\d{1,9})(?!\d)")
# `pid=1234, name=python, ` after the code (R470+ drivers; `pid='<unknown>'` when none).
_PROCESS_RE = re.compile(r"^pid='?(\d{1,9}|<unknown>)'?,(?:\s*name=([^,\s]{1,64}),)?")


def parse_xid(line: str) -> XidEvent | None:
    """Parse one kernel-log line; None when it is not an Xid line."""
    if "Xid" not in line:
        return None
    m = _XID_RE.search(line)
    if not m:
        return None
    caused = _CAUSED_RE.search(m.group(3))
    proc = _PROCESS_RE.match(m.group(3))
    pid = proc.group(1) if proc else None
    name = proc.group(2) if proc else None
    return XidEvent(
        code=int(m.group(2)),
        pci=normalize_pci(m.group(1)),
        text=m.group(3).strip(),
        line=line.rstrip("\n"),
        caused_by=int(caused.group(1)) if caused else None,
        pid=int(pid) if pid and pid.isdigit() else None,
        process=name if name and name != "<unknown>" else None,
    )


def normalize_pci(text: str) -> str | None:
    """`PCI:0000:9B:00`, `00000000:9B:00.0` -> `0000:9b:00` (domain:bus:device)."""
    m = _PCI_RE.search(text)
    if not m:
        return None
    domain = m.group(1)[-4:].lower()
    return f"{domain}:{m.group(2).lower()}:{m.group(3).lower()}"


def nvlink5_fatal(event: XidEvent) -> bool:
    """Xid 144-150 lines say `Fatal` or `Nonfatal`; only fatal ones need a reset."""
    return bool(re.search(r"\bFatal\b", event.text))


def needs_drain(event: XidEvent) -> bool:
    """Whether this Xid alone means the node must not take the next job."""
    if event.code in range(144, 151):
        return nvlink5_fatal(event)
    if event.code == 154:
        return "(None)" not in event.text.split(" to ", 1)[-1]
    return lookup(event.code).action in DRAIN_ACTIONS

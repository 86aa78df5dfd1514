"""NVSwitch SXids: the table, one reading of an SXid line, and the `kernel.sxid` check.

An NVSwitch driver error is logged as (docs/gpu-facts.md 2.4)
    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up
    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity 1 Engine instance 60 ...
    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Data {0x10000000, ...}
The first line is the event; the lines after it (same code) carry its details and are not
events of their own. The severity is the driver's word on that line: `Fatal` (the error broke
the fabric: NVIDIA's Fabric Manager user guide says the GPUs and NVSwitches must be reset, or
the node rebooted, before the next job), `Non-fatal` (the switch recovered; the job may have
seen it, the node is kept) or `Correctable`. The same code can be either: the driver reports a
"contained" error as non-fatal and an uncontained one as fatal.

Source of the table: NVIDIA open-gpu-kernel-modules 595.45.04 (2026-03-05), the SXid numbers
of `src/common/nvswitch/interface/ctrl_dev_nvswitch.h` (enum NVSWITCH_ERR_TYPE) and the
severity and text each is reported with in `src/common/nvswitch/kernel/ls10/intr_ls10.c`
(NVSwitch gen 3, HGX H100/H200) and `lr10/intr_lr10.c` (gen 2, HGX A100): NVSWITCH_REPORT_FATAL
-> "fatal", NVSWITCH_REPORT_NONFATAL and _PRI_ERROR_NONFATAL -> "non-fatal",
NVSWITCH_REPORT_CONTAIN -> "either" (fatal unless contained). Verdicts: NVIDIA Fabric Manager
user guide, "Runtime NVSwitch and GPU errors" (r560, 2024-10-23). A code not in the table is
judged by the severity word of its line.
"""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.declare import HARDWARE, RESET, check
from gpugate.checks.gpu import source_missing
from gpugate.record import Record
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.checks.expect import Context
    from gpugate.checks.facts import Facts

FATAL, NON_FATAL, EITHER = "fatal", "non-fatal", "either"


class SxidInfo(Record):
    """One table entry."""

    code: int
    severity: str  # fatal / non-fatal / either (fatal unless the switch contained it)
    meaning: str


# Built on first use: a healthy check reads no SXid, and 231 records cost ~0.8 ms a run.
# `TABLE` (the module attribute) stays: __getattr__ builds it when it is first read.
TABLE: dict[int, SxidInfo]
_table: dict[int, SxidInfo] | None = None


def table() -> dict[int, SxidInfo]:
    """The SXid table by code (built from sxid_catalog.SXID_ROWS on first use)."""
    global _table
    if _table is None:
        # Late: the data module too (its constants cost ~0.4 ms to load; gpugate/startup.py).
        from gpugate.checks.sxid_catalog import SXID_ROWS

        _table = {c: SxidInfo(code=c, severity=s, meaning=m) for c, s, m in SXID_ROWS}
    return _table


def __getattr__(name: str) -> object:
    """`TABLE`, built on first read (PEP 562)."""
    if name == "TABLE":
        return table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SxidEvent(Record):
    """One SXid event: the first line of an NVSwitch error."""

    switch: str | None  # the driver's device name, "nvswitch0"
    pci: str | None  # the switch's PCI address as logged, lower-case ("0000:05:00.0")
    code: int
    fatal: bool
    link: int | None  # the NVLink port of the switch, when the line names one
    text: str  # what follows the code
    severity: str = NON_FATAL  # fatal / non-fatal / correctable


# `nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, <text>` (common_nvswitch.h NVSWITCH_PRINT_SXID).
_SXID_RE = lazy(r"(?:nvidia-(\w{1,32}): )?SXid \((?:PCI:)?([^)]{0,40})\): (\d{1,9})(?!\d),?\s*(.*)")
_SEVERITY_RE = lazy(r"(?i)^(Fatal|Non-fatal|Nonfatal|Correctable)\b")
_LINK_RE = lazy(r"\bLink (\d{1,4})\b")
# The detail lines after the event ("Severity 1 Engine instance ..", "Data {..}").
_DETAIL_RE = lazy(r"^(?:Severity \d|Data \{)")


def parse_sxid(line: str) -> SxidEvent | None:
    """The SXid event on this kernel-log line; None for another line or an event's detail line."""
    m = _SXID_RE.search(line) if "SXid" in line else None
    if m is None or _DETAIL_RE.match(m.group(4)):
        return None  # not an SXid, or a detail line of the event before it
    code, text = int(m.group(3)), m.group(4).strip()
    word = _SEVERITY_RE.match(text)
    if word:
        severity = word.group(1).lower().replace("nonfatal", NON_FATAL)
    else:  # no word: the table's, and fatal when the table says it may be
        severity = FATAL if lookup(code).severity in (FATAL, EITHER) else NON_FATAL
    link = _LINK_RE.search(text)
    return SxidEvent(
        switch=m.group(1),
        pci=m.group(2).strip().lower() or None,
        code=code,
        fatal=severity == FATAL,
        link=int(link.group(1)) if link else None,
        text=text,
        severity=severity,
    )


def lookup(code: int) -> SxidInfo:
    """The table entry, or one for a code the table lacks (judged by its line's word)."""
    return table().get(code) or SxidInfo(
        code=code, severity=EITHER, meaning="not in the SXid table"
    )


def _where(event: SxidEvent) -> str:
    """ "nvswitch0 (PCI 0000:05:00.0) link 33"."""
    switch = event.switch or "NVSwitch"
    pci = f" (PCI {event.pci})" if event.pci else ""
    link = f" link {event.link}" if event.link is not None else " (no link named)"
    return f"{switch}{pci}{link}"


def _describe(event: SxidEvent, count: int) -> str:
    times = f" x{count}" if count > 1 else ""
    return f"{_where(event)}: SXid {event.code}{times} {event.severity}: {_meaning(event)}"


def _meaning(event: SxidEvent) -> str:
    info = table().get(event.code)
    return info.meaning if info else event.text.split(", ", 1)[-1][:80] or "unknown SXid"


@check("kernel.sxid", hardware=True, action=RESET, fault=HARDWARE)
def check_kernel_sxid(facts: Facts, ctx: Context) -> list[F.Finding]:
    """No fatal NVSwitch SXid in the kernel log (NVIDIA Fabric Manager user guide)."""
    if facts.kernel_log is None:
        return source_missing("kernel.sxid", facts, "kernel log", "kernel_log")
    groups: dict[
        tuple[Any, ...], list[SxidEvent]
    ] = {}  # (switch, pci, code, link, severity) -> events
    for line in facts.kernel_log:
        event = parse_sxid(line)
        if event is not None:
            key = (event.switch, event.pci, event.code, event.link, event.severity)
            groups.setdefault(key, []).append(event)
    out, info = [], []
    for events in groups.values():
        event, detail = events[0], _describe(events[0], len(events))
        if event.fatal:
            todo = "reset the GPUs and NVSwitches (nvidia-smi -r) or reboot the node"
            out.append(F.fail("kernel.sxid", f"{detail} ({todo})", value=event.code))
        elif event.severity == NON_FATAL:
            out.append(F.warn("kernel.sxid", f"{detail} (recovered, node kept)", value=event.code))
        else:
            info.append(detail)
    if out:
        return out
    seen = f"; correctable: {'; '.join(info)}" if info else ""
    return [F.ok("kernel.sxid", f"no NVSwitch SXid needing action{seen}")]

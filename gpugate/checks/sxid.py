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

# (SXid, how the driver reports it, the driver's text). Generated from the source above.
_ROWS = (
    (10001, "non-fatal", "PRI WRITE SYS error"),
    (10002, "non-fatal", "PBUS PRI SQUASH error"),
    (11001, "either", "ingress invalid command"),
    (11004, "non-fatal", "ingress invalid ACL"),
    (11009, "either", "ingress invalid VCSet"),
    (11011, "non-fatal", "ingress request context mismatch"),
    (11012, "non-fatal", "ingress header ECC"),
    (11013, "either", "ingress header DBE"),
    (11014, "non-fatal", "ingress address bounds"),
    (11015, "non-fatal", "ingress RID packet"),
    (11016, "non-fatal", "ingress RLAN packet"),
    (11017, "either", "ingress Remap DBE"),
    (11018, "either", "ingress RID DBE"),
    (11019, "either", "ingress RLAN DBE"),
    (11020, "either", "ingress control parity"),
    (11021, "non-fatal", "ingress remap ECC"),
    (11022, "non-fatal", "ingress RID ECC"),
    (11023, "non-fatal", "ingress RLAN ECC"),
    (11024, "non-fatal", "ingress illegal address"),
    (11025, "non-fatal", "ingress ExtA remap index"),
    (11026, "non-fatal", "ingress ExtB remap index"),
    (11027, "non-fatal", "ingress MC remap index"),
    (11028, "either", "ingress ExtA remap DBE"),
    (11029, "either", "ingress ExtB remap DBE"),
    (11030, "either", "ingress MC remap DBE"),
    (11031, "non-fatal", "ingress ExtA request context mismatch"),
    (11032, "non-fatal", "ingress ExtB request context mismatch"),
    (11033, "non-fatal", "ingress MC request context mismatch"),
    (11034, "non-fatal", "ingress invalid ExtA ACL"),
    (11035, "non-fatal", "ingress invalid ExtB ACL"),
    (11036, "non-fatal", "ingress invalid MC ACL"),
    (11037, "non-fatal", "ingress ExtA address bounds"),
    (11038, "non-fatal", "ingress ExtB address bounds"),
    (11039, "non-fatal", "ingress MC address bounds"),
    (11040, "non-fatal", "ingress ExtA remap ECC"),
    (11041, "non-fatal", "ingress ExtB remap ECC"),
    (11042, "non-fatal", "ingress MC remap ECC"),
    (11043, "non-fatal", "ingress MC command to uc"),
    (11044, "non-fatal", "ingress read reflective"),
    (11045, "non-fatal", "ingress ExtA address type"),
    (11046, "non-fatal", "ingress ExtB address type"),
    (11047, "non-fatal", "ingress MC address type"),
    (12001, "either", "egress crossbar overflow"),
    (12002, "either", "egress packet route"),
    (12014, "either", "egress non-posted UR error"),
    (12020, "either", "egress sequence ID error"),
    (12021, "non-fatal", "egress input ECC error limit"),
    (12022, "either", "egress input ECC DBE error"),
    (12023, "non-fatal", "egress output ECC error limit"),
    (12024, "either", "egress output ECC DBE error"),
    (12025, "either", "egress credit overflow"),
    (12026, "either", "egress destination request ID error"),
    (12027, "either", "egress destination response ID error"),
    (12028, "non-fatal", "egress non-posted PRIV error"),
    (12029, "either", "egress non-posted HW error"),
    (12030, "either", "egress control parity error"),
    (12031, "either", "egress credit parity error"),
    (12032, "either", "egress flit type mismatch"),
    (12033, "either", "egress credit timeout"),
    (12034, "either", "egress invalid VC set"),
    (12035, "either", "egress crossbar SB parity"),
    (12036, "non-fatal", "egress reduction header ECC error limit"),
    (12037, "non-fatal", "egress reduction header ECC DBE error"),
    (12038, "non-fatal", "egress MC response ECC error limit"),
    (12039, "either", "egress MC response ECC DBE error"),
    (12040, "non-fatal", "egress RB ECC error limit"),
    (12041, "either", "egress reduction ECC DBE error"),
    (12042, "non-fatal", "egress RSG ECC error limit"),
    (12043, "either", "egress MC SG ECC DBE error"),
    (12044, "non-fatal", "egress MCRB ECC error limit"),
    (12045, "non-fatal", "egress reduction buffer ECC DBE error"),
    (12046, "non-fatal", "egress MC header ECC error limit"),
    (12047, "either", "egress MC ram ECC DBE error"),
    (12048, "non-fatal", "egress reduction header parity error"),
    (12049, "non-fatal", "egress reduction flit mismatch error"),
    (12050, "non-fatal", "egress MC response count error"),
    (12051, "non-fatal", "egress reduction response count error"),
    (14001, "either", "TS pointer crossover"),
    (14002, "either", "TS crumbstore"),
    (14007, "non-fatal", "TS tag store single-bit threshold"),
    (14008, "either", "TS tag store fatal ECC"),
    (14009, "non-fatal", "TS crumbstore single-bit threshold"),
    (14010, "either", "TS crumbstore fatal ECC"),
    (14017, "either", "TS ATO timeout"),
    (14018, "either", "Rsp Tag value out of range"),
    (15001, "either", "route buffer over/underflow"),
    (15002, "non-fatal", "route undefined route"),
    (15003, "non-fatal", "route invalid policy"),
    (15006, "either", "route transdone over/underflow"),
    (15009, "either", "route GLT DBE"),
    (15010, "either", "route parity"),
    (15011, "non-fatal", "route incoming ECC limit"),
    (15012, "either", "route incoming DBE"),
    (15013, "either", "route credit parity"),
    (15015, "either", "MC route ECC"),
    (15017, "either", "Extd MC route ECC"),
    (15018, "non-fatal", "RAM ECC limit"),
    (15019, "either", "route RAM ECC"),
    (15020, "non-fatal", "invalid MC route"),
    (18018, "either", "RSTSEQ_PHYARB_TIMEOUT"),
    (18019, "either", "RSTSEQ_PLL_TIMEOUT"),
    (18020, "either", "CLKCTL_ILLEGAL_REQUEST"),
    (19004, "fatal", "TX DL Credit Parity Error"),
    (19009, "fatal", "Poison Error"),
    (19013, "fatal", "RX DL HDR Parity Error"),
    (19014, "fatal", "RX DL Data Parity Error"),
    (19015, "fatal", "RX DL Ctrl Parity Error"),
    (19018, "fatal", "RX Invalid DAE Error"),
    (19019, "fatal", "RX Invalid BE Error"),
    (19020, "fatal", "RX Invalid Addr Align Error"),
    (19021, "fatal", "RX Packet Length Error"),
    (19022, "fatal", "RSV Cmd Encoding Error"),
    (19023, "fatal", "RSV Data Length Encoding Error"),
    (19026, "fatal", "RSV Packet Status Error"),
    (19027, "fatal", "RSV Packet Status Error"),
    (19028, "fatal", "RSV CacheAttr Probe Rsp Error"),
    (19030, "fatal", "Data Length RMW Req Max Error"),
    (19031, "fatal", "Data Len Lt ATR RSP Min Error"),
    (19032, "fatal", "Invalid Cache Attr PO Error"),
    (19033, "fatal", "Invalid CR Error"),
    (19036, "fatal", "RX HDR OVF Error"),
    (19037, "fatal", "RX Data OVF Error"),
    (19038, "fatal", "Stomp Det Error"),
    (19039, "fatal", "RX Poison Error"),
    (19046, "fatal", "NCISOC Parity Error"),
    (19047, "fatal", "NCISOC HDR ECC DBE Error"),
    (19048, "either", "NCISOC DAT ECC DBE Error"),
    (19049, "either", "NCISOC ECC Limit Error"),
    (19050, "fatal", "TX Response Status HW Error"),
    (19051, "fatal", "TX Response Status UR Error"),
    (19052, "fatal", "TX Response Status PRIV Error"),
    (19053, "fatal", "NCISOC Parity Error"),
    (19054, "fatal", "HDR RAM ECC DBE Error"),
    (19055, "fatal", "HDR RAM ECC Limit Error"),
    (19056, "either", "DAT0 RAM ECC DBE Error"),
    (19057, "fatal", "DAT0 RAM ECC Limit Error"),
    (19058, "either", "DAT1 RAM ECC DBE Error"),
    (19059, "fatal", "DAT1 RAM ECC Limit Error"),
    (19060, "fatal", "CREQ RAM HDR ECC DBE Error"),
    (19061, "non-fatal", "CREQ RAM DAT ECC DBE Error"),
    (19062, "non-fatal", "CREQ RAM DAT ECC Limit Error"),
    (19063, "fatal", "Response RAM HDR ECC DBE Error"),
    (19064, "non-fatal", "Response RAM DAT ECC DBE Error"),
    (19065, "non-fatal", "Response RAM ECC Limit Error"),
    (19066, "fatal", "COM RAM HDR ECC DBE Error"),
    (19067, "non-fatal", "COM RAM DAT ECC DBE Error"),
    (19068, "non-fatal", "COM RAM ECC Limit Error"),
    (19069, "fatal", "RSP1 RAM HDR ECC DBE Error"),
    (19070, "fatal", "RSP1 RAM DAT ECC DBE Error"),
    (19071, "non-fatal", "RSP1 RAM ECC Limit Error"),
    (19072, "non-fatal", "AN1 Timeout VC0"),
    (19073, "non-fatal", "AN1 Timeout VC1"),
    (19074, "non-fatal", "AN1 Timeout VC2"),
    (19075, "non-fatal", "AN1 Timeout VC3"),
    (19076, "non-fatal", "AN1 Timeout VC4"),
    (19077, "non-fatal", "AN1 Timeout VC5"),
    (19078, "non-fatal", "AN1 Timeout VC6"),
    (19079, "non-fatal", "AN1 Timeout VC7"),
    (19080, "fatal", "RX Rsp Status HW Error"),
    (19081, "fatal", "RX Rsp Status UR Error"),
    (19082, "non-fatal", "RX Rsp Status PRIV Error"),
    (19083, "fatal", "Invalid Collapsed Response Error"),
    (19084, "non-fatal", "AN1 Heartbeat Timeout Error"),
    (20001, "non-fatal", "TX Replay Error"),
    (20002, "non-fatal", "TX Recovery Short"),
    (20004, "fatal", "TX Fault Ram"),
    (20005, "fatal", "TX Fault Interface"),
    (20006, "fatal", "TX Fault Sublink Change"),
    (20007, "fatal", "RX Fault Sublink Change"),
    (20008, "fatal", "RX Fault DL Protocol"),
    (20009, "non-fatal", "RX Short Error Rate"),
    (20010, "non-fatal", "RX Long Error Rate"),
    (20011, "non-fatal", "RX ILA Trigger"),
    (20012, "non-fatal", "RX CRC Error Rate"),
    (20014, "fatal", "LTSSM Protocol Error"),
    (20034, "fatal", "LTSSM Fault Up"),
    (20035, "fatal", "LTSSM Fault Down"),
    (20036, "fatal", "PHY_A Error"),
    (20037, "fatal", "TX_PL Error"),
    (20038, "fatal", "RX_PL Error"),
    (22003, "fatal", "MINION HALT"),
    (22010, "fatal", "MINION Watchdog timer ran out"),
    (22011, "fatal", "MINION EXTERR"),
    (22012, "fatal", "Minion Link NA interrupt"),
    (22013, "non-fatal", "Minion Link DLREQ interrupt"),
    (23001, "fatal", "ingress SRC-VC buffer overflow"),
    (23002, "fatal", "ingress SRC-VC buffer underflow"),
    (23003, "fatal", "egress DST-VC credit overflow"),
    (23004, "fatal", "egress DST-VC credit underflow"),
    (23005, "fatal", "ingress packet burst error"),
    (23006, "fatal", "ingress packet sticky error"),
    (23007, "fatal", "possible bubbles at ingress"),
    (23008, "fatal", "ingress packet invalid dst error"),
    (23009, "fatal", "ingress packet parity error"),
    (23010, "fatal", "ingress SRC-VC buffer overflow"),
    (23011, "fatal", "ingress SRC-VC buffer underflow"),
    (23012, "fatal", "egress DST-VC credit overflow"),
    (23013, "fatal", "egress DST-VC credit underflow"),
    (23014, "fatal", "ingress packet burst error"),
    (23015, "fatal", "ingress packet sticky error"),
    (23016, "fatal", "possible bubbles at ingress"),
    (23017, "fatal", "ingress credit parity error"),
    (24001, "non-fatal", "sourcetrack TCEN0 crumbstore ECC limit err"),
    (24003, "non-fatal", "sourcetrack TCEN1 crumbstore ECC limit err"),
    (24004, "either", "sourcetrack TCEN0 crumbstore DBE"),
    (24006, "either", "sourcetrack TCEN1 crumbstore DBE"),
    (24007, "either", "sourcetrack timeout error"),
    (24008, "either", "sourcetrack duplicate CREQ"),
    (24009, "either", "sourcetrack invalid TCEN0 CREQ"),
    (24010, "either", "sourcetrack invalid TCEN1 CREQ"),
    (25001, "non-fatal", "_HW_NVLIPT_LNK_ILLEGALLINKSTATEREQUEST"),
    (25002, "non-fatal", "_FAILEDMINIONREQUEST"),
    (25003, "non-fatal", "_RESERVEDREQUESTVALUE"),
    (25004, "non-fatal", "_LINKSTATEWRITEWHILEBUSY"),
    (25005, "non-fatal", "_LINK_STATE_REQUEST_TIMEOUT"),
    (25006, "non-fatal", "_WRITE_TO_LOCKED_SYSTEM_REG_ERR"),
    (25007, "fatal", "No non-empty link is detected"),
    (25008, "fatal", "Reset sequencer timed out waiting for a handshake from PHYCTL"),
    (25009, "fatal", "Reset sequencer timed out waiting for a handshake from CLKCTL"),
    (29001, "non-fatal", "MC TS tag store single-bit threshold"),
    (29002, "either", "MC TS tag store fatal ECC"),
    (29003, "non-fatal", "MC TS crumbstore single-bit threshold"),
    (29004, "either", "MC TS crumbstore fatal ECC"),
    (29005, "either", "MC crumbstore overwrite"),
    (29006, "non-fatal", "MC TS crumbstore MCTO"),
    (30001, "non-fatal", "Red TS tag store single-bit threshold"),
    (30002, "either", "Red TS tag store fatal ECC"),
    (30003, "non-fatal", "Red TS crumbstore single-bit threshold"),
    (30004, "either", "Red TS crumbstore fatal ECC"),
    (30005, "either", "Red crumbstore overwrite"),
    (30006, "non-fatal", "Red TS crumbstore RTO"),
)  # fmt: skip


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
    """The SXid table by code (built from _ROWS on first use)."""
    global _table
    if _table is None:
        _table = {c: SxidInfo(code=c, severity=s, meaning=m) for c, s, m in _ROWS}
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

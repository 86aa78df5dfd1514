"""The Xid catalog: what each NVIDIA Xid means and what gpugate does about it.

The table is gpugate/checks/xid_catalog.py (every code of NVIDIA's catalog, its source and date); this
module parses a line and decides. A single application-class Xid never drains; an Xid missing
from the catalog warns and is reported; sites override per Xid (`checks.kernel.xid_actions`).
Categories are the diagnosis' closed set (corpus labelling rules).
"""

from __future__ import annotations

from gpugate.record import Record
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class XidInfo(Record):
    """One catalog entry."""

    code: int
    mnemonic: str
    meaning: str
    action: str  # none / restart_app / report / reset_gpu / reboot / workflow
    category: str  # diagnosis category: ecc_error, nvlink_error, gpu_xid_hardware, ...
    resolution: str = "-"  # NVIDIA's immediate resolution bucket


_ECC = frozenset({48, 63, 64, 92, 94, 95, 140, 156, 157, 168, 171, 172})
_NVLINK = frozenset({74, 108, 136, 137, 155, 166, 170, *range(144, 151)})
# Application faults per NVIDIA (13, 31: RESTART_APP with a same-GPU workflow; 43: IGNORE).
APP_XIDS = frozenset({13, 31, 43})


def _category(code: int, action: str) -> str:
    if code in _ECC:
        return "ecc_error"
    if code in _NVLINK:
        return "nvlink_error"
    if code in APP_XIDS:
        return "gpu_xid_user_app"
    return "other" if action in ("none", "report") or code == 45 else "gpu_xid_hardware"


# Built on first use: a healthy check reads no Xid, and 172 records cost ~0.6 ms a run.
_catalog: dict[int, XidInfo] | None = None


def catalog() -> dict[int, XidInfo]:
    """The Xid catalog by code (built from xid_catalog.XID_ROWS on first use)."""
    global _catalog
    if _catalog is None:
        # Late: the data module too (its constants cost ~0.5 ms to load; gpugate/startup.py).
        from gpugate.checks.xid_catalog import XID_ROWS

        _catalog = {
            code: XidInfo(
                code=code,
                mnemonic=mn,
                meaning=desc,
                action=act,
                category=_category(code, act),
                resolution=res,
            )
            for code, mn, desc, res, act in XID_ROWS
        }
    return _catalog


DRAIN_ACTIONS = frozenset({"reset_gpu", "reboot"})
# Site overrides (checks.kernel.xid_actions) name these; each maps onto a catalog action.
SITE_ACTIONS = {"drain": "reset_gpu", "reboot": "reboot", "warn": "report", "ignore": "none"}


def lookup(code: int) -> XidInfo:
    """The catalog entry, or an entry for a code NVIDIA's catalog does not list (reported)."""
    info = catalog().get(code)
    if info is not None:
        return info
    return XidInfo(
        code=code,
        mnemonic="UNKNOWN",
        meaning="not in NVIDIA's Xid catalog (reported; set checks.kernel.xid_actions to act)",
        action="report",
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
_XID_RE = lazy(r"NVRM: Xid \(([^)]*)\): (\d{1,9})(?!\d),?\s*(.*)")
_PCI_RE = lazy(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})")
_SHORT_PCI_RE = lazy(
    r"(?<![0-9a-fA-F])(?<![0-9a-fA-F]:)([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?![0-9a-fA-F:])"
)
_CAUSED_RE = lazy(r"caused by previous Xid (\d{1,9})(?!\d)")
# `pid=1234, name=python, ` after the code (R470+ drivers; `pid='<unknown>'` when none).
_PROCESS_RE = lazy(r"^pid='?(\d{1,9}|<unknown>)'?,(?:\s*name=([^,\s]{1,64}),)?")


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


_HEX = frozenset("0123456789abcdefABCDEF")


def plain_pci(text: str) -> str | None:
    """NVML's own form, `00000000:9B:00.0` (or `0000:9b:00`), read without a regex; else None.

    Every check run normalises each GPU's address: this keeps `re` (~12 ms to import) off a
    healthy run. Its answers are _PCI_RE's (tests/unit/core/test_regex.py holds the two together).
    """
    head, dot, function = text.partition(".")
    if dot and not (len(function) == 1 and function in _HEX):
        return None
    parts = head.split(":")
    if len(parts) != 3 or not all(c in _HEX for part in parts for c in part):
        return None
    domain, bus, device = parts
    if not (4 <= len(domain) <= 8 and len(bus) == 2 and len(device) == 2):
        return None
    return f"{domain[-4:].lower()}:{bus.lower()}:{device.lower()}"


def normalize_pci(text: str) -> str | None:
    """`PCI:0000:9B:00`, `00000000:9B:00.0`, `18:00.0` -> `0000:9b:00` (domain:bus:device)."""
    plain = plain_pci(text)
    if plain is not None:
        return plain
    m = _PCI_RE.search(text)
    if not m:
        # No domain (`GPU 18:00.0`, `PCI:18:00`): domain 0, as NVML lists single-domain hosts.
        short = _SHORT_PCI_RE.search(text)
        return f"0000:{short.group(1).lower()}:{short.group(2).lower()}" if short else None
    domain = m.group(1)[-4:].lower()
    return f"{domain}:{m.group(2).lower()}:{m.group(3).lower()}"


_HEX_WORDS = lazy(r"\((0x[0-9a-fA-F]{1,8})(?:[\s,]+(0x[0-9a-fA-F]{1,8}))?")
_RECOVERY_RE = lazy(r"\bto\s+0x[0-9a-fA-F]+\s*\(([^)]*)\)")


def _bits_match(value: int, pattern: str) -> bool:
    """IntrInfo against a decode-sheet pattern (MSB first, `-` any bit)."""
    bits = f"{value:032b}"[-len(pattern) :]
    return all(p in ("-", b) for p, b in zip(pattern, bits, strict=True))


def nvlink5_resolution(event: XidEvent) -> str | None:
    """NVIDIA's resolution for an Xid 144-150 line from its IntrInfo and ErrorStatus words.

    The worst of the matching "XID 144-150 Decode" rows (RESET_GPU, XID_154_EVAL, IGNORE), or
    None when the words are missing or match no row.
    """
    m = _HEX_WORDS.search(event.text)
    if m is None:
        return None
    intr, status = int(m.group(1), 16), int(m.group(2) or "0x0", 16)
    from gpugate.checks.xid_catalog import NVLINK5_RULES  # late: see catalog()

    found = set()
    for code, _unit, v1, v2, bit, resolution in NVLINK5_RULES:
        if code != event.code or not (_bits_match(intr, v1) or _bits_match(intr, v2)):
            continue
        if bit == 0 or status & bit:
            found.add(resolution)
    for worst in ("RESET_GPU", "XID_154_EVAL", "IGNORE"):
        if worst in found:
            return worst
    return None


def nvlink5_fatal(event: XidEvent) -> bool:
    """Xid 144-150: decoded by the sub-code words; the word `Fatal` only when they decode to
    nothing (an XID_154_EVAL row follows Xid 154's own line: alone it restarts the app)."""
    resolution = nvlink5_resolution(event)
    if resolution is not None:
        return resolution == "RESET_GPU"
    import re  # late: an NVLink5 Xid only (gpugate/startup.py)

    return bool(re.search(r"\bFatal\b", event.text))


def recovery_action(event: XidEvent) -> str | None:
    """Xid 154's announced action (`... to 0x2 (Node Reboot Required)`), lower-case."""
    m = _RECOVERY_RE.search(event.text)
    return m.group(1).strip().lower() if m else None


def action_of(event: XidEvent, overrides: dict[str, Any] | None = None) -> str:
    """What this Xid alone asks of the node: none / restart_app / report / reset_gpu / reboot."""
    site = (overrides or {}).get(str(event.code))
    if site is not None:
        return SITE_ACTIONS.get(site, "report")
    code = event.code
    if code == 45:
        if event.caused_by is not None and event.caused_by != 45:
            cause = lookup(event.caused_by).action
            # The cause's own line is judged; a consequence of an app fault is not counted.
            return "restart_app" if cause in ("workflow", "restart_app") else cause
        return "none"  # alone: a channel torn down (RESTART_FM in NVIDIA's workflow)
    if code in range(144, 151):
        return "reset_gpu" if nvlink5_fatal(event) else "none"
    if code == 154:
        announced = recovery_action(event)
        if announced is None or announced == "none":
            return "none"
        return "reboot" if "reboot" in announced else "reset_gpu"
    if code == 74:
        return "reset_gpu"  # WORKFLOW_NVLINK_ERR: a GPU reset (or reboot) clears it
    return lookup(code).action


def needs_drain(event: XidEvent, overrides: dict[str, Any] | None = None) -> bool:
    """Whether this Xid alone means the node must not take the next job."""
    return action_of(event, overrides) in DRAIN_ACTIONS

"""One reading of a kernel line: Xid, SXid, fallen-off-the-bus, init-failed and reset-required.

`check` (kernel.xid, kernel.gpu_bus), the epilog's record of application Xids and `gpugate
diagnose` all read lines through here, so they never disagree about what a line is. The formats
are those of docs/gpu-facts.md section 2 (2.1 Xid, 2.2 lost GPUs, 2.4 NVSwitch SXid; the SXid
parser and table are gpugate/checks/sxid.py).
"""

from __future__ import annotations

from gpugate.checks.sxid import SxidEvent, parse_sxid
from gpugate.checks.xid import XidEvent, normalize_pci, parse_xid
from gpugate.record import Record
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

_PCI = r"(?:PCI:)?((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"

# A GPU lost or unusable, reported without an Xid number (docs/gpu-facts.md 2.2):
#   NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.
#   NVRM: GPU at 0000:01:00.0 has fallen off the bus.                      (old drivers)
#   NVRM: The NVIDIA GPU 0000:b3:00.0 / (PCI ID: ...) installed in this system has /
#         NVRM: fallen off the bus and is not responding to commands.       (at probe time)
#   NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)
#   NVRM: rm_init_adapter failed, device minor number 5
#   NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] ...
BUS_PATTERNS = (
    (
        "fallen_off_bus",
        lazy(r"NVRM: .*fallen off the bus"),
        "GPU has fallen off the bus (reboot the node)",
    ),
    (
        "init_failed",
        lazy(r"NVRM: .*(?:RmInitAdapter|rm_init_adapter) failed"),
        "driver could not initialise the GPU (RmInitAdapter failed)",
    ),
    (
        "reset_required",
        lazy(r"NV_ERR_RESET_REQUIRED"),
        "driver says a GPU reset is required (NV_ERR_RESET_REQUIRED)",
    ),
)
# The GPU a line names ("NVRM: GPU 0000:91:00.0:", "NVRM: GPU at 0000:01:00.0", "GPU 18:00.0"),
# and the first line of the multi-line form, whose address belongs to the lines after it.
GPU_ADDRESS = lazy(r"NVRM: GPU (?:at )?" + _PCI)
MULTILINE_OPENER = lazy(r"NVRM: The NVIDIA GPU " + _PCI)


class BusEvent(Record):
    """A GPU lost from the bus, failing to initialise, or needing a reset, without an Xid."""

    kind: str  # fallen_off_bus / init_failed / reset_required
    pci: str | None  # normalised "dddd:bb:dd", or None when the line names no address
    what: str  # the message for a finding
    line: str


def read_line(line: str, announced: str | None = None) -> XidEvent | SxidEvent | BusEvent | None:
    """What one kernel line says; `announced` is the address a multi-line message opened with."""
    event = parse_xid(line) or parse_sxid(line)
    if event is not None:
        return event  # Xid lines (79 says "fallen off the bus" too) are Xids
    if "NVRM: " not in line and "NV_ERR_RESET_REQUIRED" not in line:
        return None  # what every BUS_PATTERNS needs: most lines, and no regex (gpugate/regex.py)
    for kind, pattern, what in BUS_PATTERNS:
        if pattern.search(line):
            named = GPU_ADDRESS.search(line)
            address = named.group(1) if named else announced
            return BusEvent(
                kind=kind,
                pci=normalize_pci(address) if address else None,
                what=what,
                line=line.rstrip("\n"),
            )
    return None


def read_lines(lines: Sequence[str]) -> list[XidEvent | SxidEvent | BusEvent]:
    """Every Xid and bus event of a log, in order; multi-line messages joined to their GPU."""
    out: list[XidEvent | SxidEvent | BusEvent] = []
    announced = None
    for line in lines:
        opener = MULTILINE_OPENER.search(line) if "NVRM: The NVIDIA GPU " in line else None
        if opener and parse_xid(line) is None:
            announced = opener.group(1)
            continue
        event = read_line(line, announced)
        if event is not None:
            out.append(event)
            if isinstance(event, BusEvent):
                announced = None
    return out

"""Fault drills: a simulated fault laid over one node's real facts for a bounded window.

`gpugate drill` (gpugate/commands/drill.py) writes `<state_dir>/drill.json` (root's state:
a DrillWindow: id, fault, node, start, end). While the window is open, `gather()` lays the fault's overlay
over the facts it read (checks/sources: `with_drill`) and marks the process (reasons.mark_drill),
so every drain reason, AdminComment and event line it writes says `DRILL <id>`. The epilog's
bundle of a job that ends under it is a `drill` bundle (store/evidence.bundle_kind), and its
decision record carries the id to EpilogSlurmctld (another process, on the controller), which
marks the requeued job's AdminComment so too; a drill's drains are no false drains, no RMA
count (store/history.drill_of). Once the window
has ended the file is ignored and removed by whoever reads it next: a drill never outlives its
window, even if the drill command died. Its drain is lifted by the drill command's checked
resume once the window ends, or by the next health run (hooks/health.py, `lift_drill`); on
Slurm 23.02 and later the drain also carries Slurm's own timer (`ResumeAfter`, set by
SlurmControl.drain from `slurm_lift_at`), which lifts it when neither ran: a dead drill
command on a site whose health check is not periodic (HealthCheckNodeState=REBOOT_ONLY or
START_ONLY, HealthCheckInterval=0). Past drills are kept in `drills.jsonl`
(admin.history_dir, gpugate/store/drills.py), bounded like drains.jsonl.

This package imports only gpugate's base modules: the sources (below the gate, the hooks and
the stores) read the window and lay the overlay.

The overlays, one per fault, each what the real fault looks like in the facts (GPU0 or the
first InfiniBand port; the real values of everything else are kept):
- xid79: the kernel log gains `NVRM: Xid (PCI:<GPU0's bus id>): 79, ... GPU has fallen off the
  bus.`, as the driver prints it (fails kernel.xid, a hardware fault).
- ecc: GPU0 gains one volatile and one aggregate uncorrected ECC error (fails gpu.ecc).
- gpu-lost: NVML reports GPU0 lost (error gpu_is_lost, nothing else read; fails gpu.lost).
- nvlink: GPU0's first NVLink is inactive (fails nvlink.links).
- ib-down: the first InfiniBand port is DOWN/Polling, no link (fails ib.ports).
- hang: GPU0's driver asks for a GPU reset (NVML recovery action gpu_reset), what a hung GPU
  whose processes cannot be killed shows (fails gpu.recovery_action).
"""

from __future__ import annotations

import os
import time

from gpugate.fsutil import read_regular
from gpugate.jsonrecord import JsonRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar

    from gpugate.config.schema import Config

DRILL_FILE = "drill.json"
# Slurm's own lift of a drill's drain (ResumeAfter) comes this long after the window's end: after
# the drill command's checked resume (it tries for up to 90 s, commands/drill.py GRACE_S), so it
# is the fallback when that command died, not a race with it. slurmctld fires the timer from its
# periodic check (check_node_timers, every PERIODIC_TIMEOUT, 30 s), so up to 30 s later again.
SLURM_LIFT_MARGIN_S = 120.0


class DrillWindow(JsonRecord):
    """`<state_dir>/drill.json`: the open drill (also each drills.jsonl entry's `drill`)."""

    id: str
    fault: str
    node: str
    start: float
    end: float

    _doc: ClassVar[dict[str, str]] = {
        "id": "the drill's id (its start, UTC: `20261206-101500`); drain reasons say `DRILL <id>`",
        "fault": "the fault simulated (one of FAULTS: `xid79`, `ecc`, `gpu-lost`, `nvlink`, "
        "`ib-down`, `hang`)",
        "node": "the node drilled",
        "start": "the window's start, epoch seconds",
        "end": "its end, epoch seconds (the overlay is off from then on)",
    }


class DrillError(ValueError):
    """A drill that cannot be started or ended; the message says why."""


def _xid79(data: dict[str, Any]) -> None:
    bus = _gpu0(data).get("pci_bus_id") or "00000000:00:00.0"
    # NVML's 00000000:AB:00.0 is the driver's 0000:ab:00 in its Xid lines.
    domain, rest = bus.split(":", 1)
    pci = f"{domain[-4:]}:{rest.rsplit('.', 1)[0]}".lower()
    stamp = time.strftime("%a %b %d %H:%M:%S %Y")
    line = f"[{stamp}] NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    data["kernel_log"] = [*(data.get("kernel_log") or []), line]


def _ecc(data: dict[str, Any]) -> None:
    gpu = _gpu0(data)
    for key in ("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected"):
        gpu[key] = int(gpu.get(key) or 0) + 1
    gpu["ecc_mode_enabled"] = True


def _gpu_lost(data: dict[str, Any]) -> None:
    gpu = _gpu0(data)
    # NVML answers nothing about a lost GPU: every reading becomes unknown.
    for key in list(gpu):
        if key != "index":
            gpu[key] = None
    gpu["error"] = "gpu_is_lost"


def _nvlink(data: dict[str, Any]) -> None:
    gpu = _gpu0(data)
    links = list(gpu.get("nvlink_active") or [True])
    links[0] = False
    gpu["nvlink_active"] = links


def _ib_down(data: dict[str, Any]) -> None:
    ports = data.get("infiniband") or [{"device": "mlx5_0", "port": 1, "link_layer": "InfiniBand"}]
    data["infiniband"] = ports
    ports[0].update(state="DOWN", phys_state="Polling")


def _hang(data: dict[str, Any]) -> None:
    _gpu0(data)["recovery_action"] = "gpu_reset"


def _gpu0(data: dict[str, Any]) -> dict[str, Any]:
    gpus = data.get("gpus") or [{"index": 0}]
    data["gpus"] = gpus
    gpu: dict[str, Any] = gpus[0]
    return gpu


# fault -> (what the drill simulates, the overlay)
FAULTS: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "xid79": ("Xid 79 in the kernel log: GPU0 has fallen off the bus", _xid79),
    "ecc": ("an uncorrected ECC error on GPU0", _ecc),
    "gpu-lost": ("NVML reports GPU0 lost", _gpu_lost),
    "nvlink": ("GPU0's first NVLink inactive", _nvlink),
    "ib-down": ("the first InfiniBand port DOWN/Polling", _ib_down),
    "hang": ("GPU0 hung: its driver asks for a GPU reset", _hang),
}


def overlay(fault: str, data: dict[str, Any]) -> dict[str, Any]:
    """`data` (a snapshot dict) with `fault`'s overlay applied (a deep copy; `data` is kept)."""
    import json  # late, as in active_drill

    out: dict[str, Any] = json.loads(json.dumps(data))
    FAULTS[fault][1](out)
    return out


# ---------------------------------------------------------------------------- the window


def slurm_lift_at(end: float) -> float:
    """When Slurm itself should resume a drain of the drill whose window ends at `end`."""
    return end + SLURM_LIFT_MARGIN_S


def drill_path(config: Config) -> str:
    """Where the open drill lives: `<state_dir>/drill.json` (root's state)."""
    return os.path.join(config.state_dir, DRILL_FILE)


def read_drill(obj: object, where: str = DRILL_FILE) -> DrillWindow | None:
    """The drill `obj` is, as start_drill() writes it (a known fault, an id and a node), or
    None."""
    try:
        drill = DrillWindow.from_json(obj, where)
    except ValueError:
        return None
    return drill if drill.fault in FAULTS and drill.id and drill.node else None


def active_drill(config: Config, now: float | None = None) -> DrillWindow | None:
    """The open drill, or None; a drill whose window ended (or a broken file) is removed."""
    path = drill_path(config)
    try:
        raw = read_regular(path, 1 << 20, follow=False)  # never blocks
    except FileNotFoundError:  # the usual case, on every gather: no drill, no JSON to import
        return None
    except OSError:
        raw = b""  # unreadable: removed below, as a broken file is
    import json  # late: gpugate/startup.py

    try:
        drill = read_drill(json.loads(raw), path)
    except ValueError:
        drill = None
    now = time.time() if now is None else now
    if drill is not None and drill.start <= now < drill.end:
        return drill
    try:
        os.unlink(path)  # ended: it must never act again, whoever reads it next
    except OSError:
        pass
    return None


def start_drill(
    config: Config, node: str, fault: str, minutes: float, now: float | None = None
) -> DrillWindow:
    """Open a drill window on `node` (DrillError: bad fault, window too long, one already open)."""
    import json  # late: gpugate/startup.py

    if fault not in FAULTS:
        raise DrillError(f"unknown fault {fault!r} (known: {', '.join(FAULTS)})")
    limit = config.drill.max_minutes
    if not 0 < minutes <= limit:
        raise DrillError(f"--minutes must be above 0 and at most drill.max_minutes ({limit:g}), got {minutes:g}")  # fmt: skip
    current = active_drill(config, now)
    if current is not None:
        raise DrillError(f"drill {current.id} ({current.fault}) is already running until {_iso(current.end)}")  # fmt: skip
    start = time.time() if now is None else now
    drill = DrillWindow(id=time.strftime("%Y%m%d-%H%M%S", time.gmtime(start)), fault=fault,
                        node=node, start=round(start, 3), end=round(start + minutes * 60, 3))  # fmt: skip
    from gpugate.fsutil import PRIVATE_FILE, STATE_DIR_MODE, atomic_write, private_dir

    private_dir(config.state_dir, STATE_DIR_MODE, gid=-1)
    atomic_write(drill_path(config), json.dumps(drill.to_json()), PRIVATE_FILE)
    return drill


def end_drill(config: Config) -> DrillWindow | None:
    """Close the open drill now; the drill it was, or None when none was open."""
    drill = active_drill(config)
    try:
        os.unlink(drill_path(config))
    except OSError:
        pass
    return drill


def _iso(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))

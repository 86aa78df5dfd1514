"""Kernel-log checks: Xid errors, GPUs lost without an Xid, and the host OOM killer.

The line patterns are all here, written from the formats in docs/gpu-facts.md
(section 2). They match the payload of a line; the timestamp prefix differs by tool.
"""

from __future__ import annotations

import re

from gpugate.checks import findings as F
from gpugate.checks.gpu import source_missing
from gpugate.checks.kerneltime import line_seconds
from gpugate.checks.registry import REBOOT, RESET, check
from gpugate.checks.xid import APP_XIDS, lookup, needs_drain, normalize_pci, parse_xid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.expect import Context
    from gpugate.checks.facts import Facts
    from gpugate.checks.xid import XidEvent

_PCI = r"(?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"

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
        re.compile(r"NVRM: .*fallen off the bus"),
        "GPU has fallen off the bus (reboot the node)",
    ),
    (
        re.compile(r"NVRM: .*(?:RmInitAdapter|rm_init_adapter) failed"),
        "driver could not initialise the GPU (RmInitAdapter failed)",
    ),
    (
        re.compile(r"NV_ERR_RESET_REQUIRED"),
        "driver says a GPU reset is required (NV_ERR_RESET_REQUIRED)",
    ),
)
# The GPU a line names ("NVRM: GPU 0000:91:00.0:", "NVRM: GPU at 0000:01:00.0"), and the first
# line of the multi-line form, whose address belongs to the lines after it.
GPU_ADDRESS = re.compile(r"NVRM: GPU (?:at )?" + _PCI)
MULTILINE_OPENER = re.compile(r"NVRM: The NVIDIA GPU " + _PCI)

# Host OOM killer (mm/oom_kill.c; docs/gpu-facts.md 2.5): victim line, current and 4.x forms, and
# the "Memory cgroup out of memory:" prefix when a cgroup limit (a Slurm job's) was hit.
OOM_KILLED = re.compile(r"(Memory cgroup )?[Oo]ut of memory: Kill(?:ed)? process (\d+) \(([^)]*)\)")
# `(?<!\S)`: tried from word starts only; else a long word costs its length squared.
OOM_INVOKED = re.compile(r"(?<!\S)(\S+) invoked oom-killer")

# NVIDIA groups Xids into one burst until there are 3 minutes of silence (Fleet Intelligence).
BURST_GAP_S = 180.0


def _bursts(lines: list[str]) -> int:
    """How many bursts these lines (one GPU, one Xid, log order) form; untimed lines join one."""
    count, last = 0, None
    for line in lines:
        t = line_seconds(line)  # only the gaps between lines matter
        if count == 0 or (t is not None and last is not None and abs(t - last) > BURST_GAP_S):
            count += 1
        last = t if t is not None else last
    return count


def _gpu_at(facts: Facts) -> dict[str, int]:
    """Normalised PCI address ("0000:ab:00") -> GPU index."""
    return {
        normalize_pci(g.pci_bus_id): g.index
        for g in facts.gpus or ()
        if g.pci_bus_id and normalize_pci(g.pci_bus_id)
    }


def _where(pci: str | None, gpu_at: dict[str, int]) -> tuple[str, int | None]:
    """ "GPU5 (0000:ab:00)" and the index, for the message and the finding's `gpu`."""
    if pci is None:
        return "GPU ? (address not in the line)", None
    if pci in gpu_at:
        return f"GPU{gpu_at[pci]} ({pci})", gpu_at[pci]
    return f"PCI {pci} (no GPU listed there)", None


def _times(n: int) -> str:
    return f" x{n}" if n > 1 else ""


def _xid_verdict(event: XidEvent) -> str:
    """fail (drain), app (the job's own fault; counted), warn (job-level) or info."""
    if event.code == 45 and event.caused_by is not None:
        # 45 is the teardown after another error: judge the cause, not the teardown.
        event = event.replace(code=event.caused_by, caused_by=None)
        if event.code in APP_XIDS:
            return "warn"  # the cause's own line is counted; its consequence must not be
    if needs_drain(event):
        return "fail"
    if event.code in APP_XIDS:
        return "app"
    return "warn" if lookup(event.code).action == "restart_app" else "info"


@check("kernel.xid", hardware=True, action=RESET)  # refined by the Xid catalog (admin)
def check_kernel_xid(facts: Facts, ctx: Context) -> list[F.Finding]:
    """No Xid in the kernel log that needs a GPU reset or reboot (NVIDIA Xid catalog)."""
    if facts.kernel_log is None:
        return source_missing("kernel.xid", facts, "kernel log", "kernel_log")
    groups: dict[tuple, list[str]] = {}  # (pci, code, verdict) -> lines, in log order
    for line in facts.kernel_log:
        event = parse_xid(line)
        if event is not None:
            groups.setdefault((event.pci, event.code, _xid_verdict(event)), []).append(line)
    gpu_at, out, info = _gpu_at(facts), [], []
    for (pci, code, verdict), lines in groups.items():
        where, gpu = _where(pci, gpu_at)
        xid = lookup(code)
        head = f"{where} Xid {code} {xid.mnemonic}{_times(len(lines))}: {xid.meaning}"
        if verdict == "fail":
            todo = "reboot the node" if xid.action == "reboot" else "reset the GPU"
            out.append(F.fail("kernel.xid", f"{head} ({todo})", gpu=gpu, value=code))
        elif verdict == "app":
            out.append(_app_xid(head, lines, pci, gpu, ctx))
        elif verdict == "warn":
            out.append(F.warn("kernel.xid", f"{head} (job-level, node kept)", gpu=gpu, value=code))
        else:
            info.append(f"Xid {code}{_times(len(lines))} on {where}")
    if out:
        return out
    seen = f"; informational: {', '.join(info)}" if info else ""
    return [
        F.ok("kernel.xid", f"no Xid needing action in {len(facts.kernel_log)} log line(s){seen}")
    ]


def repeats(app_xids: tuple, pci: str | None) -> tuple[int, int]:
    """(distinct jobs, distinct users) that raised application Xids on the GPU at `pci`."""
    mine = [e for e in app_xids if pci is not None and e.get("gpu") == pci]
    users = {e.get("uid") for e in mine if e.get("uid") is not None}
    return len({e.get("job") for e in mine if e.get("job")}), len(users)


def _app_xid(head: str, lines: list[str], pci: str | None, gpu: int | None,
             ctx: Context) -> F.Finding:  # fmt: skip
    """An application-class Xid: the job's own fault, however often one job raises it.

    NVIDIA's catalog resolves Xid 13/31 as RESTART_APP and 43 as IGNORE; its Xid 13/31
    workflows suspect the GPU only when the same GPU repeats them across unrelated jobs
    (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html). So the node fails
    only when the hooks' per-job record (ctx.app_xids) shows this GPU raising them in enough
    distinct jobs of enough distinct users within the window.
    """
    k = ctx.config.checks.kernel
    bursts = _bursts(lines)  # one fault logs a burst of lines: bursts are reported, not lines
    jobs, users = repeats(ctx.app_xids, pci)
    if jobs >= k.app_xid_jobs_min and users >= k.app_xid_users_min:
        # Short and telling first: a drain reason is cut at 200 characters.
        what = head.split(": ", 1)[0]
        detail = (f"{what}: application Xids in {jobs} jobs of {users} users within "
                  f"{k.app_xid_window_h:g} h (suspect the GPU: run DCGM diagnostics)")  # fmt: skip
        return F.fail("kernel.xid", detail, gpu=gpu, value=jobs, limit=k.app_xid_jobs_min)
    detail = (f"{head} ({bursts} burst(s); the application's own fault: the node fails only "
              f"when {k.app_xid_jobs_min} jobs of {k.app_xid_users_min} users raise them on "
              f"this GPU within {k.app_xid_window_h:g} h, {jobs} recorded)")  # fmt: skip
    return F.warn("kernel.xid", detail, gpu=gpu, value=bursts, limit=k.app_xid_jobs_min)


@check("kernel.gpu_bus", hardware=True, action=REBOOT)
def check_kernel_gpu_bus(facts: Facts, ctx: Context) -> list[F.Finding]:
    """No GPU fallen off the bus, failed to initialise or needing a reset, without an Xid."""
    if facts.kernel_log is None:
        return source_missing("kernel.gpu_bus", facts, "kernel log", "kernel_log")
    hits: dict[tuple, int] = {}  # (pci, what) -> lines
    announced = None  # the address a multi-line message opened with
    for line in facts.kernel_log:
        if parse_xid(line) is not None:
            continue  # Xid lines (79 says "fallen off the bus" too) are kernel.xid's
        opener = MULTILINE_OPENER.search(line)
        if opener:
            announced = opener.group(1)
            continue
        for pattern, what in BUS_PATTERNS:
            if pattern.search(line):
                named = GPU_ADDRESS.search(line)
                address = named.group(1) if named else announced
                key = (normalize_pci(address) if address else None, what)
                hits[key] = hits.get(key, 0) + 1
                announced = None
                break
    gpu_at, out = _gpu_at(facts), []
    for (pci, what), n in hits.items():
        where, gpu = _where(pci, gpu_at)
        out.append(F.fail("kernel.gpu_bus", f"{where}: {what}{_times(n)}", gpu=gpu))
    return out or [F.ok("kernel.gpu_bus", "no GPU lost from the bus or failing to initialise")]


@check("kernel.oom")
def check_kernel_oom(facts: Facts, ctx: Context) -> list[F.Finding]:
    """The host OOM killer did not run (a warning: it concerns the previous job, not the node)."""
    if facts.kernel_log is None:
        return source_missing("kernel.oom", facts, "kernel log", "kernel_log")
    killed, invoked = [], []
    for line in facts.kernel_log:
        victim = OOM_KILLED.search(line)
        if victim:
            scope = " in a cgroup" if victim.group(1) else ""
            killed.append(f"pid {victim.group(2)} {victim.group(3)}{scope}")
        elif OOM_INVOKED.search(line):
            invoked.append(OOM_INVOKED.search(line).group(1))
    if killed:
        more = f" and {len(killed) - 5} more" if len(killed) > 5 else ""
        detail = f"OOM killer killed {len(killed)} process(es): {', '.join(killed[:5])}{more}"
        return [F.warn("kernel.oom", detail, value=len(killed))]
    if invoked:
        detail = f"OOM killer invoked {len(invoked)} time(s), by {', '.join(sorted(set(invoked)))}"
        return [F.warn("kernel.oom", detail, value=len(invoked))]
    return [F.ok("kernel.oom", "the host OOM killer did not run")]

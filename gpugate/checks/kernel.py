"""Kernel-log checks: Xid errors, GPUs lost without an Xid, and the host OOM killer.

The line patterns are all here, written from the formats in docs/gpu-facts.md
(section 2). They match the payload of a line; the timestamp prefix differs by tool.
"""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.declare import HARDWARE, REBOOT, RESET, TRANSIENT, check
from gpugate.checks.gpu import source_missing
from gpugate.checks.kernel_lines import BusEvent, read_lines
from gpugate.checks.kerneltime import line_seconds
from gpugate.checks.xid import APP_XIDS, XidEvent, action_of, lookup, normalize_pci
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from gpugate.checks.expect import AppXid, Context
    from gpugate.checks.facts import Facts, KernelLogLoss
    from gpugate.config.schema import KernelChecks

# Host OOM killer (mm/oom_kill.c; docs/gpu-facts.md 2.5): victim line, current and 4.x forms, and
# the "Memory cgroup out of memory:" prefix when a cgroup limit (a Slurm job's) was hit.
OOM_KILLED = lazy(r"(Memory cgroup )?[Oo]ut of memory: Kill(?:ed)? process (\d+) \(([^)]*)\)")
# `(?<!\S)`: tried from word starts only; else a long word costs its length squared.
OOM_INVOKED = lazy(r"(?<!\S)(\S+) invoked oom-killer")

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
        pci: g.index
        for g in facts.gpus or ()
        if g.pci_bus_id and (pci := normalize_pci(g.pci_bus_id))
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


def _xid_verdict(event: XidEvent, overrides: dict[str, Any]) -> str:
    """fail (drain), app (the job's own fault; counted), warn (job-level or reported) or info."""
    action = action_of(event, overrides)
    if action in ("reset_gpu", "reboot"):
        return "fail"
    if (event.code in APP_XIDS and action == "restart_app") or (
        event.code == 43 and action == "none"
    ):
        return "app"
    return "warn" if action in ("restart_app", "report") else "info"


@check(
    "kernel.xid", hardware=True, action=RESET, fault=HARDWARE
)  # refined by the Xid catalog (admin)
def check_kernel_xid(facts: Facts, ctx: Context) -> list[F.Finding]:
    """No Xid in the kernel log that needs a GPU reset or reboot (NVIDIA Xid catalog)."""
    if facts.kernel_log is None:
        return source_missing("kernel.xid", facts, "kernel log", "kernel_log")
    overrides = ctx.config.checks.kernel.xid_actions
    groups: dict[
        tuple[Any, ...], list[str]
    ] = {}  # (pci, code, verdict, action) -> lines, in log order
    for event in read_lines(facts.kernel_log):
        if isinstance(event, XidEvent):
            key = (
                event.pci,
                event.code,
                _xid_verdict(event, overrides),
                action_of(event, overrides),
            )
            groups.setdefault(key, []).append(event.line)
    gpu_at, out, info = _gpu_at(facts), [], []
    for (pci, code, verdict, action), lines in groups.items():
        where, gpu = _where(pci, gpu_at)
        xid = lookup(code)
        # A drain reason has 200 chars: the first of NVIDIA's names ("A / B"), without prefix.
        name = xid.mnemonic.split(" / ")[0].removeprefix("ROBUST_CHANNEL_")
        head = f"{where} Xid {code} {name}{_times(len(lines))}: {xid.meaning}"
        if verdict == "fail":
            todo = "reboot the node" if action == "reboot" else "reset the GPU"
            out.append(F.fail("kernel.xid", f"{head} ({todo})", gpu=gpu, value=code))
        elif verdict == "app":
            out.append(_app_xid(head, lines, pci, gpu, ctx))
        elif verdict == "warn":
            kept = "reported, node kept" if action == "report" else "job-level, node kept"
            out.append(F.warn("kernel.xid", f"{head} ({kept})", gpu=gpu, value=code))
        else:
            info.append(f"Xid {code}{_times(len(lines))} on {where}")
    lost = [] if facts.kernel_log_lost is None else [lost_finding(facts.kernel_log_lost)]
    if out or lost:
        return out + lost
    seen = f"; informational: {', '.join(info)}" if info else ""
    return [
        F.ok("kernel.xid", f"no Xid needing action in {len(facts.kernel_log)} log line(s){seen}")
    ]


def lost_finding(loss: KernelLogLoss) -> F.Finding:
    """kernel.xid unknown: records were lost unread, so an Xid among them cannot be ruled out.

    Unknown, not fail: what was lost may be nothing but the flood itself, and a user can cause
    one (issue 41, R9: an OOM-kill loop in the job's own memory cgroup); `policy.unknown` says
    what it means (a warning by default). Never a silent pass.
    """
    return F.unknown("kernel.xid", lost_detail(loss))


def lost_detail(loss: KernelLogLoss) -> str:
    """ "kernel records lost between <t1> and <t2> (...): an Xid may be unseen"."""
    since = f"the last check (record {loss.after_seq})" if loss.after_seq is not None else None
    until = f"record {loss.resumed_seq}" if loss.resumed_seq is not None else "now"
    count = f"{loss.records} " if loss.records else ""
    return (f"kernel records lost between {loss.after_at or since or 'the last check'} and "
            f"{loss.resumed_at or until} ({count}overwritten in the ring buffer before they were "
            "read, e.g. by a flood of OOM kills): an Xid may be unseen")  # fmt: skip


def unknown_xids(findings: list[F.Finding]) -> tuple[int, ...]:
    """The codes of Xids the kernel log shows that NVIDIA's catalog does not list (reported)."""
    codes = {
        f.value
        for f in findings
        if f.check == "kernel.xid" and isinstance(f.value, int) and not isinstance(f.value, bool)
    }
    return tuple(sorted(c for c in codes if lookup(c).mnemonic == "UNKNOWN"))


def repeats(app_xids: Iterable[AppXid], pci: str | None) -> tuple[int, int]:
    """(distinct jobs, distinct users) that raised application Xids on the GPU at `pci`."""
    jobs = _jobs_by_user(app_xids, pci)
    return sum(len(j) for j in jobs.values()), len(jobs)


def _jobs_by_user(app_xids: Iterable[AppXid], pci: str | None) -> dict[int | None, set[str]]:
    """{uid: its distinct jobs} of the application Xids on the GPU at `pci` (no uid: one user)."""
    out: dict[int | None, set[str]] = {}
    for e in app_xids:
        if pci is not None and e.gpu == pci and e.job:
            out.setdefault(e.uid, set()).add(e.job)
    return out


def app_xid_suspect(app_xids: Iterable[AppXid], pci: str | None, k: KernelChecks) -> bool:
    """Whether the GPU at `pci` repeats application Xids across jobs spread fairly over users.

    At least `app_xid_jobs_min` jobs, and either `app_xid_users_min` users with
    `app_xid_jobs_per_user` jobs each, or as many distinct users as `app_xid_jobs_min`: one
    user's jobs can raise Xid 31 at will, so they prime nothing a second user could tip.
    """
    jobs = _jobs_by_user(app_xids, pci)
    total = sum(len(j) for j in jobs.values())
    steady = sum(1 for j in jobs.values() if len(j) >= k.app_xid_jobs_per_user)
    fair = steady >= k.app_xid_users_min or len(jobs) >= k.app_xid_jobs_min
    return total >= k.app_xid_jobs_min and fair


def _app_xid(head: str, lines: list[str], pci: str | None, gpu: int | None,
             ctx: Context) -> F.Finding:  # fmt: skip
    """An application-class Xid: the job's own fault, however often one job raises it.

    NVIDIA's catalog resolves Xid 13/31 as RESTART_APP and 43 as IGNORE; its Xid 13/31
    workflows suspect the GPU only when the same GPU repeats them across unrelated jobs
    (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html). So the node fails
    only when the hooks' per-job record (ctx.app_xids) shows this GPU raising them in enough
    distinct jobs spread over enough users within the window (app_xid_suspect). Even then the
    finding only warns: the jobs' code raised them, so the epilog flags the node for a
    qualification (gpugate/gate/suspicion.py) instead of draining it.
    """
    k = ctx.config.checks.kernel
    bursts = _bursts(lines)  # one fault logs a burst of lines: bursts are reported, not lines
    jobs, users = repeats(ctx.app_xids, pci)
    if app_xid_suspect(ctx.app_xids, pci, k):
        what = head.split(": ", 1)[0]
        detail = (f"{what}: application Xids in {jobs} jobs of {users} users within "
                  f"{k.app_xid_window_h:g} h (suspect the GPU: flagged for qualification)")  # fmt: skip
        return F.warn("kernel.xid", detail, gpu=gpu, value=jobs, limit=k.app_xid_jobs_min)
    detail = (f"{head} ({bursts} burst(s); the application's own fault: the GPU becomes a "
              f"suspect only when {k.app_xid_jobs_min} jobs of {k.app_xid_users_min} users "
              f"({k.app_xid_jobs_per_user} each) raise them within {k.app_xid_window_h:g} h, "
              f"{jobs} recorded)")  # fmt: skip
    return F.warn("kernel.xid", detail, gpu=gpu, value=bursts, limit=k.app_xid_jobs_min)


@check("kernel.gpu_bus", hardware=True, action=REBOOT, fault=HARDWARE)
def check_kernel_gpu_bus(facts: Facts, ctx: Context) -> list[F.Finding]:
    """No GPU fallen off the bus, failed to initialise or needing a reset, without an Xid."""
    if facts.kernel_log is None:
        return source_missing("kernel.gpu_bus", facts, "kernel log", "kernel_log")
    hits: dict[tuple[Any, ...], int] = {}  # (pci, what) -> lines
    for event in read_lines(facts.kernel_log):
        if isinstance(event, BusEvent):  # Xid lines (79 says "fallen off the bus" too): kernel.xid
            hits[(event.pci, event.what)] = hits.get((event.pci, event.what), 0) + 1
    gpu_at, out = _gpu_at(facts), []
    for (pci, what), n in hits.items():
        where, gpu = _where(pci, gpu_at)
        out.append(F.fail("kernel.gpu_bus", f"{where}: {what}{_times(n)}", gpu=gpu))
    return out or [F.ok("kernel.gpu_bus", "no GPU lost from the bus or failing to initialise")]


@check("kernel.oom", fault=TRANSIENT)
def check_kernel_oom(facts: Facts, ctx: Context) -> list[F.Finding]:
    """The host OOM killer did not run (a warning: it concerns the previous job, not the node)."""
    if facts.kernel_log is None:
        return source_missing("kernel.oom", facts, "kernel log", "kernel_log")
    killed, invoked = [], []
    for line in facts.kernel_log:
        # The plain text each pattern needs first: a healthy log compiles neither.
        victim = OOM_KILLED.search(line) if "ut of memory: Kill" in line else None
        if victim:
            scope = " in a cgroup" if victim.group(1) else ""
            killed.append(f"pid {victim.group(2)} {victim.group(3)}{scope}")
        elif " invoked oom-killer" in line and (invoker := OOM_INVOKED.search(line)):
            invoked.append(invoker.group(1))
    if killed:
        more = f" and {len(killed) - 5} more" if len(killed) > 5 else ""
        detail = f"OOM killer killed {len(killed)} process(es): {', '.join(killed[:5])}{more}"
        return [F.warn("kernel.oom", detail, value=len(killed))]
    if invoked:
        detail = f"OOM killer invoked {len(invoked)} time(s), by {', '.join(sorted(set(invoked)))}"
        return [F.warn("kernel.oom", detail, value=len(invoked))]
    return [F.ok("kernel.oom", "the host OOM killer did not run")]

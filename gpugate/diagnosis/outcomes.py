"""What a matched line means when its pattern alone cannot say: the signatures' resolvers.

A signature with a `resolve` hands its match here; the resolver returns the line's category,
strength, root Xid and extra fields (`detail`, `pci`, `inferred`, `gpu`). Xid and SXid lines
are read as `gpugate check` reads them (one kernel-line reader, NVIDIA's catalog), NCCL WARN
lines by their kind (nccl_warn), a process's end by how it ended.
"""

from __future__ import annotations

import re

from gpugate.checks import xid as X
from gpugate.checks.kernel_lines import read_line
from gpugate.checks.sxid import SxidEvent
from gpugate.diagnosis import nccl_warn
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

# What one line proves (see signatures' docstring).
FATAL, MINOR, PRECURSOR, CONTEXT = "fatal", "minor", "precursor", "context"


def xid_outcome(m: re.Match[str], text: str) -> tuple[str, str, int | None, dict[str, Any]]:
    """Category, strength and root code of an Xid line, read as `gpugate check` reads it.

    An `NVRM:` line the kernel-line reader does not take for an Xid (`NVRM: Xid : 32, ...`) is
    none here either. A line that drains names its catalog category (fatal); an application
    Xid is the job's own fault (user app, fatal); an informational one is minor.
    """
    event = read_line(text)
    event = event if isinstance(event, X.XidEvent) else None
    if event is None and "NVRM" in text:
        return "other", MINOR, None, {}
    if event is None:  # a tool's summary (`dcgm health: GPU 2 reported Xid 48`): by code
        info = X.lookup(int(m.group("xid")))
        fatal = info.action in X.DRAIN_ACTIONS or info.action == "restart_app"
        return info.category, FATAL if fatal else MINOR, info.code, {}
    root = event.caused_by if event.code == 45 and event.caused_by is not None else event.code
    info = X.lookup(root)
    gpu = {"pci": event.pci} if event.pci else {}
    if event.code == 45 and event.caused_by is not None:
        return info.category, FATAL if info.action != "none" else MINOR, root, gpu
    action = X.action_of(event)
    if action in X.DRAIN_ACTIONS:
        return info.category, FATAL, root, gpu
    if action == "restart_app" or root in X.APP_XIDS:
        # The job's own fault; a contained ECC error (94) still says why the job failed.
        category = "ecc_error" if info.category == "ecc_error" else "gpu_xid_user_app"
        return category, FATAL, root, gpu
    return info.category, MINOR, root, gpu


def sxid_outcome(m: re.Match[str], text: str) -> tuple[str, str, int | None]:
    """NVSwitch SXid (or fabric manager line): NVLink fabric error, fatal as kernel.sxid reads it."""
    event = read_line(text) if "SXid" in text else None
    if isinstance(event, SxidEvent):
        return "nvlink_error", FATAL if event.fatal else MINOR, None
    return "nvlink_error", FATAL if m.group("sev").lower() == "fatal" else MINOR, None


def nccl_warn_outcome(m: re.Match[str], text: str) -> tuple[str | None, str, None, dict[str, Any]]:
    """An NCCL WARN: a failure of its kind (named in `detail`), or chatter (decides nothing)."""
    kind = nccl_warn.classify(m.group("msg"))
    if kind is None:
        return None, CONTEXT, None, {}
    return "nccl_error", FATAL, None, {"detail": kind}


def explained(
    words: str, **by_group: str
) -> Callable[[re.Match[str], str], tuple[str, str, None, dict[str, Any]]]:
    """A resolve for a failure no category names: `other`, fatal, `words` quoted in the summary.

    `words` may name the match's groups (`{plugin}`): what the line itself says fills them in.
    `by_group` gives other words where the named group matched (one pattern, two wordings).
    """

    def resolve(m: re.Match[str], text: str) -> tuple[str, str, None, dict[str, Any]]:
        groups = {k: v or "" for k, v in m.groupdict().items()}
        said = next((w for g, w in by_group.items() if groups.get(g)), words)
        return "other", FATAL, None, {"said": said.format(**groups)}

    return resolve


# How a process's end is written when it was SIGKILLed: exit code -9 (torchrun, DeepSpeed),
# 137 (a shell's 128+9), signal 9, SIGKILL, or a shell's "Killed".
_SIGKILL = lazy(r"^(?:-9|137|9|SIGKILL|Killed)$")


def exit_outcome(m: re.Match[str], text: str) -> tuple[str | None, str, None, dict[str, Any]]:
    """A process's end: a failure that says how, not why (`other`); exit code 0 is no failure.

    A SIGKILL is `other` too, marked `inferred: sigkill` so the summary says who usually sends
    it (the kernel's OOM killer, else a scheduler): the corpus's rule 5 makes a SIGKILL host_oom
    only where a line names the RAM (the OOM killer's own line, Slurm's oom-kill, Ray's memory
    monitor: signatures of their own, which outrank this). Guessing host_oom from the signal
    alone misled wherever an admin, a watchdog or a cgroup limit sent it.
    """
    groups = m.groupdict()
    how = next((groups[k] for k in ("exitcode", "signal", "signame", "how") if groups.get(k)), "")
    how = how.strip()
    if how == "0":
        return None, CONTEXT, None, {}
    if _SIGKILL.match(how) or how.endswith(("SIGKILL", ": 9", "Killed")):
        return "other", FATAL, None, {"inferred": "sigkill"}
    return "other", FATAL, None, {}


_GPU_CAPACITY = lazy(r"GPU (\d+) has a total capacity")


def oom_outcome(m: re.Match[str], text: str) -> tuple[str, str, None, dict[str, Any]]:
    """A CUDA OOM; the device it names becomes a rank only under torchrun's one-node launch."""
    gpu = _GPU_CAPACITY.search(text)
    return "cuda_oom", FATAL, None, ({"gpu": gpu.group(1)} if gpu else {})

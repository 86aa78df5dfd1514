"""Fact sources: the only code that touches the hardware and the OS.

Each source is a function `read_*(config) -> dict` returning snapshot keys (the YAML contract).
`gather_dict()` runs them concurrently, each under its own timeout; a source that raises or
hangs is recorded in `source_errors` and its keys stay absent ("not known"). Nothing is raised
past here. `gather()` is the one entry point of the hooks and commands: replay or live, with the
kernel-log position and the deadline (only `gpugate facts` calls gather_dict(): it writes the
snapshot that others replay).
"""

from __future__ import annotations

import os
import time

from gpugate.checks.facts import Facts, facts_from_dict, load_snapshot
from gpugate.checks.sources.kernel_log import boot_id
from gpugate.clock import utc
from gpugate.drill import active_drill, drill_path, overlay
from gpugate.slurm import reasons
from gpugate.startup import import_module

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpugate.config.schema import Config

# name -> (module, function). Imported lazily: pynvml alone costs more than the checklist.
SOURCES: dict[str, tuple[str, str]] = {
    "nvml": ("gpugate.checks.sources.nvml", "read_nvml"),
    "kernel_log": ("gpugate.checks.sources.kernel_log", "read_kernel_log"),
    "infiniband": ("gpugate.checks.sources.infiniband", "read_infiniband"),
    "host": ("gpugate.checks.sources.host", "read_host"),
    "mounts": ("gpugate.checks.sources.mounts", "read_mounts"),
}


class _Result:
    def __init__(self) -> None:
        self.data: dict[str, Any] | None = None
        self.error: str | None = None


def _call(fn: Callable[[], dict[str, Any]], result: _Result) -> None:
    try:
        result.data = fn()
    except Exception as exc:  # recorded, never raised: one broken source must not hide the rest
        result.error = f"{type(exc).__name__}: {exc}"
        result.data = getattr(exc, "facts", None)  # what a failing source could still say


def _load(name: str) -> Callable[..., Any]:
    module, func = SOURCES[name]
    read: Callable[..., Any] = getattr(import_module(module), func)
    return read


def gather_dict(
    config: Config,
    node: str,
    only: list[str] | None = None,
    deadline_s: float | None = None,
    source_kwargs: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run the sources concurrently; return the snapshot as a plain dict.

    `source_kwargs` passes extra arguments to one source, e.g. the kernel-log position.
    """
    import threading  # late: a replayed snapshot runs no source (gpugate/startup.py)

    started = time.monotonic()
    names = [n for n in SOURCES if only is None or n in only]
    timeouts = config.sources.timeout_s
    threads: dict[str, tuple[threading.Thread, _Result, float]] = {}
    errors: dict[str, str] = {}
    for name in names:
        try:
            fn = _load(name)
        except Exception as exc:
            errors[name] = f"cannot load source: {type(exc).__name__}: {exc}"
            continue
        result = _Result()
        kwargs = (source_kwargs or {}).get(name, {})
        # Daemon threads: a call stuck in the kernel or the driver is abandoned at exit.
        t = threading.Thread(
            target=_call,
            args=(lambda fn=fn, kw=kwargs: fn(config, **kw), result),
            name=name,
            daemon=True,
        )
        t.start()
        threads[name] = (t, result, float(getattr(timeouts, name)))
    snapshot: dict[str, Any] = {"node": node, "collected_at": utc()}
    for name, (t, result, timeout) in threads.items():
        remaining = timeout - (time.monotonic() - started)
        if deadline_s is not None:
            remaining = min(remaining, deadline_s - (time.monotonic() - started))
        t.join(max(0.0, remaining))
        if t.is_alive():
            errors[name] = f"timed out after {timeout:g} s"
        elif result.error:
            errors[name] = result.error
            snapshot.update(result.data or {})
        elif result.data:
            snapshot.update(result.data)
    snapshot["source_errors"] = errors
    return snapshot


def gather(
    config: Config,
    node: str,
    *,
    position: tuple[str | None, int | None] | None = None,
    deadline_s: float | None = None,
    only: list[str] | None = None,
    snapshot: str | None = None,
) -> Facts:
    """This node's facts: a replayed snapshot, else gathered live. The one way in for every caller.

    `snapshot` (a --facts option) or the site's `facts_file` is replayed as it is. Live, the
    sources run under `deadline_s`, and the kernel log is read from `position`, the (boot id,
    sequence number) an earlier run reached, when that was this boot (see since_seq).
    """
    # An open drill's overlay goes over the node's facts (with_drill), never over a snapshot
    # someone named (`--facts`): that is not this node's.
    if snapshot:
        return load_snapshot(snapshot)
    replay = replay_path(config, node)
    if replay:
        return with_drill(config, node, load_snapshot(replay))
    seq = since_seq(config, position)
    kwargs = {"kernel_log": {"since_seq": seq}} if seq is not None else {}
    facts = facts_from_dict(gather_dict(config, node, only, deadline_s, kwargs))
    return with_drill(config, node, facts)


def with_drill(config: Config, node: str, facts: Facts) -> Facts:
    """`facts` with the open drill's overlay on them when it is this node's; else `facts`.

    The process's drill mark (reasons.mark_drill) follows each gather: set while the overlay is
    on the facts, cleared otherwise, so nothing built after a drill's window says DRILL.
    """
    reasons.mark_drill(None)
    if not os.path.exists(drill_path(config)):  # the usual case: one stat
        return facts
    drill = active_drill(config)
    if drill is None or drill.node != node:
        return facts
    reasons.mark_drill(drill.id, drill.end)
    return facts_from_dict(overlay(drill.fault, facts.to_dict()), f"drill {drill.id}")


def since_seq(config: Config, position: tuple[str | None, int | None] | None) -> int | None:
    """The kernel-log sequence number to read on from: `position`'s, if it was this boot.

    Xids stay in the kernel log until the next boot; without this, one old Xid 79 would refuse
    every job after an admin repaired the GPU and resumed the node. Sequence numbers start
    again at each boot, so a position of another boot (or of an unknown one) counts for nothing.
    """
    boot, seq = position or (None, None)
    if boot is None or seq is None:
        return None

    return seq if boot == boot_id(config) else None


def replay_path(config: Config, node: str) -> str | None:
    """The snapshot to replay for `node`, if the config says so."""
    if not config.facts_file:
        return None
    return config.facts_file.replace("{node}", node)


def proc_path(config: Config, *parts: str) -> str:
    """A path under the configured /proc root."""
    return os.path.join(config.sources.proc_root, *parts)


def sys_path(config: Config, *parts: str) -> str:
    """A path under the configured /sys root."""
    return os.path.join(config.sources.sysfs_root, *parts)

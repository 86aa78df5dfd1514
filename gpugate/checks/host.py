"""Host checks: the open-files limit jobs inherit, host memory, and required filesystems."""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.declare import LOAD_HOST, TRANSIENT, check
from gpugate.checks.gpu import source_missing

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.expect import Context
    from gpugate.checks.facts import Facts, Mount


@check("host.nofile", fault=TRANSIENT)
def check_host_nofile(facts: Facts, ctx: Context) -> list[F.Finding]:
    """Open-files soft limit at least `nofile_min` (seed: `ulimit -n` 1048576)."""
    want = ctx.config.checks.host.nofile_min
    soft = facts.limits.nofile_soft if facts.limits else None
    if soft is None:
        return source_missing("host.nofile", facts, "open-files limit", "host")
    # Jobs inherit slurmd's limits; many data-loader processes opening dataset files run out.
    if soft < want:
        detail = f"open-files soft limit {soft} < {want} (ulimit -n)"
        return [F.fail("host.nofile", detail, value=soft, limit=want)]
    return [F.ok("host.nofile", f"open-files soft limit {soft} >= {want}", value=soft, limit=want)]


@check("host.memory", fault=TRANSIENT, load=LOAD_HOST)
def check_host_memory(facts: Facts, ctx: Context) -> list[F.Finding]:
    """Enough host memory available; swap in use only warns (a job that swaps slows down)."""
    cfg = ctx.config.checks.host
    mem = facts.memory
    if mem is None:
        return source_missing("host.memory", facts, "host memory facts", "host")
    out = []
    avail, swap = mem.available_mib, mem.swap_used_mib
    if avail is None:
        out.append(F.unknown("host.memory", "available memory not reported"))
    elif avail < cfg.memory_available_min_mib:
        detail = f"available memory {avail} MiB < {cfg.memory_available_min_mib} MiB"
        out.append(F.fail("host.memory", detail, value=avail, limit=cfg.memory_available_min_mib))
    # Swapped pages stay out until touched, long after the pressure that put them there, so
    # swap in use says "an earlier job pressed memory", not "this node cannot run a job".
    if swap is None:
        out.append(F.unknown("host.memory", "swap use not reported"))
    elif swap > cfg.swap_used_max_mib:
        detail = f"swap in use {swap} MiB > {cfg.swap_used_max_mib} MiB"
        out.append(F.warn("host.memory", detail, value=swap, limit=cfg.swap_used_max_mib))
    return out or [F.ok("host.memory", f"{avail} MiB available, {swap} MiB swap in use")]


def _judge_mount(m: Mount, limit: float) -> list[F.Finding]:
    """One mount: mounted, then writable, then a small write+fsync under `limit` ms."""
    why = f" ({m.error})" if m.error else ""
    if m.mounted is None:
        return [F.unknown("host.mounts", f"{m.path}: not known whether mounted{why}")]
    if not m.mounted:
        return [F.fail("host.mounts", f"{m.path} not mounted{why}")]
    if m.writable is None:
        return [F.unknown("host.mounts", f"{m.path}: not known whether writable{why}")]
    if not m.writable:
        return [F.fail("host.mounts", f"{m.path} not writable{why}")]
    if m.fsync_ms is None:
        return [F.unknown("host.mounts", f"{m.path}: write+fsync time not measured{why}")]
    if m.fsync_ms > limit:
        detail = f"{m.path} write+fsync took {m.fsync_ms:g} ms > {limit:g} ms{why} (check the filesystem)"
        return [F.fail("host.mounts", detail, value=m.fsync_ms, limit=limit)]
    return []


@check("host.mounts", fault=TRANSIENT)
def check_host_mounts(facts: Facts, ctx: Context) -> list[F.Finding]:
    """Required filesystems mounted, writable, and a 4 KiB write+fsync under the limit."""
    if facts.mounts is None:
        return source_missing("host.mounts", facts, "mount facts", "mounts")
    limits = {r.path: r.fsync_ms_max for r in ctx.config.sources.required_mounts}
    default = ctx.config.checks.host.fsync_ms_max
    seen = {m.path for m in facts.mounts}
    # The gatherer checks every configured path, so one missing was not checked at all.
    out = [
        F.unknown("host.mounts", f"{path}: required but not in the facts (not checked)")
        for path in limits
        if path not in seen
    ]
    for m in facts.mounts:
        out += _judge_mount(m, limits.get(m.path, default))
    if out:
        return out
    if not facts.mounts:
        return [F.ok("host.mounts", "no mounts required (sources.required_mounts)")]
    paths = ", ".join(m.path for m in facts.mounts)
    return [F.ok("host.mounts", f"{paths}: mounted, writable, write+fsync within the limit")]

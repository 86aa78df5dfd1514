"""Run the checklist over one snapshot. A check that raises is reported, never propagated."""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.expect import make_context
from gpugate.checks.gpu import CPU_ONLY, not_gpu_node
from gpugate.checks.readable import readable
from gpugate.checks.registry import registered

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpugate.checks.expect import AppXid
    from gpugate.checks.facts import Facts
    from gpugate.config.schema import Config

# The checks a CPU-only node is not judged by (GPUDirect RDMA needs a GPU too).
GPU_RULES = ("gpu.", "pcie.", "nvlink.", "ib.peermem")


def run_checks(
    facts: Facts, config: Config, only: list[str] | None = None, app_xids: Iterable[AppXid] = ()
) -> list[F.Finding]:
    """Every enabled check over `facts`, findings sorted problems first."""
    ctx = make_context(facts, config, app_xids)
    disabled = set(config.checks.disabled)
    cpu_only = not_gpu_node(facts, ctx)  # no GPU on the bus and none expected
    out: list[F.Finding] = []
    for check_id, fn in registered().items():
        if check_id in disabled or (only is not None and check_id not in only):
            continue
        if cpu_only and check_id.startswith(GPU_RULES):
            out.append(F.ok(check_id, CPU_ONLY))
            continue
        try:
            out.extend(fn(facts, ctx))
        except Exception as exc:  # a bug in one check must not hide the others
            out.append(F.unknown(check_id, f"check crashed: {type(exc).__name__}: {exc}"))
    return F.sort_findings(readable(out, facts))

"""GPU presence and driver checks."""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.registry import check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.expect import Context
    from gpugate.checks.facts import Facts


def nvml_missing(check_id: str, facts: Facts) -> list[F.Finding]:
    """The finding every GPU check returns when NVML gave no GPU list at all."""
    why = (facts.source_errors or {}).get("nvml", "no GPU facts in the snapshot")
    return [F.unknown(check_id, f"NVML facts missing: {why}")]


@check("gpu.count")
def check_gpu_count(facts: Facts, ctx: Context) -> list[F.Finding]:
    """GPUs NVML sees against the board's expected count (and the PCI bus's count)."""
    if facts.gpus is None:
        # The driver is missing or NVML hung: on a GPU node that is itself a failure.
        why = (facts.source_errors or {}).get("nvml", "no GPU facts in the snapshot")
        expected = ctx.expected.gpu_count
        if expected:
            return [F.fail("gpu.count", f"NVML sees no GPUs ({why}); expected {expected}")]
        return nvml_missing("gpu.count", facts)
    seen = len(facts.gpus)
    expected = ctx.expected.gpu_count
    if expected is None:
        expected = facts.pci_gpu_count
    if expected is None:
        return [F.unknown("gpu.count", f"{seen} GPUs seen; no expected count (board unknown)")]
    if seen < expected:
        return [F.fail("gpu.count", f"{seen} GPUs seen, expected {expected}", value=seen, limit=expected)]
    if facts.pci_gpu_count is not None and facts.pci_gpu_count > seen:
        return [F.fail("gpu.count", f"{facts.pci_gpu_count} NVIDIA GPUs on the PCI bus but NVML sees {seen}",
                       value=seen, limit=facts.pci_gpu_count)]
    return [F.ok("gpu.count", f"{seen} GPUs (expected {expected})", value=seen, limit=expected)]  # fmt: skip


@check("gpu.lost")
def check_gpu_lost(facts: Facts, ctx: Context) -> list[F.Finding]:
    """No GPU that NVML reports lost, needing reset, or unreachable."""
    if facts.gpus is None:
        return nvml_missing("gpu.lost", facts)
    bad = [
        F.fail("gpu.lost", f"GPU{g.index} ({g.pci_bus_id or '?'}): {g.error}", gpu=g.index, value=g.error)
        for g in facts.gpus
        if g.error
    ]  # fmt: skip
    return bad or [F.ok("gpu.lost", f"all {len(facts.gpus)} GPUs answer NVML")]

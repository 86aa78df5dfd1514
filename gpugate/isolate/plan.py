"""Which GPUs a drain's failing findings could be narrowed to, or why the node must go."""

from __future__ import annotations

import time

from gpugate.isolate.comment import IsolatedGpu

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.facts import Gpu
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config


def targets(
    config: Config, failing: list[Finding], gpus: tuple[Gpu, ...] | None
) -> list[IsolatedGpu] | str:
    """The GPUs to isolate for these failures; a string saying why the node is drained instead.

    Every failure must come from a check in `isolate.checks` and name its GPU, at most
    `isolate.max_gpus` GPUs, each with a known device minor (NVML's; the index is not the
    minor, and the wrong device denied would hand the bad GPU to jobs).
    """
    iso = config.isolate
    if iso is None or iso.unit != "gpu":
        return "isolate.unit is node"
    if not failing:
        return "no failure to isolate"
    first: dict[int, Finding] = {}
    for finding in failing:
        if finding.check not in iso.checks:
            return f"{finding.check} concerns the whole node"
        if finding.gpu is None:
            return f"{finding.check} names no single GPU"
        first.setdefault(finding.gpu, finding)
    if len(first) > iso.max_gpus:
        return f"{len(first)} GPUs at fault (isolate.max_gpus: {iso.max_gpus})"
    by_index = {g.index: g for g in gpus or ()}
    out = []
    now = int(time.time())
    for index, finding in sorted(first.items()):
        gpu = by_index.get(index)
        minor = getattr(gpu, "minor_number", None) if gpu is not None else None
        if minor is None:
            return f"GPU{index}'s device minor number is unknown (NVML did not say)"
        out.append(
            IsolatedGpu(
                index=index,
                minor=int(minor),
                serial=(gpu.serial if gpu is not None else None) or "",
                since=now,
                why=finding.message,
            )
        )
    return out

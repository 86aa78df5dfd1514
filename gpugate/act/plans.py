"""The plans the hooks share: draining a node for failing findings (prolog, epilog, health)."""

from __future__ import annotations

from gpugate.act.steps import Drain, Isolate, Undo
from gpugate.slurm.reasons import drain_reason, evidence_detail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.act.steps import Plan
    from gpugate.checks.facts import Gpu
    from gpugate.checks.findings import Finding


def drain_steps(
    node: str,
    failing: list[Finding],
    gpus: tuple[Gpu, ...] | None = None,
    boot_id: str | None = None,
    bundle: str | None = None,
) -> Plan:
    """Drain `node` for `failing` with gpugate's reason (the first failure and how many more;
    the evidence bundle named when there is one), within the budget; undo a drain that ranks
    beyond it once concurrent drains have landed; then take out only the faulty GPU where the
    site isolates GPUs (`isolate.unit: gpu`)."""
    from gpugate.gate.drain import drain_detail  # only a failing hook plans a drain (start-up)

    check, detail = drain_detail(failing)
    if bundle:
        detail = evidence_detail(bundle, detail)
    return (
        Drain(node=node, check=check, reason=drain_reason(check, detail)),
        Undo(node=node, check=check),
        Isolate(node=node, failing=tuple(failing), gpus=gpus, boot_id=boot_id),
    )

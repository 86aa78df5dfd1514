"""Compute-fabric checks: InfiniBand / RoCE ports up, at rate, and GPUDirect RDMA loaded."""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.declare import HARDWARE, RESEAT, TRANSIENT, check
from gpugate.checks.gpu import source_missing

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.expect import Context
    from gpugate.checks.facts import Facts, IbPort

# nvidia_peermem ships with the driver (R470+); nv_peer_mem is the older Mellanox module.
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")


def _fabric_ports(facts: Facts, ctx: Context) -> list[IbPort]:
    """The ports on the link layers the site counts as its compute fabric."""
    layers = ctx.config.checks.ib.link_layers
    return [p for p in facts.infiniband or () if p.link_layer in layers]


def _name(p: IbPort) -> str:
    return f"{p.device} port {p.port}"


def _active(p: IbPort) -> bool:
    # sysfs says "4: ACTIVE" / "5: LinkUp", ibstat "Active": the source keeps the name.
    return (p.state or "").upper() == "ACTIVE" and (p.phys_state or "").lower() == "linkup"


@check("ib.ports", hardware=True, action=RESEAT, fault=TRANSIENT)
def check_ib_ports(facts: Facts, ctx: Context) -> list[F.Finding]:
    """Every fabric port ACTIVE and LinkUp; as many as the site expects (`expect.ib_ports`)."""
    # How many ports a node has is the site's (a GPU board is sold with 4 or 8 NICs, or none):
    # `expect.ib_ports` or a learned profile (`gpugate profile`). Without it, every present
    # port must be up (a port that is cabled but down is a fault whatever the count).
    if facts.infiniband is None:
        return source_missing("ib.ports", facts, "InfiniBand facts", "infiniband")
    ports, want = _fabric_ports(facts, ctx), ctx.expected.ib_ports
    layers = "/".join(ctx.config.checks.ib.link_layers)
    out = []
    if want is not None and len(ports) < want:
        detail = f"{len(ports)} {layers} ports, expected {want}"
        out.append(F.fail("ib.ports", detail, value=len(ports), limit=want))
    for p in ports:
        if p.state is None or p.phys_state is None:
            out.append(F.unknown("ib.ports", f"{_name(p)} did not report its state"))
        elif not _active(p):
            detail = f"{_name(p)} {p.state}/{p.phys_state}, expected ACTIVE/LinkUp"
            out.append(F.fail("ib.ports", detail, value=f"{p.state}/{p.phys_state}"))
    if out:
        return out
    if want is None:
        detail = (
            f"all {len(ports)} {layers} ports ACTIVE/LinkUp (no expected count: expect.ib_ports)"
        )
        return [F.ok("ib.ports", detail, value=len(ports))]
    return [F.ok("ib.ports", f"{len(ports)} {layers} ports ACTIVE/LinkUp (expected {want})")]


@check("ib.rate", hardware=True, action=RESEAT, fault=HARDWARE)
def check_ib_rate(facts: Facts, ctx: Context) -> list[F.Finding]:
    """Every active fabric port at the site's rate (`expect.ib_rate_gbps`), else at one rate."""
    if facts.infiniband is None:
        return source_missing("ib.rate", facts, "InfiniBand facts", "infiniband")
    active = [p for p in _fabric_ports(facts, ctx) if _active(p)]
    if not active:
        if ctx.expected.ib_ports == 0 or not _fabric_ports(facts, ctx):
            return [F.ok("ib.rate", "no fabric ports to measure")]
        return [F.unknown("ib.rate", "no active fabric port to measure (see ib.ports)")]
    out = [
        F.unknown("ib.rate", f"{_name(p)} did not report its rate")
        for p in active
        if p.rate_gbps is None
    ]
    rated = [p for p in active if p.rate_gbps is not None]
    want = ctx.expected.ib_rate_gbps
    # Without the site's rate, the ports must agree: one port trained slower than its
    # siblings (a bad cable at HDR among NDR) is the fault; the fastest port is the yardstick.
    limit = want if want is not None else max((p.rate_gbps for p in rated), default=0.0)
    whose = "" if want is not None else " (the other ports' rate; set expect.ib_rate_gbps)"
    for p in rated:
        if p.rate_gbps < limit:
            detail = f"{_name(p)} rate {p.rate_gbps:g} Gb/s < {limit:g} Gb/s{whose}"
            out.append(F.fail("ib.rate", detail, value=p.rate_gbps, limit=limit))
    if out:
        return out
    if want is None:
        return [F.ok("ib.rate", f"{len(rated)} active ports share one rate, {limit:g} Gb/s")]
    return [F.ok("ib.rate", f"{len(active)} active ports at >= {want:g} Gb/s")]


@check("ib.peermem", fault=HARDWARE)
def check_ib_peermem(facts: Facts, ctx: Context) -> list[F.Finding]:
    """GPUDirect RDMA module (nvidia_peermem) loaded wherever fabric ports are present."""
    # The seed: "works on one GPU, fails on many" is often peermem not loaded before training.
    # Sites whose NCCL uses DMA-BUF instead turn this off (checks.ib.require_peermem).
    if not ctx.config.checks.ib.require_peermem:
        return [F.ok("ib.peermem", "not required (checks.ib.require_peermem: false)")]
    if facts.infiniband is None:
        return source_missing("ib.peermem", facts, "InfiniBand facts", "infiniband")
    ports = _fabric_ports(facts, ctx)
    if not ports:
        return [F.ok("ib.peermem", "no fabric ports, GPUDirect RDMA not needed")]
    if facts.kernel_modules is None:
        return source_missing("ib.peermem", facts, "kernel module list", "host")
    loaded = {m.replace("-", "_") for m in facts.kernel_modules}
    found = [m for m in PEERMEM_MODULES if m in loaded]
    if found:
        return [F.ok("ib.peermem", f"{found[0]} loaded for {len(ports)} fabric ports")]
    detail = f"{len(ports)} fabric ports but nvidia_peermem is not loaded (no GPUDirect RDMA)"
    return [F.fail("ib.peermem", detail, limit="nvidia_peermem")]

"""GPU link checks: the PCIe link to the host, NVLinks, and the NVSwitch fabric."""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.boards import unknown_board
from gpugate.checks.declare import HARDWARE, RESEAT, RESET, check
from gpugate.checks.gpu import not_reported, nvml_missing, per_gpu

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.expect import Context
    from gpugate.checks.facts import Facts, Gpu


@check(
    "pcie.link", hardware=True, action=RESEAT, fault=HARDWARE
)  # trained below x16 or its generation
def check_pcie_link(facts: Facts, ctx: Context) -> list[F.Finding]:
    """Each GPU's PCIe link at full width and at the board's generation."""
    if facts.gpus is None:  # the board is picked by GPU name: NVML is the root cause
        return nvml_missing("pcie.link", facts)
    if ctx.expected.c2c:
        # Grace boards (GH200, GB200, GB300): the GPU hangs off NVLink-C2C, and the "PCIe link"
        # NVML reports (GH200: Gen4 x1) is no host link to judge (gpugate.yaml boards).
        why = f"board {ctx.expected.board or '?'}: GPUs on NVLink-C2C, no host PCIe link to judge"
        return [F.ok("pcie.link", why)]
    want_width, want_gen = ctx.expected.pcie_width, ctx.expected.pcie_gen
    # Idle GPUs drop the current generation to save power, so by default only the trained
    # maximum is compared; a narrower link (x16 -> x8) is a fault at any load
    # (docs/gpu-facts.md 3.6).
    current = ctx.config.checks.pcie.generation == "current"

    def judge(g: Gpu) -> list[F.Finding]:
        p = g.pcie
        if p is None or p.width is None:
            return [not_reported("pcie.link", g, "its PCIe link")]
        out = []
        # The width the site or the board expects wins (a card in a slot wired x8 is not a
        # degraded link there); without one, the card's own maximum.
        full = next((w for w in (want_width, p.max_width) if w is not None), p.width)
        if p.width < full:
            detail = f"GPU{g.index} PCIe link x{p.width} < x{full} (degraded link)"
            out.append(F.fail("pcie.link", detail, gpu=g.index, value=p.width, limit=full))
        if want_gen is None:
            return out
        gens = [("max", p.max_gen)] + ([("current", p.gen)] if current else [])
        for label, gen in gens:
            if gen is None:
                out.append(not_reported("pcie.link", g, f"its {label} PCIe generation"))
            elif gen < want_gen:
                detail = f"GPU{g.index} PCIe {label} generation Gen{gen} < Gen{want_gen}"
                out.append(F.fail("pcie.link", detail, gpu=g.index, value=gen, limit=want_gen))
        return out

    gens = f", Gen{want_gen} {'current' if current else 'max'}" if want_gen else ""
    out = per_gpu("pcie.link", facts, judge, f"at full width{gens}")
    if want_gen is None:
        why = f"no expected PCIe generation ({_unset(facts, ctx, 'pcie_gen')})"
        out.insert(0, F.unknown("pcie.link", why))
    return out


@check("nvlink.links", hardware=True, action=RESET, fault=HARDWARE)
def check_nvlink_links(facts: Facts, ctx: Context) -> list[F.Finding]:
    """Every GPU has all of the board's NVLinks active (seed: `nvidia-smi topo -m` complete)."""
    want = ctx.expected.nvlinks_per_gpu
    why = f"no expected NVLink count ({_unset(facts, ctx, 'nvlinks_per_gpu')})"
    settled = _settled_by_board("nvlink.links", facts, ctx, want, why, "no NVLinks")
    if settled is not None:
        return settled

    def judge(g: Gpu) -> list[F.Finding]:
        links = g.nvlink_active
        if links is None:
            return [not_reported("nvlink.links", g, "its NVLink states")]
        active = sum(1 for up in links if up)
        if active >= want:
            return []
        down = ", ".join(str(n) for n, up in enumerate(links) if not up)
        detail = (
            f"GPU{g.index} {active}/{want} NVLinks active (inactive links: {down or 'none listed'})"
        )
        return [F.fail("nvlink.links", detail, gpu=g.index, value=active, limit=want)]

    return per_gpu("nvlink.links", facts, judge, f"with {want}/{want} NVLinks active")


@check("nvlink.fabric", hardware=True, action=RESET, fault=HARDWARE)
def check_nvlink_fabric(facts: Facts, ctx: Context) -> list[F.Finding]:
    """On NVSwitch boards, every GPU registered with the fabric (state completed, success)."""
    why = f"not known whether the board has NVSwitches ({_unset(facts, ctx, 'nvswitch')})"
    settled = _settled_by_board(
        "nvlink.fabric", facts, ctx, ctx.expected.nvswitch, why, "no NVSwitch fabric"
    )
    if settled is not None:
        return settled

    # Until Fabric Manager has registered a GPU, CUDA jobs fail to start or run without NVLink
    # (docs/gpu-facts.md 3.9): anything but completed/success is a failure. A state that is
    # not completed fails on its own, whether or not the status was reported.
    def judge(g: Gpu) -> list[F.Finding]:
        if g.fabric_state is None:
            return [not_reported("nvlink.fabric", g, "its fabric state (Fabric Manager running?)")]
        if g.fabric_state != "completed":
            detail = f"GPU{g.index} NVSwitch fabric state {g.fabric_state}, not completed"
            return [F.fail("nvlink.fabric", detail, gpu=g.index, value=g.fabric_state)]
        if g.fabric_status is None:
            return [not_reported("nvlink.fabric", g, "its fabric status")]
        if g.fabric_status != "success":
            detail = f"GPU{g.index} NVSwitch fabric status {g.fabric_status}, not success"
            return [F.fail("nvlink.fabric", detail, gpu=g.index, value=g.fabric_status)]
        return []

    return per_gpu("nvlink.fabric", facts, judge, "registered with the NVSwitch fabric")


def _unset(facts: Facts, ctx: Context, key: str) -> str:
    """Why the board gives no `key`: no profile fits the GPUs (and how to add one), or the
    picked profile leaves it null."""
    if ctx.expected.board is None:
        return (
            unknown_board([g.name for g in facts.gpus or () if g.name]) + f"; or set expect.{key}"
        )
    return f"board {ctx.expected.board} sets no {key}; set expect.{key}"


def _settled_by_board(
    check_id: str, facts: Facts, ctx: Context, want: object, unknown: str, has_none: str
) -> list[F.Finding] | None:
    """What settles a link check before any GPU is judged: no NVML facts, the board's count
    unknown (`unknown` says why), or a board without such links; None: judge the GPUs."""
    if facts.gpus is None:
        return nvml_missing(check_id, facts)
    if want is None:
        return [F.unknown(check_id, unknown)]
    if not want:
        return [F.ok(check_id, f"board {ctx.expected.board or '?'} has {has_none}")]
    return None

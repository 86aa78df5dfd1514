"""Network checks between the nodes of a multi-node job."""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.declare import RESEAT, TRANSIENT, check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.expect import Context
    from gpugate.checks.facts import Facts


@check("net.peers", action=RESEAT, fault=TRANSIENT)
def check_net_peers(facts: Facts, ctx: Context) -> list[F.Finding]:
    """Unfragmented pings to some of the job's nodes: no loss, average latency under the limit."""
    if facts.peers is None:
        return []  # not a multi-node prolog, or the probe is switched off: nothing to say
    cfg = ctx.config.prolog.peers
    out = []
    for p in facts.peers:
        pair = f"{p.prober or facts.node} -> {p.node}"  # a bad link shows on both of its ends
        if p.skipped:
            # A name this node cannot resolve, or no ping binary: nothing was sent, so nothing
            # is known about the link; the node is not at fault.
            out.append(F.warn("net.peers", f"{pair}: not probed, {p.skipped} ({p.error}); "
                              "not a link fault"))  # fmt: skip
            continue
        if p.error and not p.sent:
            out.append(
                F.fail(
                    "net.peers",
                    f"{pair}: no answer to unfragmented {cfg.packet_size}-byte pings ({p.error})",
                )
            )
            continue
        sent, received = p.sent or 0, p.received or 0
        loss = 100.0 * (sent - received) / sent if sent else 100.0
        if loss > cfg.max_loss_pct:
            out.append(
                F.fail(
                    "net.peers",
                    f"{pair}: {loss:.0f}% loss of {sent} unfragmented {cfg.packet_size}-byte pings"
                    + (f" ({p.error})" if p.error else ""),
                    value=loss,
                    limit=cfg.max_loss_pct,
                )
            )
        elif p.avg_ms is not None and p.avg_ms > cfg.max_avg_ms:
            out.append(
                F.fail(
                    "net.peers",
                    f"{pair}: average ping {p.avg_ms:.1f} ms > {cfg.max_avg_ms:g} ms",
                    value=p.avg_ms,
                    limit=cfg.max_avg_ms,
                )
            )
    if not out:
        names = ", ".join(p.node for p in facts.peers) or "none"
        me = next((p.prober for p in facts.peers if p.prober), facts.node)
        detail = f"{me} -> {names}: answer without loss under {cfg.max_avg_ms:g} ms"
        out.append(F.ok("net.peers", detail))
    return out  # fmt: skip

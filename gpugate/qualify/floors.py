"""The bandwidth floor a qualification test is judged against, and who says so.

The site's figure (config `qualify:`) wins; else the board profile's (`qualify_busbw_gbps`,
`qualify_h2d_gbps`, each cited in config/gpugate.yaml); else none, and the test is judged
against the median of the nodes qualified together only (pairs.judge_bandwidth).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import BoardProfile

TESTS = ("dcgm", "allreduce", "h2d", "pair")
BACKENDS = ("nccl", "gloo", None)


def floor_for(
    board: BoardProfile | None,
    test: str,
    backend: str | None,
    site_floor: float | None,
    *,
    board_name: str | None = None,
) -> tuple[float | None, str]:
    """(floor GB/s or None, where it comes from) for one test on one board."""
    if test not in TESTS:
        raise ValueError(f"floor_for: unknown test {test!r} (one of {', '.join(TESTS)})")
    if backend not in BACKENDS:
        raise ValueError(f"floor_for: unknown backend {backend!r} (nccl or gloo)")
    if site_floor is not None:
        if site_floor < 0:
            raise ValueError(f"floor_for: a floor cannot be negative ({site_floor})")
        return float(site_floor), "the site's qualify config"
    if test == "dcgm":
        return None, "dcgmi judges its own tests"
    named = f"board {board_name}" if board_name else "the board profile"
    if test == "pair":
        # Between nodes the bandwidth is the site's fabric (NICs, switches), not the board's.
        return None, "no floor between nodes (set qualify.pair_busbw_gbps): median only"
    if test == "allreduce" and backend != "nccl":
        # Board figures are NCCL over NVLink; gloo on the CPU is another order of magnitude.
        return None, "no floor for gloo (set qualify.gloo_busbw_gbps): median only"
    field = "qualify_busbw_gbps" if test == "allreduce" else "qualify_h2d_gbps"
    value = getattr(board, field, None) if board is not None else None
    if value is None:
        return None, f"{named} names no {field}: median only"
    return float(value), f"{named} {field}"

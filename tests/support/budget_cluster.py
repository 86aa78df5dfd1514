"""A partition for the drain budget: its nodes and the time the budget is asked at."""

from __future__ import annotations

from gpugate.slurm.records import NodeInfo

NOW = 1_800_000_000.0


def node(
    name: str, ours: bool = False, admin: bool = False, age_s: float = 60, parts: tuple = ("gpu",)
) -> NodeInfo:
    """A node of the partition: in service, drained by gpugate AGE_S ago (OURS) or by an admin."""
    if ours:
        return NodeInfo(name=name, state="IDLE", flags=("DRAIN",), reason="gpugate: gpu.ecc: x",
                        reason_time=int(NOW - age_s), partitions=parts)  # fmt: skip
    if admin:
        return NodeInfo(
            name=name, state="IDLE", flags=("DRAIN",), reason="fan swap", partitions=parts
        )
    return NodeInfo(name=name, state="IDLE", partitions=parts)


def cluster(n: int, ours: int = 0, admin: int = 0, **kw) -> dict[str, NodeInfo]:
    """N nodes, the first OURS drained by gpugate and the next ADMIN by an admin."""
    nodes = [
        node(f"n{i:02d}", ours=i < ours, admin=ours <= i < ours + admin, **kw) for i in range(n)
    ]
    return {x.name: x for x in nodes}

"""The drain budget: how many nodes gpugate may take out on its own (pure, no I/O).

Slurm itself is the shared state: the nodes drained now with a `gpugate:` reason, and when
each reason was set. One `scontrol show node` gives both, on any node, with no coordination.
"""

from __future__ import annotations

from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Budget
    from gpugate.slurm_hooks.slurm.records import NodeInfo


class BudgetVerdict(Record):
    """Whether one more gpugate drain fits, and why not."""

    allowed: bool
    why: str


def check_budget(nodes: dict[str, NodeInfo], node: str, cfg: Budget, now: float) -> BudgetVerdict:
    """May gpugate drain `node` now? Counts gpugate's current drains per partition and window."""
    ours = [n for n in nodes.values() if n.drained and n.gpugate_owned and n.name != node]
    me = nodes.get(node)
    for partition in me.partitions if me else ():
        members = [n for n in nodes.values() if partition in n.partitions]
        limit = max(cfg.min_drains_allowed, int(cfg.max_drained_share * len(members)))
        drained = sum(1 for n in ours if partition in n.partitions)
        if drained + 1 > limit:
            return BudgetVerdict(
                allowed=False,
                why=f"partition {partition}: gpugate already drained {drained} of {len(members)} nodes "
                f"(limit {limit}: {cfg.max_drained_share:.0%}, at least {cfg.min_drains_allowed})",
            )
    recent = sum(
        1 for n in ours if n.reason_time is not None and now - n.reason_time < cfg.window_s
    )
    if recent + 1 > cfg.max_drains_per_window:
        return BudgetVerdict(
            allowed=False,
            why=f"{recent} gpugate drains in the last {cfg.window_s:g} s (limit {cfg.max_drains_per_window})",
        )
    return BudgetVerdict(allowed=True, why="within the drain budget")


def keeps_drain(nodes: dict[str, NodeInfo], node: str, cfg: Budget, now: float) -> BudgetVerdict:
    """After draining: does `node` rank within the budget among gpugate's drains?

    Prologs on many nodes can check the budget in the same instant and all see room. So each
    drains, waits for the others, reads Slurm again and ranks gpugate's drains by (when set,
    node name): every node sees the same ranking, and exactly the first `limit` keep theirs.
    """
    ours = [n for n in nodes.values() if n.drained and n.gpugate_owned]
    order = sorted(
        ours, key=lambda n: (n.reason_time if n.reason_time is not None else float("inf"), n.name)
    )
    me = nodes.get(node)
    for partition in me.partitions if me else ():
        members = [n for n in nodes.values() if partition in n.partitions]
        limit = max(cfg.min_drains_allowed, int(cfg.max_drained_share * len(members)))
        ranked = [n.name for n in order if partition in n.partitions]
        if node in ranked and ranked.index(node) >= limit:
            return BudgetVerdict(allowed=False, why=f"partition {partition}: {len(ranked)} of {len(members)} nodes "
                                 f"drained by gpugate at once (limit {limit})")  # fmt: skip
    recent = [
        n.name for n in order if n.reason_time is not None and now - n.reason_time < cfg.window_s
    ]
    if node in recent and recent.index(node) >= cfg.max_drains_per_window:
        return BudgetVerdict(allowed=False, why=f"{len(recent)} gpugate drains in the last {cfg.window_s:g} s "
                             f"(limit {cfg.max_drains_per_window})")  # fmt: skip
    return BudgetVerdict(allowed=True, why="within the drain budget")

"""The drain budget: how many nodes gpugate may take out on its own (pure but for warn_daily).

Slurm itself is the shared state: the nodes drained now with a `gpugate:` reason, and when
each reason was set. One `scontrol show node` gives both, on any node, with no coordination.

Two limits per partition (docs/flow.md "The drain budget"):
- any check: `max_drained_share` of the partition, at least `min_drains_allowed` nodes;
- a check in `hardware_checks` (a fault that makes the node useless for any job: a GPU lost
  or off the bus, a reset or reboot Xid, uncorrectable ECC): at least
  `hardware_share` of the partition (rounded up), beyond the share never the last node
  in service.
  Such a node fails every job that lands on it, so keeping it in service saves no capacity;
  the budget is there to stop a gpugate bug or a fleet-wide false positive, and half the
  partition plus the cluster-wide `max_drains_per_window` still bound those.

Two pools (issue 41): a drain for a hardware fault (the check's `fault=HARDWARE` on its
`@check` line: a GPU off the bus, ECC, NVLink, PCIe, the fabric) counts only gpugate's hardware
drains (and its GPU isolations) against its limits and the window; a drain for a transient
fault (temperature, leftover processes, host memory, mounts) counts every gpugate drain. So
transient drains can never fill the budget a hardware fault needs, while hardware drains do
hold back transient ones; an unreadable drain reason counts as hardware (the cautious side).

The budget counts GPUs out of service (issue 31): a node gpugate drained counts 1 (whatever its
Comment says); a node in service with GPUs gpugate isolated (its Comment, gpugate/isolate/
comment.py) counts isolated / (isolated + the GPUs Slurm still gives it), or 1 when Slurm's
count is unknown (the cautious side). What gpugate holds out, in whole nodes (a part of a node
still serves), stays within the limit after the action: seven of eight GPUs isolated across a
partition still allow one drain, eight do not. Each isolation is one action against
`max_drains_per_window`, like a drain.
"""

from __future__ import annotations

import math
import os
import time

from gpugate import log
from gpugate.checks.registry import HARDWARE, fault_class
from gpugate.isolate.comment import parse_comment
from gpugate.record import Record
from gpugate.slurm.reasons import reason_check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Budget, Config
    from gpugate.slurm.records import NodeInfo

# Shares of nodes are summed as floats (fractions imports re: start-up, gpugate/startup.py);
# whole nodes are counted with this slack, so that 3 x 1/3 is one node, not 0.999...
_SLACK = 1e-9
WARN_EVERY_S = 86400  # warn_daily: a budget too small to act is logged once a day per node
WARN_STAMP = ".budget-warned"


class BudgetVerdict(Record):
    """Whether one more gpugate drain fits, and why not."""

    allowed: bool
    why: str


def hardware_drain(check: str | None) -> bool:
    """Whether a drain for `check` is a hardware fault's (the registry's `fault=` for it)."""
    return check is not None and fault_class(check) == HARDWARE


def counted(n: NodeInfo, hardware: bool) -> bool:
    """Whether gpugate's hold on `n` counts against a drain (`hardware`: for a hardware fault).

    A hardware drain counts only hardware drains (and isolations, which are a GPU's hardware
    fault); a transient one counts them all. A node not drained by gpugate holds nothing.
    """
    if not hardware or not n.drained:
        return True
    # A reason that names no known check (an older release's, hand-edited) is hardware.
    return fault_class(reason_check(n.reason)) == HARDWARE


def share_limit(cfg: Budget, members: int) -> int:
    """Drains allowed in a partition of `members` nodes for a check outside hardware_checks."""
    return max(cfg.min_drains_allowed, int(cfg.max_drained_share * members))


def partition_limit(cfg: Budget, members: list[NodeInfo], check: str | None) -> int:
    """Drains gpugate may hold in one partition for a drain of `check`."""
    limit = share_limit(cfg, len(members))
    if check is None or check not in cfg.hardware_checks:
        return limit
    # Ceiling of the share, without math: -(-a // b).
    hardware = max(limit, -int(-cfg.hardware_share * len(members) // 1))
    # Beyond the share, never the last node in service: nodes out for anyone (admin, down)
    # count as out. The share itself stands (a 1-node partition may still lose its node).
    foreign_out = sum(1 for n in members if n.drained and not n.gpugate_owned)
    return max(limit, min(hardware, len(members) - 1 - foreign_out))


def _limit_why(cfg: Budget, limit: int, check: str | None) -> str:
    if check is not None and check in cfg.hardware_checks:
        return (f"limit {limit}: {check} is a hardware check, {cfg.hardware_share:.0%} of the "
                "partition and one node left in service")  # fmt: skip
    return f"limit {limit}: {cfg.max_drained_share:.0%}, at least {cfg.min_drains_allowed}"


def held_out(info: NodeInfo, more: int = 0) -> float:
    """How much of node `info` gpugate holds out of service (0 to 1), with `more` GPUs isolated."""
    if info.drained:
        # Drained counts whole, whatever its Comment says; an admin's drain is not gpugate's.
        return 1.0 if info.gpugate_owned else 0.0
    before = len(parse_comment(info.comment))
    isolated = before + more
    if isolated <= 0:
        return 0.0
    if info.gres_gpus is None:
        return 1.0  # Slurm's count unknown: the share unknown, count the whole node
    # gres_gpus is what Slurm gives the node now: the GPUs still serving, isolated ones left out.
    return min(1.0, isolated / (before + info.gres_gpus))


def whole_nodes(share: float) -> int:
    """Whole nodes in a sum of nodes' shares (a part of a node still serves)."""
    return math.floor(share + _SLACK)


def check_budget(
    nodes: dict[str, NodeInfo], node: str, cfg: Budget, now: float, check: str | None = None
) -> BudgetVerdict:
    """May gpugate drain `node` (for `check`) now? Counts gpugate's drains per partition and window."""
    return _check(nodes, node, cfg, now, check, 1.0)


def _check(
    nodes: dict[str, NodeInfo],
    node: str,
    cfg: Budget,
    now: float,
    check: str | None,
    mine: float,
) -> BudgetVerdict:
    # `node` itself counts as `mine`, its share after the action (re-draining it is free). What
    # gpugate holds out is counted in whole nodes: a node with some GPUs isolated still serves.
    hardware = hardware_drain(check)
    others = [n for n in nodes.values() if n.name != node and counted(n, hardware)]
    me = nodes.get(node)
    for partition in me.partitions if me else ():
        members = [n for n in nodes.values() if partition in n.partitions]
        limit = partition_limit(cfg, members, check)
        held = [n for n in others if partition in n.partitions]
        if whole_nodes(sum(held_out(n) for n in held) + mine) > limit:
            return BudgetVerdict(
                allowed=False,
                why=f"partition {partition}: gpugate already {_held_why(held, len(members))} "
                f"({_limit_why(cfg, limit, check)})",
            )
    recent = sum(1 for n in others if _recent_drain(n, cfg, now))
    isolations = sum(_recent_isolations(n, cfg, now) for n in others)
    if recent + isolations + 1 > cfg.max_drains_per_window:
        also = f" and {isolations} GPU isolations" if isolations else ""
        kind = ", hardware faults' drains only" if hardware else ""
        return BudgetVerdict(
            allowed=False,
            why=f"{recent} gpugate drains{also} in the last {cfg.window_s:g} s "
            f"(limit {cfg.max_drains_per_window}{kind})",
        )
    return BudgetVerdict(allowed=True, why="within the drain budget")


def _recent_drain(n: NodeInfo, cfg: Budget, now: float) -> bool:
    return (
        n.drained
        and n.gpugate_owned
        and n.reason_time is not None
        and now - n.reason_time < cfg.window_s
    )


def _recent_isolations(n: NodeInfo, cfg: Budget, now: float) -> int:
    if n.drained:
        return 0  # a drained node counts once, as its drain
    return sum(1 for g in parse_comment(n.comment) if now - g.since < cfg.window_s)


def _held_why(held: list[NodeInfo], members: int) -> str:
    """`drained 2 of 20 nodes`, and the GPUs isolated on the others if any."""
    drained = sum(1 for n in held if n.drained and n.gpugate_owned)
    text = f"drained {drained} of {members} nodes"
    isolated = [n for n in held if not n.drained and n.comment and held_out(n)]
    if isolated:
        gpus = sum(len(parse_comment(n.comment)) for n in isolated)
        share = sum(held_out(n) for n in isolated)
        text += f" and isolated {gpus} GPUs on {len(isolated)} nodes ({float(share):.3g} of a node)"
    return text


def keeps_drain(
    nodes: dict[str, NodeInfo], node: str, cfg: Budget, now: float, check: str | None = None
) -> BudgetVerdict:
    """After draining: does `node` rank within the budget among gpugate's drains?

    Prologs on many nodes can check the budget in the same instant and all see room. So each
    drains, waits for the others, reads Slurm again and ranks gpugate's drains by (when set,
    node name): every node sees the same ranking, and exactly the first `limit` keep theirs.
    """
    hardware = hardware_drain(check)
    ours = [n for n in nodes.values() if n.drained and n.gpugate_owned and counted(n, hardware)]
    order = sorted(
        ours, key=lambda n: (n.reason_time if n.reason_time is not None else float("inf"), n.name)
    )
    me = nodes.get(node)
    for partition in me.partitions if me else ():
        members = [n for n in nodes.values() if partition in n.partitions]
        # Whole nodes' worth of isolated GPUs in service take their place in the ranking first.
        isolated = sum(held_out(n) for n in members if not n.drained)
        limit = partition_limit(cfg, members, check)
        ranked = [n.name for n in order if partition in n.partitions]
        if node in ranked and ranked.index(node) >= limit - whole_nodes(isolated):
            also = f" with {float(isolated):.3g} nodes' worth of GPUs isolated" if isolated else ""
            return BudgetVerdict(allowed=False, why=f"partition {partition}: {len(ranked)} of {len(members)} nodes "
                                 f"drained by gpugate at once{also} ({_limit_why(cfg, limit, check)})")  # fmt: skip
    recent = [
        n.name for n in order if n.reason_time is not None and now - n.reason_time < cfg.window_s
    ]
    if node in recent and recent.index(node) >= cfg.max_drains_per_window:
        return BudgetVerdict(allowed=False, why=f"{len(recent)} gpugate drains in the last {cfg.window_s:g} s "
                             f"(limit {cfg.max_drains_per_window})")  # fmt: skip
    return BudgetVerdict(allowed=True, why="within the drain budget")


def budget_warnings(cfg: Budget, nodes: dict[str, NodeInfo] | None = None) -> list[str]:
    """Why the budget cannot act: the settings (and, given Slurm's nodes, the partitions) that
    allow gpugate no drain at all; empty when it can drain somewhere."""
    out = []
    if cfg.max_drains_per_window < 1:
        out.append(f"budget.max_drains_per_window is {cfg.max_drains_per_window}: gpugate "
                   "will never drain a node")  # fmt: skip
    if nodes is None:
        if cfg.min_drains_allowed < 1 and cfg.max_drained_share > 0:
            smallest = -int(-1 // cfg.max_drained_share)
            out.append(f"budget.min_drains_allowed is 0: partitions under {smallest} nodes get "
                       "no drain for checks outside budget.hardware_checks")  # fmt: skip
        elif cfg.min_drains_allowed < 1:
            out.append("budget.min_drains_allowed and max_drained_share are 0: only "
                       "budget.hardware_checks can drain")  # fmt: skip
        return out
    parts: dict[str, list[NodeInfo]] = {}
    for n in nodes.values():
        for p in n.partitions:
            parts.setdefault(p, []).append(n)
    for p, members in sorted(parts.items()):
        if share_limit(cfg, len(members)) < 1:
            out.append(f"partition {p} ({len(members)} nodes): the drain budget allows 0 drains "
                       "for checks outside budget.hardware_checks")  # fmt: skip
    return out


def warn_daily(config: Config, nodes: dict[str, NodeInfo] | None = None) -> list[str]:
    """For the hooks: log budget_warnings() at most once a day per state directory (a stat on
    the other runs); the warnings logged now (empty when none, or already logged today)."""
    # The settings alone (at a hook's start, one stat) and with Slurm's partitions (when a
    # hook counts the budget) are warned about apart: the first must not silence the second.
    stamp = os.path.join(config.state_dir, WARN_STAMP + ("" if nodes is None else "-slurm"))
    try:
        if time.time() - os.stat(stamp).st_mtime < WARN_EVERY_S:
            return []
    except OSError:
        pass
    warnings = budget_warnings(config.budget, nodes)
    if not warnings:
        return []

    for w in warnings:
        log.error(config.state_dir, f"DRAIN BUDGET TOO SMALL TO ACT: {w}")
    try:
        with open(stamp, "w", encoding="utf-8") as fh:
            fh.write(f"{time.time():.0f}\n")
    except OSError:
        pass  # no stamp: warned again next run, which is louder, not wrong
    return warnings

"""The drain budget counts GPUs out of service: isolated GPUs as a share of their node (issue 31)."""

from __future__ import annotations

from factories import default_config

from gpugate.gate.budget import (
    check_budget,
    held_out,
    keeps_drain,
    whole_nodes,
)
from gpugate.isolate.comment import IsolatedGpu, format_comment
from gpugate.slurm.records import NodeInfo

NOW = 1_800_000_000
CFG = default_config().budget  # 10 % of a partition, at least 1 node; 10 per hour


def comment(*indices: int, age_s: int = 60) -> str:
    """The Comment of a node with these GPUs isolated `age_s` ago."""
    gpus = [
        IsolatedGpu(index=i, minor=i, serial=f"16500000000{i}", since=NOW - age_s, why="gpu.ecc")
        for i in indices
    ]
    return format_comment(gpus)


def serving(name: str, isolated: tuple[int, ...] = (), gpus: int | None = 8, **kw) -> NodeInfo:
    """A node in service; `gpus` is what Slurm gives it now (the isolated GPUs left out)."""
    count = None if gpus is None else gpus - len(isolated)
    return NodeInfo(name=name, state="IDLE", partitions=("gpu",), gres_gpus=count,
                    comment=comment(*isolated, **kw) if isolated else "")  # fmt: skip


def drained(name: str, reason: str = "gpugate: gpu.ecc: GPU3 x", **kw) -> NodeInfo:
    return NodeInfo(name=name, state="IDLE", flags=("DRAIN",), reason=reason,
                    reason_time=NOW - 60, partitions=("gpu",), gres_gpus=8, **kw)  # fmt: skip


def partition(*special: NodeInfo, size: int = 10) -> dict[str, NodeInfo]:
    """`size` nodes: `special`, and healthy ones named up to `x09` (unless special has it)."""
    taken = {n.name for n in special}
    free = [f"x{i:02d}" for i in range(size) if f"x{i:02d}" not in taken]
    nodes = list(special) + [serving(name) for name in free[len(free) - size + len(special) :]]
    assert len({n.name for n in nodes}) == size
    return {n.name: n for n in nodes}


def test_a_node_with_isolated_gpus_counts_as_their_share_of_it():
    assert held_out(serving("a")) == 0
    assert held_out(serving("a", (3,))) == 1 / 8  # 1 out, 7 still serving
    assert held_out(serving("a", (3, 5))) == 1 / 4
    assert held_out(serving("a", (3,)), more=1) == 1 / 4
    assert held_out(serving("a"), more=1) == 1 / 8
    assert held_out(serving("a", (3,), gpus=None)) == 1  # Slurm's count unknown: cautious
    assert held_out(serving("a", gpus=None)) == 0  # nothing isolated: nothing held


def test_sevenths_of_nodes_make_a_whole_node():
    # One GPU of each of seven 7-GPU nodes: the float sum is 0.9999999999999998, one node.
    sevenths = sum(held_out(serving(f"t{k}", (0,), gpus=7)) for k in range(7))
    assert sevenths < 1 and whole_nodes(sevenths) == 1
    assert whole_nodes(sevenths - 1 / 7) == 0
    nodes = partition(*(serving(f"t{k}", (0,), gpus=7) for k in range(7)))
    assert not check_budget(nodes, "x09", CFG, NOW).allowed


def test_a_drained_node_counts_whole_whatever_its_comment_says():
    assert held_out(drained("a", comment=comment(3))) == 1
    assert held_out(drained("a", comment=comment(1, 2, 3))) == 1
    # An admin's drain is not gpugate's, as before (its Comment changes nothing).
    assert held_out(drained("a", reason="fan swap", comment=comment(3))) == 0


def test_one_drained_node_blocks_a_second_drain():
    nodes = partition(drained("d0"))
    verdict = check_budget(nodes, "x09", CFG, NOW)
    assert not verdict.allowed and "already drained 1 of 10 nodes" in verdict.why
    assert check_budget(partition(), "x09", CFG, NOW).allowed


def test_seven_isolated_gpus_on_seven_nodes_still_allow_one_drain():
    nodes = partition(*(serving(f"i{k}", (k,)) for k in range(7)))  # 7 x 1/8 = 0.875 node
    assert check_budget(nodes, "x09", CFG, NOW).allowed


def test_eight_isolated_gpus_make_a_whole_node_and_block_a_drain():
    nodes = partition(*(serving(f"i{k}", (k,)) for k in range(8)))  # 8 x 1/8 = 1 node
    verdict = check_budget(nodes, "x09", CFG, NOW)
    assert not verdict.allowed
    assert "drained 0 of 10 nodes and isolated 8 GPUs on 8 nodes (1 of a node)" in verdict.why
    # The same eight on one node count the same: that node is all out.
    one = partition(serving("i0", (0, 1, 2, 3, 4, 5, 6, 7)))
    assert not check_budget(one, "x09", CFG, NOW).allowed


def test_isolated_gpus_with_an_unknown_count_block_as_a_whole_node():
    nodes = partition(serving("i0", (3,), gpus=None))
    assert not check_budget(nodes, "x09", CFG, NOW).allowed
    assert check_budget(partition(serving("i0", (3,))), "x09", CFG, NOW).allowed


def test_draining_a_node_replaces_its_own_isolated_share():
    # The node's 4 isolated GPUs become its whole drain; they are not counted twice.
    nodes = partition(serving("i0", (0, 1, 2, 3)), *(serving(f"j{k}", (k,)) for k in range(7)))
    assert check_budget(nodes, "i0", CFG, NOW).allowed  # 0.875 elsewhere + i0 whole
    assert not check_budget(nodes, "x09", CFG, NOW).allowed  # 0.5 + 0.875 elsewhere


def test_isolated_gpus_weigh_their_share_of_a_drain():
    # Limit 1 node. One drained and 0.75 isolated elsewhere: a drain makes 2.75, over.
    six = [serving(f"i{k}", (k,)) for k in range(6)]
    assert not check_budget(partition(drained("d0"), *six), "x09", CFG, NOW).allowed
    verdict = check_budget(partition(drained("d0")), "x09", CFG, NOW)
    assert not verdict.allowed and "drained 1 of 10 nodes" in verdict.why
    assert check_budget(partition(*six), "x09", CFG, NOW).allowed  # 0.75 + 1: one whole node


def test_isolations_count_against_the_window_like_drains():
    cfg = CFG.replace(max_drains_per_window=2, max_drained_share=1.0)
    nodes = partition(drained("d0"), serving("i1", (3,)))
    verdict = check_budget(nodes, "x09", cfg, NOW)
    assert not verdict.allowed
    assert "1 gpugate drains and 1 GPU isolations in the last 3600 s (limit 2)" in verdict.why
    # An isolation older than the window no longer counts, as an old drain does not.
    old = partition(drained("d0"), serving("i1", (3,), age_s=7200))
    assert check_budget(old, "x09", cfg, NOW).allowed
    # Each GPU is one action: two isolated on one node fill a window of 2.
    assert not check_budget(partition(serving("i1", (3, 5))), "x09", cfg, NOW).allowed


def test_after_draining_isolated_gpus_take_their_place_in_the_ranking():
    seven = [serving(f"i{k}", (k,)) for k in range(7)]
    assert keeps_drain(partition(drained("d0"), *seven), "d0", CFG, NOW).allowed
    eight = [serving(f"i{k}", (k,)) for k in range(8)]
    verdict = keeps_drain(partition(drained("d0"), *eight), "d0", CFG, NOW)
    assert not verdict.allowed and "1 nodes' worth of GPUs isolated" in verdict.why

"""Which node ran a rank: the job's nodelist and its tasks per node (Slurm's block layout).

Slurm places a step's tasks on its nodes in blocks by default (`--distribution=block`): the
first node's `SLURM_TASKS_PER_NODE` tasks get ranks 0..n-1, the next node the following ones.
`SLURM_TASKS_PER_NODE` is written `8(x4)` (8 on each of 4 nodes) or `2(x3),1`; torchrun's one
launcher per node with `--nproc-per-node 8` and `--node-rank $SLURM_NODEID` gives the same
layout. A cyclic or arbitrary distribution is not this one: callers pass a layout only where
they know it is the block one, and get None wherever the numbers do not add up.
"""

from __future__ import annotations

from gpugate.regex import lazy
from gpugate.slurm.hostlist import expand_lenient

_COUNT_RE = lazy(r"^\s*(\d+)(?:\(x(\d+)\))?\s*$")


def valid_spec(spec: str) -> bool:
    """Whether `spec` is a count or SLURM_TASKS_PER_NODE's form (`8(x4)`, `2(x3),1`)."""
    return all(_COUNT_RE.match(p) and int(p.strip().split("(")[0]) > 0 for p in spec.split(","))


def tasks_per_node(spec: str | int | None, nodes: int) -> list[int] | None:
    """Tasks on each of `nodes` nodes from `8(x4)`, `2(x3),1`, `8` (every node) or 8; None when
    the spec is malformed or names another number of nodes."""
    if spec is None or nodes <= 0:
        return None
    if isinstance(spec, int):
        return [spec] * nodes if spec > 0 else None
    counts: list[int] = []
    for part in spec.split(","):
        m = _COUNT_RE.match(part)
        if m is None:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if len(counts) == 1 and "(x" not in spec:
        counts *= nodes  # a bare number: the same on every node
    if len(counts) != nodes or any(c <= 0 for c in counts):
        return None
    return counts


def node_of_rank(
    rank: int | None, nodelist: str | list[str] | None, per_node: str | int | None
) -> str | None:
    """The node that ran global rank `rank` under a block layout, or None when unknown.

    `nodelist` is a Slurm hostlist (`gpu[01-04]`) or the expanded names, in the job's order;
    `per_node` is SLURM_TASKS_PER_NODE's form or one count. A job on one node needs no count.
    """
    if rank is None or rank < 0 or not nodelist:
        return None
    nodes = expand_lenient(nodelist) if isinstance(nodelist, str) else list(nodelist)
    if not nodes:
        return None
    if per_node is None:
        return nodes[0] if len(nodes) == 1 else None
    counts = tasks_per_node(per_node, len(nodes))
    if counts is None:
        return None
    first = 0
    for node, count in zip(nodes, counts):
        if rank < first + count:
            return node
        first += count
    return None  # a rank beyond the layout: not this job's, or another layout

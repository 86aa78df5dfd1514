"""Node classes: parts of the config overlaid on the nodes of one hostlist or partition.

One slurm.conf often holds several kinds of node (CPU-only beside 8-GPU, A100 beside H200,
4 or 8 fabric ports). The site file's `classes:` list says what differs per kind:

    classes:
      - nodes: "cpu[01-64]"          # a Slurm hostlist
        expect: {gpu_count: 0}
      - partitions: [inference]      # the job's partition (SLURM_JOB_PARTITION)
        expect: {ib_ports: 2, ib_rate_gbps: 200}
        checks: {gpu: {require_persistence_mode: true}}

Every class that matches this node (its name in `nodes`, or the job's partition in
`partitions`) is merged over the site config in the order listed; its other keys are any
keys of the config itself, validated like the site file's.
"""

from __future__ import annotations

import os

from gpugate.slurm.hostlist import HostlistError, hostlist_expand

SELECTORS = ("nodes", "partitions")


def split_classes(data: dict, source: str, error: type[Exception]) -> tuple[dict, list[dict]]:
    """`data` without its `classes:` key, and the classes (each checked for its selectors)."""
    classes = data.get("classes", [])
    if classes is None:
        classes = []
    if not isinstance(classes, list):
        raise error(f"{source}: classes: expected a list of node classes")
    for i, cls in enumerate(classes):
        where = f"{source}: classes[{i}]"
        if not isinstance(cls, dict):
            raise error(f"{where}: expected a mapping (nodes: or partitions:, then config keys)")
        if not any(k in cls for k in SELECTORS):
            raise error(f"{where}: names no nodes: hostlist nor partitions: list")
        _check_selectors(cls, where, error)
    return {k: v for k, v in data.items() if k != "classes"}, classes


def _check_selectors(cls: dict, where: str, error: type[Exception]) -> None:
    nodes, parts = cls.get("nodes"), cls.get("partitions")
    if "nodes" in cls:
        if not isinstance(nodes, str) or not nodes.strip():
            raise error(f'{where}.nodes: expected a Slurm hostlist such as "gpu[01-16]"')
        try:
            hostlist_expand(nodes)
        except HostlistError as exc:
            raise error(f"{where}.nodes: {exc}") from None
    if "partitions" in cls and (
        not isinstance(parts, list) or not all(isinstance(p, str) for p in parts)
    ):
        raise error(f"{where}.partitions: expected a list of partition names")


def overlay(cls: dict) -> dict:
    """The config keys of one class (without its selectors)."""
    return {k: v for k, v in cls.items() if k not in SELECTORS}


def matches(cls: dict, node: str | None, partition: str | None) -> bool:
    """Whether this node (or the job's partition) is in the class."""
    if node and "nodes" in cls and node in hostlist_expand(cls["nodes"]):
        return True
    wanted = cls.get("partitions") or ()
    return bool(partition) and any(p in wanted for p in partition.split(","))


def this_node() -> tuple[str, str | None]:
    """This node's Slurm name and, inside a job's hook, the job's partition(s)."""
    from gpugate.node import node_name

    return node_name(), os.environ.get("SLURM_JOB_PARTITION") or None

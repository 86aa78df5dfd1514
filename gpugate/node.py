"""This node's Slurm name."""

from __future__ import annotations

import os


def node_name() -> str:
    """`SLURMD_NODENAME` (set for Slurm hooks), else the short host name."""
    # os.uname() rather than socket.gethostname(): the same name, without importing socket.
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".", 1)[0]


def not_this_node(node: str, option: str = "") -> str:
    """Why `node` is not taken for this host, naming how to say that it is (`option`: the
    command's own, e.g. `--node`)."""
    here = node_name()
    also = f", or {option} {node}" if option else ""
    return (f"{node} is not this host's Slurm name ({here}: SLURMD_NODENAME, else the short "
            f"host name); where Slurm's NodeName is not the host name, set "
            f"SLURMD_NODENAME={node}{also}")  # fmt: skip


def node_hint(node: str, option: str = "--node") -> str:
    """The clause for an error about `node`'s files or Slurm record: where its name came from."""
    give = f"give {option} NAME or " if option else ""
    return (f"node {node} is SLURMD_NODENAME, else the short host name; where Slurm's NodeName "
            f"is not the host name, {give}set SLURMD_NODENAME=NAME")  # fmt: skip

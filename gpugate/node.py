"""This node's Slurm name."""

from __future__ import annotations

import os


def node_name() -> str:
    """`SLURMD_NODENAME` (set for Slurm hooks), else the short host name."""
    # os.uname() rather than socket.gethostname(): the same name, without importing socket.
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".", 1)[0]

"""This node's Slurm name."""

from __future__ import annotations

import os
import socket


def node_name() -> str:
    """`SLURMD_NODENAME` (set for Slurm hooks), else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]

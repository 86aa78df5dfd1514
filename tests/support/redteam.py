"""What the red-team end-to-end tests share: one node, a second ordinary user, the node in service.

The attacker is an ordinary user besides the cluster's job user (the victim): it plants files
where every user may write, before the victim's job runs.
"""

from __future__ import annotations

import os
import subprocess
import sys

from localslurm import LocalSlurm, ensure_user

NODE = "gpu-node-01"
ATTACKER = "gpugate-e2e-squat"  # a second ordinary user, besides the cluster's job user
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def as_user(name: str, code: str, *args: str) -> None:
    """Run Python `code` (argv: `args`) as the ordinary user `name`."""
    uid, gid = ensure_user(name)
    subprocess.run([PYTHON, "-c", code, *args], user=uid, group=gid, extra_groups=[],
                   cwd="/", check=True, timeout=30, capture_output=True)  # fmt: skip


def node_in_service(cluster: LocalSlurm) -> None:
    """The node is neither drained nor down."""
    state = cluster.node(NODE).get("State", "")
    assert not cluster.is_drained(NODE), f"{NODE} drained: {cluster.node(NODE)}"
    assert "DOWN" not in state and "FAIL" not in state, state

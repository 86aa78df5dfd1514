"""What the GPU isolation's end-to-end tests share: a node's fields read through a controller
that restarts (24.11's reconfigure), waits on them, gpugate run as root on a node, the isolate
events (tests/e2e/test_e2e_isolate.py on cgroup v1, test_e2e_isolate_v2.py on v2)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence

from e2e import Site  # first: it puts tests/slurm on the path
from localslurm import LocalSlurm, LocalSlurmError, state_flags

GPUS = 8
BAD = 3  # h100-ecc.yaml: GPU3 has uncorrectable ECC errors
ISOLATE_GPU = "isolate:\n  unit: gpu\n  settle_s: 60\n  wait_idle_s: 120\n"


def node_fields(cluster: LocalSlurm, node: str) -> dict[str, str]:
    """The node's fields, waiting out a controller that restarts."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return cluster.node(node)
        except (LocalSlurmError, subprocess.SubprocessError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wait_for(
    cluster: LocalSlurm, node: str, what: Callable[[dict[str, str]], bool], timeout: float = 120
) -> dict[str, str]:
    """Poll the node until `what(fields)`; the fields."""
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = node_fields(cluster, node)
        if what(fields):
            return fields
        time.sleep(0.5)
    raise AssertionError(f"{node} never got there: {fields}")


def gres(fields: dict[str, str]) -> str:
    """The node's Gres= without the socket list (`gpu:7`)."""
    return fields.get("Gres", "").split("(")[0]


def in_service(count: int) -> Callable[[dict[str, str]], bool]:
    """A `wait_for` test: the node counts `count` GPUs and is not drained."""
    return lambda f: gres(f) == f"gpu:{count}" and "DRAIN" not in state_flags(f["State"])


def gpugate(
    site: Site, cluster: LocalSlurm, *argv: str, node: str = "n1"
) -> subprocess.CompletedProcess[str]:
    """A gpugate command as root on `node` (SLURMD_NODENAME; its view of cgroups,
    LocalSlurm.on_node), against this cluster."""
    env = {**cluster.env(), "GPUGATE_CONFIG": str(site.config), "SLURMD_NODENAME": node,
           "GPUGATE_CACHE_DIR": str(site.base / "cache")}  # fmt: skip
    return subprocess.run(cluster.on_node([str(site.gpugate), *argv]), env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def fresh_start(cluster: LocalSlurm, nodes: Sequence[str]) -> None:
    """No job, every node in service (a test before may have left one drained)."""
    for job in cluster.queue():
        cluster.run(["scancel", str(job)], check=False)
    for node in nodes:
        if cluster.is_drained(node):
            cluster.resume(node)
    wait_for(cluster, nodes[0], lambda f: "DRAIN" not in state_flags(f["State"]), 30)


def isolate_events(site: Site) -> list[dict]:
    """The isolate events of the site (requested, applied, failed, restored)."""
    return [e for e in site.events() if e.get("hook") == "isolate"]

"""selftest: whether this site can take one GPU out of Slurm's service (issue 31).

`isolate.unit: gpu` only narrows a drain where every step is safe (gpugate/isolate/apply.py):
Slurm 24.11 or newer, jobs confined to their devices (TaskPlugin=task/cgroup,
ConstrainDevices=yes), the cgroup v1 devices controller, slurm.conf and gres.conf writable here
with explicit `File=` lines for this node. Elsewhere the hooks drain the node as before; this
says so before a fault does.
"""

from __future__ import annotations

from gpugate.admin.access import Problem
from gpugate.isolate.apply import route, site_problem
from gpugate.slurm.cli import CliBackend

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config

FIX = (
    "set isolate.unit: node (the node is drained on a GPU fault), or meet what "
    'docs/slurm-facts.md ("One GPU out of a node") lists'
)


def check_isolation(
    config: Config | None, slurm_conf: str | None, node: str
) -> tuple[str, list[Problem]]:
    """A note when isolation is off or possible here; the problem when it is asked for and
    cannot be done (the hooks then drain instead)."""
    isolate = getattr(config, "isolate", None)
    if config is None or isolate is None or isolate.unit != "gpu":
        return "isolate: node (a GPU fault drains the node)", []
    try:
        cli = CliBackend(config.slurm.timeout_s, slurm_conf=slurm_conf)
        why = site_problem(config, cli, node, slurm_conf)
    except Exception as exc:  # Slurm unreadable: said by the site's other checks
        why = f"{type(exc).__name__}: {exc}"
    if why:
        return "", [Problem(f"isolate.unit is gpu, but {node} cannot isolate a GPU: {why}; "
                            "its GPU faults drain the node", FIX)]  # fmt: skip
    return (f"isolate: gpu ({node} can take a faulty GPU out of Slurm's service, by "
            f"{route(config, node)})", [])  # fmt: skip

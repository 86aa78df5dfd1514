"""What Slurm tells its HealthCheckProgram, or lets it read: how long slurmd lets it run
(HealthCheckTimeout, Slurm 26.05) and the controller's in-service verdict
(SLURM_NODE_IS_HEALTHY, 26.05.2 with SlurmctldParameters=health_check_report). Read at
SchedMD/slurm tags slurm-22-05-8-1 to slurm-26-05-3-1 (docs/slurm-facts.md, "HealthCheckTimeout
and SLURM_NODE_IS_HEALTHY"); each used where present, the older path kept where not.
"""

from __future__ import annotations

from gpugate.record import Record
from gpugate.slurm.control import SlurmError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpugate.slurm.control import SlurmControl

# Before 26.05 slurmd gives the program a fixed 60 s: run_script_health_check()
# (src/slurmd/slurmd/slurmd.c) passes run_command() `.max_wait = 60 * 1000` (22.05.8, 24.11.5,
# 25.11.7). 26.05 passes `slurm_conf.health_check_timeout * 1000` (commit 74979c20b5, "Add
# configurable timeout for health check"): slurm.conf HealthCheckTimeout, default 60
# (DEFAULT_HEALTH_CHECK_TIMEOUT, src/common/read_config.h), 0 reset to it, at most 65535.
# Past it run_command kills the program's process group (_kill_pg, src/common/run_command.c:
# SIGTERM, 10 ms, SIGKILL); slurmd only logs it, the node's state is not changed.
FIXED_TIMEOUT_S = 60
MAX_TIMEOUT_S = 65535
# What the run keeps back below slurmd's limit to write its verdict and records, release its
# locks and exit (the fixed 60 s less the 55 s that health.deadline_s allowed before 26.05).
MARGIN_S = 5.0
FROM_SLURM_CONF = "HealthCheckTimeout"
FIXED = "fixed"

# slurmd sets it for the periodic run when slurmctld sent REQUEST_NODE_HEALTH_CHECK (26.05.2+
# with SlurmctldParameters=health_check_report; the default from 26.11): "yes", or "no" where
# the controller holds the node DOWN, DRAIN (draining or drained), FAIL or MAINT
# (_node_unhealthy_for_hc, src/slurmctld/ping_nodes.c); unset at slurmd's start-up run and on
# older Slurm (run_script_health_check, src/slurmd/slurmd/slurmd.c, commit fa567834c7).
NODE_IS_HEALTHY = "SLURM_NODE_IS_HEALTHY"


class HealthLimit(Record):
    """The time slurmd gives the health run, and the run's own budget below it."""

    timeout_s: int  # slurmd kills the program after this many seconds
    budget_s: float  # the run's own deadline (health.deadline_s, at most timeout_s less a margin)
    source: str  # FROM_SLURM_CONF (read from Slurm) or FIXED (older Slurm, or unread)


def parse_health_check_timeout(shown: str) -> int | None:
    """HealthCheckTimeout in seconds from `scontrol show config` (`HealthCheckTimeout = 60
    sec`: src/api/config_info.c); None where the line is absent (Slurm before 26.05)."""
    for line in shown.splitlines():
        name, eq, value = line.partition("=")
        if eq and name.strip() == FROM_SLURM_CONF:
            first = value.split()[0] if value.split() else ""
            if first.isdigit() and 0 < int(first) <= MAX_TIMEOUT_S:
                return int(first)
            return None
    return None


def read_health_check_timeout(slurm: SlurmControl) -> tuple[int | None, str]:
    """HealthCheckTimeout as Slurm's controller reports it (one `scontrol show config`), and
    why it is None when it is: "" where this Slurm has no such option."""
    try:
        shown = slurm.show_config()
    except SlurmError as exc:  # the adapter's bounded call failed: the fixed limit applies
        return None, f"cannot read HealthCheckTimeout ({exc})"
    return parse_health_check_timeout(shown), ""


def health_limit(deadline_s: float, timeout_s: int | None) -> HealthLimit:
    """The run's budget: `deadline_s` (health.deadline_s), at most slurmd's limit less a margin
    (MARGIN_S, at most half the limit); the fixed 60 s where `timeout_s` is None."""
    limit = timeout_s if timeout_s is not None else FIXED_TIMEOUT_S
    margin = min(MARGIN_S, limit / 2)
    source = FROM_SLURM_CONF if timeout_s is not None else FIXED
    return HealthLimit(timeout_s=limit, budget_s=min(deadline_s, limit - margin), source=source)


def node_is_healthy(environ: Mapping[str, str]) -> bool | None:
    """SLURM_NODE_IS_HEALTHY: True ("yes"), False ("no"), None (unset or another word)."""
    return {"yes": True, "no": False}.get(environ.get(NODE_IS_HEALTHY, ""))

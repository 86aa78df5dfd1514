"""Where the stores keep their files: the history's directory, the controller's, the
qualification metrics file (the lock list, locks.py, names them, below history and metrics)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config

QUALIFY_FILE = "gpugate-qualify.prom"  # beside admin.metrics_file
CHECKS_FILE = "gpugate-checks.prom"  # beside admin.metrics_file: `gpugate report`'s per-check rates
# Beside admin.metrics_file: `gpugate report`'s fleet reliability figures (admin/reliability.py).
RELIABILITY_FILE = "gpugate-reliability.prom"


def history_dir(config: Config) -> str:
    """Where the history and the audit log live: `admin.history_dir`, else `state_dir`."""
    return config.admin.history_dir or config.state_dir


CONTROLLER = "controller"  # <state_dir>/controller: the default controller_dir


def controller_dir(config: Config) -> str:
    """Where EpilogSlurmctld writes (events, votes, flags, locks, log): `controller_dir`, else
    `<state_dir>/controller` (the package makes it the SlurmUser's)."""
    return config.controller_dir or os.path.join(config.state_dir, CONTROLLER)


def read_dirs(config: Config) -> tuple[str, ...]:
    """Every directory whose history and events the readers merge: the history's, the controller's."""
    return tuple(dict.fromkeys((history_dir(config), controller_dir(config))))

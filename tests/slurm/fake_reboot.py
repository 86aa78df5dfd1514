#!/usr/bin/env python3
"""A test RebootProgram for LocalSlurm: the node "reboots" by its slurmd restarting with -b.

slurmd runs RebootProgram (slurm.conf(5)) and waits for it (system(3)); this program finds
the slurmd that started it (an ancestor whose command line is `slurmd ... -N NODE`), detaches,
returns at once, and from the background restarts that slurmd with `-b`: slurmd(8), "-b
Report node rebooted when daemon restarted. Used for testing purposes." slurmctld then sees
a new boot time, ends the reboot and applies `nextstate`. What it did goes to
`<base>/log/fake-reboot.log`. Stdlib only, like localslurm.py.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from localslurm import MARKER_VAR, LocalSlurm

PAUSE_S = 1.0  # a reboot is not instant: lets a test see the node REBOOT_ISSUED


def _parent(pid: int) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def slurmd_above(start: int) -> tuple[int, str] | None:
    """(pid, `-N NODE`) of the nearest slurmd among the ancestors of process `start`."""
    pid = start
    for _ in range(8):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if argv and os.path.basename(argv[0].decode()) == "slurmd" and b"-N" in argv:
            return pid, argv[argv.index(b"-N") + 1].decode()
        if pid <= 1:
            return None
        pid = _parent(pid)
    return None


def cluster_base(slurmd_pid: int) -> str | None:
    """The LocalSlurm base of that slurmd: ours if Slurm passed it on, else the slurmd's own.

    22.05 and 24.11 run RebootProgram with slurmd's environment (system(3)); 26.05 runs it as
    a power action with only SLURM_NODE_NAME (and LC_CTYPE) set, so the marker LocalSlurm
    gave slurmd is read from slurmd's /proc/PID/environ instead.
    """
    base = os.environ.get(MARKER_VAR)
    if base:
        return base
    try:
        environ = Path(f"/proc/{slurmd_pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{MARKER_VAR}=".encode()
    return next((v[len(prefix) :].decode() for v in environ if v.startswith(prefix)), None)


def main() -> int:
    """Detach and restart this node's slurmd with -b; exit 0 at once (slurmd waits)."""
    found = slurmd_above(os.getppid())
    base = cluster_base(found[0]) if found else None
    if not found or not base:
        sys.stderr.write(f"fake_reboot: no LocalSlurm slurmd above pid {os.getpid()}\n")
        return 1
    node = found[1]
    if os.fork():
        return 0
    os.setsid()  # out of slurmd's session: its shutdown must not take us with it
    if os.fork():
        os._exit(0)
    log = Path(base) / "log" / "fake-reboot.log"
    with open(log, "a") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    time.sleep(PAUSE_S)
    try:
        LocalSlurm.from_dir(base).restart_slurmd(node, booted=True)
        print(f"{time.time():.1f} fake_reboot: {node}: slurmd restarted with -b", flush=True)
    except Exception as exc:  # the log is all a test has to go on
        print(f"{time.time():.1f} fake_reboot: {node}: {type(exc).__name__}: {exc}", flush=True)
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

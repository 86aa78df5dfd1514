"""No `scontrol reconfigure` while slurmctld may run one of its own scripts.

On 24.11 `scontrol reconfigure` makes slurmctld shut down and exec itself again; on the way
down it unloads its priority plugin *before* it kills the PrologSlurmctld/EpilogSlurmctld
scripts still running (`main` in src/slurmctld/controller.c), and the killed script's
completion callback (`prep_epilog_slurmctld_callback` -> `cleanup_completing` ->
`batch_requeue_fini` -> `set_job_prio`) then calls into the unloaded plugin: SIGSEGV. Fixed
upstream in 25.05.7 and 25.11.4 (commit 34776eeb "Fix race: Unload priority plugin after
script callbacks complete", ticket 24566), never in 24.11. docs/slurm-facts.md ("Reconfigure
and the controller's scripts") has the references.

So every reconfigure gpugate issues waits, bounded, for a quiet controller (`reconfigure_slot`):
- one gpugate reconfigure at a time: a lock in the history directory (`<history_dir>/locks/
  reconfigure.lock`), held from the wait until the controller answers again, so the next one
  waits for the restart this one caused. It covers every host sharing that directory (a shared
  `admin.history_dir`, as the isolation's shared records want); with a node-local one, only
  this node. Reconfigures by admins or other tools are outside it: the quiet wait below sees
  their restart only as a controller that does not answer;
- no job anywhere CONFIGURING (PrologSlurmctld may run) or COMPLETING (EpilogSlurmctld may
  run), and squeue answering, for HOLD_S in a row.
What it cannot close: a job that starts or ends in the instant between the last quiet poll and
the reconfigure. The window is one squeue round trip instead of a whole script's run.
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager

from gpugate.fsutil import FileLock, lock_file
from gpugate.store.dirs import history_dir
from gpugate.store.locks import RECONFIGURE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Protocol

    from gpugate.config.schema import Config

    class ScriptJobs(Protocol):
        """The one Slurm question the wait asks (gpugate.slurm.cli.CliBackend)."""

        def script_jobs(self) -> list[tuple[str, str]]: ...


# Quiet this long in a row: an EpilogSlurmctld starts when the job's last node has run its
# Epilog, a moment after the node itself looks idle (what the isolation waited for).
HOLD_S = 3.0
# squeue filters states on its side (`_filter_job`, src/squeue/print.c): each poll loads the
# whole job list from slurmctld, so no faster than this.
POLL_S = 1.0
SHOWN = 5  # jobs named in the refusal


class ControllerBusy(RuntimeError):
    """No quiet controller within the wait, or no lock to wait with: no reconfigure issued."""


@contextmanager
def reconfigure_slot(config: Config, cli: ScriptJobs, timeout: float) -> Iterator[None]:
    """Hold the cluster's gpugate reconfigure lock and wait until the controller is quiet, at
    most `timeout` s in all; ControllerBusy (nothing issued) when either does not come."""
    deadline = time.monotonic() + timeout
    with ExitStack() as stack:
        try:
            path = lock_file(history_dir(config), RECONFIGURE)
            lock = stack.enter_context(FileLock(path, wait_s=timeout))
        except OSError as exc:  # no lock, no reconfigure: the caller's safe way out
            raise ControllerBusy(f"no gpugate reconfigure lock: {exc}") from exc
        if not lock.held:
            raise ControllerBusy(f"another gpugate reconfigure held {lock.path} for {timeout:g} s")
        wait_quiet(cli, deadline)
        yield


def wait_quiet(cli: ScriptJobs, deadline: float) -> None:
    """Until no job is CONFIGURING or COMPLETING anywhere for HOLD_S in a row (monotonic
    `deadline`); ControllerBusy, naming what it last saw, when that does not come."""
    quiet_since: float | None = None
    last = "nothing asked"
    while True:
        now = time.monotonic()
        try:
            jobs = cli.script_jobs()
        except Exception as exc:  # slurmctld restarting (someone's reconfigure) or away
            jobs, last = None, f"squeue: {type(exc).__name__}: {exc}"
        if jobs:
            last = busy_jobs(jobs)
        if jobs == []:
            quiet_since = now if quiet_since is None else quiet_since
            last = f"quiet for only {now - quiet_since:.1f} s"
            if now - quiet_since >= HOLD_S:
                return
        else:
            quiet_since = None
        if now >= deadline:
            raise ControllerBusy(f"slurmctld's scripts may run: {last}")
        time.sleep(max(0.0, min(POLL_S, deadline - now)))


def busy_jobs(jobs: list[tuple[str, str]]) -> str:
    """`job 14 COMPLETING, job 15 CONFIGURING (+3 more)`: the first few of `jobs`."""
    shown = ", ".join(f"job {job} {state}" for job, state in jobs[:SHOWN])
    more = len(jobs) - SHOWN
    return f"{shown} (+{more} more)" if more > 0 else shown

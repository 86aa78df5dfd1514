"""The thin subcommands: parse the arguments, call the code that does the work, print.

Shared here: the hooks' help and arguments, the cluster commands' options. Running a hook under
the guard is `guarded.py`, asking Slurm for one node or job `ask.py`: kept out of this package's
import, which a replayed `gpugate check` pays (gpugate/startup.py)."""

from __future__ import annotations

from gpugate.cli import make_parser, quick_options

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser, Namespace
    from types import SimpleNamespace


# What each Slurm hook does, for its `--help` (Slurm passes hooks no arguments).
HOOK_HELP: dict[str, str] = {
    "prolog": (
        "Slurm Prolog: run the checklist before the job starts; on failure drain "
        "the node with a `gpugate:` reason and exit 1 so Slurm requeues the job. Reads the job "
        "from Slurm's environment (SLURMD_NODENAME, SLURM_JOB_ID, SLURM_JOB_GPUS, ...)."
    ),
    "task-prolog": (
        "Slurm TaskProlog: print `export NAME=value` lines (NCCL_DEBUG=WARN, "
        "NCCL_IB_TIMEOUT=22 with NCCL_IB_RETRY_CNT=7, NCCL_DEBUG_FILE, async error handling) "
        "for every variable the job did not set itself."
    ),
    "epilog": (
        "Slurm Epilog: after an abnormal end (exit code, signal, failed step, fresh kernel-log "
        "errors) write an evidence bundle, name the cause, and drain the node when its own "
        "evidence shows a hardware fault. Always exits 0: a failing epilog would make Slurm "
        "drain the node with a meaningless 'Epilog error'."
    ),
    "epilog-slurmctld": (
        "Slurm EpilogSlurmctld (runs once per job on the controller): when a job that opted in "
        "(--comment gpugate:ckpt=DIR or gpugate:requeue) ended through an infrastructure cause "
        "and has restarts left, requeue it off the suspected nodes and record the checkpoint it "
        "resumes from. Always exits 0."
    ),
    "health": (
        "Slurm HealthCheckProgram (slurm.conf HealthCheckProgram=/usr/libexec/gpugate/"
        "gpugate-health): run the checklist between jobs within health.deadline_s; drain a "
        "failing node as the prolog does (same reasons, budget, never an admin's drain); skip "
        "what running jobs change on their GPUs; lift gpugate's own transient drains after "
        "health.heal_after_passes passing runs, hardware drains only after a reboot and a "
        "passing checklist (audited like `gpugate resume`). Always exits 0. `--dry-run "
        "[--node NAME]`: decide as it would now and print the plan; nothing is changed."
    ),
}


# Every hook honours it; `gpugate selftest` runs each hook wrapper so.
SELFTEST_HELP = (
    " With GPUGATE_SELFTEST=1 (`gpugate selftest`) it only loads its config and says so on "
    "stderr: nothing checked, drained, written or requeued."
)


def hook_args(hook: str, argv: list[str]) -> Namespace | SimpleNamespace:
    """A Slurm hook's arguments: only `--config FILE`."""
    quick = quick_options(argv, values=("--config",))
    if quick is not None:
        return quick
    p = make_parser(f"gpugate {hook}", HOOK_HELP[hook] + SELFTEST_HELP)
    p.add_argument("--config", metavar="FILE", help="site config")
    return p.parse_args(argv)


def add_cluster_options(p: ArgumentParser, window: str) -> None:
    """`--sinfo-json FILE`, `--window-days DAYS` (`window`: what it counts) and `--config`."""
    p.add_argument("--sinfo-json", metavar="FILE", help="read this saved `sinfo --json` output")
    p.add_argument("--window-days", type=float, metavar="DAYS",
                   help=f"{window} (default: admin.history_window_days)")  # fmt: skip
    p.add_argument("--config", metavar="FILE", help="site config")

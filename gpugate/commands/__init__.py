"""The thin subcommands: parse the arguments, call the code that does the work, print."""

from __future__ import annotations

import os
import sys

from gpugate import log, names
from gpugate.cli import EXIT_USAGE, make_parser, quick_options
from gpugate.config import load_config
from gpugate.gate.guard import run_hook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser, Namespace
    from collections.abc import Callable, Iterable
    from typing import Any, TypeVar

    _T = TypeVar("_T")
    from types import SimpleNamespace

    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl


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
        "passing checklist (audited like `gpugate resume`). Always exits 0."
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


def run_hook_command(hook: str, argv: list[str], body: Callable[[Config], int]) -> int:
    """Parse a hook's arguments and run `body` under the hook guard; the exit code for Slurm."""
    args = hook_args(hook, argv)
    if selftest_mode():
        return selftest_dry_run(hook, args.config)
    code = run_hook(hook, args.config, body)
    # Only the prolog may fail: Slurm drains a node whose epilog fails ("Epilog error").
    return code if hook == "prolog" else 0


def selftest_mode() -> bool:
    """GPUGATE_SELFTEST=1: `gpugate selftest` runs the hook, which must take no action."""

    return os.environ.get("GPUGATE_SELFTEST") == "1"


def selftest_dry_run(hook: str, config_path: str | None) -> int:
    """Load the config and say so on stderr (never stdout: the TaskProlog's is the job's)."""

    try:
        config = load_config(config_path)
    except Exception as exc:  # the selftest reports it; no job depends on this run
        print(f"gpugate {hook}: selftest: config unusable: {exc}", file=sys.stderr)
        return 2
    print(f"gpugate {hook}: selftest ok (state_dir {config.state_dir}); no action taken",
          file=sys.stderr)  # fmt: skip
    return 0


def each_on_its_own(
    hook: str, steps: Iterable[Callable[..., Any]], kept: str, *args: object
) -> None:
    """Run a hook's bookkeeping steps: one that raises is one line in slurmd's log, the rest run."""
    for step in steps:
        try:
            step(*args)
        except Exception as exc:  # MemoryError and RecursionError included: bookkeeping only
            log.say(f"{hook}: {step.__name__} failed ({type(exc).__name__}: {exc}); {kept} kept")


def add_cluster_options(p: ArgumentParser, window: str) -> None:
    """`--sinfo-json FILE`, `--window-days DAYS` (`window`: what it counts) and `--config`."""
    p.add_argument("--sinfo-json", metavar="FILE", help="read this saved `sinfo --json` output")
    p.add_argument("--window-days", type=float, metavar="DAYS",
                   help=f"{window} (default: admin.history_window_days)")  # fmt: skip
    p.add_argument("--config", metavar="FILE", help="site config")


def ask_slurm_for(
    prog: str,
    kind: str,
    ident: str,
    config_file: str | None,
    read: Callable[[SlurmControl, str], _T],
) -> tuple[Config, SlurmControl, _T] | int:
    """(config, the Slurm backend, `read(backend, ident)`: Slurm's record of the node or job),
    or the exit code after one line: 2 when `ident` is not one node name / job id, 1 when Slurm
    cannot say."""
    # Late: the Slurm adapter is for the commands that ask Slurm; a replayed check, which
    # shares this package, never does (gpugate/startup.py).
    from gpugate.slurm.choose import backend
    from gpugate.slurm.control import JobNotFound, NodeNotFound, SlurmError

    try:
        (names.node_name if kind == "node" else names.job_id)(ident)
    except names.BadName as exc:
        return names.refuse(prog, exc, EXIT_USAGE)
    config = load_config(config_file)
    slurm: SlurmControl | None = None

    def fetch() -> _T:
        nonlocal slurm
        slurm = backend(config.slurm.backend, timeout=config.slurm.timeout_s)
        return read(slurm, ident)

    not_found = NodeNotFound if kind == "node" else JobNotFound
    info, code = names.ask_slurm(
        prog, f"{kind} {ident}", fetch, not_found, (SlurmError, ValueError)
    )
    if code is not None:
        return code
    # fetch() returned: both are set
    assert slurm is not None and info is not None
    return config, slurm, info

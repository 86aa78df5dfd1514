"""Running a Slurm hook: its arguments, the selftest dry run, the hook guard, its bookkeeping."""

from __future__ import annotations

import os
import sys

from gpugate import log
from gpugate.commands import hook_args
from gpugate.config import load_config
from gpugate.gate.guard import run_hook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from gpugate.checks.facts import Facts
    from gpugate.config.schema import Config


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


# The hooks that gather this node's facts (the TaskProlog and EpilogSlurmctld read none).
GATHERING = ("prolog", "epilog", "health")


def selftest_dry_run(hook: str, config_path: str | None) -> int:
    """Load the config, gather the facts as the hook would, say what failed on stderr (never
    stdout: the TaskProlog's is the job's); exit 0 only when the real hook could check."""

    try:
        config = load_config(config_path)
    except Exception as exc:  # the selftest reports it; no job depends on this run
        print(f"gpugate {hook}: selftest: config unusable: {exc}", file=sys.stderr)
        return 2
    problem = facts_problem(config) if hook in GATHERING else None
    if problem:
        print(f"gpugate {hook}: selftest: {problem}", file=sys.stderr)
        return 1
    print(f"gpugate {hook}: selftest ok (state_dir {config.state_dir}); no action taken",
          file=sys.stderr)  # fmt: skip
    return 0


def facts_problem(config: Config, gather: Callable[..., Facts] | None = None) -> str | None:
    """Why this node's facts cannot be gathered as the prolog gathers them, or None.

    A replayed facts_file that is missing makes the real prolog fail inside gpugate, which
    (prolog.on_error: allow) lets every job run unchecked; a failed source leaves its checks
    "unknown" (a warning by default): both look like "ok" unless gathered here. `gather`: as
    gpugate.checks.sources.gather (None: that one)."""
    from gpugate.checks import sources
    from gpugate.checks.sources import replay_path
    from gpugate.node import node_name

    collect = gather or sources.gather
    node = node_name()  # SLURMD_NODENAME, as slurmd gives the hooks (selftest passes it)
    try:
        facts = collect(config, node, deadline_s=config.prolog.deadline_s)
    except Exception as exc:  # exactly what would end the real prolog as an internal error
        where = replay_path(config, node)
        source = f"facts_file {where}" if where else "the facts"
        return (f"cannot gather node {node}'s facts ({source}: {type(exc).__name__}: {exc}); "
                "the real hook would fail and let every job run unchecked "
                "(SLURMD_NODENAME or selftest --node must be Slurm's name of this node)")  # fmt: skip
    failed = sorted((facts.source_errors or {}).items())
    if failed:
        said = "; ".join(f"{name}: {why}" for name, why in failed)
        return (f"facts source(s) failed on node {node} ({said}); their checks would say "
                "unknown and jobs run unchecked by them")  # fmt: skip
    return None


def each_on_its_own(
    hook: str, steps: Iterable[Callable[..., Any]], kept: str, *args: object
) -> None:
    """Run a hook's bookkeeping steps: one that raises is one line in slurmd's log, the rest run."""
    for step in steps:
        try:
            step(*args)
        except Exception as exc:  # MemoryError and RecursionError included: bookkeeping only
            log.say(f"{hook}: {step.__name__} failed ({type(exc).__name__}: {exc}); {kept} kept")

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

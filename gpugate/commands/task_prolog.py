"""`gpugate task-prolog`: the Slurm TaskProlog entry point."""

from __future__ import annotations

import os
import sys

from gpugate import log
from gpugate.commands import hook_args
from gpugate.commands.guarded import selftest_dry_run, selftest_mode
from gpugate.config import load_config_for_hook
from gpugate.hooks.task_prolog import exports, render


def main(argv: list[str]) -> int:
    """Run the task prolog; it never fails a job step."""
    args = hook_args("task-prolog", argv)
    if selftest_mode():
        return selftest_dry_run("task-prolog", args.config)

    try:
        # As the other hooks: a refused site key is said and left out, the exports still made.
        config, problems = load_config_for_hook(args.config)
        for problem in problems:
            log.alarm(f"task-prolog: config: {problem}")
        if not config.task_prolog.enabled:
            return 0
        job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
        out = render(exports(config, dict(os.environ), job_id))
        # A path that is not UTF-8 reached us as lone surrogates (surrogateescape): write its
        # original bytes back, as slurmstepd will setenv() them, instead of failing the write.
        buffer = getattr(sys.stdout, "buffer", None)
        if buffer is None:
            sys.stdout.write(out.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
        else:
            sys.stdout.flush()
            buffer.write(out.encode("utf-8", "surrogateescape"))
            buffer.flush()
    except Exception as exc:  # a job step must never fail because of us
        log.say(f"task-prolog: {type(exc).__name__}: {exc}")
    return 0

"""Run a hook so that gpugate's own failure has one documented outcome.

Default: the job runs and the node stays in service; the error is logged and counted. A bug in
gpugate must never look to Slurm like a failed prolog (which would drain the node and hold the
job) unless the site asked for that (`prolog.on_error: refuse`).
"""

from __future__ import annotations

import os
import time

from gpugate import log
from gpugate.config import load_config_for_hook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.config.schema import Config


# Where a hook logs when its config cannot be loaded (so state_dir is unknown): the packaged
# default, unless GPUGATE_FALLBACK_STATE_DIR names another (tests: never the host's).
FALLBACK_STATE_DIR = "/var/lib/gpugate"
FALLBACK_ENV = "GPUGATE_FALLBACK_STATE_DIR"


def fallback_state_dir() -> str:
    """The state directory a hook with an unusable config logs to."""

    return os.environ.get(FALLBACK_ENV) or FALLBACK_STATE_DIR


# No world bits on anything a hook creates, including what libraries create without asking
# for a mode (loguru's rotated logs, temporary files): state can quote users' files.
HOOK_UMASK = 0o027


def run_hook(hook: str, config_path: str | None, body: Callable[[Config], int]) -> int:
    """Load the config and run `body`; map any failure of gpugate itself to the set outcome."""

    old_umask = os.umask(HOOK_UMASK)
    try:
        return _run(hook, config_path, body)
    finally:
        os.umask(old_umask)


def _run(hook: str, config_path: str | None, body: Callable[[Config], int]) -> int:
    started = time.monotonic()
    try:
        # A refused site file gates with what of it is valid and the packaged defaults, and
        # says so on every run (config.load_config_for_hook says why not fail closed).
        config, problems = load_config_for_hook(config_path)
    except BaseException as exc:
        # Only a broken install (the packaged defaults themselves unusable) gets here.
        state_dir = fallback_state_dir()
        log.error(state_dir, f"{hook}: CONFIGURATION UNUSABLE, NOT GATING: job allowed "
                  "unchecked; reinstall gpugate and run `gpugate config check`", exc)  # fmt: skip
        log.event(state_dir, hook, outcome="internal_error", error=str(exc)[:500])
        return 0
    for problem in problems:
        log.alarm(f"{hook}: config: {problem}")
    # The controller (SlurmUser) writes only its own directory; the node hooks their state_dir.
    where = config.state_dir
    if hook == "epilog-slurmctld":
        from gpugate.store.history import controller_dir

        where = controller_dir(config)
    else:
        _secure(config)
    try:
        return body(config)
    except BaseException as exc:
        code = 1 if config.prolog.on_error == "refuse" and hook == "prolog" else 0
        log.error(where, f"{hook}: internal error (exit {code} per prolog.on_error)", exc)
        log.event(where, hook, outcome="internal_error", error=f"{type(exc).__name__}: {exc}"[:500],
                  duration_s=round(time.monotonic() - started, 3))  # fmt: skip
        _count_internal_error(config, hook)
        return code


def _secure(config: Config) -> None:
    """The state directory's modes and group (best effort: it must not change the decision)."""
    try:
        from gpugate.store.state import secure_state_dir

        for problem in secure_state_dir(config):
            log.say(problem)
    except Exception as exc:
        log.say(f"could not check the state directory's permissions: {exc}")


def _count_internal_error(config: Config, hook: str) -> None:
    try:
        from gpugate.node import node_name
        from gpugate.store.metrics import note_run

        note_run(config, node_name(), hook, internal_error=True)
    except Exception:  # the metrics module itself may be what broke
        pass

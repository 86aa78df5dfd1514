"""Logging for the hooks: a cheap event line on every run, loguru for errors.

Every hook run appends one JSON line to `<state_dir>/events.jsonl` (the drain history and
metrics read it) and prints one line to stderr, which slurmd writes to its log. Errors with
their tracebacks go through loguru to `<state_dir>/gpugate.log` (rotated); loguru is imported
only then, because importing it costs more than a healthy prolog's whole checklist.
"""

from __future__ import annotations

import json
import os
import sys
import time

_EVENTS = "events.jsonl"
_LOG = "gpugate.log"


def event(state_dir: str | None, hook: str, **fields: object) -> None:
    """Record one hook run (best effort: logging must never fail a hook)."""
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "hook": hook}
    record.update(fields)
    line = json.dumps(record, default=str, separators=(",", ":")) + "\n"
    if not state_dir:
        return
    try:
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
        fd = os.open(
            os.path.join(state_dir, _EVENTS),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
            0o644,
        )
        try:
            os.write(
                fd, line.encode()
            )  # one write() with O_APPEND: concurrent hooks don't interleave
        finally:
            os.close(fd)
    except OSError:
        pass


def say(message: str) -> None:
    """One line for slurmd's log (a hook's stderr ends up there)."""
    try:
        sys.stderr.write(f"gpugate: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def error(state_dir: str | None, message: str, exc: BaseException | None = None) -> None:
    """Log an error with its traceback to the rotated log file and a line to stderr."""
    say(message if exc is None else f"{message}: {type(exc).__name__}: {exc}")
    if not state_dir:
        return
    try:
        from loguru import logger

        logger.remove()
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
        logger.add(os.path.join(state_dir, _LOG), rotation="10 MB", retention=5, level="INFO")
        if exc is not None:
            logger.opt(exception=exc).error(message)
        else:
            logger.error(message)
        logger.remove()
    except Exception:  # a broken log must not turn into a failed prolog
        pass

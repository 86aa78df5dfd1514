"""Logging for the hooks: a cheap event line on every run, loguru for errors.

Every hook run appends one JSON line to `<state_dir>/events.jsonl` (the drain history and
metrics read it) and prints one line to stderr, which slurmd writes to its log. Errors with
their tracebacks go through loguru to `<state_dir>/gpugate.log` (rotated); loguru is imported
only then, because importing it costs more than a healthy prolog's whole checklist.

Both files are root's and the admin group's only (0640, see fsutil): an error can quote a
user's file or path. The traceback is a plain one: loguru's `diagnose` would print the value
of every local variable of every frame (a user's log line, a token in an environment copy).
"""

from __future__ import annotations

import os
import sys

from gpugate.clock import utc
from gpugate.fsutil import STATE_DIR_MODE, open_private, private_dir
from gpugate.jsonrecord import JsonRecord
from gpugate.slurm.reasons import drill_mark

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar

_EVENTS = "events.jsonl"
_LOG = "gpugate.log"


class Event(JsonRecord):
    """One line of events.jsonl: when, which hook, and that hook's own fields (in `extra`:
    each hook says what it did in its own words, e.g. the prolog's `status` and `action`)."""

    time: str
    hook: str

    _doc: ClassVar[dict[str, str]] = {
        "time": "UTC, when the hook wrote it",
        "hook": "`prolog`, `epilog`, `health`, `epilog-slurmctld`, `vote`, `suspect`, "
        "`repair`, `qualify`, ...; the hook's own fields follow, and `drill` (its id) last "
        "for a run under a fault drill's overlay",
    }

    @property
    def drill(self) -> str | None:
        """The fault drill this run was under, or None."""
        drill = self.extra.get("drill")
        return drill if isinstance(drill, str) and drill else None


def event(state_dir: str | None, hook: str, **fields: object) -> None:
    """Record one hook run (best effort: logging must never fail a hook)."""
    if drill_mark():  # a run under a drill's overlay says so (gpugate/drill/__init__.py)
        fields["drill"] = drill_mark()
    record = Event(time=utc(), hook=hook, extra=fields)
    if not state_dir:
        return

    from gpugate.jsonl import append  # late: JSON is for runs that record (gpugate/startup.py)

    path = os.path.join(state_dir, _EVENTS)
    try:
        try:
            append(path, [record.to_json()])
        except FileNotFoundError:  # the first run on this node
            _ensure_state_dir(state_dir)
            append(path, [record.to_json()])
    except (OSError, ValueError):  # ValueError: a NUL in the configured path
        pass


def read_events(state_dir: str, hook: str | None = None) -> list[Event]:
    """The events of `state_dir` (of one hook, or all), oldest first: the newest 32 MiB, a
    line that is no event (torn, foreign, of the wrong types) skipped. Raises OSError."""
    from gpugate.jsonl import parse, read_tail  # late, as event()'s

    data, _ = read_tail(os.path.join(state_dir, _EVENTS))
    out = []
    for line in parse(data):
        try:
            e = Event.from_json(line, _EVENTS)
        except ValueError:
            continue
        if hook is None or e.hook == hook:
            out.append(e)
    return out


def _ensure_state_dir(state_dir: str) -> None:
    private_dir(state_dir, STATE_DIR_MODE, gid=-1)  # its group is set by secure_state_dir


def say(message: str) -> None:
    """One line for slurmd's log (a hook's stderr ends up there)."""
    try:
        sys.stderr.write(f"gpugate: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def alarm(message: str) -> None:
    """A line that must reach an admin on every run: stderr and syslog (LOG_WARNING).

    slurmd logs a Prolog's or Epilog's stderr only when it fails (or at SlurmdDebug=debug and
    above: 22.05 at info showed nothing of a passing prolog's), so a hook that gates on with a
    refused or migrated config says so to syslog too, where journald and log shippers keep it.
    """
    say(message)
    try:
        import syslog  # late: only a hook with something to alarm about

        syslog.openlog("gpugate", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING, message)
    except (OSError, ValueError):  # ValueError: a NUL in the message
        pass


def error(state_dir: str | None, message: str, exc: BaseException | None = None) -> None:
    """Log an error with its traceback to the rotated log file and a line to stderr."""
    say(message if exc is None else f"{message}: {type(exc).__name__}: {exc}")
    if not state_dir:
        return
    try:
        from loguru import logger

        logger.remove()
        if not os.path.isdir(state_dir):
            _ensure_state_dir(state_dir)
        # diagnose/backtrace off: no frame locals, no frames above the catch (user data can be
        # in any of them). catch off: a failing sink raises here, into the except below, instead
        # of loguru printing the record and its own traceback to slurmd's log.
        logger.add(
            os.path.join(state_dir, _LOG),
            rotation="10 MB",
            retention=5,
            level="INFO",
            diagnose=False,
            backtrace=False,
            catch=False,
            opener=lambda path, flags: open_private(path, flags),
        )
        try:
            if exc is not None:
                logger.opt(exception=exc).error(message)
            else:
                logger.error(message)
        finally:
            logger.remove()  # closes the file, also after a failed write (a full disk)
    except Exception:  # a broken log must not turn into a failed prolog
        pass

"""The one way gpugate runs a command: an argument list, a timeout, the outcome told apart.

Never a shell string. The command runs in its own session so that on timeout the whole process
group is killed, not just the leader (a hung `scontrol` can leave children behind). "missing",
"timeout", "killed" (by a signal) and "nonzero" are distinct outcomes, each with the output
that was captured.
"""

from __future__ import annotations

import os
import signal

from gpugate.record import Record

# Hooks get no PATH from slurmd; these are where scontrol, dmesg, ping and friends live.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

OK, MISSING, TIMEOUT, KILLED, NONZERO = "ok", "missing", "timeout", "killed", "nonzero"


class CommandResult(Record):
    """What happened to one command."""

    argv: tuple[str, ...]
    status: str  # ok / missing / timeout / killed / nonzero
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the command ran and exited 0."""
        return self.status == OK

    def describe(self) -> str:
        """One line for logs and error messages."""
        what = " ".join(self.argv)
        detail = {
            OK: "ok",
            MISSING: "command not found",
            TIMEOUT: f"timed out after {self.duration_s:.1f} s",
            KILLED: f"killed by signal {-(self.returncode or 0)}",
            NONZERO: f"exit {self.returncode}",
        }[self.status]
        err = self.stderr.strip().splitlines()[-1:] if self.stderr else []
        return f"{what}: {detail}" + (f": {err[0][:200]}" if err else "")


class CommandError(RuntimeError):
    """A command that had to succeed did not; carries the result."""

    def __init__(self, result: CommandResult) -> None:
        super().__init__(result.describe())
        self.result = result


def command_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with a usable PATH, plus `extra`."""
    env = dict(os.environ)
    path = env.get("PATH")
    env["PATH"] = f"{path}:{SAFE_PATH}" if path else SAFE_PATH
    env.setdefault("LC_ALL", "C")  # stable, parseable output from the tools we read
    if extra:
        env.update(extra)
    return env


def run(
    argv: list[str] | tuple[str, ...],
    timeout: float,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> CommandResult:
    """Run `argv` (through `sh`) with a timeout; never raises for the command's own failure."""
    import time

    import sh

    argv = tuple(str(a) for a in argv)
    started = time.monotonic()
    full_env = command_env(env)

    def result(status: str, rc: int | None, out: str = "", err: str = "") -> CommandResult:
        took = time.monotonic() - started
        return CommandResult(argv=argv, status=status, returncode=rc, stdout=out, stderr=err,
                             duration_s=took)  # fmt: skip

    try:
        program = sh.Command(argv[0], search_paths=full_env["PATH"].split(":"))
    except sh.CommandNotFound:
        return result(MISSING, None)
    proc = program(
        *argv[1:],
        _bg=True,
        _bg_exc=False,
        _new_session=True,  # our own process group, killed whole on timeout
        _tty_out=False,  # pipes, not a pty: no line discipline mangling, no controlling tty
        _env=full_env,
        _in=stdin,
        # Every exit code and signal is an outcome we report, not an exception sh raises.
        _ok_code=list(range(-64, 256)),
        _decode_errors="replace",
    )
    try:
        proc.wait(timeout=timeout)
    except sh.TimeoutException:
        _kill_group(proc)
        return result(TIMEOUT, None, _text(proc, "stdout"), _text(proc, "stderr"))
    rc = proc.exit_code
    out, err = _text(proc, "stdout"), _text(proc, "stderr")
    if rc is not None and rc < 0:
        return result(KILLED, rc, out, err)
    return result(OK if rc == 0 else NONZERO, rc, out, err)


def run_checked(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run `argv`; return stdout, or raise CommandError unless it exited 0."""
    res = run(argv, timeout, env)
    if not res.ok:
        raise CommandError(res)
    return res.stdout


def _kill_group(proc: object) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    except (ProcessLookupError, PermissionError, AttributeError):
        pass
    try:
        proc.wait(timeout=2)  # type: ignore[attr-defined]
    except Exception:  # reaped or stuck in the kernel: nothing more we can do
        pass


def _text(proc: object, stream: str) -> str:
    try:
        data = getattr(proc.process, stream)  # type: ignore[attr-defined]
    except Exception:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""

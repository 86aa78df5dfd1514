"""The one way gpugate runs a command: an argument list, a timeout, the outcome told apart.

Never a shell string. Built on `subprocess`, not on `sh`: sh 2.4 in background mode lost the
stdout of fast commands (71 of 200 `printf` runs came back empty on these machines), and in
foreground mode its timeout kills only the leader, not the process group. The command runs in its own session so that on timeout the whole process
group is killed, not just the leader (a hung `scontrol` can leave children behind). "missing",
"timeout", "killed" (by a signal) and "nonzero" are distinct outcomes, each with the output
that was captured.
"""

from __future__ import annotations

import os
import time

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
    """Run `argv` with a timeout; never raises for the command's own failure."""
    import shutil
    import subprocess

    argv = tuple(str(a) for a in argv)
    started = time.monotonic()
    full_env = command_env(env)

    def result(status: str, rc: int | None, out: bytes = b"", err: bytes = b"") -> CommandResult:
        return CommandResult(argv=argv, status=status, returncode=rc, stdout=_text(out),
                             stderr=_text(err), duration_s=time.monotonic() - started)  # fmt: skip

    program = shutil.which(argv[0], path=full_env["PATH"])
    if program is None:
        return result(MISSING, None)
    try:
        proc = subprocess.Popen(
            (program, *argv[1:]),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            start_new_session=True,  # its own process group, killed whole on timeout
            close_fds=True,
        )
    except OSError as exc:
        return result(MISSING, None, err=str(exc).encode())
    try:
        out, err = proc.communicate(stdin.encode() if stdin is not None else None, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:  # stuck in the kernel (D state): leave it
            out, err = b"", b""
        return result(TIMEOUT, None, out, err)
    rc = proc.returncode
    if rc < 0:
        return result(KILLED, rc, out, err)
    return result(OK if rc == 0 else NONZERO, rc, out, err)


def run_checked(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run `argv`; return stdout, or raise CommandError unless it exited 0."""
    res = run(argv, timeout, env)
    if not res.ok:
        raise CommandError(res)
    return res.stdout


def _kill_group(pgid: int) -> None:
    import signal  # late: only a command past its timeout needs it (gpugate/startup.py)

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace")

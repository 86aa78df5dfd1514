"""A clean child process that runs one allow-listed gpugate function: no fork of this process.

gpugate's hooks run threads (the gatherer runs each source in one), and fork() of a process
that runs threads can deadlock the child on a lock another thread held (Python 3.12 warns of
it: https://docs.python.org/3.12/library/os.html#os.fork). So work that must run apart (a write
probe that may hang in the kernel, reading a user's files with the user's rights) runs in a
fresh interpreter: `subprocess` forks and execs in C, and drops to the job's user
(`user=`/`group=`/`extra_groups=`) before the exec.

The protocol: the child gets one JSON request on stdin, `{"task": "module:function", "kwargs":
{...}, "parent": pid, "timeout": s}`, and answers one JSON object on stdout, `{"ok": result}`
or `{"error": "Type: message", "strerror": ...}`. Only the tasks in TASKS run. The parent reads
back at most `max_bytes` and kills the child's process group at the deadline. The child holds
nothing of its parent's (stdin/stdout are our pipes, stderr is /dev/null, every other fd
closed, its own session), so a child that outlives a killed hook never keeps slurmd's pipes
open; it also dies with its parent (PR_SET_PDEATHSIG) and on its own alarm.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time

import gpugate
from gpugate.runner import SAFE_PATH

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any, Protocol

    class Detach(Protocol):
        """What starts a task apart from this process (detach(); a test's recorder)."""

        def __call__(self, task: str, kwargs: dict[str, Any], timeout: float) -> object: ...


# The only functions a child runs ("module:function"); each takes JSON kwargs, returns JSON.
TASKS = frozenset(
    {
        "gpugate.checks.sources.mounts:timed_probe",
        "gpugate.hooks.collect:_read_and_diagnose",
        "gpugate.checkpoints.discover:latest_checkpoint_path",
        "gpugate.userfiles:write_note",  # the controller's "not requeued" note, as the user
        "gpugate.store.runs:log_sizes",  # the prolog's log offsets, as the job's user
        "gpugate.checkpoints.freshness:newest_complete",
        "gpugate.hooks.flightrec_collect:read_dumps",
        "gpugate.gate.requeue:start_now_when_pending",
        "gpugate.qualify.launch:qualify_suspect",
        "gpugate.qualify.launch:qualify_repaired",  # the repair ladder's, before the resume
        "gpugate.store.nccl_dir:sweep",  # the epilog's NCCL directory, set aside
        "gpugate.child:selftest",  # for the tests and self-checks: sleep, exit, fds, ids
    }
)

# The child finds gpugate exactly where this process did (the RPM's launcher runs python with
# -Es and puts /opt/gpugate/lib on sys.path by hand; -E makes PYTHONPATH useless for that),
# so the parent's own sys.path is passed in argv and replaces the child's.
_BOOT = "import sys; sys.path[:] = sys.argv[1:]; from gpugate.child import main; main()"
# `gpugate ARGS` again, as a new process (a qualification job's step, `qualify --no-wait`): the
# same path, passed as one JSON word before the CLI's arguments. `python3 -m gpugate` finds no
# gpugate where the package's launcher put it on the path by hand (/opt/gpugate/lib).
_CLI_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv.pop(1)); "
    "from gpugate.cli import main; sys.exit(main())"
)
_READ = 1 << 16
_REAP_GRACE_S = 0.5
# In the environment of a child meant to outlive its parent (detach()): no parent-death signal.
_DETACHED = "GPUGATE_CHILD_DETACHED"
# What a detached child needs from the hook's environment, all set by root's hook.env: a Slurm
# poller's SLURM_CONF (EpilogSlurmctld gets none from slurmctld's own), and where the site keeps
# gpugate's parsed-YAML cache and its fallback log (without them a detached qualification wrote
# the default /var/cache/gpugate whatever hook.env said: found when the tests' did, issue 40).
_PASSED_ON = ("SLURM_CONF", "GPUGATE_CACHE_DIR", "GPUGATE_FALLBACK_STATE_DIR")


class ChildError(Exception):
    """The child could not be started, timed out, died or answered badly; the message says which."""

    def __init__(self, message: str, strerror: str | None = None) -> None:
        super().__init__(message)
        self.strerror = strerror


class Child:
    """One started child: its process, our ends of its pipes, what it has sent so far."""

    def __init__(
        self, proc: subprocess.Popen[bytes], stdin_fd: int, stdout_fd: int, request: bytes
    ):
        self.proc = proc
        self.stdin_fd: int | None = stdin_fd
        self.stdout_fd: int | None = stdout_fd
        self.pending = memoryview(request)
        self.chunks: list[bytes] = []
        self.size = 0
        self.eof = False
        self.failure: str | None = None


def command() -> list[str]:
    """The child's argv: this interpreter, isolated, with this process's module path."""
    if not sys.executable:
        raise ChildError("cannot start a child: sys.executable is unknown")
    flags = ["-I"]  # no PYTHON* variables, no user site, no script directory on the path
    if _self_contained():
        flags.append("-S")  # no site: ~15 ms less per child, and sys.path comes from us anyway
    paths = [p for p in sys.path if os.path.isabs(p)]
    return [sys.executable, *flags, "-c", _BOOT, *paths]


def cli_command() -> list[str]:
    """The argv of `gpugate` run again, found where this process found it; append its args."""
    if not sys.executable:
        raise ChildError("cannot start gpugate: sys.executable is unknown")
    flags = ["-I", "-S"] if _self_contained() else ["-I"]
    paths = [p for p in sys.path if os.path.isabs(p)]
    return [sys.executable, *flags, "-c", _CLI_BOOT, json.dumps(paths)]


def _self_contained() -> bool:
    """True when sys.path alone finds gpugate (a wheel, the RPM, a checkout on the path).

    An editable install finds the package through a finder that `site` installs, so there
    the child needs `site`.
    """
    return os.path.dirname(gpugate.__path__[0]) in sys.path


def start(
    task: str,
    kwargs: dict[str, Any],
    timeout: float,
    user: int | None = None,
    group: int | None = None,
    extra_groups: list[int] | None = None,
) -> Child:
    """Start a child running `task(**kwargs)`, as `user` when given (needs root)."""
    import subprocess

    if task not in TASKS:
        raise ChildError(f"{task}: not a task a gpugate child runs")

    request = json.dumps(
        {"task": task, "kwargs": kwargs, "parent": os.getpid(), "timeout": timeout}
    ).encode()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    creds: dict[str, Any] = {}
    if user is not None:
        # Always pass extra_groups with a user: without it the child keeps root's groups.
        creds = {"user": user, "group": group, "extra_groups": list(extra_groups or [])}
    try:
        proc = subprocess.Popen(
            command(),
            stdin=in_r,
            stdout=out_w,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # its own session and process group, killed whole
            cwd="/",
            # Nothing of the hook's environment (a job's variables in the epilog).
            env={"PATH": SAFE_PATH, "LC_ALL": "C"},
            **creds,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        for fd in (in_r, in_w, out_r, out_w):
            os.close(fd)
        raise ChildError(f"cannot start a child: {exc}") from None
    os.close(in_r)
    os.close(out_w)
    os.set_blocking(in_w, False)
    return Child(proc, in_w, out_r, request)


def detach(task: str, kwargs: dict[str, Any], timeout: float) -> int:
    """Start `task(**kwargs)` in a child that outlives this process; returns its pid.

    For work a hook must leave running after it exits (EpilogSlurmctld's "start the requeued
    job once it is pending"). The child holds none of our file descriptors: slurmscriptd
    waits for EOF on a hook's output pipe, not for its exit (22.05 and 24.11), so a child that
    kept that pipe would hold the hook until PrologEpilogTimeout. It ends on its own alarm.
    """
    import subprocess

    if task not in TASKS:
        raise ChildError(f"{task}: not a task a gpugate child runs")

    env = {"PATH": SAFE_PATH, "LC_ALL": "C", _DETACHED: "1"}
    env.update({k: os.environ[k] for k in _PASSED_ON if k in os.environ})
    request = json.dumps(
        {"task": task, "kwargs": kwargs, "parent": os.getpid(), "timeout": timeout}
    )
    try:
        proc = subprocess.Popen(
            command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
            cwd="/",
            env=env,
        )
        assert proc.stdin is not None
        proc.stdin.write(request.encode())  # small: fits the pipe, never blocks
        proc.stdin.close()
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise ChildError(f"cannot start a child: {exc}") from None
    return proc.pid


def wait(children: list[Child], deadline: float, max_bytes: int) -> None:
    """Feed each child its request and read its answer until it closes, or until `deadline`.

    A child that sends more than `max_bytes` or is still out at the deadline is killed.
    """
    import select

    poller = select.poll()  # poll, not select(): fd numbers may pass FD_SETSIZE (1024)
    owner: dict[int, Child] = {}
    for child in children:
        # A child just started holds both ends: only _close_stdin and _finish set them to None.
        assert child.stdout_fd is not None and child.stdin_fd is not None
        poller.register(child.stdout_fd, select.POLLIN)
        owner[child.stdout_fd] = child
        if child.pending:
            poller.register(child.stdin_fd, select.POLLOUT)
            owner[child.stdin_fd] = child
        else:
            _close_stdin(child)
    reading = len(children)
    while reading:
        left_ms = (deadline - time.monotonic()) * 1000
        if left_ms <= 0:
            break
        for fd, _events in poller.poll(left_ms):
            found = owner.get(fd)
            if found is None:
                continue
            child = found
            if fd == child.stdin_fd:
                if _feed(child):
                    poller.unregister(fd)
                    del owner[fd]
                    _close_stdin(child)
                continue
            chunk = os.read(fd, _READ)
            if chunk:
                child.chunks.append(chunk)
                child.size += len(chunk)
                if child.size <= max_bytes:
                    continue
                child.failure = f"the child's answer is larger than {max_bytes} bytes"
            else:
                child.eof = True
            poller.unregister(fd)
            del owner[fd]
            reading -= 1
    for child in children:
        _finish(child, deadline)


def _feed(child: Child) -> bool:
    """Write what the pipe takes of the request; True when it is all written (or unwanted)."""
    if child.stdin_fd is None:  # closed already: nothing more to write
        return True
    try:
        written = os.write(child.stdin_fd, child.pending[:_READ])
    except BlockingIOError:
        return False
    except OSError:  # EPIPE: the child is gone; its (missing) answer tells the rest
        return True
    child.pending = child.pending[written:]
    return not child.pending


def _close_stdin(child: Child) -> None:
    if child.stdin_fd is not None:
        os.close(child.stdin_fd)
        child.stdin_fd = None


def _finish(child: Child, deadline: float) -> None:
    """Close our ends; reap the child, killing its group if it is not done."""
    import subprocess

    _close_stdin(child)
    if child.stdout_fd is not None:
        os.close(child.stdout_fd)
        child.stdout_fd = None
    if child.eof and child.failure is None:
        try:
            child.proc.wait(_REAP_GRACE_S)  # it exits right after its answer
            return
        except subprocess.TimeoutExpired:
            pass
    elif child.failure is None:
        child.failure = "timed out"
    try:
        os.killpg(child.proc.pid, 9)  # SIGKILL; the pid is not reaped yet, so not reused
    except (ProcessLookupError, PermissionError):
        pass
    try:
        child.proc.wait(0.05)
    except subprocess.TimeoutExpired:
        pass  # stuck in the kernel (a dead NFS server): left for init, never waited on


def answer(child: Child) -> object:
    """The child's result, or ChildError with its error, its failure or its silence."""
    if child.failure:
        raise ChildError(child.failure)
    try:
        payload = json.loads(b"".join(child.chunks) or b"null")
    except ValueError:
        payload = None
    if isinstance(payload, dict) and "ok" in payload:
        return payload["ok"]
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        strerror = payload.get("strerror")
        raise ChildError(payload["error"], strerror if isinstance(strerror, str) else None)
    if child.chunks:
        raise ChildError("the child sent garbage")
    rc = child.proc.returncode
    how = f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exit {rc}"
    raise ChildError(f"the child died without an answer ({how})")


def call(
    task: str,
    kwargs: dict[str, Any],
    timeout: float,
    max_bytes: int,
    user: int | None = None,
    group: int | None = None,
    extra_groups: list[int] | None = None,
) -> object:
    """Run `task(**kwargs)` in a child and return its result; ChildError on any failure."""

    deadline = time.monotonic() + timeout
    child = start(task, kwargs, timeout, user, group, extra_groups)
    wait([child], deadline, max_bytes)
    if child.failure == "timed out":
        raise ChildError(f"timed out after {timeout:g} s")
    return answer(child)


# ---- the child's side -------------------------------------------------------------------


def main() -> None:
    """The child: die with the parent, read the request, run the task, answer, exit."""

    detached = os.environ.get(_DETACHED) == "1"
    if not detached:
        _die_with_parent()
    signal.alarm(300)  # until the request says how long we may take
    try:
        request = json.loads(sys.stdin.buffer.read())
        # The parent may have died before the prctl above: then nobody waits for an answer.
        if not detached and os.getppid() != request["parent"]:
            os._exit(70)
        # Backstop should the parent's kill never come: our own alarm, a little later.
        signal.alarm(int(float(request["timeout"])) + 2)
        payload: dict[str, Any] = {"ok": run_task(request["task"], request.get("kwargs") or {})}
    except BaseException as exc:  # the answer says what went wrong; nothing on stderr
        payload = {"error": f"{type(exc).__name__}: {exc}"}
        if isinstance(exc, OSError) and exc.strerror:
            payload["strerror"] = exc.strerror
    try:
        data = json.dumps(payload, default=str).encode()
    except (TypeError, ValueError) as exc:
        data = json.dumps({"error": f"the answer is not JSON: {exc}"}).encode()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]
    finally:
        os._exit(0)


def run_task(task: str, kwargs: dict[str, Any]) -> object:
    """Import and call one allow-listed task."""

    if task not in TASKS:
        raise PermissionError(f"{task}: not a task a gpugate child runs")
    module, _, name = task.partition(":")
    return getattr(importlib.import_module(module), name)(**kwargs)


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL) and PR_SET_DUMPABLE(0), set after the exec.

    The kernel clears the parent-death signal when the credentials change, so it is set here,
    after subprocess dropped to the user (man7.org/linux/man-pages/man2/pr_set_pdeathsig.2const
    .html); it fires when the thread that started us ends, and every caller waits on us in
    that thread. Not dumpable: the job's user, whose uid we now run as, cannot ptrace us to
    forge the answer (the exec made us dumpable again after the drop).
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def selftest(action: str, seconds: float = 0.0, errno: int = 0, path: str = "") -> object:
    """Test-only behaviours: sleep, exit without an answer, fail, list fds, say who we are."""

    if action == "sleep":
        time.sleep(seconds)
        return "slept"
    if action == "exit":
        os._exit(3)
    if action == "oserror":
        raise OSError(errno, os.strerror(errno), path or None)
    if action == "fds":
        return sorted(os.listdir("/proc/self/fd"))
    if action == "ids":
        return {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups())}
    if action == "flood":
        return "x" * int(seconds)
    raise ValueError(f"unknown selftest action {action!r}")

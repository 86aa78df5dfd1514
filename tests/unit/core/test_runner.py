"""The one way to run a command: outcomes told apart, output kept, process groups killed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpugate.runner import CommandError, command_env, run, run_checked


def test_output_is_never_lost_for_fast_commands():
    # sh 2.4's background mode lost this output about a third of the time; keep it honest.
    for _ in range(50):
        assert run(["printf", "x%.0s", "1", "2", "3"], 5).stdout == "xxx"


@pytest.mark.parametrize(
    ("argv", "status", "words"),
    [
        (["true"], "ok", "ok"),
        (["false"], "nonzero", "exit 1"),
        (["no-such-command-xyz"], "missing", "command not found"),
        (["sh", "-c", "kill -9 $$"], "killed", "killed by signal 9"),
    ],
)
def test_outcomes_are_told_apart(argv, status, words):
    res = run(argv, 5)
    assert res.status == status and words in res.describe()


def test_timeout_kills_the_whole_group_and_keeps_partial_output(tmp_path):
    pidfile = tmp_path / "child.pid"
    started = time.monotonic()
    res = run(["sh", "-c", f"echo partial; sleep 30 & echo $! > {pidfile}; wait"], 1)
    assert res.status == "timeout" and res.stdout == "partial\n"
    assert time.monotonic() - started < 5
    child = int(pidfile.read_text())
    time.sleep(0.2)
    try:
        os.kill(child, 0)
        state = Path(f"/proc/{child}/stat").read_text().split()[2]
        assert state == "Z", "the background child survived the timeout"
    except ProcessLookupError:
        pass


def test_stdin_and_env_are_passed():
    assert run(["cat"], 5, stdin="abc").stdout == "abc"
    assert run(["sh", "-c", "echo $GPUGATE_X"], 5, env={"GPUGATE_X": "42"}).stdout == "42\n"


def test_path_always_has_the_system_directories(monkeypatch):
    monkeypatch.delenv("PATH", raising=False)
    assert "/usr/sbin" in command_env()["PATH"]
    assert run(["true"], 5).ok  # found without a PATH of our own, like in a Slurm hook


def test_run_checked_raises_with_the_result():
    with pytest.raises(CommandError) as err:
        run_checked(["sh", "-c", "echo boom >&2; exit 3"], 5)
    assert err.value.result.returncode == 3 and "boom" in str(err.value)

"""slurm_hooks/gpugate-hook: one wrapper for the four hooks, the hook taken from its own name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import paths
import pytest

sys.path.insert(0, str(paths.SLURM_HARNESS))
from gpugate_site import own_hook_env_only

HOOKS_DIR = paths.SLURM_HOOKS
HOOKS = ("prolog", "epilog", "task-prolog", "epilog-slurmctld")


def run(script: Path, env_file: str | None = None) -> subprocess.CompletedProcess:
    """Run a wrapper as slurmd would: no PATH of ours, only what hook.env beside it says
    (the copy never reads the host's /etc/gpugate/hook.env)."""
    own_hook_env_only(script)
    if env_file is not None:
        (script.parent / "hook.env").write_text(env_file)
    return subprocess.run(["/bin/sh", str(script)], env={}, capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    script = tmp_path / "fake-gpugate"
    script.write_text('#!/bin/sh\necho "args: $*; config: $GPUGATE_CONFIG"\nexit 7\n')
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("hook", HOOKS)
def test_each_hook_name_is_the_one_wrapper(hook):
    path = HOOKS_DIR / f"gpugate-{hook}"
    assert path.is_symlink() and os.readlink(path) == "gpugate-hook"


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("how", ["copy", "symlink"])
def test_the_name_picks_the_hook(tmp_path, fake_bin, hook, how):
    shutil.copy(HOOKS_DIR / "gpugate-hook", tmp_path / "gpugate-hook")
    script = tmp_path / f"gpugate-{hook}"
    if how == "copy":  # what the RPM and the test site install
        shutil.copy(HOOKS_DIR / f"gpugate-{hook}", script)
    else:
        script.symlink_to("gpugate-hook")
    done = run(script, f"GPUGATE_BIN={fake_bin}\nGPUGATE_CONFIG=/etc/site.yaml\n")
    assert (done.returncode, done.stdout) == (7, f"args: {hook}; config: /etc/site.yaml\n")


def test_a_name_that_is_no_hook_allows_the_job(tmp_path, fake_bin):
    script = tmp_path / "gpugate-prologue"
    shutil.copy(HOOKS_DIR / "gpugate-hook", script)
    done = run(script, f"GPUGATE_BIN={fake_bin}\n")
    assert done.returncode == 0 and done.stdout == "" and "not a hook name" in done.stderr


def test_a_missing_gpugate_allows_the_job(tmp_path):
    script = tmp_path / "gpugate-prolog"
    shutil.copy(HOOKS_DIR / "gpugate-prolog", script)
    done = run(script, f"GPUGATE_BIN={tmp_path / 'nothing'}\n")
    assert done.returncode == 0 and "prolog skipped, job allowed" in done.stderr


@pytest.mark.parametrize("installed", ["copy", "symlink"])
def test_a_link_of_another_name_reaches_its_hook(tmp_path, fake_bin, installed):
    """slurm.conf `Prolog=/etc/slurm/prolog.d/*` with `50-gpugate` -> .../gpugate-prolog."""
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    shutil.copy(HOOKS_DIR / "gpugate-hook", libexec / "gpugate-hook")
    if installed == "copy":  # the RPM: a file of the hook's name
        shutil.copy(HOOKS_DIR / "gpugate-hook", libexec / "gpugate-prolog")
    else:  # the source tree: a link to gpugate-hook
        (libexec / "gpugate-prolog").symlink_to("gpugate-hook")
    prolog_d = tmp_path / "prolog.d"
    prolog_d.mkdir()
    (prolog_d / "50-gpugate").symlink_to(libexec / "gpugate-prolog")
    (prolog_d / "60-relative").symlink_to(Path("..") / "libexec" / "gpugate-prolog")
    for name in ("50-gpugate", "60-relative"):
        done = run(prolog_d / name, f"GPUGATE_BIN={fake_bin}\n")
        assert done.stdout.startswith("args: prolog;"), done.stderr


def _launcher(path: Path, shebang: str) -> Path:
    path.write_text(f"{shebang}\necho launched $*\n")
    path.chmod(0o755)
    return path


def test_the_wrapper_is_posix_sh():
    wrapper = HOOKS_DIR / "gpugate-hook"
    assert subprocess.run(["/bin/sh", "-n", str(wrapper)], timeout=30).returncode == 0
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        done = subprocess.run([shellcheck, "--shell=sh", str(wrapper)], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("hook", ["prolog", "task-prolog"])
def test_a_missing_interpreter_allows_the_job(tmp_path, hook):
    """A launcher whose #! names a python that is gone: exit 0, a message, nothing on stdout."""
    launcher = _launcher(tmp_path / "gpugate", f"#!{tmp_path}/venv/bin/python3 -Es")
    script = tmp_path / f"gpugate-{hook}"
    shutil.copy(HOOKS_DIR / "gpugate-hook", script)
    done = run(script, f"GPUGATE_BIN={launcher}\n")
    assert (done.returncode, done.stdout) == (0, "")
    assert f"gpugate: {hook}: {tmp_path}/venv/bin/python3 is not executable for " in done.stderr
    assert "does not exist" in done.stderr and f"{hook} skipped, job allowed" in done.stderr


def test_an_interpreter_without_execute_permission_allows_the_job(tmp_path):
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\necho ran\n")
    python.chmod(0o644)
    launcher = _launcher(tmp_path / "gpugate", f"#!{python}")
    script = tmp_path / "gpugate-epilog"
    shutil.copy(HOOKS_DIR / "gpugate-hook", script)
    done = run(script, f"GPUGATE_BIN={launcher}\n")
    assert done.returncode == 0 and "ran" not in done.stdout
    assert (
        f"{python} is not executable for" in done.stderr and "no execute permission" in done.stderr
    )


@pytest.mark.parametrize(
    ("command", "ok"), [("sh", True), ("gpugate-no-such-python3", False)]
)  # fmt: skip
def test_an_env_style_launcher(tmp_path, command, ok):
    """`#!/usr/bin/env python3`: the command is looked up on the wrapper's own PATH."""
    launcher = _launcher(tmp_path / "gpugate", f"#!/usr/bin/env {command}")
    script = tmp_path / "gpugate-prolog"
    shutil.copy(HOOKS_DIR / "gpugate-hook", script)
    done = run(script, f"GPUGATE_BIN={launcher}\n")
    assert done.returncode == 0
    if ok:
        assert done.stdout == "launched prolog\n", done.stderr
    else:
        assert done.stdout == "" and f"{command} is not executable for" in done.stderr
        assert "not found on PATH=" in done.stderr and "job allowed" in done.stderr


def test_an_unreadable_launcher_allows_the_job(tmp_path):
    launcher = _launcher(tmp_path / "gpugate", "#!/bin/sh")
    launcher.chmod(0o111)
    script = tmp_path / "gpugate-prolog"
    shutil.copy(HOOKS_DIR / "gpugate-hook", script)
    if os.access(launcher, os.R_OK):  # root reads anything: the job user's case is below
        pytest.skip("root can read a mode-0111 file")
    done = run(script, f"GPUGATE_BIN={launcher}\n")
    assert done.returncode == 0 and "not readable" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the wrapper as another user")
def test_an_interpreter_closed_to_the_job_user_allows_the_job(tmp_path):
    """The bug of issue 16: a venv's python inside root's home, run as the TaskProlog's user."""
    import sys

    sys.path.insert(0, str(paths.SLURM_HARNESS))
    from localslurm import JOB_USER, ensure_user, open_path

    ensure_user()
    private = tmp_path / "root-home"
    private.mkdir(mode=0o700)
    python = private / "python3"
    python.symlink_to("/bin/sh")
    public = tmp_path / "opt"
    public.mkdir()
    launcher = _launcher(public / "gpugate", f"#!{python} -e")
    script = public / "gpugate-task-prolog"
    shutil.copy(HOOKS_DIR / "gpugate-hook", script)
    (public / "hook.env").write_text(f"GPUGATE_BIN={launcher}\n")
    open_path(public)
    as_root = run(script)
    assert as_root.stdout == "launched task-prolog\n", as_root.stderr  # root's check passes
    runuser = shutil.which("runuser") or pytest.skip("no runuser")
    done = subprocess.run([runuser, "-u", JOB_USER, "--", "/bin/sh", str(script)], env={},
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "")
    assert f"gpugate: task-prolog: {python} is not executable for {JOB_USER} (" in done.stderr
    assert "task-prolog skipped, job allowed" in done.stderr


# --- hook.env as admins write it (issue 26, deliver 3) ----------------------------------------


@pytest.fixture
def env_bin(tmp_path: Path) -> Path:
    """A GPUGATE_BIN that prints the environment it was exec'd with, one NAME=value a line."""
    script = tmp_path / "env-gpugate"
    script.write_text("#!/bin/sh\nexec env\n")
    script.chmod(0o755)
    return script


def _exported(done: subprocess.CompletedProcess) -> dict[str, str]:
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


@pytest.mark.parametrize("hook", [*HOOKS, "health"])
def test_plain_and_export_lines_both_reach_gpugate(tmp_path, env_bin, hook):
    """`SLURM_CONF=/x` (the documented spelling) and `export NAME=value` are both exported."""
    script = tmp_path / f"gpugate-{hook}"
    shutil.copy(HOOKS_DIR / "gpugate-hook", script)
    text = (
        f"GPUGATE_BIN={env_bin}\n"
        "SLURM_CONF=/x/slurm.conf\n"
        "export GPUGATE_CACHE_DIR=/y/cache\n"
        "# a comment, and a quoted value with a space\n"
        "SITE_NOTE='two words'\n"
    )
    seen = _exported(run(script, text))
    assert seen["SLURM_CONF"] == "/x/slurm.conf"
    assert seen["GPUGATE_CACHE_DIR"] == "/y/cache"
    assert seen["SITE_NOTE"] == "two words"
    assert seen["GPUGATE_BIN"] == str(env_bin)


def test_a_hook_env_line_may_depend_on_the_hook(tmp_path, env_bin):
    """A `case $hook in` line sees the hook's name, as selftest's reading of hook.env does."""
    text = (
        f"GPUGATE_BIN={env_bin}\n"
        "case $hook in health | epilog-slurmctld) SLURM_CONF=/ctl/slurm.conf ;; esac\n"
    )
    for hook, expected in (("health", "/ctl/slurm.conf"), ("prolog", None)):
        script = tmp_path / f"gpugate-{hook}"
        shutil.copy(HOOKS_DIR / "gpugate-hook", script)
        assert _exported(run(script, text)).get("SLURM_CONF") == expected

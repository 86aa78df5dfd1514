"""slurm_hooks/gpugate-hook: one wrapper for the four hooks, the hook taken from its own name."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

HOOKS_DIR = Path(__file__).resolve().parent.parent / "slurm_hooks"
HOOKS = ("prolog", "epilog", "task-prolog", "epilog-slurmctld")


def run(script: Path, env_file: str | None = None) -> subprocess.CompletedProcess:
    """Run a wrapper as slurmd would: no PATH of ours, only what hook.env beside it says."""
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

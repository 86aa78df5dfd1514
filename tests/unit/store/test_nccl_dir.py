"""The jobs' NCCL directories (issue 25, attacks 4 and 9): a squatted base gets nothing, the
epilog only renames, the removal happens apart (a detached child, the health run)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
from factories import default_config

from gpugate.hooks.task_prolog import exports
from gpugate.store import nccl_dir as N
from gpugate.store.state import StateError

NOBODY = 65534
# Ownership is the point here: root's base, the job user's directory, someone else's.
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
NCCL_PATHS = (
    "NCCL_DEBUG_FILE",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
)


def config_with(tmp_path):
    config = default_config().replace(state_dir=str(tmp_path / "state"))
    tp = config.task_prolog.replace(nccl_debug_dir=str(tmp_path / "nccl"))
    return config.replace(task_prolog=tp)


def gone_entries(base) -> list[str]:
    return sorted(n for n in os.listdir(base) if n.startswith(N.GONE))


def wait_swept(base, timeout: float = 60.0) -> None:
    """Until the background removal has left nothing set aside in `base` (or fail)."""
    deadline = time.monotonic() + timeout
    while gone_entries(base) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone_entries(base) == [], "the background removal did not finish"


def exported(config, job_id: str = "42"):
    notes: list[str] = []
    pairs = dict(exports(config, {}, job_id, notes.append))
    return pairs, notes


# ---- the packaged default ----------------------------------------------------------------


def test_the_default_base_is_root_owned_state_not_a_world_writable_tmp():
    base = default_config().task_prolog.nccl_debug_dir
    assert base == "/var/lib/gpugate/nccl"
    assert not base.startswith(("/tmp/", "/var/tmp/", "/dev/shm/"))


# ---- the TaskProlog refuses a squatted base and exports none of the paths ---------------


def test_a_prepared_directory_is_exported(tmp_path):
    config = config_with(tmp_path)
    made = N.prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    pairs, notes = exported(config)
    assert pairs["NCCL_DEBUG_FILE"] == os.path.join(made, "nccl.%h.%p.log")
    assert pairs["TORCH_FR_DUMP_TEMP_FILE"] == os.path.join(made, "fr_rank_")
    assert notes == []


def squat_777(base, job_dir):
    os.chmod(base, 0o777)


def squat_owned_by_a_user(base, job_dir):
    os.chown(base, NOBODY, NOBODY)


def squat_job_dir_a_symlink(base, job_dir):
    os.rmdir(job_dir)
    target = os.path.join(os.path.dirname(base), "attackers")
    os.mkdir(target, 0o700)
    os.symlink(target, job_dir)


def squat_job_dir_of_another_uid(base, job_dir):
    os.chown(job_dir, NOBODY, NOBODY)


def squat_job_dir_group_writable(base, job_dir):
    os.chmod(job_dir, 0o770)


def squat_parent_writable(base, job_dir):
    os.chmod(os.path.dirname(base), 0o777)  # not sticky: anyone could swap the base


def squat_base_a_symlink(base, job_dir):
    real = base + ".real"
    os.rename(base, real)
    os.symlink(real, base)


@pytest.mark.parametrize(
    ("squat", "why"),
    [
        (squat_777, "writable by group or others (mode 0777)"),
        (squat_owned_by_a_user, f"owned by uid {NOBODY}, not root"),
        (squat_job_dir_a_symlink, "not a plain directory"),
        (squat_job_dir_of_another_uid, f"owned by uid {NOBODY}, not the job's user"),
        (squat_job_dir_group_writable, "writable by group or others (mode 0770)"),
        (squat_parent_writable, "writable by group or others (mode 0777)"),
        (squat_base_a_symlink, "not a plain directory"),
    ],
)
def test_a_squatted_base_or_job_directory_exports_no_path_and_says_why(tmp_path, squat, why):
    config = config_with(tmp_path)
    made = N.prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    squat(str(tmp_path / "nccl"), made)
    pairs, notes = exported(config)
    assert not set(NCCL_PATHS) & set(pairs)
    assert pairs["NCCL_DEBUG"] == "WARN" and pairs["TORCH_FR_BUFFER_SIZE"] == "2000"  # the rest
    assert len(notes) == 1 and why in notes[0] and "not exported" in notes[0]


def test_a_sticky_world_writable_parent_is_fine_when_the_base_is_roots(tmp_path):
    os.chmod(tmp_path, 0o1777)  # like /tmp: no one renames root's entries in it
    config = config_with(tmp_path)
    made = N.prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    pairs, notes = exported(config)
    assert pairs["NCCL_DEBUG_FILE"].startswith(made) and notes == []


def test_the_task_prolog_says_why_on_stderr(tmp_path, monkeypatch, capsys):
    from gpugate.cli import main

    os.makedirs(tmp_path / "nccl" / "7")
    os.chmod(tmp_path / "nccl", 0o777)
    site = tmp_path / "site.yaml"
    site.write_text(
        f"state_dir: {tmp_path / 'state'}\ntask_prolog:\n  nccl_debug_dir: {tmp_path / 'nccl'}\n"
    )
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    for name in NCCL_PATHS:
        monkeypatch.delenv(name, raising=False)
    assert main(["task-prolog", "--config", str(site)]) == 0
    out, err = capsys.readouterr()
    assert "export NCCL_DEBUG=WARN" in out.splitlines()
    assert not any(name in out for name in NCCL_PATHS)
    assert "not exported" in err and "writable by group or others" in err


# ---- the prolog refuses a squatted base ----------------------------------------------------


def test_the_prolog_creates_nothing_in_a_squatted_base(tmp_path):
    base = tmp_path / "nccl"
    base.mkdir(mode=0o777)
    os.chmod(base, 0o777)
    os.chown(base, NOBODY, NOBODY)
    (tmp_path / "victim").write_text("the victim's own")
    (base / "42").mkdir()
    os.symlink(tmp_path / "victim", base / "42" / "fr_rank_0")
    with pytest.raises(StateError, match="not using it"):
        N.prepare_nccl_dir(config_with(tmp_path), "42", os.getuid(), os.getgid())
    assert sorted(os.listdir(base)) == ["42"] and os.listdir(base / "42") == ["fr_rank_0"]
    assert (tmp_path / "victim").read_text() == "the victim's own"


def test_the_prolog_makes_the_base_and_its_parents_0755_roots(tmp_path):
    old = os.umask(0o077)
    try:
        config = config_with(tmp_path / "a" / "b")
        made = N.prepare_nccl_dir(config, "42", NOBODY, NOBODY)
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "nccl"):
        st = os.lstat(d)
        assert (st.st_uid, oct(st.st_mode & 0o777)) == (0, "0o755"), d
    st = os.lstat(made)
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o777)) == (NOBODY, NOBODY, "0o700")


# ---- the epilog only renames; the removal happens apart ------------------------------------


def fill(job_dir, files: int, depth: int) -> None:
    """What a hostile job leaves: many empty files, a deep chain, links to outside."""
    fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(files):
            os.close(os.open(f"f{i}", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    from deep_trees import deep_chain

    deep_chain(job_dir, depth)


def test_the_epilog_only_renames_and_the_health_sweep_then_removes_it(tmp_path, monkeypatch):
    import sys

    from gpugate.commands.health import sweep_nccl
    from gpugate.hooks.epilog import cleanup

    config = config_with(tmp_path)
    base = tmp_path / "nccl"
    made = N.prepare_nccl_dir(config, "42", NOBODY, NOBODY)
    files = 50_000
    fill(made, files, sys.getrecursionlimit() + 100)
    (tmp_path / "keep").write_text("x")
    os.symlink(tmp_path / "keep", os.path.join(made, "link"))
    handed = []
    monkeypatch.setattr(N, "remove_in_background", handed.append)  # no child: see below

    cleanup(config, SimpleNamespace(job_id="42"))

    assert not os.path.lexists(made) and handed == [str(base)]
    [gone] = gone_entries(base)
    st = os.lstat(base / gone)
    assert (st.st_uid, oct(st.st_mode & 0o777)) == (0, "0o700")  # sealed: the user is out
    assert len(os.listdir(base / gone)) == files + 2  # renamed whole: nothing removed yet
    sweep_nccl(config, "gpu-node-01", 600.0)  # the health run's share
    assert gone_entries(base) == [] and os.listdir(base) == []
    assert (tmp_path / "keep").read_text() == "x"


def test_the_epilogs_detached_child_removes_what_was_set_aside(tmp_path):
    from gpugate.hooks.epilog import cleanup

    config = config_with(tmp_path)
    made = N.prepare_nccl_dir(config, "42", NOBODY, NOBODY)
    fill(made, 2000, 1200)
    cleanup(config, SimpleNamespace(job_id="42"))
    assert not os.path.lexists(made)
    wait_swept(tmp_path / "nccl")
    assert os.listdir(tmp_path / "nccl") == []


def test_a_reused_job_id_hands_nothing_on_and_the_leftover_goes_in_the_background(tmp_path):
    config = config_with(tmp_path)
    first = N.prepare_nccl_dir(config, "42", NOBODY, NOBODY)
    fill(first, 100, 1200)
    again = N.prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    assert again == first and os.listdir(again) == []
    assert os.lstat(again).st_uid == os.getuid()
    wait_swept(tmp_path / "nccl")


def test_the_sweep_refuses_an_unsafe_base_and_leaves_it_alone(tmp_path):
    config = config_with(tmp_path)
    made = N.prepare_nccl_dir(config, "42", NOBODY, NOBODY)
    N.set_aside(str(tmp_path / "nccl"), made)
    os.chmod(tmp_path / "nccl", 0o777)
    with pytest.raises(StateError, match="not sweeping it"):
        N.sweep(str(tmp_path / "nccl"), 10.0)
    assert len(gone_entries(tmp_path / "nccl")) == 1


def test_the_background_task_is_one_a_child_may_run():
    from gpugate.child import TASKS

    assert f"{N.__name__}:sweep" in TASKS

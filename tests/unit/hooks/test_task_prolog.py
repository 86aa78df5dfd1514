"""TaskProlog: the seed's NCCL settings, never overriding what the job set itself."""

from __future__ import annotations

import os

import pytest
from factories import default_config

from gpugate.hooks.task_prolog import (
    exports,
    nccl_job_dir,
    prepare_nccl_dir,
    remove_nccl_dir,
    render,
)


def wait_swept(base, timeout: float = 60.0) -> None:
    """Until nothing set aside (`.gone-*`) is left in `base`: the background removal is done."""
    import time

    deadline = time.monotonic() + timeout
    while any(n.startswith(".gone-") for n in os.listdir(base)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(n.startswith(".gone-") for n in os.listdir(base))


def config_with(tmp_path, **task_prolog):
    config = default_config()
    tp = config.task_prolog.replace(nccl_debug_dir=str(tmp_path / "nccl"), **task_prolog)
    return config.replace(task_prolog=tp, state_dir=str(tmp_path / "state"))


def test_exports_the_seed_settings(tmp_path):
    pairs = dict(exports(config_with(tmp_path), {}, "42"))
    assert pairs["NCCL_DEBUG"] == "WARN"
    assert pairs["NCCL_IB_TIMEOUT"] == "22" and pairs["NCCL_IB_RETRY_CNT"] == "7"
    assert pairs["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert pairs["GPUGATE_JOB_ID"] == "42"
    assert "NCCL_DEBUG_FILE" not in pairs  # the prolog has not created the directory


def test_the_jobs_own_settings_win(tmp_path):
    pairs = dict(
        exports(config_with(tmp_path), {"NCCL_DEBUG": "INFO", "NCCL_IB_TIMEOUT": "18"}, "42")
    )
    assert "NCCL_DEBUG" not in pairs and "NCCL_IB_TIMEOUT" not in pairs
    assert pairs["NCCL_IB_RETRY_CNT"] == "7"


def test_ib_settings_only_together(tmp_path):
    pairs = dict(exports(config_with(tmp_path, nccl_ib_retry_cnt=None), {}, "42"))
    assert "NCCL_IB_TIMEOUT" not in pairs and "NCCL_IB_RETRY_CNT" not in pairs


def test_render_is_one_export_line_each():
    assert render([("A", "1"), ("B", "x y")]) == "export A=1\nexport B=x y\n"


def test_debug_file_points_into_the_prepared_job_directory(tmp_path):
    config = config_with(tmp_path)
    made = prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    assert made == nccl_job_dir(config, "42")
    assert oct(os.stat(made).st_mode & 0o777) == "0o700"
    pairs = dict(exports(config, {}, "42"))
    assert pairs["NCCL_DEBUG_FILE"] == os.path.join(made, "nccl.%h.%p.log")


def test_a_symlinked_base_directory_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "nccl").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Exception, match="not a plain directory"):
        prepare_nccl_dir(config_with(tmp_path), "42", os.getuid(), os.getgid())
    assert not (tmp_path / "elsewhere" / "42").exists()


def test_a_job_id_that_is_not_a_number_makes_no_path(tmp_path):
    assert nccl_job_dir(config_with(tmp_path), "../../etc") is None


def test_cli_prints_only_export_lines(tmp_path, monkeypatch, capsys):
    from gpugate.cli import main

    site = tmp_path / "site.yaml"
    site.write_text(f"task_prolog:\n  nccl_debug_dir: {tmp_path / 'nccl'}\n")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    assert main(["task-prolog", "--config", str(site)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("export ") for line in lines)
    assert "export NCCL_DEBUG=WARN" in lines


def test_cli_never_fails_the_step_even_with_a_broken_config(tmp_path, capsys):
    from gpugate.cli import main

    site = tmp_path / "site.yaml"
    site.write_text("task_prolog: [\n")
    assert main(["task-prolog", "--config", str(site)]) == 0
    # Refused whole: the packaged defaults' exports, and the reason on stderr (issue 40).
    out, err = capsys.readouterr()
    assert "export NCCL_DEBUG=WARN" in out.splitlines()
    assert f"task-prolog: config: {site}: not valid YAML" in err
    assert "REFUSED: the whole file ignored" in err


# --- only well-formed export lines (issue 11, point 6) ----------------------------------------

EVIL_DIR = "/tmp/x\nexport LD_PRELOAD=/tmp/evil.so"  # the path the issue names, exactly


@pytest.fixture
def evil_dir():
    """EVIL_DIR holding one complete, hour-old checkpoint; removed afterwards."""
    import shutil
    from pathlib import Path

    top = EVIL_DIR.split("/")[2]
    assert not os.path.lexists(f"/tmp/{top}"), "left over from an earlier run"
    try:
        yield _checkpoint_dir(Path("/"), EVIL_DIR)
    finally:
        shutil.rmtree(f"/tmp/{top}", ignore_errors=True)


def _checkpoint_dir(tmp_path, name):
    """A directory `name` under tmp_path holding one complete, hour-old checkpoint."""
    import time
    import zipfile

    d = tmp_path / name.lstrip("/")
    d.mkdir(parents=True)
    with zipfile.ZipFile(d / "ckpt_100.pt", "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/version", b"3\n")
    old = time.time() - 3600
    os.utime(d / "ckpt_100.pt", (old, old))
    return d


def _run_task_prolog(tmp_path, monkeypatch, capsysbinary, env):
    from gpugate.cli import main

    site = tmp_path / "site.yaml"
    site.write_text(
        f"state_dir: {tmp_path / 'state'}\ntask_prolog:\n  nccl_debug_dir: {tmp_path / 'nccl'}\n"
    )
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("GPUGATE_CKPT_DIR", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["task-prolog", "--config", str(site)]) == 0
    captured = capsysbinary.readouterr()
    return captured.out.decode("utf-8", "surrogateescape"), captured.err.decode()


def _assert_only_well_formed(out):
    import re

    assert out.endswith("\n")
    for line in out.splitlines():
        assert re.fullmatch(r"export [A-Za-z_][A-Za-z0-9_]*=[^\x00-\x1f\x7f]*", line), line
    assert "LD_PRELOAD" not in out


def test_a_newline_in_the_checkpoint_dir_from_the_environment_injects_nothing(
    tmp_path, monkeypatch, capsysbinary, evil_dir
):
    d = evil_dir
    out, err = _run_task_prolog(tmp_path, monkeypatch, capsysbinary, {"GPUGATE_CKPT_DIR": str(d)})
    _assert_only_well_formed(out)
    assert "GPUGATE_RESUME_FROM" not in out
    assert "export NCCL_DEBUG=WARN" in out.splitlines()  # the rest still arrives
    assert "not exporting GPUGATE_RESUME_FROM=" in err and "a newline" in err
    assert "\\n" in err and "\nexport LD_PRELOAD" not in err  # the note shows it escaped


def test_a_newline_in_the_checkpoint_dir_from_the_comment_injects_nothing(
    tmp_path, monkeypatch, capsysbinary
):
    import json

    d = _checkpoint_dir(tmp_path, "x\nexport LD_PRELOAD=/tmp/evil.so")
    job = tmp_path / "state" / "jobs" / "7"
    job.mkdir(parents=True)
    (job / "baseline.json").write_text(json.dumps({"job_id": "7", "ckpt_dir": str(d)}))
    from gpugate.store.state import load_baseline

    assert load_baseline(str(tmp_path / "state"), "7").ckpt_dir == str(d)
    out, err = _run_task_prolog(tmp_path, monkeypatch, capsysbinary, {})
    _assert_only_well_formed(out)
    assert "GPUGATE_CKPT_DIR" not in out and "GPUGATE_RESUME_FROM" not in out
    assert "not exporting GPUGATE_CKPT_DIR=" in err


def test_a_plain_checkpoint_dir_is_still_exported_as_it_is(tmp_path, monkeypatch, capsysbinary):
    d = _checkpoint_dir(tmp_path, "run 1 'best' ü")  # spaces, quotes, UTF-8: kept literally
    out, _ = _run_task_prolog(tmp_path, monkeypatch, capsysbinary, {"GPUGATE_CKPT_DIR": str(d)})
    assert f"export GPUGATE_RESUME_FROM={d / 'ckpt_100.pt'}" in out.splitlines()


def test_a_path_that_is_not_utf8_arrives_as_its_bytes(tmp_path, monkeypatch, capsysbinary):
    name = os.fsdecode(b"run\xff")
    d = _checkpoint_dir(tmp_path, name)
    out, _ = _run_task_prolog(tmp_path, monkeypatch, capsysbinary, {"GPUGATE_CKPT_DIR": str(d)})
    raw = out.encode("utf-8", "surrogateescape")
    assert b"export GPUGATE_RESUME_FROM=" + os.fsencode(str(d / "ckpt_100.pt")) + b"\n" in raw


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("A", "1\nexport LD_PRELOAD=/x.so", "a newline"),
        ("A", "1\r", "a carriage return"),
        ("A", "a\0b", "a NUL"),
        ("A", "\x1b[2J", "U+001B"),
        ("A", "x\x7f", "U+007F"),
        ("A", "x\x9by", "U+009B"),
        ("LD_PRELOAD=/x.so A", "1", "not a valid variable name"),
        ("1A", "1", "not a valid variable name"),
        ("", "1", "not a valid variable name"),
        ("A\nB", "1", "not a valid variable name"),
    ],
)
def test_render_refuses_what_slurm_would_read_differently(name, value, why):
    notes = []
    out = render([("GOOD", "1"), (name, value), ("ALSO_GOOD", "a b=c 'd'")], notes.append)
    assert out == "export GOOD=1\nexport ALSO_GOOD=a b=c 'd'\n"
    assert len(notes) == 1 and why in notes[0]
    assert "\x1b" not in notes[0] and "\n" not in notes[0]


def test_a_reused_job_id_gets_a_fresh_empty_directory(tmp_path):
    config = config_with(tmp_path)
    first = prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    (tmp_path / "precious").write_text("another user's")
    with open(os.path.join(first, "nccl.host.1.log"), "w") as fh:
        fh.write("the first user's secrets")
    os.symlink(tmp_path / "precious", os.path.join(first, "link"))
    again = prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    assert again == first and os.listdir(again) == []  # nothing of the first job is handed on
    assert (tmp_path / "precious").read_text() == "another user's"  # the link was not followed
    wait_swept(tmp_path / "nccl")  # the first job's files, set aside, go in the background
    assert (tmp_path / "precious").read_text() == "another user's"


def test_a_symlink_in_place_of_the_job_directory_is_replaced_not_followed(tmp_path):
    config = config_with(tmp_path)
    os.makedirs(tmp_path / "nccl")
    (tmp_path / "target").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "nccl" / "42")
    made = prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    assert not os.path.islink(made) and os.path.isdir(made)
    assert (tmp_path / "target").is_dir()


def test_the_epilog_removes_the_jobs_nccl_directory(tmp_path):
    from types import SimpleNamespace

    from gpugate.hooks.epilog import cleanup

    config = config_with(tmp_path).replace(state_dir=str(tmp_path / "state"))
    made = prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    os.makedirs(os.path.join(made, "deep", "er"))
    (tmp_path / "keep").write_text("x")
    os.symlink(tmp_path / "keep", os.path.join(made, "deep", "er", "link"))
    with open(os.path.join(made, "huge"), "wb") as fh:
        fh.truncate(50 << 30)  # 50 GB sparse: removal costs an unlink, not a read
    cleanup(config, SimpleNamespace(job_id="42"))
    assert not os.path.lexists(made)  # renamed away at once, removed by a detached child
    wait_swept(tmp_path / "nccl")
    assert (tmp_path / "keep").read_text() == "x"
    assert os.listdir(tmp_path / "nccl") == []
    assert remove_nccl_dir(config, "42") is True  # nothing there: nothing to do


def test_an_unsafe_base_is_never_touched(tmp_path, capsys):
    config = config_with(tmp_path)
    made = prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    os.chmod(tmp_path / "nccl", 0o777)  # someone opened the base to everyone: not ours to trust
    assert remove_nccl_dir(config, "42") is False
    assert os.path.isdir(made)
    assert "not removed" in capsys.readouterr().err


def test_only_a_job_id_makes_an_nccl_path(tmp_path):
    config = config_with(tmp_path)
    assert nccl_job_dir(config, "1_2_3") is None and nccl_job_dir(config, "\u0663") is None
    assert nccl_job_dir(config, "12_3") == str(tmp_path / "nccl" / "12_3")


def test_the_base_is_traversable_whatever_the_hooks_umask(tmp_path):
    old = os.umask(0o027)  # the hooks' private umask
    try:
        made = prepare_nccl_dir(config_with(tmp_path), "42", os.getuid(), os.getgid())
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "nccl").st_mode & 0o111 == 0o111  # the user reaches its own dir
    assert oct(os.stat(made).st_mode & 0o777) == "0o700"


# ---- PyTorch's flight recorder --------------------------------------------------------------

FR_ALL = (
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
)


def _prepared(tmp_path, **task_prolog):
    config = config_with(tmp_path, **task_prolog)
    config = config.replace(state_dir=str(tmp_path / "state"))
    made = prepare_nccl_dir(config, "42", os.getuid(), os.getgid())
    return config, made


def test_the_flight_recorder_is_on_under_both_names_dumping_into_the_job_directory(tmp_path):
    config, made = _prepared(tmp_path, fr_buffer_size=1234)
    pairs = dict(exports(config, {}, "42"))
    assert pairs["TORCH_FR_BUFFER_SIZE"] == pairs["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "1234"
    assert pairs["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    prefix = os.path.join(made, "fr_rank_")
    assert pairs["TORCH_FR_DUMP_TEMP_FILE"] == pairs["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix


def test_a_fleet_on_pytorch_2_8_or_later_gets_only_the_torch_fr_names(tmp_path):
    config, made = _prepared(tmp_path, fr_legacy_names=False)
    pairs = dict(exports(config, {}, "42"))
    assert pairs["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert pairs["TORCH_FR_DUMP_TEMP_FILE"] == os.path.join(made, "fr_rank_")
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in pairs
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in pairs
    # The job's own old-name setting still wins: nothing of that setting is exported then.
    pairs = dict(exports(config, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}, "42"))
    assert "TORCH_FR_BUFFER_SIZE" not in pairs


def test_no_dump_prefix_without_the_prepared_directory(tmp_path):
    pairs = dict(exports(config_with(tmp_path), {}, "42"))
    assert pairs["TORCH_FR_BUFFER_SIZE"] == "2000"  # the packaged default
    assert "TORCH_FR_DUMP_TEMP_FILE" not in pairs  # PyTorch's default /tmp prefix, collected too


@pytest.mark.parametrize("name", ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"])
def test_a_buffer_size_of_zero_under_either_name_turns_it_all_off(tmp_path, name):
    config, _ = _prepared(tmp_path)
    pairs = dict(exports(config, {name: "0"}, "42"))
    assert not set(FR_ALL) & set(pairs)
    assert pairs["NCCL_DEBUG"] == "WARN"  # the rest still arrives


@pytest.mark.parametrize(
    ("own", "kept_out"),
    [
        ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}, ("TORCH_FR_BUFFER_SIZE",)),
        ({"TORCH_FR_BUFFER_SIZE": "500"}, ("TORCH_NCCL_TRACE_BUFFER_SIZE",)),
        ({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/me/fr_"}, ("TORCH_FR_DUMP_TEMP_FILE",)),
        ({"TORCH_FR_DUMP_TEMP_FILE": "/scratch/me/fr_"}, ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE",)),
        ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, ()),
    ],
)
def test_the_jobs_own_setting_under_either_name_wins(tmp_path, own, kept_out):
    config, _ = _prepared(tmp_path)
    pairs = dict(exports(config, own, "42"))
    # A newer PyTorch reads TORCH_FR_* first: exporting it would override the job's old name.
    assert not (set(own) | set(kept_out)) & set(pairs)
    assert len(set(FR_ALL) & set(pairs)) == len(FR_ALL) - len(own) - len(kept_out)


def test_the_site_turns_it_off(tmp_path):
    config, _ = _prepared(tmp_path, flight_recorder=False)
    assert not set(FR_ALL) & set(dict(exports(config, {}, "42")))


@pytest.mark.parametrize(
    ("comment", "off"),
    [
        ("gpugate:no-fr", True),
        ("run 3, gpugate:ckpt=/d gpugate:no-fr", True),
        ("gpugate:no-ckpt", False),  # comment_tokens reads both as "no"
        ("gpugate:no-frx", False),
        ("xgpugate:no-fr", False),
    ],
)
def test_the_comment_opt_out_reaches_the_task_prolog_through_the_task_file(tmp_path, comment, off):
    from gpugate.hooks.prolog import prepare_task_file
    from gpugate.slurm.hookenv import HookEnv

    config, _ = _prepared(tmp_path)
    env = HookEnv(job_id="42", uid=os.getuid(), gid=os.getgid(), comment=comment)
    prepare_task_file(config, env)
    pairs = dict(exports(config, {}, "42"))
    assert ("TORCH_FR_BUFFER_SIZE" not in pairs) is off
    if "ckpt=/d" in comment:
        assert pairs["GPUGATE_CKPT_DIR"] == "/d"  # the checkpoint still travels with it

"""TaskProlog: the seed's NCCL settings, never overriding what the job set itself."""

from __future__ import annotations

import os

import pytest
from factories import default_config
from gpugate.slurm_hooks.task_prolog import exports, nccl_job_dir, prepare_nccl_dir, render


def config_with(tmp_path, **task_prolog):
    config = default_config()
    tp = config.task_prolog.replace(nccl_debug_dir=str(tmp_path / "nccl"), **task_prolog)
    return config.replace(task_prolog=tp)


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
    assert capsys.readouterr().out == ""

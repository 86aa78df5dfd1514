"""Upgrades never turn gating off (issue 40): old values migrated, refused keys loud, still gating.

The previous release's files are fixtures (tests/fixtures/upgrade/): its whole packaged
gpugate.yaml (every key and value it accepted) and a site file written for it. The current
release accepts both, with one warning naming the key, the file and the new value. A key it
does refuse is said by every hook on stderr (slurmd's log) and left out: the hooks keep
gating with its packaged default. Only a broken install (the packaged file itself unusable)
lets a job through, and says so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import paths
import pytest
from factories import make_facts

import gpugate.config as config_module
from gpugate.cli import main
from gpugate.config import (
    ConfigError,
    error_key,
    load_config,
    load_config_for_hook,
    load_config_warned,
)
from gpugate.yamlio import dump_yaml

FIXTURES = paths.FIXTURES / "upgrade"
OLD_FILES = ("gpugate-previous-release.yaml", "site-previous-release.yaml")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """The built-Config cache in this test's own directory (a fetched config says it too)."""
    monkeypatch.setenv("GPUGATE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", OLD_FILES)
def test_the_previous_releases_files_are_accepted_with_one_warning(name):
    path = str(FIXTURES / name)
    config, warnings = load_config_warned(path)
    assert config.requeue.wait_for_bundles_s == config.epilog.deadline_s == 45
    (warning,) = warnings
    assert warning.startswith(f"{path}: requeue.wait_for_bundles_s: 30 s is shorter than")
    assert "raised to 45 s" in warning


def test_the_migration_warning_is_said_on_stderr_each_time_even_from_the_cache(capsys):
    path = str(FIXTURES / "site-previous-release.yaml")
    for _ in range(2):  # the second load is fetched from the built-Config cache
        config_module._said.clear()  # a new process
        assert load_config(path).requeue.wait_for_bundles_s == 45
        err = capsys.readouterr().err
        assert f"gpugate: config: {path}: requeue.wait_for_bundles_s: 30 s" in err, err


def test_a_wait_at_least_the_deadline_is_no_warning(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("requeue:\n  wait_for_bundles_s: 50\nepilog:\n  deadline_s: 45\n")
    config, warnings = load_config_warned(str(site))
    assert config.requeue.wait_for_bundles_s == 50 and warnings == []


def test_a_refused_key_is_left_out_and_the_rest_kept(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(
        "state_dir: /srv/state\nchecks:\n  disabled: [gpu.nope, gpu.temperature]\n"
        "  gpu: {ecc_aggregate_uncorrected_max: 7, temperature_max_c: hot}\n"
        "budget: {jitter_s: 50}\nclasses:\n  - nodes: n1\n    expect: {gpu_count: many}\n"
    )
    with pytest.raises(ConfigError):
        load_config(str(site))
    config, problems = load_config_for_hook(str(site))
    assert config.state_dir == "/srv/state"
    assert config.checks.disabled == ["gpu.temperature"]  # only the unknown id left out
    assert config.checks.gpu.ecc_aggregate_uncorrected_max == 7
    assert (
        config.checks.gpu.temperature_max_c == load_config("/dev/null").checks.gpu.temperature_max_c
    )
    assert config.budget.jitter_s == 0.5
    keys = [p.split(": ")[1] for p in problems]
    assert keys == ["checks.disabled[0]", "checks.gpu.temperature_max_c", "budget.jitter_s",
                    "classes[0].expect.gpu_count"]  # fmt: skip
    assert all(p.startswith(f"{site}: ") and "REFUSED" in p for p in problems)
    assert all("`gpugate config check`" in p for p in problems)


@pytest.mark.parametrize("text", [":\n - [", "- a list\n"])
def test_an_unusable_site_file_gates_with_the_packaged_defaults(tmp_path, text):
    site = tmp_path / "site.yaml"
    site.write_text(text)
    config, problems = load_config_for_hook(str(site))
    assert config == load_config("/dev/null")
    (problem,) = problems
    assert problem.startswith(f"{site}: ") and "the whole file ignored" in problem


def test_error_key_reads_the_key_a_message_names():
    site = "/etc/gpugate/gpugate.yaml"
    assert error_key(f"{site}: checks.gpu.x: unknown key (known: a, b)", site) == "checks.gpu.x"
    assert error_key(f"{site}: classes[2]: names no nodes: hostlist", site) == "classes[2]"
    assert error_key(f"{site}: not valid YAML (line 1): x", site) is None
    assert error_key("/other.yaml: a: b", site) is None


# --------------------------------------------------------------------------- the hooks


@pytest.fixture
def faulty_node(tmp_path, monkeypatch):
    """A site whose node has an uncorrectable ECC error, its state in tmp_path (never the host's)."""
    snap = tmp_path / "gpu-node-01.yaml"
    snap.write_text(dump_yaml(make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}}).to_dict()))
    for key, value in {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu-node-01",
                       "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GID": str(os.getgid())}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: the drain fails fast
    monkeypatch.setenv("GPUGATE_FALLBACK_STATE_DIR", str(tmp_path / "fallback"))
    base = (f"facts_file: {tmp_path}/{{node}}.yaml\nstate_dir: {tmp_path / 'state'}\n"
            f"evidence_dir: {tmp_path / 'ev'}\ntask_prolog:\n  nccl_debug_dir: null\n")  # fmt: skip
    return tmp_path, base


def prolog_events(tmp_path: Path) -> list[dict]:
    path = tmp_path / "state" / "events.jsonl"
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["hook"] == "prolog"]


def test_the_old_site_file_keeps_the_prolog_gating(faulty_node, capsys):
    tmp_path, base = faulty_node
    site = tmp_path / "site.yaml"
    site.write_text(base + (FIXTURES / "site-previous-release.yaml").read_text())
    assert main(["prolog", "--config", str(site)]) == 1  # the job is refused
    err = capsys.readouterr().err
    assert f"{site}: requeue.wait_for_bundles_s: 30 s is shorter" in err, err
    assert "raised to 45 s" in err
    assert prolog_events(tmp_path)[-1]["refused"] is True


@pytest.mark.parametrize("hook", ["prolog", "epilog", "task-prolog", "epilog-slurmctld", "health"])
def test_a_refused_key_is_loud_in_every_hook(faulty_node, capsys, monkeypatch, hook):
    """On stderr (slurmd logs a failing hook's) and syslog (a passing one's is not logged)."""
    import syslog

    logged: list[tuple[int, str]] = []
    monkeypatch.setattr(
        syslog, "syslog", lambda priority, message: logged.append((priority, message))
    )
    tmp_path, base = faulty_node
    site = tmp_path / "site.yaml"
    site.write_text(base + "checks:\n  gpu: [not, a, mapping]\n")
    code = main([hook, "--config", str(site)])
    err = capsys.readouterr().err
    line = f"gpugate: {hook}: config: {site}: checks.gpu: expected a mapping"
    assert line in err, err
    assert "REFUSED: checks.gpu ignored, gating with its packaged default" in err
    assert "`gpugate config check`" in err
    assert [m for p, m in logged if p == syslog.LOG_WARNING and "REFUSED: checks.gpu" in m]
    # Still gating: the prolog refuses the job on the faulty node, the others ran their body.
    assert code == (1 if hook == "prolog" else 0)
    assert not (tmp_path / "fallback").exists()
    if hook == "prolog":
        assert prolog_events(tmp_path)[-1]["refused"] is True


@pytest.mark.parametrize("hook", ["prolog", "epilog", "task-prolog", "epilog-slurmctld"])
def test_a_broken_install_lets_the_job_run_and_says_it_is_not_gating(
    faulty_node, capsys, monkeypatch, hook
):
    """The packaged file itself unusable: nothing to gate with; the job runs, loudly."""
    tmp_path, base = faulty_node
    broken = tmp_path / "packaged.yaml"
    broken.write_text("- not a mapping\n")
    monkeypatch.setattr(config_module, "PACKAGED_FILE", str(broken))
    site = tmp_path / "site.yaml"
    site.write_text(base)
    assert main([hook, "--config", str(site)]) == 0
    err = capsys.readouterr().err
    if hook == "task-prolog":  # runs as the job's user: it writes no state at all
        assert "expected a mapping at the top" in err
        assert not (tmp_path / "fallback").exists()
        return
    assert "CONFIGURATION UNUSABLE, NOT GATING" in err
    assert "NOT GATING" in (tmp_path / "fallback" / "gpugate.log").read_text()
    (event,) = map(json.loads, (tmp_path / "fallback" / "events.jsonl").read_text().splitlines())
    assert event["hook"] == hook and event["outcome"] == "internal_error"


# ---------------------------------------------------------------- gpugate config check


def test_config_check_passes_the_old_file_with_its_warning(capsys):
    path = str(FIXTURES / "site-previous-release.yaml")
    assert main(["config", "check", "--config", path]) == 0
    out = capsys.readouterr().out
    assert f"warning: {path}: requeue.wait_for_bundles_s: 30 s" in out
    assert out.splitlines()[-1] == f"gpugate config: {path}: ok (with the warnings above)"


def test_config_check_lists_every_refused_key_and_exits_2(tmp_path, capsys):
    site = tmp_path / "site.yaml"
    site.write_text("checks:\n  gpu: [x]\nbudget: {jitter_s: 50}\n")
    assert main(["config", "check", "--config", str(site)]) == 2
    out = capsys.readouterr().out
    assert f"{site}: checks.gpu: expected a mapping" in out
    assert f"{site}: budget.jitter_s: must be at most 10" in out
    assert "the hooks still gate" in out


def test_config_check_of_no_site_file_is_ok(capsys):
    assert main(["config", "check", "--config", "/dev/null"]) == 0
    assert capsys.readouterr().out == "gpugate config: /dev/null: ok\n"

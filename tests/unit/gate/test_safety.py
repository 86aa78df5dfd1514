"""gpugate's own failures, hangs and concurrent hooks: one documented outcome, never an outage.

Default outcome of gpugate's own failure in any hook: the job runs, the node is not drained,
the error is logged (gpugate.log) and counted (events.jsonl), exit 0 (`prolog.on_error:
refuse` turns the prolog's into exit 1). A source that never returns is cut at its timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import make_facts

from gpugate.cli import main
from gpugate.yamlio import dump_yaml

HOOKS = ["prolog", "epilog", "task-prolog", "epilog-slurmctld"]
# Each hook's body, named where the hook's entry looks it up (the one place to break it).
BODIES = {
    "prolog": "gpugate.commands.prolog.run_prolog",
    "epilog": "gpugate.commands.epilog.run_epilog",
    "epilog-slurmctld": "gpugate.hooks.epilog_slurmctld.run_requeue",
    "task-prolog": "gpugate.commands.task_prolog.exports",
}


@pytest.fixture
def hook_env(tmp_path, monkeypatch):
    snap = tmp_path / "gpu-node-01.yaml"
    snap.write_text(dump_yaml(make_facts().to_dict()))
    site = tmp_path / "site.yaml"
    site.write_text(
        f"facts_file: {tmp_path}/{{node}}.yaml\nstate_dir: {tmp_path / 'state'}\n"
        f"evidence_dir: {tmp_path / 'ev'}\ntask_prolog:\n  nccl_debug_dir: null\n"
    )
    for key, value in {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu-node-01", "SLURM_JOB_UID": str(os.getuid()),
                       "SLURM_JOB_GID": str(os.getgid()), "SLURM_JOB_EXIT_CODE2": "1:0"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(
        "PATH", "/nonexistent"
    )  # no scontrol: Slurm calls fail fast, like a dead controller
    return tmp_path, site


def events(tmp_path: Path) -> list[dict]:
    """The node hooks' events (state_dir) and the controller's (controller_dir), in that order."""
    found = []
    for path in (
        tmp_path / "state" / "events.jsonl",
        tmp_path / "state" / "controller" / "events.jsonl",
    ):
        found += (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )
    return found


@pytest.mark.parametrize("hook", HOOKS)
def test_a_crash_in_any_hook_lets_the_job_run(hook, hook_env, monkeypatch, capsys):
    tmp_path, site = hook_env

    def boom(*args, **kwargs):
        raise RuntimeError("injected bug")

    monkeypatch.setattr(BODIES[hook], boom)
    assert main([hook, "--config", str(site)]) == 0
    captured = capsys.readouterr()
    if hook == "task-prolog":
        assert captured.out == ""  # nothing half-exported into the job
    else:
        assert "injected bug" in captured.err
        assert events(tmp_path)[-1]["outcome"] == "internal_error"
        # The controller writes only its own directory (controller_dir: state/controller).
        where = tmp_path / "state" / ("controller" if hook == "epilog-slurmctld" else "")
        assert "injected bug" in (where / "gpugate.log").read_text()


def test_an_unreadable_baseline_does_not_stop_the_epilog(hook_env):
    tmp_path, site = hook_env
    job_dir = tmp_path / "state" / "jobs" / "42"
    job_dir.mkdir(parents=True)
    (job_dir / "baseline.json").write_bytes(b"\x00{not json")
    assert main(["epilog", "--config", str(site)]) == 0
    assert events(tmp_path)[-1]["hook"] == "epilog" and "outcome" not in events(tmp_path)[-1]


def test_a_source_that_never_returns_is_cut_at_its_timeout(monkeypatch):
    from gpugate.checks import sources
    from gpugate.config import load_config

    module = type(sys)("gpugate_test_hang")
    module.read_hang = lambda config: time.sleep(3600)
    monkeypatch.setitem(sys.modules, "gpugate_test_hang", module)
    monkeypatch.setattr(sources, "SOURCES", {"host": ("gpugate_test_hang", "read_hang")})
    config = load_config("/dev/null")
    config = config.replace(
        sources=config.sources.replace(timeout_s=config.sources.timeout_s.replace(host=0.5))
    )
    started = time.monotonic()
    snap = sources.gather_dict(config, "n1")
    assert time.monotonic() - started < 2
    assert snap["source_errors"]["host"] == "timed out after 0.5 s"


def test_a_hung_source_is_also_bounded_by_the_deadline(monkeypatch):
    from gpugate.checks import sources
    from gpugate.config import load_config

    module = type(sys)("gpugate_test_hang2")
    module.read_hang = lambda config: time.sleep(3600)
    monkeypatch.setitem(sys.modules, "gpugate_test_hang2", module)
    monkeypatch.setattr(sources, "SOURCES", {"nvml": ("gpugate_test_hang2", "read_hang")})
    started = time.monotonic()
    snap = sources.gather_dict(load_config("/dev/null"), "n1", deadline_s=0.5)  # nvml's own is 8 s
    assert time.monotonic() - started < 2 and "nvml" in snap["source_errors"]


def test_concurrent_prologs_and_epilogs_keep_their_state_apart(hook_env):
    """Eight jobs' prologs, then their epilogs, all at once on one node (shared nodes)."""
    tmp_path, site = hook_env
    gpugate = str(Path(sys.executable).parent / "gpugate")
    base = dict(os.environ, GPUGATE_CACHE_DIR=str(tmp_path / "cache"))

    def run_all(hook: str) -> None:
        procs = [
            subprocess.Popen(
                [gpugate, hook, "--config", str(site)],
                env=dict(base, SLURM_JOB_ID=str(100 + i)),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for i in range(8)
        ]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()

    run_all("prolog")
    for i in range(8):
        baseline = json.loads(
            (tmp_path / "state" / "jobs" / str(100 + i) / "baseline.json").read_text()
        )
        assert baseline["job_id"] == str(100 + i) and len(baseline["gpus"]) == 8
    run_all("epilog")  # exit code 1 in the environment: every job gets its own bundle
    for i in range(8):
        summary = json.loads(
            (tmp_path / "ev" / str(100 + i) / "gpu-node-01-r0" / "summary.json").read_text()
        )
        assert summary["job_id"] == str(100 + i)
    runs = events(tmp_path)  # every line whole: one write() per event with O_APPEND
    assert len([e for e in runs if e["hook"] == "prolog"]) == 8
    assert len([e for e in runs if e["hook"] == "epilog"]) == 8
    assert not list((tmp_path / "ev").glob("*/.*"))  # no half-written bundle left behind

"""The prolog's decisions, with Slurm faked at the adapter (the real Slurm runs in test_e2e_*)."""

from __future__ import annotations

import json

import pytest
from factories import default_config, make_facts, this_boot
from fakes import NODE, FakeSlurm, SharedSlurm, drained
from prolog_setup import env, setup

from gpugate.hooks.prolog import run_prolog


def test_healthy_node_allows_and_saves_the_baseline(tmp_path):
    slurm = FakeSlurm()
    result = run_prolog(setup(tmp_path, make_facts()), env(), slurm)
    assert (result.exit_code, result.action) == (0, "allow")
    assert slurm.drains == []
    baseline = json.loads((tmp_path / "state/jobs/42/baseline.json").read_text())
    assert baseline["gpus"]["3"]["ecc_aggregate_uncorrected"] == 0


def test_broken_gpu_of_the_job_drains_and_refuses(tmp_path):
    slurm = FakeSlurm()
    facts = make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}})
    result = run_prolog(setup(tmp_path, facts), env(gpus=(2, 3)), slurm)
    assert (result.exit_code, result.refused, result.drained) == (1, True, True)
    assert slurm.drains == [("gpu-node-01", result.reason)]
    assert result.reason.startswith("gpugate: gpu.ecc: GPU3 ")
    assert slurm.comments[0][1].startswith("gpugate: node gpu-node-01 refused: gpu.ecc")


def test_broken_gpu_outside_the_job_drains_but_lets_it_start(tmp_path):
    slurm = SharedSlurm("gpu:h100:2(IDX:0-1)")  # GPU 7 is no job's: its heat is the node's
    facts = make_facts(gpus={7: {"temperature_c": 95.0}})
    result = run_prolog(setup(tmp_path, facts), env(gpus=(0, 1)), slurm)
    assert (result.exit_code, result.drained, result.refused) == (0, True, False)
    assert slurm.comments == []


def test_site_can_refuse_for_other_gpus_too(tmp_path):
    facts = make_facts(gpus={7: {"temperature_c": 95.0}})
    slurm = SharedSlurm("gpu:h100:2(IDX:0-1)")  # GPU 7 is no job's
    result = run_prolog(setup(tmp_path, facts, refuse_for_other_gpus=True), env(gpus=(0, 1)), slurm)
    assert result.exit_code == 1


def test_node_wide_failure_refuses_any_job(tmp_path):
    from gpugate.checks.facts import Limits

    facts = make_facts(limits=Limits(nofile_soft=1024, nofile_hard=1024))
    result = run_prolog(setup(tmp_path, facts), env(gpus=(0,)), FakeSlurm())
    assert result.exit_code == 1 and result.reason.startswith("gpugate: host.nofile: ")


def test_admins_drain_is_kept_and_the_job_still_refused(tmp_path):
    slurm = FakeSlurm(nodes=[drained(NODE, "fan swap", user="admin")])
    facts = make_facts(gpus={0: {"error": "gpu_is_lost"}})
    result = run_prolog(setup(tmp_path, facts), env(), slurm)
    assert result.exit_code == 1 and not result.drained and slurm.drains == []


def test_a_prolog_drain_runs_the_real_budget_count_and_settle(tmp_path):
    slurm = FakeSlurm()
    facts = make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}})
    result = run_prolog(setup(tmp_path, facts), env(), slurm)
    # One read to count before the drain, one to settle after it; the drain stands.
    assert slurm.listings == 2 and result.drained and slurm.resumed == []
    assert slurm.node(NODE).drained and slurm.node(NODE).reason == result.reason


def test_several_failures_name_the_first_and_count_the_rest(tmp_path):
    facts = make_facts(gpus={1: {"error": "gpu_is_lost"}, 2: {"temperature_c": 99.0}})
    slurm = SharedSlurm("gpu:0(IDX:N/A)")  # no job holds a GPU: GPU 2's heat is the node's
    result = run_prolog(setup(tmp_path, facts), env(), slurm)
    assert "(+1 more)" in result.reason or "(+2 more)" in result.reason


def test_report_only_never_drains(tmp_path):
    config = setup(tmp_path, make_facts(gpus={3: {"error": "gpu_is_lost"}}))
    config = config.replace(policy=config.policy.replace(report_only=True))
    slurm = FakeSlurm()
    result = run_prolog(config, env(), slurm)
    assert result.exit_code == 0 and slurm.drains == [] and result.status == "fail"


@pytest.mark.parametrize(("allowed", "expected_exit"), [(True, 0), (False, 1)])
def test_user_skip_token_only_when_the_site_allows_it(tmp_path, allowed, expected_exit):
    facts = make_facts(gpus={3: {"error": "gpu_is_lost"}})
    config = setup(tmp_path, facts, allow_user_skip=allowed)
    result = run_prolog(config, env(comment="run 7 gpugate:skip"), FakeSlurm())
    assert result.exit_code == expected_exit


def test_gpugates_own_crash_allows_the_job_by_default(tmp_path, monkeypatch, capsys):
    from gpugate.cli import main

    site = tmp_path / "site.yaml"
    site.write_text(
        f"facts_file: {tmp_path / 'missing-snapshot.yaml'}\nstate_dir: {tmp_path / 'state'}\n"
    )
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node-01")
    assert main(["prolog", "--config", str(site)]) == 0
    assert "internal error" in capsys.readouterr().err
    events = [json.loads(x) for x in (tmp_path / "state/events.jsonl").read_text().splitlines()]
    assert events[-1]["outcome"] == "internal_error"


def test_on_error_refuse_fails_the_prolog(tmp_path, monkeypatch):
    from gpugate.cli import main

    site = tmp_path / "site.yaml"
    site.write_text(
        f"facts_file: {tmp_path / 'missing.yaml'}\nstate_dir: {tmp_path / 'state'}\nprolog:\n  on_error: refuse\n"
    )
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert main(["prolog", "--config", str(site)]) == 1


def test_kernel_log_is_read_from_where_the_last_check_stopped(tmp_path):
    from gpugate.checks.sources import since_seq
    from gpugate.store.state import load_kernel_pos, save_kernel_pos

    config = this_boot(default_config().replace(state_dir=str(tmp_path)), tmp_path, "boot-a")
    save_kernel_pos(str(tmp_path), "boot-a", 1234)
    assert since_seq(config, load_kernel_pos(config.state_dir)) == 1234
    save_kernel_pos(str(tmp_path), "boot-b", 99)  # an earlier boot: read everything
    assert since_seq(config, load_kernel_pos(config.state_dir)) is None
    assert load_kernel_pos(str(tmp_path)) == ("boot-b", 99)

"""Staged roll-out of a check (issue 45): report-only per check, a canary partition where a
check may act, and each check's false-drain rate with its stage (gate/policy.py,
admin/rollout.py). Slurm faked at the adapter."""

from __future__ import annotations

import json

import pytest
from factories import make_facts
from fakes import NODE, FakeSlurm
from prolog_setup import env, setup

from gpugate import cli
from gpugate.admin import report as R
from gpugate.admin.rollout import OTHER, check_rates
from gpugate.checks.facts import Limits
from gpugate.checks.findings import fail
from gpugate.config import ConfigError, load_config, load_config_for_hook
from gpugate.config.schema import Canary
from gpugate.gate.policy import ACTING, CANARY, DRAIN, REPORT_ONLY, WARN, decide, rollout
from gpugate.hooks.health import run_health
from gpugate.hooks.prolog import run_prolog
from gpugate.slurm.hookenv import from_environ
from gpugate.slurm.records import NodeInfo
from gpugate.store import history as H
from gpugate.store.entries import AuditEntry, DrainEntry
from gpugate.store.metrics import check_rate_samples, note_check_rates, parse_samples, render
from gpugate.store.outcomes import check_record

ECC = {3: {"ecc_aggregate_uncorrected": 120}}
NOW = 1_790_000_000.0
DAY = 86400.0


def staged(config, report_only=(), canary=(), partitions=(), everything=False):
    """`config` with the policy's roll-out keys set."""
    policy = config.policy.replace(
        report_only=everything,
        report_only_checks=list(report_only),
        canary=Canary(checks=list(canary), partitions=list(partitions)),
    )
    return config.replace(policy=policy)


# ------------------------------------------------------------------------- the decision


def test_a_report_only_check_never_drains_while_another_still_does():
    policy = staged(load_config("/dev/null"), report_only=["gpu.ecc"]).policy
    ecc, nofile = fail("gpu.ecc", "gpu.ecc: GPU3 120"), fail("host.nofile", "host.nofile: 1024")
    alone = decide([ecc], policy)
    assert (alone.status, alone.action, alone.failing, alone.reported) == ("fail", WARN, (), (ecc,))
    both = decide([ecc, nofile], policy)
    assert (both.status, both.action) == ("fail", DRAIN)
    assert both.failing == (nofile,) and both.reported == (ecc,)
    assert both.failures == (nofile, ecc)


def test_a_family_names_every_check_of_it():
    policy = staged(load_config("/dev/null"), report_only=["ib.*"]).policy
    assert rollout("ib.rate", policy) == rollout("ib.ports", policy) == REPORT_ONLY
    assert rollout("gpu.ecc", policy) == ACTING
    assert rollout("ibx.rate", policy) == ACTING  # a family is `ib.`, not every "ib" prefix


def test_a_canary_check_acts_only_in_its_partitions():
    policy = staged(load_config("/dev/null"), canary=["gpu.ecc"], partitions=["canary"]).policy
    ecc = fail("gpu.ecc", "gpu.ecc: GPU3 120")
    assert rollout("gpu.ecc", policy) == CANARY
    assert decide([ecc], policy, partitions=("canary",)).action == DRAIN
    assert decide([ecc], policy, partitions=("gpu", "canary")).action == DRAIN
    assert decide([ecc], policy, partitions=("gpu",)).action == WARN
    assert decide([ecc], policy).action == WARN  # partition unknown: the safe side
    # Report-only wins over the canary, and the global switch over both.
    both = staged(load_config("/dev/null"), report_only=["gpu.ecc"], canary=["gpu.ecc"],
                  partitions=["canary"]).policy  # fmt: skip
    assert decide([ecc], both, partitions=("canary",)).action == WARN
    every = staged(load_config("/dev/null"), canary=["gpu.ecc"], partitions=["canary"],
                   everything=True).policy  # fmt: skip
    assert decide([ecc], every, partitions=("canary",)).action == WARN


def test_the_global_switch_still_reports_every_failure_as_failing():
    policy = staged(load_config("/dev/null"), everything=True).policy
    ecc = fail("gpu.ecc", "gpu.ecc: GPU3 120")
    decision = decide([ecc], policy)
    assert (decision.action, decision.failing, decision.reported) == (WARN, (ecc,), ())


def test_a_report_only_failure_holds_no_drained_node_out(tmp_path):
    from health_setup import setup as health_site

    from gpugate.admin.resume import Request, check_then_resume

    drained_for = "gpugate: gpu.temperature: hot"
    info = NodeInfo(name=NODE, state="IDLE", flags=("DRAIN",), reason=drained_for,
                    partitions=("gpu",))  # fmt: skip
    for stage, resumed in (({"report_only": ["gpu.ecc"]}, True), ({}, False)):
        where = tmp_path / str(resumed)
        where.mkdir()
        config = staged(health_site(where, make_facts(gpus=ECC)), **stage)
        H.record_drain(config.state_dir, NODE, drained_for)
        attempt = check_then_resume(config, FakeSlurm(nodes=[info]), info,
                                    Request(node=NODE, why="cooled"))  # fmt: skip
        assert attempt.resumed is resumed, attempt


@pytest.mark.parametrize(("report_only", "action"), [(["gpu.ecc"], "lift"), ([], "keep")])
def test_healing_is_not_held_by_a_report_only_failure(tmp_path, report_only, action):
    from health_setup import setup as health_site

    drained_for = "gpugate: gpu.temperature: hot"
    config = staged(health_site(tmp_path, make_facts(gpus=ECC), passes=1), report_only=report_only)
    H.record_drain(config.state_dir, NODE, drained_for)
    info = NodeInfo(name=NODE, state="IDLE", flags=("DRAIN",), reason=drained_for,
                    partitions=("gpu",))  # fmt: skip
    result = run_health(config, NODE, FakeSlurm(nodes=[info]))
    assert (result.action, result.resumed, result.status) == (action, action == "lift", "fail")


def test_the_hooks_read_the_jobs_partition_from_slurm():
    assert from_environ({"SLURM_JOB_PARTITION": "canary"}).partition == "canary"
    assert from_environ({}).partition is None


# ------------------------------------------------------------------------- the hooks


def test_prolog_a_report_only_failure_is_reported_and_another_check_drains(tmp_path):
    limits = Limits(nofile_soft=1024, nofile_hard=1024)
    config = staged(setup(tmp_path, make_facts(gpus=ECC, limits=limits)), report_only=["gpu.*"])
    slurm = FakeSlurm()
    result = run_prolog(config, env(gpus=(3,)), slurm)
    assert result.drained and result.reason.startswith("gpugate: host.nofile: ")
    assert result.statuses["gpu.ecc"] == "fail"  # the metrics still say it failed
    assert "gpu.ecc" in result.message and "(report only here)" in result.message


def test_prolog_a_report_only_failure_alone_never_drains(tmp_path):
    config = staged(setup(tmp_path, make_facts(gpus=ECC)), report_only=["gpu.ecc"])
    slurm = FakeSlurm()
    result = run_prolog(config, env(gpus=(3,)), slurm)
    assert (result.exit_code, result.status, result.action) == (0, "fail", WARN)
    assert slurm.drains == [] and result.statuses["gpu.ecc"] == "fail"
    events = (tmp_path / "state/events.jsonl").read_text().splitlines()
    assert json.loads(events[-1])["status"] == "fail"


@pytest.mark.parametrize(("partition", "drains"), [("canary", True), ("gpu", False), (None, False)])
def test_prolog_a_canary_check_drains_only_for_a_job_of_the_canary(tmp_path, partition, drains):
    config = staged(setup(tmp_path, make_facts(gpus=ECC)), canary=["gpu.ecc"],
                    partitions=["canary"])  # fmt: skip
    slurm = FakeSlurm()
    result = run_prolog(config, env(gpus=(3,), partition=partition), slurm)
    assert result.drained is drains and bool(slurm.drains) is drains
    assert result.status == "fail" and result.exit_code == (1 if drains else 0)


@pytest.mark.parametrize(("partitions", "drains"), [(["gpu"], True), (["canary"], False)])
def test_health_judges_a_canary_by_the_nodes_partitions(tmp_path, partitions, drains):
    from health_setup import setup as health_site

    config = staged(health_site(tmp_path, make_facts(gpus=ECC)), canary=["gpu.ecc"],
                    partitions=partitions)  # fmt: skip
    others = [NodeInfo(name=f"gpu-node-0{i}", state="IDLE", partitions=("gpu",)) for i in (2, 3, 4)]
    slurm = FakeSlurm([NodeInfo(name=NODE, state="IDLE", partitions=("gpu",)), *others])
    result = run_health(config, NODE, slurm)
    assert result.drained is drains and result.status == "fail"


def test_epilog_a_canary_hardware_fault_drains_only_for_a_job_of_the_canary(tmp_path):
    from epilog_setup import XID79, slurm_with_job, snapshot
    from epilog_setup import env as epilog_env
    from epilog_setup import setup as epilog_site

    from gpugate.hooks.epilog import run_epilog

    for partition, drains in (("canary", True), ("gpu", False)):
        where = tmp_path / partition
        where.mkdir()
        config = staged(epilog_site(where), canary=["kernel.xid"], partitions=["canary"])
        snapshot(where, make_facts())
        assert run_prolog(config, env(partition=partition, job_id="77"),
                          slurm_with_job("")).exit_code == 0  # fmt: skip
        (where / "job.out").write_text("step 1\n")
        snapshot(where, make_facts(kernel_log=(XID79,)))
        slurm = slurm_with_job(str(where / "job.out"))
        result = run_epilog(config, epilog_env(exit_code=9, exit_code2="0:9", partition=partition),
                            slurm)  # fmt: skip
        # Reported as a hardware fault either way (the bundle, the job's verdict).
        assert result.hardware_fault and result.hardware_checks == ("kernel.xid",)
        assert result.drained is drains and bool(slurm.drains) is drains


# ------------------------------------------------------------------------- the config


def site_file(tmp_path, text: str) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("value", [True, False])
def test_old_report_only_files_load_and_mean_what_they_meant(tmp_path, value):
    config = load_config(site_file(tmp_path, f"policy:\n  report_only: {str(value).lower()}\n"))
    assert config.policy.report_only is value
    assert config.policy.report_only_checks == [] and config.policy.canary.checks == []
    expected = REPORT_ONLY if value else ACTING
    assert {rollout(c, config.policy) for c in ("gpu.ecc", "ib.rate")} == {expected}


def test_the_new_keys_load(tmp_path):
    text = ("policy:\n  report_only_checks: [ib.*, gpu.power_limit]\n"
            "  canary: {checks: [nvlink.fabric], partitions: [canary, h200-test]}\n")  # fmt: skip
    policy = load_config(site_file(tmp_path, text)).policy
    assert policy.report_only_checks == ["ib.*", "gpu.power_limit"]
    assert policy.canary == Canary(checks=["nvlink.fabric"], partitions=["canary", "h200-test"])


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("policy:\n  report_only: [gpu.ecc]\n", "policy.report_only: expected bool"),
        ("policy:\n  report_only_checks: [gpu.eccc]\n",
         "policy.report_only_checks[0]: unknown check 'gpu.eccc' or a family such as 'ib.*'"),
        ("policy:\n  report_only_checks: [nosuch.*]\n",
         "policy.report_only_checks[0]: unknown check 'nosuch.*'"),
        ("policy:\n  report_only_checks: ib.rate\n", "policy.report_only_checks: expected a list"),
        ("policy:\n  canary: {checks: [gpu.ecc]}\n",
         "policy.canary.checks: names checks but policy.canary.partitions is empty"),
        ("policy:\n  canary: {checks: [gpu.ecc], partitions: canary}\n",
         "policy.canary.partitions: expected a list"),
        ("policy:\n  canary: {checks: [gpu.ecc], partitions: ['a,b']}\n",
         "policy.canary.partitions[0]: 'a,b' is not a partition name"),
        ("policy:\n  canary: {check: [gpu.ecc]}\n", "policy.canary.check: unknown key"),
        ("policy:\n  warn_only: [ib.*]\n", "policy.warn_only[0]: unknown check 'ib.*' (known"),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_naming_its_key(tmp_path, text, named):
    path = site_file(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert named in str(refused.value)


def test_a_hook_leaves_a_canary_without_partitions_out_and_still_gates(tmp_path):
    path = site_file(tmp_path, "policy:\n  canary: {checks: [gpu.ecc]}\n  unknown: fail\n")
    config, problems = load_config_for_hook(path)
    assert config.policy.canary.checks == [] and config.policy.unknown == "fail"
    assert any("policy.canary.checks" in p and "REFUSED" in p for p in problems)


# ------------------------------------------------------------------------- what is shown


def test_check_and_config_check_show_each_checks_stage(tmp_path, capsys):
    facts = tmp_path / "facts.yaml"
    from gpugate.yamlio import dump_yaml

    facts.write_text(dump_yaml(make_facts(gpus=ECC).to_dict()))
    path = site_file(tmp_path, "policy:\n  report_only_checks: [gpu.ecc]\n"
                     "  canary: {checks: [ib.*], partitions: [canary]}\n")  # fmt: skip
    assert cli.main(["check", "--facts", str(facts), "--config", path]) == 1
    out = capsys.readouterr().out
    assert any("gpu.ecc" in line and line.endswith("[report-only]") for line in out.splitlines())
    assert cli.main(["check", "--facts", str(facts), "--config", path, "--json"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert found["action"] == "warn"
    assert {f["rollout"] for f in found["findings"] if f["check"] == "gpu.ecc"} == {REPORT_ONLY}
    assert {f["rollout"] for f in found["findings"] if f["check"] == "ib.rate"} <= {CANARY}
    assert cli.main(["config", "check", "--config", path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "gpugate config: policy.report_only_checks: gpu.ecc: report only, never drain" in lines
    assert ("gpugate config: policy.canary: ib.*: act only in partitions canary, report "
            "elsewhere") in lines  # fmt: skip
    assert lines[-1] == f"gpugate config: {path}: ok"


# ------------------------------------------------------------------------- the rates


def drain(node: str, check: str, days_ago: float, boot: str = "b1", **extra) -> DrainEntry:
    return DrainEntry.from_json({"node": node, "when": NOW - days_ago * DAY, "check": check,
                                 "reason": f"gpugate: {check}: x", "boot_id": boot, **extra})  # fmt: skip


def lift(node: str, days_ago: float, boot: str = "b1", **extra) -> AuditEntry:
    return AuditEntry.from_json({"node": node, "when": NOW - days_ago * DAY, "who": "ann",
                                 "why": "ok", "resumed": True, "forced": False, "boot_id": boot,
                                 **extra})  # fmt: skip


def history():
    """gpu.ecc: 3 drains, 1 lifted after a reboot, 1 lifted without repair, 1 still drained;
    ib.rate: 2 drains on the canary, both lifted without repair; a drill's drain of ib.rate,
    lifted with no repair, that never counts; a drain of a check gpugate no longer has."""
    drains = [
        drain("n1", "gpu.ecc", 10), drain("n1", "gpu.ecc", 5), drain("n2", "gpu.ecc", 4),
        drain("c1", "ib.rate", 6), drain("c2", "ib.rate", 3),
        drain("c3", "ib.rate", 2, reason="gpugate: DRILL d1: ib.rate: x", drill="d1"),
        drain("n9", "old.check", 2),
    ]  # fmt: skip
    audit = [lift("n1", 8, boot="b2"), lift("n1", 4), lift("c1", 5), lift("c2", 2),
             lift("c3", 1)]  # fmt: skip
    return drains, audit


def test_each_checks_false_drain_rate_with_its_stage():
    drains, audit = history()
    record = check_record(drains, audit, NOW - 30 * DAY, drained_now={"n2"})
    policy = staged(load_config("/dev/null"), report_only=["gpu.power_limit"], canary=["ib.*"],
                    partitions=["canary"]).policy  # fmt: skip
    rows = {r.check: r for r in check_rates(record, policy)}
    ecc, ib = rows["gpu.ecc"], rows["ib.rate"]
    assert (ecc.rollout, ecc.drains, ecc.false_drains, ecc.lifted) == (ACTING, 3, 1, 2)
    assert ecc.rate == 0.5
    # The drill's drain is not counted: two drains, both false.
    assert (ib.rollout, ib.drains, ib.false_drains, ib.lifted, ib.rate) == (CANARY, 2, 2, 2, 1.0)
    # A staged check is shown though it never drained; a check gone from gpugate is "other".
    assert rows["gpu.power_limit"].rollout == REPORT_ONLY and rows["gpu.power_limit"].rate is None
    assert rows["ib.ports"].rollout == CANARY and rows["ib.ports"].drains == 0
    assert rows[OTHER].drains == 1 and "old.check" not in rows
    assert "gpu.temperature" not in rows  # acting and never drained: nothing to show


def test_the_rates_as_metrics_and_in_the_report(tmp_path):
    drains, audit = history()
    policy = staged(load_config("/dev/null"), canary=["ib.*"], partitions=["canary"]).policy
    rows = check_rates(check_record(drains, audit, NOW - 30 * DAY), policy)
    text = render(check_rate_samples([{"check": r.check, **r.to_json()} for r in rows]))
    assert 'gpugate_check_false_drain_ratio{check="gpu.ecc"} 0.5' in text
    assert 'gpugate_check_false_drain_ratio{check="ib.rate"} 1' in text
    assert 'gpugate_check_rollout{check="ib.rate"} 1' in text
    assert 'gpugate_check_window_drains{check="gpu.ecc"} 3' in text
    assert 'gpugate_check_false_drain_ratio{check="ib.ports"}' not in text  # none lifted
    assert "# TYPE gpugate_check_false_drain_ratio gauge" in text
    assert parse_samples(text)[("gpugate_check_window_false_drains", (("check", "ib.rate"),))] == 2
    page = R.render_html([], drains, audit, window_days=30, now=NOW, policy=policy)
    assert '<h2 id="rollout">' in page and "<td>canary-only</td>" in page and "50%" in page
    assert '<h2 id="rollout">' not in R.render_html([], drains, audit, window_days=30, now=NOW)
    config = load_config("/dev/null")
    config = config.replace(state_dir=str(tmp_path / "state"), admin=config.admin.replace(
        metrics_file=str(tmp_path / "gpugate.prom")))  # fmt: skip
    written = note_check_rates(config, [{"check": r.check, **r.to_json()} for r in rows])
    assert written == str(tmp_path / "gpugate-checks.prom")
    prom = (tmp_path / "gpugate-checks.prom").read_text()
    assert 'gpugate_check_rollout{check="gpu.ecc"} 0' in prom
    no_dir = config.replace(admin=config.admin.replace(metrics_file=str(tmp_path / "no/g.prom")))
    assert note_check_rates(no_dir, []) is None


def test_the_report_command_prints_and_writes_the_rates(tmp_path, capsys):
    state = tmp_path / "state"
    drains, audit = history()
    for d in drains:
        H.record_drain(str(state), d.node, d.reason, check=d.check, when=d.when,
                       boot_id=d.boot_id, drill=d.drill)  # fmt: skip
    for a in audit:
        H.record_resume(str(state), a.node, why="ok", when=a.when, boot_id=a.boot_id)
    sinfo = tmp_path / "sinfo.json"
    sinfo.write_text(json.dumps({"nodes": []}))
    path = site_file(tmp_path, f"state_dir: {state}\nevidence_dir: {tmp_path / 'evidence'}\n"
                     f"admin: {{metrics_file: {tmp_path / 'gpugate.prom'}}}\n"
                     "policy: {canary: {checks: [ib.*], partitions: [canary]}}\n")  # fmt: skip
    args = ["report", "--config", path, "--json", "--sinfo-json", str(sinfo), "--window-days",
            "36500"]  # fmt: skip
    assert cli.main(args) == 0
    rates = json.loads(capsys.readouterr().out)["false_drain_rates"]
    assert rates["ib.rate"] == {"rollout": CANARY, "drains": 2, "false_drains": 2, "lifted": 2,
                                "rate": 1.0}  # fmt: skip
    assert rates["gpu.ecc"]["drains"] == 3 and rates["gpu.ecc"]["rollout"] == ACTING
    prom = (tmp_path / "gpugate-checks.prom").read_text()
    assert 'gpugate_check_false_drain_ratio{check="ib.rate"} 1' in prom

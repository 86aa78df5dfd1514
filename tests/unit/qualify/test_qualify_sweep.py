"""Sweeps (`gpugate qualify --idle`), the qualification metrics and the report's section."""

from __future__ import annotations

import os

import pytest
from factories import default_config
from fakes import FakeSlurm, drained, idle

from gpugate.qualify.sweep import select_idle, sweepable
from gpugate.store import metrics as M
from gpugate.store.qualify import QualifyEntry, QualifyTestResult, record_qualification

NOW = 1_790_000_000.0


def config_in(tmp_path, **qualify):
    config = default_config()
    config = config.replace(state_dir=str(tmp_path / "state"), evidence_dir=str(tmp_path / "ev"),
                            admin=config.admin.replace(history_dir=str(tmp_path / "hist")))  # fmt: skip
    return config.replace(qualify=config.qualify.replace(**qualify)) if qualify else config


def cluster():
    return FakeSlurm(nodes=[
        idle("n1"), idle("n2"), idle("n3"),
        drained("n4", "gpugate: gpu.ecc: GPU3 ECC"),  # drained: a resume's business
        idle("n5").replace(state="ALLOCATED"),  # running a job
        idle("n6").replace(state="MIXED"),
        idle("n7").replace(flags=("RESERVED",)),  # someone's reservation
        idle("n8").replace(flags=("REBOOT_REQUESTED",)),
        idle("n9").replace(state="DOWN", flags=("NOT_RESPONDING",)),
        idle("g1", partition="debug"),
    ])  # fmt: skip


def entry(node: str, when: float, passed: bool = True, **extra) -> QualifyEntry:
    return QualifyEntry(node=node, when=when, run_id="r", level=2, passed=passed,
                        **{"tests": [], "job_ids": ["7"], "why": "", "by": "root", **extra})  # fmt: skip


def test_only_idle_nodes_in_service_are_swept(tmp_path):
    assert select_idle(config_in(tmp_path), cluster(), None) == ["g1", "n1", "n2", "n3"]


def test_the_partition_limits_the_sweep(tmp_path):
    assert select_idle(config_in(tmp_path, partition="debug"), cluster(), None) == ["g1"]
    assert not sweepable(idle("n1"), "debug")


def test_the_longest_unqualified_go_first_up_to_max_nodes(tmp_path):
    config = config_in(tmp_path)
    hist = config.admin.history_dir
    record_qualification(hist, entry("g1", NOW - 100))
    record_qualification(hist, entry("n1", NOW - 9000))
    record_qualification(hist, entry("n2", NOW - 50, passed=False))
    # n3 never qualified: first; then n1 (longest ago), g1, n2 (the newest, even failed).
    assert select_idle(config, cluster(), None) == ["n3", "n1", "g1", "n2"]
    assert select_idle(config, cluster(), 2) == ["n3", "n1"]


@pytest.mark.parametrize("bad", [0, -3])
def test_max_nodes_below_one_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="--max-nodes must be at least 1"):
        select_idle(config_in(tmp_path), cluster(), bad)


# ------------------------------------------------------------------------------ metrics


def result(
    test: str, nodes: list[str], gbps: float | None, ok: bool | None = True
) -> QualifyTestResult:
    return QualifyTestResult(test=test, nodes=nodes, ok=ok, value_gbps=gbps, floor_gbps=9.0,
                             detail="", job_id="7")  # fmt: skip


def value(samples: dict, name: str, node: str, **labels: str) -> float | None:
    return samples.get((name, (("node", node), *labels.items())))


def test_qualification_series_per_node_and_test():
    tests = [result("allreduce", ["n1"], 41.5), result("h2d", ["n1"], 24.0),
             result("pair", ["n1", "n2"], 11.0), result("pair", ["n1", "n3"], 3.25, ok=False),
             result("dcgm", ["n1"], None)]  # fmt: skip
    samples = M.apply_qualification({}, [entry("n1", NOW, tests=tests)])
    assert value(samples, "gpugate_qualify_bandwidth_gbps", "n1", test="allreduce") == 41.5
    assert value(samples, "gpugate_qualify_bandwidth_gbps", "n1", test="h2d") == 24.0
    assert value(samples, "gpugate_qualify_bandwidth_gbps", "n1", test="pair") == 3.25  # slowest
    assert value(samples, "gpugate_qualify_bandwidth_gbps", "n1", test="dcgm") is None
    assert value(samples, "gpugate_qualify_last_pass_timestamp_seconds", "n1") == NOW
    assert value(samples, "gpugate_qualify_runs_total", "n1", result="passed") == 1
    # A failed run has a test that failed (a run that proved nothing is not_qualified).
    failed = [result("allreduce", ["n1"], 2.0, ok=False)]
    later = M.apply_qualification(samples, [entry("n1", NOW + 60, passed=False, tests=failed)])
    assert value(later, "gpugate_qualify_runs_total", "n1", result="failed") == 1
    assert value(later, "gpugate_qualify_runs_total", "n1", result="passed") == 1
    # A failed run leaves the last pass where it was.
    assert value(later, "gpugate_qualify_last_pass_timestamp_seconds", "n1") == NOW


def test_note_qualification_writes_its_own_file_beside_the_metrics_file(tmp_path):
    config = config_in(tmp_path)
    prom = tmp_path / "textfile" / "gpugate.prom"
    config = config.replace(admin=config.admin.replace(metrics_file=str(prom)))
    entries = [entry("n1", NOW, tests=[result("allreduce", ["n1"], 40.0)]), entry("n2", NOW)]
    assert M.note_qualification(config, entries) is False  # no node_exporter directory
    prom.parent.mkdir()
    assert M.note_qualification(config, entries) is True
    assert M.note_qualification(config, entries[:1]) is True  # counters carry over
    text = (prom.parent / M.QUALIFY_FILE).read_text()
    assert "# TYPE gpugate_qualify_runs_total counter" in text
    assert 'gpugate_qualify_runs_total{node="n1",result="passed"} 2' in text
    assert 'gpugate_qualify_runs_total{node="n2",result="passed"} 1' in text
    assert 'gpugate_qualify_bandwidth_gbps{node="n1",test="allreduce"} 40' in text
    assert not prom.exists()  # the hooks' own file is not touched


# ------------------------------------------------------------------------------ report


def test_the_report_shows_each_nodes_latest_run_values_floors_and_the_verdict():
    from gpugate.admin import report as R

    old = entry("n2", NOW - 900, tests=[result("allreduce", ["n2"], 1.0, ok=False)])
    slow = [result("allreduce", ["n2"], 40.0), result("pair", ["n1", "n2"], 3.25, ok=False),
            result("dcgm", ["n2"], None, ok=None).replace(floor_gbps=None)]  # fmt: skip
    new = entry("n2", NOW, passed=False, tests=slow, why="the link between n1 and n2 <b>",
                job_ids=["41", "42"])  # fmt: skip
    entries = [old, new, entry("n1", NOW - 60)]
    page = R.render_html([], [], [], now=NOW, qualifications=entries)
    section = page.split('<h2 id="qualify">Qualification</h2>', 1)[1].split("<h2", 1)[0]
    assert section.index(">n1<") < section.index(">n2<")  # by node
    assert "allreduce 1.0" not in section  # an older run of n2 is not shown
    assert "allreduce 40.0 GB/s (floor 9.0): ok" in section
    assert "pair n1-n2 3.2 GB/s (floor 9.0): FAIL" in section
    assert (
        "dcgm: not judged" in section and "qualification failure" in section and "41, 42" in section
    )
    assert "passed qualification" in section  # n1
    assert "<td>pair: failed</td>" in section  # the failure column, even without a detail
    assert "the link between n1 and n2 &lt;b&gt;" in section  # escaped
    assert "No qualification recorded" in R.render_html([], [], [], now=NOW)


# ------------------------------------------------------------------------------ the sweep's jobs


def test_a_sweeps_jobs_go_in_at_the_sweeps_qos_and_nice(tmp_path):
    from gpugate.qualify import jobs
    from gpugate.qualify.sweep import sweep_config

    config = config_in(tmp_path, qos="normal", sweep_qos="scavenger", sweep_nice=500)
    swept = sweep_config(config, None, idle=True).qualify
    assert (swept.qos, swept.nice) == ("scavenger", 500)
    argv = jobs.sbatch_argv("/x/n1.sh", ["n1"], swept, 1, "/x/n1.out", None)
    assert "--qos=scavenger" in argv and "--nice=500" in argv
    assert sweep_config(config, 7, idle=True).qualify.nice == 7  # --nice wins
    plain = sweep_config(config, None, idle=False).qualify
    assert (plain.qos, plain.nice) == ("normal", 0)
    assert not any(a.startswith("--nice") for a in jobs.sbatch_argv("/x/n1.sh", ["n1"], plain, 1,
                                                                     "/x/n1.out", None))  # fmt: skip
    no_qos = config_in(tmp_path, qos="normal")
    assert sweep_config(no_qos, None, idle=True).qualify.qos == "normal"  # no sweep_qos
    with pytest.raises(ValueError, match="--nice must be 0 or more"):
        sweep_config(config, -5, idle=False)


def test_the_command_sweeps_the_selected_idle_nodes(tmp_path, monkeypatch, capsys):
    import types

    from gpugate.commands import qualify as cmd
    from gpugate.qualify import run as qrun

    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {tmp_path}/state\nevidence_dir: {tmp_path}/ev\n"
                   "qualify:\n  sweep_nice: 300\n")  # fmt: skip
    slurm = cluster()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    asked = []

    def fake(config, slurm, nodes, level, tests, **kw):
        asked.append((nodes, config.qualify.nice, kw.get("resume_passed")))
        verdicts = {n: {"passed": True, "failed": False, "tests": [], "job_ids": ["1"], "why": ""}
                    for n in nodes}  # fmt: skip
        return types.SimpleNamespace(run_id="r", nodes=nodes, verdicts=verdicts, pairs=None,
                                     reservation=None, level=level, tests=["dcgm"])  # fmt: skip

    monkeypatch.setattr(qrun, "qualify_nodes", fake)

    def qualify(*argv: str) -> int:
        return cmd.main([*argv, "--config", str(cfg)], make_slurm=lambda config: slurm)

    assert qualify("--idle", "--max-nodes", "2") == 0
    assert asked == [(["g1", "n1"], 300, False)]
    assert qualify("--idle", "n1") == 2  # one or the other
    assert "not both" in capsys.readouterr().err
    assert qualify("--idle", "--nice", "-1") == 2
    slurm.infos = {"n4": slurm.infos["n4"]}  # only a drained node: nothing to sweep
    assert qualify("--idle") == 0
    assert "no idle node to qualify" in capsys.readouterr().out


def test_each_qualification_run_updates_the_metrics(tmp_path):
    from qualify_ops import FAST, SLOW, FakeOps, go

    prom = tmp_path / "textfile" / "gpugate.prom"
    prom.parent.mkdir()
    config = config_in(tmp_path, wait_s=5)
    config = config.replace(admin=config.admin.replace(metrics_file=str(prom)),
                            budget=config.budget.replace(settle_s=0, max_drained_share=1.0,
                                                         min_drains_allowed=5))  # fmt: skip
    slurm = FakeSlurm(["n1", "n2", "n3"])
    go(config, slurm, FakeOps(slurm, {"n1": FAST, "n2": SLOW, "n3": FAST}))
    samples = M.parse_samples((prom.parent / M.QUALIFY_FILE).read_text())
    assert value(samples, "gpugate_qualify_runs_total", "n2", result="failed") == 1
    assert value(samples, "gpugate_qualify_runs_total", "n1", result="passed") == 1
    assert value(samples, "gpugate_qualify_bandwidth_gbps", "n1", test="allreduce") == FAST

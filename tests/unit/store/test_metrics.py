"""The node_exporter textfile: exposition format, label escaping, counters carried across runs,
check statuses per hook, atomic replacement, concurrent hooks, and the example alert rules."""

from __future__ import annotations

import multiprocessing
import os
import re
from pathlib import Path

import paths
import pytest
from exposition import assert_exposition
from heldlock import held

from gpugate.checks.findings import Finding
from gpugate.config import load_config
from gpugate.store import metrics as M
from gpugate.store.locks import lock_paths
from gpugate.yamlio import parse_yaml

ALERTS = paths.CONFIG / "gpugate-alerts.yml"


def f(check: str, status: str, gpu: int | None = None) -> Finding:
    return Finding(check=check, status=status, message=f"{check}: x", gpu=gpu)


def textfile(tmp_path: Path) -> str:
    """node_exporter's textfile in its own directory (the state directory is beside it)."""
    (tmp_path / "textfile").mkdir(exist_ok=True)
    return str(tmp_path / "textfile" / "gpugate.prom")


def update(path: str, *args: object, **kwargs: object) -> bool:
    """update_metrics() with the state directory beside the textfile's directory."""
    state = os.path.join(os.path.dirname(os.path.dirname(path)), "state")
    return M.update_metrics(path, *args, state_dir=state, **kwargs)  # type: ignore[arg-type]


def value(text: str, name: str, **labels: str) -> float | None:
    return M.parse_samples(text).get((name, (("node", "n1"), *labels.items())))


def test_prolog_run_writes_every_family_with_help_and_type(tmp_path):
    path = textfile(tmp_path)
    findings = [f("gpu.ecc", "ok", 0), f("gpu.ecc", "fail", 3), f("ib.ports", "warn"),
                f("gpu.temperature", "unknown"), f("host.nofile", "ok")]  # fmt: skip
    update(path, "n1", "prolog", findings, duration_s=0.1234567,
                     drained_check="gpu.ecc", now=1790000000.5)  # fmt: skip
    text = Path(path).read_text()
    types = assert_exposition(text)
    assert types["gpugate_drains_total"] == "counter"
    assert types["gpugate_node_healthy"] == "gauge"
    assert value(text, "gpugate_check_status", check="gpu.ecc") == 2  # worst GPU wins
    assert value(text, "gpugate_check_status", check="ib.ports") == 1
    assert value(text, "gpugate_check_status", check="gpu.temperature") == 3
    assert value(text, "gpugate_check_status", check="host.nofile") == 0
    assert value(text, "gpugate_node_healthy") == 0
    assert value(text, "gpugate_drains_total", check="gpu.ecc") == 1
    assert value(text, "gpugate_internal_errors_total") == 0  # present from the start
    assert value(text, "gpugate_prolog_duration_seconds") == 0.123457
    assert value(text, "gpugate_last_run_timestamp_seconds", hook="prolog") == 1790000000.5
    assert 'gpugate_last_run_timestamp_seconds{node="n1",hook="prolog"} 1790000000.5' in text
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    # Only the textfile: its lock is root's, in the state directory, where no user can open it.
    assert os.listdir(tmp_path / "textfile") == ["gpugate.prom"]
    assert os.listdir(tmp_path / "state" / "locks") == ["metrics-gpugate.prom.lock"]


def test_counters_carry_over_and_statuses_follow_the_hook(tmp_path):
    path = textfile(tmp_path)
    update(path, "n1", "prolog", [f("gpu.ecc", "ok"), f("pcie.link", "ok")])
    text = Path(path).read_text()
    assert value(text, "gpugate_node_healthy") == 1
    update(path, "n1", "epilog", [f("gpu.ecc", "fail")], drained_check="gpu.ecc",
                     category="ecc_error")  # fmt: skip
    update(path, "n1", "epilog", category="ecc_error")
    update(path, "n1", "epilog", internal_error=True)
    text = Path(path).read_text()
    assert value(text, "gpugate_diagnoses_total", category="ecc_error") == 2
    assert value(text, "gpugate_drains_total", check="gpu.ecc") == 1
    assert value(text, "gpugate_internal_errors_total") == 1
    assert value(text, "gpugate_check_status", check="pcie.link") == 0  # epilog merges
    assert value(text, "gpugate_node_healthy") == 0  # no run since cleared it
    assert value(text, "gpugate_prolog_duration_seconds") is None
    # After the resume the next prolog passes: healthy again, counters kept, and a check
    # the site disabled since (pcie.link) is no longer reported.
    update(path, "n1", "prolog", {"gpu.ecc": "ok"}, duration_s=2)
    text = Path(path).read_text()
    assert value(text, "gpugate_node_healthy") == 1
    assert value(text, "gpugate_check_status", check="pcie.link") is None
    assert value(text, "gpugate_drains_total", check="gpu.ecc") == 1
    assert value(text, "gpugate_last_run_timestamp_seconds", hook="epilog") is not None
    assert_exposition(text)


def test_each_job_run_is_counted_by_its_own_end(tmp_path):
    path = textfile(tmp_path)
    update(path, "n1", "epilog", category="gpu_xid_hardware", job_end="failed")  # run 0
    update(path, "n1", "epilog", job_end="ok")  # the requeued run completed
    update(path, "n1", "epilog", job_end="bogus")  # not a result: counted nowhere
    text = Path(path).read_text()
    assert value(text, "gpugate_job_ends_total", result="failed") == 1
    assert value(text, "gpugate_job_ends_total", result="ok") == 1
    assert assert_exposition(text)["gpugate_job_ends_total"] == "counter"


def test_label_values_are_escaped_and_read_back(tmp_path):
    path = textfile(tmp_path)
    hostile = 'odd\\cat"egory\nx'
    update(path, "n1", "epilog", category=hostile)
    update(path, "n1", "epilog", category=hostile)
    text = Path(path).read_text()
    assert 'category="odd\\\\cat\\"egory\\nx"} 2' in text
    assert_exposition(text)
    assert M.escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_other_nodes_series_and_foreign_lines_are_dropped(tmp_path):
    path = Path(textfile(tmp_path))
    path.write_text(
        "# a comment\nnode_load1 3\n"
        'gpugate_drains_total{node="old-name",check="gpu.ecc"} 7\n'
        'gpugate_drains_total{node="n1",check="gpu.ecc"} 4\n'
        'gpugate_drains_total{node="n1",check="ib.ports"} not-a-number\n'
    )
    update(str(path), "n1", "prolog")
    text = path.read_text()
    assert "old-name" not in text and "node_load1" not in text and "ib.ports" not in text
    assert value(text, "gpugate_drains_total", check="gpu.ecc") == 4


def _hammer(path: str, n: int) -> None:
    for _ in range(n):
        update(path, "n1", "epilog", drained_check="gpu.ecc", category="ecc_error")


@pytest.mark.parametrize("wait_s", [None, 0.0])  # the real wait; none, so that many skip
def test_concurrent_hooks_lose_no_increment_uncounted(tmp_path, monkeypatch, wait_s):
    """Folds that meet take turns; one that finds the lock busy past its short try is skipped
    and counted, so the drains and the skipped updates add up to every run."""
    if wait_s is not None:
        monkeypatch.setattr(M.locks, "METRICS_WAIT_S", wait_s)  # the forked workers inherit it
    path, workers, n = textfile(tmp_path), 4, 15
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hammer, args=(path, n)) for _ in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    update(path, "n1", "epilog")  # folds in the skips counted since the last update
    text = Path(path).read_text()
    drains = value(text, "gpugate_drains_total", check="gpu.ecc")
    skipped = value(text, "gpugate_metrics_skipped_total")
    assert drains + skipped == workers * n and drains > 0
    assert value(text, "gpugate_diagnoses_total", category="ecc_error") == drains
    assert os.listdir(tmp_path / "textfile") == ["gpugate.prom"]


def test_a_held_lock_skips_the_update_it_is_not_waited_for(tmp_path):
    """A fold never waits on its lock past a short try: skipped, said, counted next time."""
    prom = tmp_path / "textfile" / "gpugate.prom"
    prom.parent.mkdir()
    site = tmp_path / "site.yaml"
    site.write_text(f"state_dir: {tmp_path / 'state'}\nadmin:\n  metrics_file: {prom}\n")
    config = load_config(str(site))
    assert M.note_run(config, "n1", "prolog", findings={"gpu.ecc": "ok"}) is True
    (lock,) = [p for p in lock_paths(config) if p.endswith("metrics-gpugate.prom.lock")]
    assert oct(os.stat(lock).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(lock)).st_mode & 0o777) == "0o700"
    with held(lock):
        assert M.note_run(config, "n1", "epilog", drained_check="gpu.ecc") is False
    assert value(prom.read_text(), "gpugate_drains_total", check="gpu.ecc") is None
    assert M.note_run(config, "n1", "epilog") is True
    assert value(prom.read_text(), "gpugate_metrics_skipped_total") == 1  # counted next time
    assert M.note_run(config, "n1", "epilog") is True
    assert value(prom.read_text(), "gpugate_metrics_skipped_total") == 1  # and only once
    assert os.listdir(prom.parent) == ["gpugate.prom"]  # nothing a user could lock there


def test_note_run_writes_only_where_node_exporter_is(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(f"state_dir: {tmp_path / 'state'}\n")
    config = load_config(str(site))
    assert config.admin.metrics_file.endswith("/textfile_collector/gpugate.prom")
    prom = tmp_path / "collector" / "gpugate.prom"
    cfg = config.replace(admin=config.admin.replace(metrics_file=str(prom)))
    assert M.note_run(cfg, "n1", "prolog", duration_s=1.0) is False  # no directory
    assert not prom.parent.exists()
    prom.parent.mkdir()
    assert M.note_run(cfg, "n1", "prolog", duration_s=1.0) is True
    assert value(prom.read_text(), "gpugate_prolog_duration_seconds") == 1
    off = config.replace(admin=config.admin.replace(metrics_file=None))
    assert M.note_run(off, "n1", "prolog") is False
    prom.unlink()
    prom.mkdir()  # a directory where the file should be: logged, not raised
    assert M.note_run(cfg, "n1", "prolog") is False


def test_example_alert_rules_use_only_gpugate_series():
    doc = parse_yaml(ALERTS.read_text(), str(ALERTS))
    rules = doc["groups"][0]["rules"]
    names = {r["alert"] for r in rules}
    assert {"GpugateNodeUnhealthy", "GpugateDrainsRising", "GpugateInternalErrors"} <= names
    unhealthy = next(r for r in rules if r["alert"] == "GpugateNodeUnhealthy")
    assert unhealthy["for"] == "5m" and "gpugate_node_healthy == 0" in unhealthy["expr"]
    for rule in rules:
        assert {"alert", "expr", "labels", "annotations"} <= set(rule)
        for name in re.findall(r"\bgpugate_[a-z_]+", rule["expr"]):
            assert name in M.FAMILIES, f"{rule['alert']}: unknown series {name}"


@pytest.mark.parametrize(
    ("statuses", "worst"),
    [(["ok", "warn"], "warn"), (["warn", "unknown"], "unknown"), (["unknown", "fail"], "fail")],
)
def test_check_statuses_fold_to_the_worst(statuses, worst):
    folded = M.check_statuses([{"check": "gpu.ecc", "status": s} for s in statuses])
    assert folded == {"gpu.ecc": worst}


def test_promtool_accepts_the_textfile_and_the_rules(tmp_path):
    """Prometheus' own linter (tests/support/prometheus.py: where it is found, when it must be)."""
    import subprocess

    from prometheus import tool_or_skip

    promtool = tool_or_skip("promtool")
    path = Path(textfile(tmp_path))
    update(str(path), "gpu-01", "prolog", [f("gpu.ecc", "fail")], duration_s=0.5,
                     drained_check="gpu.ecc", category='odd"cat\\egory', internal_error=True)  # fmt: skip
    res = subprocess.run([promtool, "check", "metrics"], input=path.read_bytes(),
                         capture_output=True, timeout=60)  # fmt: skip
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr
    res = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr

"""Honest numbers: each check's drains and how they ended, and the drains lifted without any
repair (`gpugate_false_drains_total{check}`), from a history and audit log written here."""

from __future__ import annotations

import json

from admin_site import gpugate_sinfo, site  # noqa: F401  (site: a fixture)
from factories import make_facts
from fakes import NODE, FakeSlurm
from prolog_setup import setup

from gpugate import cli
from gpugate.admin import report as R
from gpugate.admin.resume import Request, check_then_resume
from gpugate.slurm.records import NodeInfo
from gpugate.store import history as H
from gpugate.store.entries import AuditEntry, DrainEntry
from gpugate.store.metrics import apply_run, parse_samples, render
from gpugate.store.outcomes import check_record, render_record

NOW = 1_790_000_000.0
DAY = 86400.0


def drain(node: str, check: str, days_ago: float, boot: str | None = "b1") -> DrainEntry:
    when = NOW - days_ago * DAY
    return DrainEntry.from_json({"node": node, "when": when, "check": check,
                                 "reason": f"gpugate: {check}: x", "boot_id": boot})  # fmt: skip


def lift(node: str, days_ago: float, boot: str | None = "b1", **extra) -> AuditEntry:
    return AuditEntry.from_json({"node": node, "when": NOW - days_ago * DAY, "who": "ann",
                                 "why": "ok", "resumed": True, "forced": False, "boot_id": boot,
                                 **extra})  # fmt: skip


def test_repair_evidence_is_a_new_boot_or_an_audited_reset():
    d = drain("n1", "gpu.ecc", 3)
    assert H.repair_evidence(d, lift("n1", 1, boot="b2")) == H.REBOOT
    assert H.repair_evidence(d, lift("n1", 1)) is None
    assert H.lifted_without_repair(d, lift("n1", 1))
    reset = AuditEntry(node="n1", when=NOW - 2 * DAY, repair=H.GPU_RESET, resumed=False)
    assert H.repair_evidence(d, lift("n1", 1), [reset]) == H.GPU_RESET
    assert not H.lifted_without_repair(d, lift("n1", 1), [reset])
    # A reset of another node, or before the drain, is no evidence for this one.
    assert H.repair_evidence(d, lift("n1", 1), [reset.replace(node="n2")]) is None
    assert H.repair_evidence(d, lift("n1", 1), [reset.replace(when=NOW - 4 * DAY)]) is None
    # Boot ids unknown: no reboot is shown, so none is assumed.
    assert H.repair_evidence(drain("n1", "gpu.ecc", 3, boot=None), lift("n1", 1, boot="b2")) is None
    assert H.repair_evidence(d, lift("n1", 1, repair=H.GPU_RESET)) == H.GPU_RESET


def test_each_checks_record_in_the_window():
    drains = [
        drain("n1", "gpu.ecc", 10), drain("n1", "gpu.ecc", 5), drain("n2", "gpu.ecc", 4),
        drain("n3", "gpu.temperature", 3), drain("n4", "gpu.temperature", 2),
        drain("n5", "gpu.temperature", 60),  # outside the window
    ]  # fmt: skip
    audit = [
        lift("n1", 8, boot="b2"),  # after a reboot
        lift("n1", 4),  # lifted without repair
        lift("n3", 2),  # lifted without repair
        AuditEntry(node="n3", when=NOW - 2.5 * DAY, resumed=False, who="x"),  # refused: no lift
    ]
    since = NOW - 30 * DAY
    record = check_record(drains, audit, since, drained_now={"n2"})
    assert record["gpu.ecc"] == {"drains": 3, "lifted_repaired": 1, "lifted_unrepaired": 1,
                                 "still_drained": 1, "lifted_unaudited": 0}  # fmt: skip
    assert record["gpu.temperature"] == {"drains": 2, "lifted_repaired": 0,
                                         "lifted_unrepaired": 1, "still_drained": 0,
                                         "lifted_unaudited": 1}  # fmt: skip
    # Without Slurm's view every unlifted drain is still drained.
    assert check_record(drains, audit, since)["gpu.temperature"]["still_drained"] == 1
    table = render_record(record, 30)
    assert table.splitlines()[1].split()[:2] == ["CHECK", "DRAINS"]
    assert any(line.split() == ["gpu.ecc", "3", "1", "1", "1", "0"] for line in table.splitlines())
    assert render_record({}, 7) == "No drains in the last 7 days.\n"


def test_false_drains_metric_counts_by_check():
    samples = apply_run({}, "n1", "resume", false_drain_check="gpu.temperature", now=NOW)
    samples = apply_run(samples, "n1", "resume", false_drain_check="gpu.temperature", now=NOW)
    text = render(samples)
    assert "# TYPE gpugate_false_drains_total counter" in text
    assert 'gpugate_false_drains_total{node="n1",check="gpu.temperature"} 2' in text
    assert parse_samples(text) == samples


def resume_with_boot(tmp_path, drained_boot: str, now_boot: str) -> str:
    tmp_path.mkdir()
    config = setup(tmp_path, make_facts(boot_id=now_boot))
    metrics = tmp_path / "metrics"
    metrics.mkdir(exist_ok=True)
    config = config.replace(admin=config.admin.replace(metrics_file=str(metrics / "g.prom")))
    H.record_drain(config.state_dir, NODE, "gpugate: gpu.temperature: hot", boot_id=drained_boot)
    info = NodeInfo(
        name=NODE, state="IDLE", flags=("DRAIN",), reason="gpugate: gpu.temperature: hot"
    )
    slurm = FakeSlurm(nodes=[info])
    attempt = check_then_resume(config, slurm, info, Request(node=NODE, why="cooled"))
    assert attempt.resumed, attempt
    [entry] = H.resumes(config.state_dir)
    assert entry.boot_id == now_boot
    path = metrics / "g.prom"
    return path.read_text() if path.exists() else ""


def test_a_resume_without_repair_counts_a_false_drain(tmp_path):
    text = resume_with_boot(tmp_path / "a", "b1", "b1")
    assert f'gpugate_false_drains_total{{node="{NODE}",check="gpu.temperature"}} 1' in text
    assert "gpugate_false_drains_total" not in resume_with_boot(tmp_path / "b", "b1", "b2")


def test_a_drain_records_the_boot(tmp_path):
    proc = tmp_path / "proc" / "sys" / "kernel" / "random"
    proc.mkdir(parents=True)
    (proc / "boot_id").write_text("abc-123\n")
    config = setup(tmp_path, make_facts())
    config = config.replace(sources=config.sources.replace(proc_root=str(tmp_path / "proc")))
    entry = H.note_drain(config, NODE, "gpugate: gpu.ecc: x")
    assert entry.boot_id == "abc-123"


def test_nodes_stats_and_the_report_show_the_record(site, capsys):  # noqa: F811
    state = str(site / "state")
    saved = site / "sinfo.json"
    saved.write_text(gpugate_sinfo("gpugate: gpu.ecc: x"))
    H.record_drain(state, "vm", "gpugate: gpu.ecc: x", when=NOW, boot_id="b1")
    H.record_drain(state, "w", "gpugate: gpu.temperature: hot", when=NOW - DAY, boot_id="b1")
    H.record_resume(state, "w", why="cooled", when=NOW - DAY / 2, boot_id="b1")
    args = ["nodes", "--sinfo-json", str(saved), "--stats", "--window-days", "36500"]
    assert cli.main([*args, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert stats["gpu.ecc"]["still_drained"] == 1
    assert stats["gpu.temperature"]["lifted_unrepaired"] == 1
    assert cli.main(args) == 0
    assert "LIFTED WITHOUT REPAIR" in capsys.readouterr().out
    page = R.render_html([], H.drains(state), H.resumes(state), window_days=36500, now=NOW)
    assert "Lifted without repair" in page and '<td class="false">1</td>' in page

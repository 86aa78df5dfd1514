"""Failing messages readable at a glance (issue 16): an action and the GPU's serial in each
failing message, one line per missing fact source, and "admin-only" for closed bundles."""

from __future__ import annotations

import os

import paths
import pytest
from factories import default_config, make_facts, make_gpu, only, site

from gpugate.checks import findings as F
from gpugate.checks.readable import has_action, readable, with_serial
from gpugate.checks.run import run_checks
from gpugate.checks.sources import gather
from gpugate.cli import main
from gpugate.commands import evidence
from gpugate.commands.check import missing_sources, render_table
from gpugate.gate.policy import decide

SNAPSHOTS = paths.SNAPSHOTS


@pytest.mark.parametrize("snapshot", sorted(SNAPSHOTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_failing_message_of_every_bundled_snapshot_says_what_to_do(snapshot):
    config = default_config()
    facts = gather(config, "gpu-node-01", snapshot=str(snapshot))
    for f in run_checks(facts, config):
        if f.status == F.FAIL:
            assert has_action(f.message), f.message
            serial = next((g.serial for g in facts.gpus or () if g.index == f.gpu), None)
            if serial:
                assert f"GPU{f.gpu} (serial {serial}" in f.message, f.message


def test_a_message_without_an_action_gets_the_registrys():
    f = only("gpu.temperature", make_facts(gpus={6: {"temperature_c": 91.0}}))
    assert f.message.endswith("(check cooling/power)")
    # One that says what to do already is left as it is.
    f = only("gpu.ecc", make_facts(gpus={2: {"ecc_volatile_uncorrected": 1}}))
    assert f.message.endswith("> 0 (reset it)") and "(reset GPU)" not in f.message


def test_the_gpus_serial_is_named_where_the_snapshot_has_it():
    facts = make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120, "serial": "1654922004170"}})
    f = only("gpu.ecc", facts)
    assert f.message.startswith("gpu.ecc: GPU3 (serial 1654922004170) aggregate uncorrected")
    assert "RMA candidate" in f.message


def test_without_a_serial_the_message_names_only_the_gpu():
    facts = make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120, "serial": None}})
    assert only("gpu.ecc", facts).message.startswith("gpu.ecc: GPU3 aggregate uncorrected")


def test_with_serial_shares_an_existing_parenthesis_and_leaves_other_gpus_alone():
    assert (with_serial("kernel.xid: GPU5 (0000:ab:00) Xid 79", 5, "S1")
            == "kernel.xid: GPU5 (serial S1, 0000:ab:00) Xid 79")  # fmt: skip
    assert with_serial("x: GPU15 and GPU1 hot", 1, "S") == "x: GPU15 and GPU1 (serial S) hot"
    once = with_serial("x: GPU1 hot", 1, "S")
    assert with_serial(once, 1, "S") == once


def test_only_failing_findings_are_rewritten():
    facts = make_facts(gpus=[make_gpu(0, serial="S0")])
    w = F.warn("gpu.temperature", "GPU0 warm", gpu=0)
    assert readable([w], facts) == [w]


def test_a_whole_missing_source_is_one_line_in_the_table():
    facts = make_facts(kernel_log=None, source_errors={"kernel_log": "dmesg timed out after 5 s"})
    config = default_config()
    findings = run_checks(facts, config)
    unknown = [f for f in findings if f.status == F.UNKNOWN]
    assert len(unknown) >= 2 and {f.source for f in unknown} == {"kernel_log"}
    table = render_table("n1", decide(findings, config.policy), findings, 0.001)
    lines = [line for line in table.splitlines() if "UNKNOWN" in line]
    assert lines == [f"  UNKNOWN source kernel_log missing: {len(unknown)} checks not judged "
                     "(dmesg timed out after 5 s)"]  # fmt: skip


def test_one_unknown_check_keeps_its_own_message():
    u = F.unknown("host.nofile", "open-files limit missing: no host facts", source="host")
    assert missing_sources([u]) == {}
    table = render_table("n1", decide([u], default_config().policy), [u], 0.001)
    assert "  UNKNOWN host.nofile: open-files limit missing: no host facts" in table


def test_the_json_form_still_lists_every_unknown_check(tmp_path, capsys):
    snap = tmp_path / "s.yaml"
    text = (SNAPSHOTS / "h100-nvml-mismatch.yaml").read_text()
    snap.write_text(text)
    assert main(["check", "--facts", str(snap), "--config", "/dev/null", "--json"]) == 1
    out = capsys.readouterr().out
    assert out.count('"status": "unknown"') == 12 and "source" not in out.replace(
        "source_errors", ""
    )
    assert main(["check", "--facts", str(snap), "--config", "/dev/null"]) == 1
    table = capsys.readouterr().out
    assert "UNKNOWN source nvml missing: 12 checks not judged (NVML cannot start" in table
    assert table.count("UNKNOWN") == 1


def test_evidence_closed_to_this_user_says_admin_only(tmp_path, monkeypatch, capsys):
    config = site(tmp_path, f"evidence_dir: {tmp_path / 'ev'}\nepilog:\n  evidence_group: hpc\n")
    (tmp_path / "ev").mkdir(mode=0o750)
    monkeypatch.setattr(evidence.os, "access", lambda path, mode: False)  # as a job's user
    why = evidence.admin_only(config, "42")
    assert why.startswith(f"admin-only: {tmp_path / 'ev'} is readable by root and group hpc")
    cfg = tmp_path / "site.yaml"
    assert main(["evidence", "42", "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "admin-only" in err and "no evidence bundles" not in err


def test_evidence_missing_for_an_admin_is_still_no_bundles(tmp_path, capsys):
    config = site(tmp_path, f"evidence_dir: {tmp_path / 'ev'}\n")
    (tmp_path / "ev").mkdir()
    assert evidence.admin_only(config, "42") is None  # its directory does not exist: none
    assert evidence.admin_only(config.replace(evidence_dir=str(tmp_path / "nowhere"))) is None
    assert main(["evidence", "42", "--config", str(tmp_path / "site.yaml")]) == 1
    assert "no evidence bundles for job 42" in capsys.readouterr().err


def test_evidence_behind_a_closed_parent_directory_is_admin_only(tmp_path, monkeypatch):
    config = site(tmp_path, f"evidence_dir: {tmp_path / 'closed' / 'ev'}\n")
    (tmp_path / "closed" / "ev").mkdir(parents=True)
    real_stat = os.stat

    def stat(path, *a, **k):  # a closed directory above it: stat itself is refused
        if str(path).startswith(str(tmp_path / "closed")):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *a, **k)

    monkeypatch.setattr(evidence.os, "stat", stat)
    assert evidence.admin_only(config).startswith("admin-only: ")

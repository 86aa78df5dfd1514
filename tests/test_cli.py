"""The `gpugate` command: dispatch, exit codes, `facts` written and replayed by `check`."""

from __future__ import annotations

import json
import os

from factories import default_config, make_facts
from gpugate.checks import findings as F
from gpugate.slurm_hooks.policy import decide

from gpugate.cli import main
from gpugate.yamlio import parse_yaml

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def test_usage_and_unknown_command(capsys):
    assert main([]) == 2
    assert main(["--help"]) == 0 and "check" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_bad_config_is_exit_2_naming_the_key(tmp_path, capsys):
    site = tmp_path / "site.yaml"
    site.write_text("checks:\n  gpu:\n    nope: 1\n")
    assert main(["check", "--config", str(site), "--facts", "x.yaml"]) == 2
    assert "checks.gpu.nope: unknown key" in capsys.readouterr().err


def test_bad_snapshot_is_exit_2_naming_the_key(tmp_path, capsys):
    snap = tmp_path / "s.yaml"
    snap.write_text("gpus:\n  - index: zero\n")
    assert main(["check", "--config", "/dev/null", "--facts", str(snap)]) == 2
    assert "gpus[0].index: expected an integer" in capsys.readouterr().err


def test_facts_on_this_machine_are_written_and_replayed(tmp_path, capsys):
    """No GPU here: NVML's failure is recorded in the snapshot, not raised."""
    site = tmp_path / "site.yaml"
    site.write_text(
        f"sources:\n  sysfs_root: {FIXTURES}/sys-ib-h100\n  proc_root: {FIXTURES}/proc-h100\n"
        f"  kernel_log_file: {FIXTURES}/kernel-log/dmesg.txt\n"
    )
    out = tmp_path / "node.yaml"
    assert main(["facts", "-o", str(out), "--config", str(site)]) == 0
    snap = parse_yaml(out.read_text())
    for key in (
        "node",
        "collected_at",
        "infiniband",
        "kernel_log",
        "limits",
        "memory",
        "source_errors",
    ):
        assert key in snap, key
    assert len(snap["infiniband"]) == 9 and snap["memory"]["total_mib"] > 0
    assert "nvml" in snap["source_errors"]
    capsys.readouterr()
    code = main(["check", "--config", str(site), "--facts", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code in (0, 1) and report["status"] in ("ok", "warn", "fail")
    lost = [f for f in report["findings"] if f["check"] == "gpu.count"]
    assert lost and lost[0]["status"] in ("unknown", "fail")


def test_policy_maps_unknown_warn_only_and_report_only():
    config = default_config()
    u = F.unknown("gpu.count", "NVML facts missing")
    f = F.fail("gpu.ecc", "GPU3 aggregate uncorrected ECC 120 > 100", gpu=3)
    assert decide([u], config.policy).status == "warn"
    assert decide([u], config.policy.replace(unknown="fail")).status == "fail"
    assert decide([u], config.policy.replace(unknown="ok")).action == "allow"
    assert decide([f], config.policy).action == "drain"
    assert decide([f], config.policy.replace(warn_only=["gpu.ecc"])).status == "warn"
    only = decide([f], config.policy.replace(report_only=True))
    assert (only.status, only.action) == ("fail", "warn")


def test_check_table_puts_problems_first(tmp_path, capsys):
    from gpugate.yamlio import dump_yaml

    snap = tmp_path / "s.yaml"
    snap.write_text(dump_yaml(make_facts(gpus={6: {"temperature_c": 91.0}}).to_dict()))
    assert main(["check", "--config", "/dev/null", "--facts", str(snap)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("gpu-node-01: FAIL")
    assert lines[1].split()[0] == "FAIL" and "GPU6" in lines[1]

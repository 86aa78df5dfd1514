"""NVSwitch SXids (gpugate/checks/sxid.py): the table, the line parser and the `kernel.sxid` check.

The lines are the driver's own format (open-gpu-kernel-modules, NVSWITCH_PRINT_SXID and the
NVSWITCH_REPORT_* macros; docs/gpu-facts.md 2.4): `nvidia-nvswitchN: SXid (PCI:...): CODE,
Fatal|Non-fatal, Link NN text`, then detail lines of the same code.
"""

from __future__ import annotations

import json

import pytest
from factories import make_facts, only

from gpugate.checks.sxid import EITHER, FATAL, NON_FATAL, TABLE, lookup, parse_sxid
from gpugate.cli import main
from gpugate.yamlio import dump_yaml

SWITCH = "nvidia-nvswitch2: SXid (PCI:0000:07:00.0)"


def sxid(code: int, severity: str, link: int | None = 44, switch: str = SWITCH) -> str:
    word = {FATAL: "Fatal", NON_FATAL: "Non-fatal"}.get(severity, severity)
    port = f"Link {link:02d} " if link is not None else ""
    meaning = TABLE[code].meaning if code in TABLE else "something"
    return f"[ 2102.554013] {switch}: {code:05d}, {word}, {port}{meaning} (First)"


def log(*lines: str):
    return make_facts(kernel_log=lines)


# parse_sxid


def test_a_fatal_line_names_switch_pci_code_and_link():
    e = parse_sxid(
        "[ 2102.554013] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM "
        "Fault Up"
    )
    assert (e.switch, e.pci, e.code, e.fatal, e.link) == (
        "nvswitch1",
        "0000:06:00.0",
        20034,
        True,
        48,
    )
    assert e.text == "Fatal, Link 48 LTSSM Fault Up" and e.severity == FATAL


def test_a_non_fatal_line_is_not_fatal():
    e = parse_sxid(
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 33 egress non-posted "
        "PRIV error (First)"
    )
    assert (e.code, e.fatal, e.link, e.severity) == (12028, False, 33, NON_FATAL)


@pytest.mark.parametrize(
    "line",
    [
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity 1 Engine instance 60 "
        "Sub-engine instance 00",
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Data {0x10000000, 0x00000000}",
        "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off",
        "a job printed SXid but no code",
        "",
    ],
)
def test_detail_lines_and_other_lines_are_no_events(line):
    assert parse_sxid(line) is None


def test_a_line_without_a_link_or_a_severity_word():
    e = parse_sxid("nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 10001, Non-fatal, PRI WRITE SYS error, "
                   "instance=0, chiplet=0")  # fmt: skip
    assert (e.fatal, e.link) == (False, None)
    fatal = parse_sxid("nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 20034, LTSSM Fault Up")
    assert fatal.fatal  # no word: the table's severity (fatal)
    unknown = parse_sxid("nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 99999, new error")
    assert unknown.fatal and lookup(99999).severity == EITHER  # unknown and unsaid: safe side


def test_a_hostile_line_is_parsed_fast_and_safely():
    assert parse_sxid("SXid (" * 20000) is None
    assert parse_sxid("SXid (PCI:x): " + "9" * 5000) is None


def test_the_table_is_the_drivers_with_its_classes():
    assert len(TABLE) > 200
    assert TABLE[20034].severity == FATAL and TABLE[12028].severity == NON_FATAL
    assert {i.severity for i in TABLE.values()} == {FATAL, NON_FATAL, EITHER}


# kernel.sxid


def test_a_quiet_log_is_ok_and_a_missing_log_unknown():
    assert only("kernel.sxid", log("nvidia-peermem: module loaded")).status == "ok"
    missing = make_facts(kernel_log=None, source_errors={"kernel_log": "dmesg failed"})
    f = only("kernel.sxid", missing)
    assert f.status == "unknown" and "dmesg failed" in f.message


def test_fatal_fails_naming_switch_and_link_once_for_its_detail_lines():
    lines = [
        sxid(20034, FATAL, link=48),
        f"{SWITCH}: 20034, Severity 1 Engine instance 48 Sub-engine instance 00",
        f"{SWITCH}: 20034, Data {{0x10000000, 0x00000000}}",
    ]
    f = only("kernel.sxid", log(*lines))
    assert (f.status, f.value) == ("fail", 20034)
    assert f.message == (
        "kernel.sxid: nvswitch2 (PCI 0000:07:00.0) link 48: SXid 20034 fatal: LTSSM Fault Up "
        "(reset the GPUs and NVSwitches (nvidia-smi -r) or reboot the node)"
    )


def test_non_fatal_warns_and_repeats_are_counted():
    f = only("kernel.sxid", log(sxid(12028, NON_FATAL), sxid(12028, NON_FATAL)))
    assert f.status == "warn" and "link 44: SXid 12028 x2 non-fatal" in f.message


def test_correctable_is_reported_in_the_ok():
    f = only("kernel.sxid", log(sxid(12028, "Correctable")))
    assert f.status == "ok" and "correctable" in f.message


# Every SXid of the table through `gpugate check --facts`: fatal fails, non-fatal warns.
CASES = [(c, s) for c, i in sorted(TABLE.items())
         for s in ((FATAL, NON_FATAL) if i.severity == EITHER else (i.severity,))]  # fmt: skip


def test_every_sxid_of_the_table_through_gpugate_check(tmp_path, capsys):
    snap, wrong = tmp_path / "s.yaml", []
    for code, severity in CASES:
        snap.write_text(dump_yaml(log(sxid(code, severity, link=17)).to_dict()))
        rc = main(["check", "--config", "/dev/null", "--facts", str(snap), "--json"])
        report = json.loads(capsys.readouterr().out)
        mine = [f for f in report["findings"] if f["check"] == "kernel.sxid"]
        others = [f for f in report["findings"] if f["check"] != "kernel.sxid"]
        want = ("fail", 1) if severity == FATAL else ("warn", 0)
        named = mine and "nvswitch2 (PCI 0000:07:00.0) link 17" in mine[0]["message"]
        clean = all(f["status"] in ("ok", "warn", "unknown") for f in others)
        if not (named and (mine[0]["status"], rc) == want and clean):
            wrong.append((code, severity, rc, mine))
    assert not wrong, wrong[:5]


def test_every_sxid_of_the_table_through_gpugate_diagnose():
    # Beside an NCCL timeout (the symptom every rank logs): a fatal SXid is the root cause
    # (nvlink_error, hardware), a non-fatal one leaves the timeout as the diagnosis.
    from gpugate.diagnosis.engine import diagnose_bytes

    timeout = (
        "[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
        "OpType=ALLREDUCE) ran for 600061 milliseconds before timing out.\n"
    )
    wrong = []
    for code, severity in CASES:
        result = diagnose_bytes((timeout + sxid(code, severity, link=17) + "\n").encode())
        want = "nvlink_error" if severity == FATAL else "nccl_timeout"
        if result.category != want:
            wrong.append((code, severity, result.category))
    assert not wrong, wrong[:5]

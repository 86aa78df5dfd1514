"""NVIDIA's whole Xid catalog (gpugate/checks/xid_catalog.py), one line at a time, through `gpugate check
--facts` and `gpugate diagnose`: NVIDIA's verdict is gpugate's.

The node is kept for RESTART_APP and IGNORE and failed, naming the GPU, for RESET_GPU,
RESTART_BM, 48 (WORKFLOW_XID_48) and 74 (WORKFLOW_NVLINK_ERR). The workflow Xids are decoded
from their lines: 45 by its cause, 144-150 by IntrInfo/ErrorStatus, 154 by its announced action.
"""

from __future__ import annotations

import json

import pytest
from factories import findings_of, make_facts, only, site

from gpugate.checks import xid as X
from gpugate.checks.kernel_lines import BusEvent, read_line, read_lines
from gpugate.checks.xid_catalog import NVLINK5_RULES, XID_ROWS
from gpugate.cli import main
from gpugate.config import ConfigError
from gpugate.diagnosis import engine as D
from gpugate.diagnosis.categories import HARDWARE_CATEGORIES
from gpugate.yamlio import dump_yaml

GPU5 = "0000:68:00"  # make_gpu(5)'s address (factories)
KEEP = ("RESTART_APP", "IGNORE")
DRAIN = ("RESET_GPU", "RESTART_BM")
WATCHDOG = (
    "[rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds\n"
)


def xid_line(code: int, text: str = "", pci: str = GPU5) -> str:
    return f"[ 1843.30] NVRM: Xid (PCI:{pci}): {code}, pid='<unknown>', name=<unknown>, {text}"


def expected(code: int, resolution: str) -> str | None:
    """keep / drain per NVIDIA's bucket; None where the catalog leaves it to gpugate."""
    if resolution in KEEP or code == 45:
        return "keep"
    if resolution in DRAIN or code in (48, 74):
        return "drain"
    return None


TEXT = {
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer",
    74: "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
}
CASES = [(c, r) for c, _m, _d, r, _a in XID_ROWS if expected(c, r) is not None]


def check_facts(tmp_path, capsys, line: str) -> tuple[int, list]:
    snap = tmp_path / "s.yaml"
    snap.write_text(dump_yaml(make_facts(kernel_log=[line]).to_dict()))
    rc = main(["check", "--config", "/dev/null", "--facts", str(snap), "--json"])
    return rc, json.loads(capsys.readouterr().out)["findings"]


def test_the_catalog_has_every_code_from_1_to_172_with_source_and_date():
    codes = [row[0] for row in XID_ROWS]
    assert codes == list(range(1, 173))
    assert all(row[1] and row[4] for row in XID_ROWS)
    doc = X.__doc__ + __import__("gpugate.checks.xid_catalog", fromlist=["x"]).__doc__
    assert "analyzing-xid-catalog" in doc and "read 2026-12-01" in doc
    assert X.lookup(79).resolution == "RESTART_BM" and X.lookup(13).resolution == "RESTART_APP"


def test_the_catalog_cites_nvidia_and_keeps_nvidias_whole_text():
    doc = __import__("gpugate.checks.xid_catalog", fromlist=["x"]).__doc__
    assert "docs.nvidia.com" in doc and "gpud" not in doc and "transcribed" not in doc
    # Descriptions are NVIDIA's whole cells, not an abbreviation ending in "...".
    assert not [r[0] for r in XID_ROWS if r[2].endswith("...")]
    assert X.lookup(13).mnemonic.endswith("/ ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY")
    assert X.lookup(171).meaning.endswith("to differentiate DRAM/SRAM")


@pytest.mark.parametrize(("intr", "drains"), [("0x00000006", False), ("0x00000086", True)])
def test_an_rlw_rxpipe_error_promoted_by_its_intrinfo_bit_drains(intr, drains):
    # NVIDIA's "Decode for action 2": RLW_RXPIPE with IntrInfo bit 7 (V2) set is RESET_GPU even
    # where the line's own word says Nonfatal; without the bit it is IGNORE.
    line = xid_line(145, f"RLW_RXPIPE Nonfatal XC0 i0 Link 03 ({intr} 0x00000001 0x0 0x0 0x0)")
    assert X.needs_drain(X.parse_xid(line)) is drains


def test_every_catalog_xid_through_gpugate_check(tmp_path, capsys):
    wrong = []
    for code, resolution in CASES:
        rc, findings = check_facts(tmp_path, capsys, xid_line(code, TEXT.get(code, "")))
        mine = [f for f in findings if f["check"] == "kernel.xid"]
        others_clean = all(
            f["status"] in ("ok", "warn", "unknown") for f in findings if f["check"] != "kernel.xid"
        )
        if expected(code, resolution) == "drain":
            good = rc == 1 and mine[0]["status"] == "fail" and mine[0]["gpu"] == 5
        else:
            good = rc == 0 and all(f["status"] != "fail" for f in mine) and others_clean
        if not good:
            wrong.append((code, resolution, rc, mine))
    assert not wrong, wrong[:5]


def test_every_catalog_xid_through_gpugate_diagnose(tmp_path):
    """Beside a collective timeout: a draining Xid is the hardware root; a kept one is not."""
    wrong, log = [], tmp_path / "job.log"
    for code, resolution in CASES:
        log.write_text(xid_line(code, TEXT.get(code, "")) + "\n" + WATCHDOG)
        d = D.diagnose([str(log)])
        if expected(code, resolution) == "drain":
            good = d.category in HARDWARE_CATEGORIES and d.xid == code
        else:
            good = d.category != "gpu_xid_hardware" and (
                d.category not in HARDWARE_CATEGORIES or X.lookup(code).category == "ecc_error"
            )
        if not good:
            wrong.append((code, resolution, d.category, d.xid))
    assert not wrong, wrong[:5]


def first_intr(pattern: str) -> int:
    return int(pattern.replace("-", "0"), 2)


def nvlink5_cases() -> list:
    """Per Xid 144-150, one line for each resolution of its decode rows (where unambiguous)."""
    out = []
    for code, unit, v1, _v2, bit, resolution in NVLINK5_RULES:
        # The word `Fatal` says the opposite of the decode: the words decide, not the word.
        word = "Nonfatal" if resolution == "RESET_GPU" else "Fatal"
        text = f"{unit} {word} XC0 i0 Link 07 (0x{first_intr(v1):08x} 0x{bit:08x} 0x0 0x0)"
        event = X.parse_xid(xid_line(code, text))
        if X.nvlink5_resolution(event) == resolution:
            out.append((code, text, "drain" if resolution == "RESET_GPU" else "keep"))
    return out


def test_nvlink5_xids_decode_by_their_sub_code_words_not_the_word_fatal(tmp_path, capsys):
    cases = nvlink5_cases()
    resets = {r[0] for r in NVLINK5_RULES if r[5] == "RESET_GPU"}  # 147, 148: IGNORE rows only
    assert {c for c, _t, v in cases if v == "drain"} == resets == {144, 145, 146, 149, 150}
    assert {c for c, _t, v in cases if v == "keep"} == set(range(144, 150))  # 150: one row, reset
    assert {"keep", "drain"} == {v for _c, _t, v in cases}
    wrong = []
    for code, text, verdict in cases:
        rc, findings = check_facts(tmp_path, capsys, xid_line(code, text))
        mine = next(f for f in findings if f["check"] == "kernel.xid")
        if (mine["status"] == "fail") != (verdict == "drain") or (rc == 1) != (verdict == "drain"):
            wrong.append((code, text, mine["status"]))
    assert not wrong, wrong[:5]


def test_nvlink5_words_that_decode_to_nothing_fall_back_to_the_severity_word():
    fatal = X.parse_xid(xid_line(149, "NETIR_LINK_EVT Fatal XC0 i0 Link 07 (0x0 0x0 0x0)"))
    nonfatal = X.parse_xid(xid_line(149, "NETIR_LINK_EVT Nonfatal XC0 i0 Link 07"))
    assert X.needs_drain(fatal) and not X.needs_drain(nonfatal)


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x0 (None)", "none"),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "reset_gpu"),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "reboot"),
        ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", "reset_gpu"),
        ("GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)", "none"),
    ],
)
def test_xid154_follows_the_action_it_announces(text, action):
    assert X.action_of(X.parse_xid(xid_line(154, text))) == action


@pytest.mark.parametrize(("cause", "drains"), [(79, True), (48, True), (13, False), (43, False)])
def test_xid45_is_judged_by_its_cause(cause, drains):
    event = X.parse_xid(xid_line(45, f"Ch 00000010 caused by previous Xid {cause}"))
    assert X.needs_drain(event) is drains
    assert not X.needs_drain(X.parse_xid(xid_line(45, "Ch 00000010")))


def test_an_xid_missing_from_the_catalog_warns_reported_and_keeps_the_node():
    f = only("kernel.xid", make_facts(kernel_log=[xid_line(999, "something new")]))
    assert (f.status, f.gpu) == ("warn", 5) and "reported" in f.message
    assert X.lookup(999).mnemonic == "UNKNOWN"


def test_a_site_overrides_one_xid_and_a_bad_override_is_refused(tmp_path):
    config = site(tmp_path, "checks:\n  kernel:\n    xid_actions: {94: drain, 79: warn}\n")
    facts = make_facts(
        kernel_log=[xid_line(94, "Contained: SM"), xid_line(79, "fallen", "0000:38:00")]
    )
    got = {f.gpu: f.status for f in findings_of("kernel.xid", facts, config)}
    assert got == {5: "fail", 2: "warn"}
    for bad in ("{94: explode}", "{abc: drain}", "{0: drain}"):
        with pytest.raises(ConfigError, match="xid_actions"):
            site(tmp_path, f"checks:\n  kernel:\n    xid_actions: {bad}\n")


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid : 32, pid=1, name=python, PBDMA error",  # no address parentheses: no Xid
        "NVRM: Xid 32 something",
    ],
)
def test_check_and_diagnose_agree_on_what_is_no_xid_line(tmp_path, line):
    assert read_line(line) is None
    log = tmp_path / "k.log"
    log.write_text(line + "\n")
    assert D.diagnose([str(log)]).xid is None


def test_an_app_xid_is_not_the_root_of_an_ecc_diagnosis(tmp_path):
    log = tmp_path / "k.log"
    log.write_text(
        xid_line(13, "Graphics SM Warp Exception") + "\n" + xid_line(48, TEXT[48]) + "\n"
    )
    d = D.diagnose([str(log)])
    assert (d.category, d.xid) == ("ecc_error", 48)


@pytest.mark.parametrize(
    ("line", "pci"),
    [
        ("NVRM: GPU 18:00.0: GPU has fallen off the bus.", "0000:18:00"),
        ("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.", "0000:18:00"),
        ("NVRM: GPU at 00000000:18:00.0 has fallen off the bus.", "0000:18:00"),
        ("NVRM: Xid (PCI:18:00): 79, GPU has fallen off the bus.", "0000:18:00"),
    ],
)
def test_pci_addresses_with_or_without_the_domain_name_their_gpu(line, pci):
    assert read_line(line).pci == pci
    facts = make_facts(kernel_log=[line])
    check = "kernel.xid" if "Xid" in line else "kernel.gpu_bus"
    f = only(check, facts)
    assert (f.status, f.gpu) == ("fail", 0)


def test_one_reader_joins_a_multi_line_message_to_its_gpu():
    lines = [
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        "NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
        xid_line(63, "Row Remapper: New row marked for remapping, reset gpu to activate"),
    ]
    events = read_lines(lines)
    assert isinstance(events[0], BusEvent) and events[0].pci == "0000:b3:00"
    assert events[1].code == 63


def test_check_and_diagnose_agree_on_an_sxid_line_without_its_severity_word(tmp_path):
    line = "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Link 44 egress non-posted PRIV error"
    event = read_line(line)
    assert event.code == 12028 and event.link == 44
    f = only("kernel.sxid", make_facts(kernel_log=[line]))
    log = tmp_path / "k.log"
    log.write_text(line + "\n" + WATCHDOG)
    d = D.diagnose([str(log)])
    assert (f.status == "fail") is event.fatal is (d.category == "nvlink_error")


def test_an_xid_missing_from_the_catalog_is_reported_in_the_event_and_a_metric(
    tmp_path, monkeypatch
):
    # Reported, not drained: the prolog's event names it, and a counter per Xid counts it.
    from gpugate.cli import main
    from gpugate.yamlio import dump_yaml

    snap = tmp_path / "gpu-node-01.yaml"
    snap.write_text(dump_yaml(make_facts(kernel_log=[xid_line(999, "something new")]).to_dict()))
    prom = tmp_path / "metrics" / "gpugate.prom"
    prom.parent.mkdir()
    config = tmp_path / "site.yaml"
    config.write_text(f"facts_file: {snap}\nstate_dir: {tmp_path / 'state'}\n"
                      f"admin:\n  metrics_file: {prom}\n"
                      "task_prolog:\n  nccl_debug_dir: null\n")  # fmt: skip
    for name, value in {"SLURMD_NODENAME": "gpu-node-01", "SLURM_JOB_ID": "77",
                        "SLURM_JOB_UID": "0"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    assert main(["prolog", "--config", str(config)]) == 0
    lines = (tmp_path / "state" / "events.jsonl").read_text().splitlines()
    event = json.loads(lines[-1])
    assert event["hook"] == "prolog" and event["unknown_xids"] == [999]
    assert 'gpugate_unknown_xids_total{node="gpu-node-01",xid="999"} 1' in prom.read_text()

"""DCGM diagnostics for `gpugate qualify`: parsing (4.x, 3.x), judging, running, the stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import paths
import pytest

from gpugate.qualify import dcgm
from gpugate.qualify.dcgm import DcgmError, classify, dcgm_step, diag_argv, parse_diag, run_diag

STANDIN = paths.DCGMI_STANDIN / "dcgmi"
REPLAY = STANDIN.parent / "replay"
REPLAY_FILES = sorted(REPLAY.glob("*/diag-r*.json"))


@pytest.fixture
def replay_env(monkeypatch: pytest.MonkeyPatch):
    """Point the stand-in at the committed replay files; returns a node setter."""
    monkeypatch.setenv("GPUGATE_DCGMI_REPLAY", str(REPLAY))

    def on(node: str) -> None:
        monkeypatch.setenv("SLURMD_NODENAME", node)

    return on


def fake_dcgmi(tmp_path: Path, body: str) -> str:
    """A dcgmi that runs `body` (Python) instead: for hangs and garbage output."""
    path = tmp_path / "dcgmi"
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(0o755)
    return str(path)


def standin(
    *args: str, node: str = "default", env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the stand-in as a process."""
    full = {
        **os.environ,
        "GPUGATE_DCGMI_REPLAY": str(REPLAY),
        "SLURMD_NODENAME": node,
        **(env or {}),
    }
    return subprocess.run([str(STANDIN), *args], capture_output=True, env=full, timeout=30)


# --- parsing -------------------------------------------------------------------------------


def test_replay_files_are_there() -> None:
    assert len(REPLAY_FILES) >= 6


@pytest.mark.parametrize("path", REPLAY_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_replay_file_parses(path: Path) -> None:
    res = parse_diag(path.read_text())
    assert res.format in ("4.x", "3.x")
    assert res.version
    assert res.tests or res.runtime_error
    for f in res.findings:
        assert f.kind in dcgm.KINDS
        assert f.sentence().startswith(f"{f.test}: ")


def test_passing_level_2_on_eight_gpus() -> None:
    res = parse_diag((REPLAY / "default" / "diag-r2.json").read_text())
    assert res.format == "4.x" and res.version == "4.6.0"
    assert res.gpus == tuple(range(8))
    assert res.tests == (("software", "Pass"), ("memory", "Pass"), ("pcie", "Pass"))
    assert res.findings == () and res.passed
    assert res.driver_version == "570.172.08"


def test_memory_fail_names_gpu_3_as_hardware() -> None:
    res = parse_diag((REPLAY / "gpu-memfail" / "diag-r2.json").read_text())
    assert not res.passed
    (f,) = res.findings  # the summary repeats GPU 3's error: not counted twice
    assert (f.test, f.gpu, f.kind, f.error_id, f.error_severity) == ("memory", 3, "hardware", 58, 2)
    assert f.sentence().startswith("memory: GPU 3: A memory mismatch was detected on GPU 3")
    assert f.sentence().endswith(
        "(DCGM error id 58) [DCGM_FR_MEMORY_MISMATCH, category 10 Hardware Memory]"
    )


def test_persistence_mode_is_configuration_not_hardware() -> None:
    res = parse_diag((REPLAY / "gpu-nopersist" / "diag-r1.json").read_text())
    # JSON writes the Warn as "Fail" on every GPU; only GPU 5 carries the error.
    (f,) = res.findings
    assert (f.test, f.gpu, f.kind, f.error_id) == ("software", 5, "config", 29)
    assert res.of_kind("hardware") == () and res.passed


def test_dcgm3_format() -> None:
    res = parse_diag((REPLAY / "dcgm3-pciefail" / "diag-r2.json").read_text())
    assert res.format == "3.x" and res.version == "3.3.9"
    assert res.gpus == (0, 1)
    assert ("memory", "Pass") in res.tests and ("pcie", "Fail") in res.tests
    assert ("Persistence Mode", "Pass") in res.tests
    (f,) = res.findings
    assert (f.test, f.gpu, f.kind, f.error_id) == ("pcie", 1, "hardware", 107)


def test_dcgm3_deployment_warning_under_warnings_key() -> None:
    # 3.3.9 HelperJsonAddBasicTests puts the text under "warnings" and the GPU in "gpu_id" (int).
    doc = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
        {"name": "Persistence Mode", "results": [{"status": "Warn", "gpu_id": 2, "warnings": [
            {"warnings": "Persistence mode for GPU 2 is disabled.", "error_id": 29,
             "error_category": 8, "error_severity": 5}]}]}]}]}, "version": "3.3.9"}  # fmt: skip
    (f,) = parse_diag(json.dumps(doc)).findings
    assert f.gpu == 2 and f.kind == "config"
    assert f.message == "Persistence Mode: Persistence mode for GPU 2 is disabled."


def test_runtime_error() -> None:
    res = parse_diag((REPLAY / "dcgm-nonvvs" / "diag-r1.json").read_text())
    assert res.runtime_error.startswith("Error: Unable to complete diagnostic. Return: (-52)")
    assert not res.passed
    judged = dcgm.judge(res, 1)
    assert judged.ok is None and "DCGM could not run" in judged.detail


def test_error_on_no_entity_comes_from_the_summary() -> None:
    w = {"warning": "NVLink down", "error_id": 14, "error_category": 11, "error_severity": 4}
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "diagnostic", "results": [{"entity_group": "GPU", "entity_group_id": 1,
         "entity_id": 0, "status": "Pass"}], "test_summary": {"status": "Fail", "warnings": [w]}}]}]},
        "metadata": {"version": "4.6.0"}}  # fmt: skip
    (f,) = parse_diag(json.dumps(doc)).findings
    assert (
        f.gpu is None
        and f.kind == "hardware"
        and f.sentence()
        == "diagnostic: NVLink down (DCGM error id 14) "
        "[DCGM_FR_NVLINK_DOWN, category 11 Hardware NvLink]"
    )


def test_fail_without_detail_still_counts() -> None:
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Stress", "tests": [
        {"name": "targeted_power", "results": [{"entity_group": "GPU", "entity_group_id": 1,
         "entity_id": 4, "status": "Fail"}], "test_summary": {"status": "Fail"}}]}]}}  # fmt: skip
    res = parse_diag(json.dumps(doc))
    assert [(f.gpu, f.kind) for f in res.findings] == [(4, "hardware")]
    assert not res.passed


def test_skip_is_no_finding() -> None:
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0,
         "status": "Skip"}], "test_summary": {"status": "Skip"}}]}]}}  # fmt: skip
    res = parse_diag(json.dumps(doc))
    assert res.findings == () and res.tests == (("memory", "Skip"),)


def test_iterations_are_merged() -> None:
    one = json.loads((REPLAY / "default" / "diag-r2.json").read_text())
    bad = json.loads((REPLAY / "gpu-memfail" / "diag-r2.json").read_text())
    doc = {"iterations": [one, bad], "Overall Result": "Fail", "Warning": "x"}
    assert [f.gpu for f in parse_diag(json.dumps(doc)).findings] == [3]


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "not JSON"),
        (
            "Error: Unable to start an embedded host engine. Host engine connection invalid.\n",
            "not JSON",
        ),
        ('{"DCGM Diagnostic": ', "not JSON"),
        ("[1, 2]", "not JSON"),
        ('{"something": {}}', "neither"),
        ('{"DCGM Diagnostic": {"test_categories": {"a": 1}}}', "test_categories: expected a list"),
        ('{"DCGM Diagnostic": []}', "expected an object"),
        ('{"DCGM Diagnostic": {"test_categories": [{"tests": [{"results": [7]}]}]}}', "shape"),
        (
            '{"DCGM Diagnostic": {}, "entity_groups": [{"entity_group": "GPU", "entities": '
            '[{"entity_id": "x"}]}]}',
            "shape",
        ),
    ],
)
def test_bad_documents_are_clear_errors(text: str, says: str) -> None:
    with pytest.raises(DcgmError, match=says):
        parse_diag(text)


@pytest.mark.parametrize(
    "test, eid, cat, sev, kind",
    [
        ("software", 29, 8, 5, "config"),  # persistence mode
        ("software", 6, 10, 6, "hardware"),  # pending page retirements: memory, even in software
        ("memory", 58, 10, 2, "hardware"),
        ("memory", 51, 6, 1, "software"),  # a CUDA API call failed: not proof either way
        ("targeted_power", 63, 14, 4, "hardware"),
        ("memory", 60, 10, 5, "config"),  # ECC off: a setting despite its memory category
        ("memory_bandwidth", 62, 1, 4, "hardware"),  # under the bandwidth floor
        ("pcie", None, None, None, "hardware"),
        ("software", None, None, None, "config"),
    ],
)
def test_classify(test: str, eid, cat, sev, kind: str) -> None:
    assert classify(test, eid, cat, sev) == kind


# --- levels and argv -----------------------------------------------------------------------


def test_levels_cover_one_to_four_and_grow() -> None:
    assert sorted(dcgm.LEVELS) == [1, 2, 3, 4]
    for lo, hi in ((1, 2), (2, 3), (3, 4)):
        assert set(dcgm.LEVELS[lo]["plugins"]) < set(dcgm.LEVELS[hi]["plugins"])
    assert "memory" in dcgm.LEVELS[2]["plugins"] and "diagnostic" in dcgm.LEVELS[3]["plugins"]
    assert "memtest" in dcgm.LEVELS[4]["plugins"] and "memtest" not in dcgm.LEVELS[3]["plugins"]


def test_diag_argv() -> None:
    assert diag_argv(2, "/opt/dcgmi") == ["/opt/dcgmi", "diag", "-r", "2", "-j"]


@pytest.mark.parametrize("level", [0, 5, "2", True, None])
def test_diag_argv_refuses_bad_levels(level) -> None:
    with pytest.raises(DcgmError, match="level"):
        diag_argv(level)


# --- running -------------------------------------------------------------------------------


def test_run_diag_through_the_standin(replay_env) -> None:
    replay_env("gpu-memfail")
    res = run_diag(2, str(STANDIN), timeout_s=30)
    assert res.exit_code == 205 and [f.gpu for f in res.findings] == [3]
    assert run_diag(1, str(STANDIN), timeout_s=30).exit_code == 0  # falls back to default/


def test_run_diag_missing_dcgmi(tmp_path: Path) -> None:
    with pytest.raises(DcgmError) as err:
        run_diag(1, str(tmp_path / "no-dcgmi"), timeout_s=5)
    assert err.value.reason == "missing"


def test_run_diag_hang_is_killed(tmp_path: Path) -> None:
    slow = fake_dcgmi(tmp_path, "time.sleep(60)")
    with pytest.raises(DcgmError, match="timed out") as err:
        run_diag(1, slow, timeout_s=0.5)
    assert err.value.reason == "timeout"


def test_run_diag_non_json(tmp_path: Path) -> None:
    noise = fake_dcgmi(
        tmp_path, "print('Error: Unable to start an embedded host engine.'); sys.exit(235)"
    )
    with pytest.raises(DcgmError, match=r"not JSON.*exit 235"):
        run_diag(1, noise, timeout_s=5)


def test_run_diag_refuses_a_zero_timeout() -> None:
    with pytest.raises(DcgmError, match="timeout"):
        run_diag(1, str(STANDIN), timeout_s=0)


def test_dcgm_step_shapes(replay_env, tmp_path: Path) -> None:
    keys = {"test", "nodes", "ok", "value_gbps", "floor_gbps", "detail", "job_id"}
    replay_env("gpu-memfail")
    bad = dcgm_step(2, str(STANDIN), 30, "gpu-memfail", "41")
    assert keys <= set(bad.to_json()) and bad.test == "dcgm" and bad.nodes == ["gpu-memfail"]
    assert bad.ok is False and bad.job_id == "41"
    assert "memory: GPU 3:" in bad.detail and "(DCGM error id 58)" in bad.detail
    assert bad.findings[0].kind == "hardware"
    json.dumps(bad.to_json())
    replay_env("gpu-nopersist")
    conf = dcgm_step(1, str(STANDIN), 30, "gpu-nopersist", None)
    assert conf.ok is True and "configuration (not hardware)" in conf.detail
    assert "Persistence mode for GPU 5" in conf.detail
    replay_env("anything")
    assert dcgm_step(2, str(STANDIN), 30, "n1", None).ok is True
    absent = dcgm_step(1, str(tmp_path / "dcgmi"), 5, "n1", None)
    assert absent.ok is None and "not found" in absent.detail
    hung = dcgm_step(1, fake_dcgmi(tmp_path, "time.sleep(60)"), 0.5, "n1", None)
    assert hung.ok is None and "timed out" in hung.detail


# --- the stand-in as a process -------------------------------------------------------------


@pytest.mark.parametrize(
    "node, level, code",
    [("default", 1, 0), ("default", 2, 0), ("gpu-memfail", 2, 205), ("gpu-nopersist", 1, 226),
     ("dcgm3-pciefail", 2, 205), ("dcgm-nonvvs", 1, 204), ("gpu-memfail", 1, 0)],
)  # fmt: skip
def test_standin_replays_byte_for_byte(node: str, level: int, code: int) -> None:
    proc = standin("diag", "-r", str(level), "-j", node=node)
    own = REPLAY / node / f"diag-r{level}.json"
    expected = (own if own.is_file() else REPLAY / "default" / f"diag-r{level}.json").read_bytes()
    assert proc.stdout == expected
    assert proc.returncode == code


def test_standin_flag_order() -> None:
    assert standin("diag", "-j", "-r", "2").returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("diag", "-r", "1"),
        ("discovery", "-l"),
        ("diag", "-r", "x", "-j"),
        ("diag", "-r", "3", "-j"),
    ],
)
def test_standin_refuses_the_rest(args: tuple[str, ...]) -> None:
    proc = standin(*args)
    assert proc.returncode == 2 and b"dcgmi stand-in:" in proc.stderr and proc.stdout == b""


def test_standin_needs_the_replay_dir() -> None:
    proc = standin("diag", "-r", "1", "-j", env={"GPUGATE_DCGMI_REPLAY": ""})
    assert proc.returncode == 2 and b"GPUGATE_DCGMI_REPLAY" in proc.stderr

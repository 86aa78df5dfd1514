"""DCGM read by DCGM's own error catalog (issue 28, Deliver 1): the verdicts, the text table,
nvvs nulls, and the real `dcgmi diag` captures.

The captures are real dcgmi output (`../shared/reference/real-outputs/dcgm/`, see its README:
DCGM 3.3.8 on 8xH100, 4.2.3, 4.4.1 on 8xB200 inside a Slurm job, an nvvs 3.1.0 JSON document),
read in place, never copied; their tests skip cleanly where the checkout has no `shared/`.
"""

from __future__ import annotations

import json
import os

import paths
import pytest

from gpugate.qualify import dcgm_catalog as cat
from gpugate.qualify.dcgm import KINDS, DcgmError, classify, judge, parse_diag, parse_text, verdict
from gpugate.qualify.dcgm_text import read_table

HERE = str(paths.TESTS)
CAPTURES = os.path.join(HERE, "..", "..", "shared", "reference", "real-outputs", "dcgm")
FM_DOWN = "dcgm-3.3.8.h100x8.diag-r3-fail-early.text.memory-fail-cuinit-fm-down.txt"
PCIE_423 = "dcgm-4.2.3.26b9x4.diag.text.pcie-internal-error.txt"
PCIE_SLURM = "dcgm-4.4.1.b200x8.diag-r2-in-slurm-job.text.pcie-fail.txt"
PCIE_V100 = "dcgm-4.4.1.v100x4.diag-r2-v.text.pcie-fail.excerpt.txt"
NVVS = "nvvs-3.1.0.x8.json-with-warning-prefix.txt"


def capture(name: str) -> str:
    """The text of one real capture; the test skips where shared/ is absent."""
    path = os.path.join(CAPTURES, name)
    if not os.path.exists(path):
        pytest.skip(f"no capture at {path} (shared/ is not beside this checkout)")
    with open(path, encoding="utf-8") as f:
        return f.read()


def commands(text: str) -> list[str]:
    """The output of each `$ dcgmi ...` in a capture that holds several."""
    return [part.split("\n", 1)[1] for part in text.split("$ dcgmi")[1:]]


# --- the real captures -----------------------------------------------------------------------


@pytest.mark.parametrize("name", [PCIE_423, PCIE_SLURM, PCIE_V100])
@pytest.mark.shared("captures")
def test_category_16_pcie_failure_is_could_not_test_and_keeps_the_node(name: str) -> None:
    text = capture(name)
    res = parse_diag(commands(text)[0] if text.startswith("$") else text)
    assert res.format == "text" and res.version in ("4.2.3", "4.4.1")
    assert res.findings and {f.kind for f in res.findings} == {"not_tested"}
    assert {(f.test, f.error_id) for f in res.findings} == {("pcie", 44)}
    assert all("category 16 Internal Other" in f.sentence() for f in res.findings)
    step = judge(res, 2)
    assert step.ok is None and step.not_tested  # not a failure: no drain
    assert "DCGM could not test" in step.detail and "internal error" in step.detail
    assert not res.passed


@pytest.mark.shared("captures")
def test_the_slurm_job_capture_has_every_gpu_passing_the_pcie_test() -> None:
    (pcie,) = [t for t in read_table(capture(PCIE_SLURM)).tests if t.name == "pcie"]
    assert pcie.status == "Fail" and pcie.per_gpu == tuple((g, "Pass") for g in range(8))


@pytest.mark.shared("captures")
def test_plugins_that_could_not_load_are_could_not_test() -> None:
    res = parse_text(commands(capture(PCIE_V100))[1])
    assert res.runtime_error and "Cannot load plugins" in res.runtime_error
    step = judge(res, 3)
    assert step.ok is None and step.not_tested and "could not run" in step.detail


@pytest.mark.shared("captures")
def test_cuinit_system_not_yet_initialized_names_the_fabric_manager() -> None:
    res = parse_diag(capture(FM_DOWN))
    assert (res.format, res.version, res.gpus) == ("text", "3.3.8", tuple(range(8)))
    assert [f.gpu for f in res.findings] == list(range(8))
    for f in res.findings:
        assert (f.test, f.kind, f.cause, f.error_id) == ("memory", "software", "fabric manager", 51)
        assert "'system not yet initialized'" in f.message  # the cut words joined again
    step = judge(res, 3)
    assert step.ok is False and "fabric manager" in step.detail
    assert "not the GPU" in step.detail and "GPUs 0,1,2,3,4,5,6,7" in step.detail
    assert step.detail.count("cuInit") == 1 and "more like it" not in step.detail
    assert dict(res.tests)["pcie"] == "Skip" and dict(res.tests)["Persistence Mode"] == "Pass"


@pytest.mark.shared("captures")
def test_nvvs_json_with_a_warning_prefix_and_nulls_parses() -> None:
    text = capture(NVVS)
    assert text.lstrip().startswith("WARNING") and "null," in text
    res = parse_diag(text)
    assert (res.format, res.version) == ("3.x", "3.1.0")
    assert len(res.tests) == 10 and res.findings == () and res.passed
    assert judge(res, 1).ok is True


# --- DCGM's catalog ---------------------------------------------------------------------------


def test_catalog_is_dcgm_error_meta_in_order() -> None:
    assert sorted(cat.CATALOG) == list(range(118))  # DCGM_FR_OK .. DCGM_FR_TEST_SKIPPED
    assert cat.CATALOG[44] == ("INTERNAL", cat.TRIAGE, 16)
    assert cat.CATALOG[58] == ("MEMORY_MISMATCH", cat.ISOLATE, 10)
    assert cat.CATALOG[108] == ("CUDA_FM_NOT_INITIALIZED", cat.MONITOR, 6)
    assert len(cat.CATEGORIES) == 17 and cat.CATEGORIES[16] == "Internal Other"


def test_every_category_16_error_is_could_not_test() -> None:
    internal = [i for i, (_, _, c) in cat.CATALOG.items() if c == cat.INTERNAL]
    assert internal == [21, 26, 27, 32, 37, 44, 49, 53, 67, 97]
    for eid in internal:  # by the id alone (the catalog's category), and as DCGM writes both
        assert classify("pcie", eid) == "not_tested"
        assert classify("memory", eid, 16, cat.CATALOG[eid][1]) == "not_tested"


@pytest.mark.parametrize(
    "category, kind",
    [
        (0, "hardware"),  # DCGM_FR_EC_NONE: nothing to go by, the test decides (a hardware test)
        (1, "hardware"),  # performance threshold: the GPU under DCGM's bar
        (2, "hardware"),  # performance violation
        (3, "software"),  # software configuration: the first of the node's software
        (8, "software"),  # software other: the last of them
        (9, "hardware"),  # hardware thermal: the first of the hardware
        (15, "hardware"),  # hardware other: the last of them
        (16, "not_tested"),  # internal other: DCGM's own failure
        (17, "hardware"),  # a category newer than this table: the test decides
    ],
)
def test_category_boundaries(category: int, kind: str) -> None:
    assert classify("memory", None, category, cat.TRIAGE) == kind


@pytest.mark.parametrize(
    "eid, kind, cause",
    [
        (117, "not_tested", "test skipped"),  # DCGM_FR_TEST_SKIPPED, rated CONFIG
        (48, "not_tested", "test disabled"),
        (89, "not_tested", "EUD plugin could not start"),  # EUD category, the binary's permissions
        (95, "hardware", ""),  # EUD test failed: ISOLATE
        (81, "hardware", ""),  # uncontained error (Xid 95): Software XID category, ISOLATE
        (109, "hardware", ""),  # NVSwitch SXID: ISOLATE
        (101, "software", ""),  # an Xid, TRIAGE: DCGM's category says software
        (108, "software", "fabric manager"),
        (112, "software", "fabric manager"),  # FM training: rated CONFIG, yet no CUDA job starts
        (29, "config", "persistence mode"),
        (60, "config", "ECC (unsupported)"),  # hardware-memory category, CONFIG severity
        (25, "software", "graphics processes"),  # RESET in a software category: not the GPU
        (24, "software", ""),  # NVML library bad: ISOLATE, but a library is not the GPU
        (51, "software", ""),  # a CUDA API call failed: not proof either way
        (58, "hardware", ""),
    ],
)
def test_ids_by_the_catalog(eid: int, kind: str, cause: str) -> None:
    assert verdict("memory", eid) == (kind, cause)
    assert kind in KINDS


def test_without_id_or_category_the_test_decides() -> None:
    assert classify("software") == "config"
    assert classify("pcie") == "hardware"
    assert classify("something_new") == "software"


def test_message_words_give_the_id_for_the_table() -> None:
    assert cat.error_id_from_message("There was an internal error during the test: 'x'") == 44
    assert cat.error_id_from_message("GPU 1 Error using CUDA API cuInit ...") == 51
    assert cat.error_id_from_message("Unable to initialize CUDA library: 'system not yet "
                                     "initialized'") == 108  # fmt: skip
    assert cat.error_id_from_message("something else") is None


# --- JSON: 4.x with category 16, warnings before it, nulls, per-GPU results -------------------


def _v4(results: list, summary: dict | None = None) -> str:
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Integration", "tests": [
        None, {"name": "pcie", "results": results, "test_summary": summary or {"status": "Fail"}}]},
        None]}, "metadata": {"version": "4.4.1"}}  # fmt: skip
    return "Warning: could not read the config file\n" + json.dumps(doc)


def test_v4_json_internal_error_with_nulls_and_a_prefix_is_could_not_test() -> None:
    w = {"warning": "There was an internal error during the test: 'A child process (7) exited'",
         "error_id": 44, "error_category": 16, "error_severity": 4}  # fmt: skip
    results = [None, {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
               {"entity_group": "GPU", "entity_id": 1, "status": "Fail", "warnings": [w, None]}]  # fmt: skip
    res = parse_diag(_v4(results))
    assert [(f.gpu, f.kind, f.error_id) for f in res.findings] == [(1, "not_tested", 44)]
    assert judge(res, 2).ok is None


def test_different_hardware_errors_are_each_told() -> None:
    one = {"warning": "DBE on GPU 2", "error_id": 4, "error_category": 10, "error_severity": 2}
    two = {
        "warning": "mismatch on GPU 3",
        "error_id": 58,
        "error_category": 10,
        "error_severity": 2,
    }
    results = [{"entity_group": "GPU", "entity_id": 2, "status": "Fail", "warnings": [one]},
               {"entity_group": "GPU", "entity_id": 3, "status": "Fail", "warnings": [two]}]  # fmt: skip
    detail = judge(parse_diag(_v4(results)), 2).detail
    assert "pcie: GPU 2: DBE on GPU 2" in detail and "pcie: GPU 3: mismatch on GPU 3" in detail


def test_hardware_beside_could_not_test_fails_and_says_both() -> None:
    hw = {"warning": "PCIe replays", "error_id": 107, "error_category": 13, "error_severity": 2}
    internal = {"warning": "internal", "error_id": 44, "error_category": 16, "error_severity": 4}
    results = [{"entity_group": "GPU", "entity_id": 2, "status": "Fail", "warnings": [hw]},
               {"entity_group": "GPU", "entity_id": 3, "status": "Fail", "warnings": [internal]}]  # fmt: skip
    step = judge(parse_diag(_v4(results)), 2)
    assert step.ok is False and "GPU 2" in step.detail
    assert "DCGM could not test" in step.detail and step.not_tested is None


# --- the text table ---------------------------------------------------------------------------

_TABLE = """\
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 4.4.1                                          |
| GPU Device IDs Detected   | 2901, 2901                                     |
|-----  Deployment  --------+------------------------------------------------|
| software                  | Pass                                           |
| Info                      | Persistence mode for GPU 0 is disabled. Enabl  |
|                           | e it.                                          |
+-----  Hardware  ----------+------------------------------------------------+
| memory                    | Fail                                           |
|                           | GPU0: Pass                                     |
|                           | GPU1: Fail                                     |
+---------------------------+------------------------------------------------+
"""


def test_parse_text_refuses_what_is_no_table() -> None:
    with pytest.raises(DcgmError, match="not a dcgmi diag table"):
        parse_text("Successfully ran diagnostic for group.\n")


def test_table_per_gpu_failure_without_a_message_names_the_gpu() -> None:
    res = parse_diag(_TABLE)
    assert res.gpus == (0, 1) and res.tests == (("software", "Pass"), ("memory", "Fail"))
    assert [(f.test, f.gpu, f.kind) for f in res.findings] == [("memory", 1, "hardware")]


def test_table_info_is_no_finding_and_cut_words_are_joined() -> None:
    (software, _) = read_table(_TABLE).tests
    assert software.warnings == ()
    text = _TABLE.replace("| Info   ", "| Warning").replace("| Pass      ", "| Fail      ", 1)
    (software, _) = read_table(text).tests
    assert software.warnings == ("Persistence mode for GPU 0 is disabled. Enable it.",)


# --- the node's verdict -------------------------------------------------------------------------


def test_a_node_dcgm_could_not_test_is_neither_passed_nor_failed(tmp_path) -> None:
    from gpugate.config import load_config
    from gpugate.qualify import jobs
    from gpugate.qualify.judge import judge_all
    from gpugate.qualify.records import Job

    w = {"warning": "There was an internal error during the test: 'x'", "error_id": 44,
         "error_category": 16, "error_severity": 4}  # fmt: skip
    step = judge(parse_diag(_v4([{"entity_group": "GPU", "entity_id": 0, "status": "Fail",
                                  "warnings": [w]}])), 2)  # fmt: skip
    path = jobs.result_path(str(tmp_path), ("n1",), "dcgm")
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(step.replace(nodes=["n1"], job_id="7").to_json(), f)
    job = Job(name="n1", nodes=("n1",), job_id="7", output="", state="COMPLETED", started=True)
    config = load_config("/dev/null")  # the packaged defaults, no site file
    verdicts, _ = judge_all(config, str(tmp_path), [job], [], ["dcgm"])
    v = verdicts["n1"]
    assert not v["passed"] and not v["failed"]  # not qualified, and never drained for it
    assert "DCGM could not test" in v["why"]

"""Running the checklist (gpugate/checks/run.py, catalog, registry) with every check registered."""

from __future__ import annotations

import os

import paths
import pytest
from factories import default_config, make_facts, make_gpu

from gpugate.checks import registry as R
from gpugate.checks.registry import describe
from gpugate.checks.run import run_checks
from gpugate.config import load_config

CATALOGUE = os.path.join(paths.DOCS, "checks", "index.md")


def test_every_check_has_a_one_line_description():
    for check_id, text in describe().items():
        assert text and text.endswith("."), check_id


def test_the_catalogue_document_lists_every_check():
    with open(CATALOGUE, encoding="utf-8") as fh:
        doc = fh.read()
    missing = [c for c in describe() if f"`{c}`" not in doc]
    assert not missing, f"the check catalogue (docs/checks/) lacks {missing}"


def test_a_healthy_node_has_no_finding_but_ok():
    findings = run_checks(make_facts(), default_config())
    assert {f.status for f in findings} == {"ok"}


def test_disabled_checks_are_skipped(tmp_path):
    facts = make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}})
    assert "gpu.ecc" in {f.check for f in run_checks(facts, default_config()) if f.status == "fail"}
    path = tmp_path / "site.yaml"
    path.write_text("checks:\n  disabled: [gpu.ecc]\n")
    findings = run_checks(facts, load_config(str(path)))
    assert "gpu.ecc" not in {f.check for f in findings}
    assert {f.status for f in findings} == {"ok"}


def test_a_check_that_raises_becomes_unknown_and_the_others_still_run():
    # A value of the wrong type (a hand-edited snapshot that escaped validation) crashes
    # gpu.temperature; run_checks reports it instead of raising.
    facts = make_facts(gpus=[make_gpu(0, temperature_c="hot")] + [make_gpu(i) for i in range(1, 8)])
    findings = run_checks(facts, default_config())
    crashed = [f for f in findings if f.check == "gpu.temperature"]
    assert [f.status for f in crashed] == ["unknown"]
    assert "check crashed: TypeError" in crashed[0].message
    assert {f.status for f in findings if f.check != "gpu.temperature"} == {"ok"}


# The membership the epilog's list and the admin's table had before they moved to @check.
HARDWARE = {
    "gpu.lost", "gpu.ecc", "gpu.memory_errors", "gpu.recovery_action", "gpu.temperature",
    "gpu.throttle", "pcie.link", "nvlink.links", "nvlink.fabric", "ib.ports", "ib.rate",
    "kernel.xid", "kernel.gpu_bus", "kernel.sxid",
}  # fmt: skip
ACTIONS = {
    "gpu.lost": R.REBOOT, "gpu.count": R.REBOOT, "kernel.gpu_bus": R.REBOOT,
    "gpu.ecc": R.RESET, "gpu.memory_errors": R.RESET, "gpu.recovery_action": R.RESET,
    "kernel.xid": R.RESET, "kernel.sxid": R.RESET, "nvlink.links": R.RESET,
    "nvlink.fabric": R.RESET,
    "pcie.link": R.RESEAT, "ib.ports": R.RESEAT, "ib.rate": R.RESEAT, "net.peers": R.RESEAT,
    "gpu.temperature": R.COOLING, "gpu.throttle": R.COOLING,
}  # fmt: skip


def test_each_check_says_whether_it_is_hardware_and_what_an_admin_does():
    assert set(R.hardware_checks()) == HARDWARE
    for check_id in R.registered():
        assert R.is_hardware(check_id) == (check_id in HARDWARE), check_id
        assert R.suggested_action(check_id) == ACTIONS.get(check_id, R.HOST), check_id
    assert not R.is_hardware("no.such") and R.suggested_action(None) == R.HOST


def test_the_registry_refuses_a_duplicate_id_and_an_unknown_action():
    with pytest.raises(ValueError, match="registered twice"):
        R.check("gpu.ecc")(lambda facts, ctx: [])
    with pytest.raises(ValueError, match="action"):
        R.check("test.odd", action="pray")

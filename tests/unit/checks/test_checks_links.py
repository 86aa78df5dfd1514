"""Link checks (gpugate/checks/links.py): PCIe width and generation, NVLinks, the NVSwitch fabric."""

from __future__ import annotations

import pytest
from factories import findings_of, make_facts, make_gpu, only, site, statuses

from gpugate.checks.facts import Pcie


def board(name: str, **changes):
    """Eight GPUs of another model (picks another board profile), with `changes` on each."""
    return make_facts(gpus=[make_gpu(i, name=name, **changes) for i in range(8)])


@pytest.mark.parametrize("check_id", ["pcie.link", "nvlink.links", "nvlink.fabric"])
def test_a_healthy_node_gets_one_ok_per_check(check_id):
    f = only(check_id, make_facts())
    assert f.status == "ok"


@pytest.mark.parametrize("check_id", ["pcie.link", "nvlink.links", "nvlink.fabric"])
def test_without_nvml_link_checks_are_unknown(check_id):
    facts = make_facts(source_errors={"nvml": "timed out after 8 s"}).replace(gpus=None)
    f = only(check_id, facts)
    assert f.status == "unknown" and "timed out after 8 s" in f.message


# pcie.link


def test_pcie_narrow_link_fails_naming_gpu_width_and_limit():
    f = only(
        "pcie.link", make_facts(gpus={1: {"pcie": Pcie(gen=1, max_gen=5, width=8, max_width=16)}})
    )
    assert (f.status, f.gpu, f.value, f.limit) == ("fail", 1, 8, 16)
    assert f.message.startswith("pcie.link: GPU1 (serial 1652123000001) PCIe link x8 < x16")


def test_pcie_link_trained_narrow_below_the_board_width_fails():
    # The link's own maximum is x8 too (a riser, a bifurcated slot): still below the board's x16.
    facts = make_facts(gpus={1: {"pcie": Pcie(gen=5, max_gen=5, width=8, max_width=8)}})
    assert statuses(findings_of("pcie.link", facts)) == ["fail"]


def test_pcie_max_generation_below_the_board_fails():
    f = only(
        "pcie.link", make_facts(gpus={4: {"pcie": Pcie(gen=1, max_gen=4, width=16, max_width=16)}})
    )
    assert (f.status, f.gpu, f.value, f.limit) == ("fail", 4, 4, 5)
    assert "GPU4 (serial 1652123000004) PCIe max generation Gen4 < Gen5" in f.message


def test_pcie_idle_low_current_generation_passes_by_default_but_not_in_current_mode(tmp_path):
    facts = make_facts()  # idle GPUs at Gen1, trained maximum Gen5
    assert only("pcie.link", facts).status == "ok"
    config = site(tmp_path, "checks:\n  pcie:\n    generation: current\n")
    found = findings_of("pcie.link", facts, config)
    assert statuses(found) == ["fail"] * 8
    assert "GPU0 (serial 1652123000000) PCIe current generation Gen1 < Gen5" in found[0].message


def test_pcie_expected_generation_comes_from_the_site(tmp_path):
    config = site(tmp_path, "expect:\n  pcie_gen: 4\n")
    facts = make_facts(gpus={4: {"pcie": Pcie(gen=1, max_gen=4, width=16, max_width=16)}})
    assert only("pcie.link", facts, config).status == "ok"


def test_pcie_width_the_site_expects_wins_over_the_cards_maximum(tmp_path):
    # An x16 card in a slot wired x8 (L40S/T4 servers): x8 is its full width there; x4 is not.
    config = site(tmp_path, "expect:\n  pcie_width: 8\n")
    wired = make_facts(gpus={2: {"pcie": Pcie(gen=5, max_gen=5, width=8, max_width=16)}})
    assert only("pcie.link", wired, config).status == "ok"
    narrower = make_facts(gpus={2: {"pcie": Pcie(gen=5, max_gen=5, width=4, max_width=16)}})
    f = only("pcie.link", narrower, config)
    assert (f.status, f.gpu, f.value, f.limit) == ("fail", 2, 4, 8)


def test_pcie_missing_link_facts_are_unknown_for_that_gpu():
    f = only("pcie.link", make_facts(gpus={3: {"pcie": None}}))
    assert (f.status, f.gpu) == ("unknown", 3)


def test_pcie_unknown_board_still_judges_width_but_says_the_generation_is_unknown():
    facts = board("Tesla T4", pcie=Pcie(gen=3, max_gen=3, width=8, max_width=16))
    found = findings_of("pcie.link", facts)
    assert statuses(found) == ["fail"] * 8 + ["unknown"]
    assert "expect.pcie_gen" in found[-1].message


# nvlink.links


def test_nvlink_inactive_links_fail_naming_gpu_and_count():
    links = (True,) * 5 + (False,) + (True,) * 5 + (False,) + (True,) * 6
    f = only("nvlink.links", make_facts(gpus={2: {"nvlink_active": links}}))
    assert (f.status, f.gpu, f.value, f.limit) == ("fail", 2, 16, 18)
    assert f.message == (
        "nvlink.links: GPU2 (serial 1652123000002) 16/18 NVLinks active (inactive links: 5, 11) (reset GPU)"
    )


def test_nvlink_fewer_links_listed_than_the_board_has_fails():
    assert (
        only("nvlink.links", make_facts(gpus={0: {"nvlink_active": (True,) * 12}})).status == "fail"
    )


def test_nvlink_board_without_nvlinks_is_ok():
    f = only("nvlink.links", board("NVIDIA H100 PCIe", nvlink_active=()))
    assert f.status == "ok" and "h100-pcie" in f.message


def test_nvlink_a100_board_expects_12(tmp_path):
    facts = board("NVIDIA A100-SXM4-80GB", nvlink_active=(True,) * 12)
    assert only("nvlink.links", facts).status == "ok"
    config = site(tmp_path, "expect:\n  nvlinks_per_gpu: 18\n")
    assert statuses(findings_of("nvlink.links", facts, config)) == ["fail"] * 8


def test_nvlink_unknown_board_or_missing_states_are_unknown():
    assert only("nvlink.links", board("Tesla T4")).status == "unknown"
    f = only("nvlink.links", make_facts(gpus={6: {"nvlink_active": None}}))
    assert (f.status, f.gpu) == ("unknown", 6)


# nvlink.fabric


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        (
            {"fabric_state": "in_progress"},
            "GPU3 (serial 1652123000003) NVSwitch fabric state in_progress, not completed",
        ),
        (
            {"fabric_state": "not_started"},
            "GPU3 (serial 1652123000003) NVSwitch fabric state not_started",
        ),
        (
            {"fabric_status": "nvml_error_unknown"},
            "GPU3 (serial 1652123000003) NVSwitch fabric status nvml_error_unknown",
        ),
    ],
)
def test_fabric_not_registered_fails(changes, text):
    f = only("nvlink.fabric", make_facts(gpus={3: changes}))
    assert (f.status, f.gpu) == ("fail", 3)
    assert text in f.message


def test_fabric_missing_where_nvswitches_are_expected_is_unknown():
    f = only("nvlink.fabric", make_facts(gpus={3: {"fabric_state": None, "fabric_status": None}}))
    assert (f.status, f.gpu) == ("unknown", 3)


def test_fabric_not_checked_on_boards_without_nvswitch_state(tmp_path):
    facts = board("NVIDIA A100-SXM4-80GB", fabric_state=None, fabric_status=None)
    assert only("nvlink.fabric", facts).status == "ok"
    assert only("nvlink.fabric", board("Tesla T4")).status == "unknown"
    config = site(tmp_path, "expect:\n  nvswitch: false\n")
    assert only("nvlink.fabric", board("Tesla T4"), config).status == "ok"

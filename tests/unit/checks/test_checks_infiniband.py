"""Fabric checks (gpugate/checks/infiniband.py): ports up, at rate, and nvidia_peermem loaded."""

from __future__ import annotations

import pytest
from factories import findings_of, make_facts, make_gpu, make_ib, only, site, statuses

IB_CHECKS = ["ib.ports", "ib.rate", "ib.peermem"]


def ports(**changed):
    """Eight healthy NDR ports, with `changed[i]` applied to port mlx5_i."""
    return tuple(make_ib(i, **changed.get(f"mlx5_{i}", {})) for i in range(8))


@pytest.mark.parametrize("check_id", IB_CHECKS)
def test_a_healthy_node_gets_one_ok_per_check(check_id):
    assert only(check_id, make_facts()).status == "ok"


@pytest.mark.parametrize("check_id", IB_CHECKS)
def test_without_infiniband_facts_the_checks_are_unknown_and_say_why(check_id):
    facts = make_facts(infiniband=None, source_errors={"infiniband": "timed out after 2 s"})
    f = only(check_id, facts)
    assert f.status == "unknown" and "timed out after 2 s" in f.message


# ib.ports


def test_ports_down_port_fails_naming_device_port_and_state():
    f = only(
        "ib.ports", make_facts(infiniband=ports(mlx5_3={"state": "DOWN", "phys_state": "Polling"}))
    )
    assert f.status == "fail"
    assert (
        f.message
        == "ib.ports: mlx5_3 port 1 DOWN/Polling, expected ACTIVE/LinkUp (reseat/check cables)"
    )


@pytest.mark.parametrize(
    ("state", "phys"), [("INIT", "LinkUp"), ("ACTIVE", "LinkErrorRecovery"), ("ARMED", "LinkUp")]
)
def test_ports_anything_but_active_linkup_fails(state, phys):
    facts = make_facts(infiniband=ports(mlx5_0={"state": state, "phys_state": phys}))
    assert statuses(findings_of("ib.ports", facts)) == ["fail"]


def test_ports_state_names_are_matched_whatever_their_case():
    facts = make_facts(infiniband=ports(mlx5_0={"state": "Active", "phys_state": "LinkUp"}))
    assert only("ib.ports", facts).status == "ok"


def test_ports_fewer_than_the_site_expects_fails(tmp_path):
    config = site(tmp_path, "expect:\n  ib_ports: 8\n")
    f = only("ib.ports", make_facts(infiniband=ports()[:6]), config)
    assert (f.status, f.value, f.limit) == ("fail", 6, 8)
    assert "6 InfiniBand/Ethernet ports, expected 8" in f.message


def test_ports_without_a_site_count_every_present_port_up_is_ok():
    # A healthy A100 node with four HDR ports is not held to a board's guess of eight NICs.
    facts = make_facts(infiniband=ports(mlx5_0={"rate_gbps": 200.0})[:4])
    f = only("ib.ports", facts)
    assert (f.status, f.value) == ("ok", 4) and "all 4 InfiniBand/Ethernet ports" in f.message


def test_ports_only_the_configured_link_layers_count(tmp_path):
    facts = make_facts(infiniband=ports(mlx5_7={"link_layer": "Ethernet"}))
    assert only("ib.ports", facts).status == "ok"  # RoCE counts by default
    config = site(
        tmp_path, "checks:\n  ib:\n    link_layers: [InfiniBand]\nexpect:\n  ib_ports: 8\n"
    )
    assert only("ib.ports", facts, config).status == "fail"
    config = site(
        tmp_path, "checks:\n  ib:\n    link_layers: [InfiniBand]\nexpect:\n  ib_ports: 7\n"
    )
    assert only("ib.ports", facts, config).status == "ok"


def test_ports_unknown_state_and_no_expected_count():
    f = only("ib.ports", make_facts(infiniband=ports(mlx5_2={"state": None})))
    assert f.status == "unknown" and "mlx5_2 port 1" in f.message
    # No board and no site count: every present port up is healthy, and says so.
    facts = make_facts(gpus=[make_gpu(i, name="Tesla T4") for i in range(8)])
    f = only("ib.ports", facts)
    assert f.status == "ok" and "no expected count: expect.ib_ports" in f.message


# ib.rate


def test_rate_slow_active_port_fails_naming_port_rate_and_limit(tmp_path):
    config = site(tmp_path, "expect:\n  ib_rate_gbps: 400\n")
    f = only("ib.rate", make_facts(infiniband=ports(mlx5_2={"rate_gbps": 200.0})), config)
    assert (f.status, f.value, f.limit) == ("fail", 200.0, 400.0)
    assert f.message == "ib.rate: mlx5_2 port 1 rate 200 Gb/s < 400 Gb/s (reseat/check cables)"


def test_rate_without_a_site_rate_the_ports_must_share_one():
    f = only("ib.rate", make_facts(infiniband=ports(mlx5_2={"rate_gbps": 200.0})))
    assert (f.status, f.value, f.limit) == ("fail", 200.0, 400.0)
    assert "mlx5_2 port 1 rate 200 Gb/s < 400 Gb/s (the other ports' rate" in f.message
    hdr = tuple(make_ib(i, rate_gbps=200.0) for i in range(4))
    f = only("ib.rate", make_facts(infiniband=hdr))
    assert f.status == "ok" and "4 active ports share one rate, 200 Gb/s" in f.message


def test_rate_of_a_down_port_is_left_to_ib_ports():
    down = {"state": "DOWN", "phys_state": "Disabled", "rate_gbps": 40.0}
    assert only("ib.rate", make_facts(infiniband=ports(mlx5_3=down))).status == "ok"


def test_rate_expected_comes_from_the_site(tmp_path):
    config = site(tmp_path, "expect:\n  ib_rate_gbps: 200\n")
    assert (
        only("ib.rate", make_facts(infiniband=ports(mlx5_2={"rate_gbps": 200.0})), config).status
        == "ok"
    )


def test_rate_unknown_when_not_reported_or_nothing_active():
    assert (
        only("ib.rate", make_facts(infiniband=ports(mlx5_2={"rate_gbps": None}))).status
        == "unknown"
    )
    all_down = tuple(make_ib(i, state="DOWN", phys_state="Polling") for i in range(8))
    assert only("ib.rate", make_facts(infiniband=all_down)).status == "unknown"


def test_rate_on_a_board_without_fabric_ports_is_ok():
    facts = make_facts(gpus=[make_gpu(i, name="NVIDIA H100 PCIe") for i in range(8)], infiniband=())
    assert only("ib.rate", facts).status == "ok"
    assert only("ib.ports", facts).status == "ok"


# ib.peermem


def test_peermem_missing_with_fabric_ports_fails():
    f = only("ib.peermem", make_facts(kernel_modules=("nvidia", "mlx5_core", "mlx5_ib")))
    assert f.status == "fail" and "nvidia_peermem is not loaded" in f.message


@pytest.mark.parametrize("module", ["nvidia_peermem", "nv_peer_mem", "nvidia-peermem"])
def test_peermem_either_module_name_passes(module):
    assert only("ib.peermem", make_facts(kernel_modules=("nvidia", module))).status == "ok"


def test_peermem_not_needed_without_fabric_ports_or_when_switched_off(tmp_path):
    assert only("ib.peermem", make_facts(infiniband=(), kernel_modules=("nvidia",))).status == "ok"
    config = site(tmp_path, "checks:\n  ib:\n    require_peermem: false\n")
    assert only("ib.peermem", make_facts(kernel_modules=("nvidia",)), config).status == "ok"


def test_peermem_unknown_without_the_module_list():
    f = only(
        "ib.peermem", make_facts(kernel_modules=None, source_errors={"host": "PermissionError"})
    )
    assert f.status == "unknown" and "PermissionError" in f.message

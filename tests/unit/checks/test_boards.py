"""Board profiles: matched by model family on whole words (GH200 is no H200), Grace boards'
C2C link not judged as host PCIe, the fabric state judged without its status, and the 2026
boards' snapshots judged with their link checks evaluated."""

from __future__ import annotations

import json
import os

import paths
import pytest

from gpugate.checks.boards import match_board, pattern_fits
from gpugate.checks.expect import make_context
from gpugate.checks.facts import Facts, Gpu, Pcie
from gpugate.checks.links import check_nvlink_fabric, check_pcie_link
from gpugate.cli import main
from gpugate.config import load_config

SNAPSHOTS = str(paths.SNAPSHOTS)
LINKS = ("pcie.link", "nvlink.links", "nvlink.fabric")


@pytest.mark.parametrize(
    ("name", "board"),
    [
        ("NVIDIA B200", "b200-8"),
        ("NVIDIA B300 SXM6 AC", "b300-8"),
        ("NVIDIA GB200", "gb200-nvl72-tray"),
        ("NVIDIA GB300", "gb300-nvl72-tray"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA GH200 144G HBM3e", "gh200"),
        ("NVIDIA H200", "h200-sxm-8"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm-8"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-8"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla V100-SXM2-16GB", "v100-sxm2-8"),
        ("Tesla T4", None),
        ("NVIDIA A10G", None),
    ],
)
def test_each_gpu_name_gets_its_model_familys_board(name, board):
    assert match_board([name], load_config("/dev/null").boards)[0] == board


def test_a_pattern_is_whole_words_in_order():
    assert pattern_fits("H200", "NVIDIA H200 NVL")
    assert not pattern_fits("H200", "NVIDIA GH200 480GB")
    assert pattern_fits("A100 PCIe", "NVIDIA A100 80GB PCIe")
    assert not pattern_fits("PCIe A100", "NVIDIA A100 80GB PCIe")
    assert not pattern_fits("", "NVIDIA H100")


def test_a_site_board_may_name_only_what_it_knows_and_the_longer_pattern_wins(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("boards:\n  h200-custom:\n    match: ['NVIDIA H200']\n    nvlinks_per_gpu: 4\n")
    config = load_config(str(site))
    assert config.boards["h200-custom"].pcie_gen is None
    assert match_board(["NVIDIA H200"], config.boards)[0] == "h200-custom"


def facts(*gpus: Gpu) -> Facts:
    return Facts(gpus=gpus, pci_gpu_count=len(gpus))


def test_an_unknown_board_warns_and_says_how_to_add_one():
    ctx = make_context(facts(Gpu(index=0, name="NVIDIA X900")), load_config("/dev/null"))
    found = [f for f in check_pcie_link(facts(Gpu(index=0, name="NVIDIA X900")), ctx)]
    unknown = [f for f in found if f.status == "unknown"]
    assert unknown and "NVIDIA X900" in unknown[0].message
    assert "boards:" in unknown[0].message and "gpugate profile" in unknown[0].message


def test_a_grace_boards_c2c_link_is_not_judged_as_host_pcie():
    gpu = Gpu(index=0, name="NVIDIA GH200 480GB", pcie=Pcie(gen=4, max_gen=4, width=1, max_width=1))
    f = facts(gpu)
    found = check_pcie_link(f, make_context(f, load_config("/dev/null")))
    assert [x.status for x in found] == ["ok"] and "C2C" in found[0].message


@pytest.mark.parametrize("state", ["in_progress", "not_started"])
def test_a_bad_fabric_state_fails_even_without_its_status(state):
    f = facts(Gpu(index=0, name="NVIDIA B200", fabric_state=state, fabric_status=None))
    found = check_nvlink_fabric(f, make_context(f, load_config("/dev/null")))
    assert [x.status for x in found] == ["fail"] and state in found[0].message


def test_a_completed_fabric_without_status_is_unknown_not_ok():
    f = facts(Gpu(index=0, name="NVIDIA B200", fabric_state="completed", fabric_status=None))
    found = check_nvlink_fabric(f, make_context(f, load_config("/dev/null")))
    assert "fail" not in {x.status for x in found} and found[-1].status != "ok"


def check(name: str, capsys) -> tuple[int, dict[str, set]]:
    code = main(
        ["check", "--facts", os.path.join(SNAPSHOTS, name), "--config", "/dev/null", "--json"]
    )
    statuses: dict[str, set] = {}
    for f in json.loads(capsys.readouterr().out)["findings"]:
        statuses.setdefault(f["check"], set()).add(f["status"])
    return code, statuses


@pytest.mark.parametrize("name", ["b200-healthy.yaml", "gb200-healthy.yaml", "gh200-healthy.yaml"])
def test_the_2026_boards_healthy_snapshots_pass_with_their_links_judged(capsys, name):
    code, statuses = check(name, capsys)
    assert code == 0
    for check_id in (*LINKS, "gpu.count"):
        assert statuses[check_id] == {"ok"}, (check_id, statuses[check_id])
    assert not {s for found in statuses.values() for s in found} - {"ok", "warn"}


@pytest.mark.parametrize(
    ("name", "failing"),
    [("b200-fabric-in-progress.yaml", "nvlink.fabric"), ("b200-nvlink-down.yaml", "nvlink.links")],
)
def test_the_broken_b200_snapshots_fail_their_link_check_and_judge_the_others(
    capsys, name, failing
):
    code, statuses = check(name, capsys)
    assert code == 1 and "fail" in statuses[failing]
    assert all(statuses[c] == {"ok"} for c in LINKS if c != failing)

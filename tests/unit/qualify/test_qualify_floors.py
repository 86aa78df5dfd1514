"""Which floor a qualification test is judged against, and the source it names (issue 17)."""

from __future__ import annotations

from pathlib import Path

import paths
import pytest

from gpugate.config import load_config
from gpugate.config.schema import BoardProfile
from gpugate.qualify.floors import floor_for

BOARD = BoardProfile(match=["X1"], qualify_busbw_gbps=300.0, qualify_h2d_gbps=50.0)


def test_the_site_floor_wins_over_the_board() -> None:
    assert floor_for(BOARD, "allreduce", "nccl", 120.0) == (120.0, "the site's qualify config")
    assert floor_for(BOARD, "pair", "gloo", 2.5) == (2.5, "the site's qualify config")


def test_the_board_floor_for_nccl_allreduce_and_h2d() -> None:
    assert floor_for(BOARD, "allreduce", "nccl", None, board_name="x1") == (
        300.0,
        "board x1 qualify_busbw_gbps",
    )
    assert floor_for(BOARD, "h2d", None, None) == (50.0, "the board profile qualify_h2d_gbps")


def test_no_board_floor_for_gloo_or_between_nodes() -> None:
    value, why = floor_for(BOARD, "allreduce", "gloo", None)
    assert value is None and "qualify.gloo_busbw_gbps" in why
    value, why = floor_for(BOARD, "pair", "nccl", None)
    assert value is None and "qualify.pair_busbw_gbps" in why


def test_a_board_without_a_figure_says_so() -> None:
    bare = BoardProfile(match=["X2"])
    assert floor_for(bare, "h2d", None, None, board_name="x2") == (
        None,
        "board x2 names no qualify_h2d_gbps: median only",
    )
    assert floor_for(None, "allreduce", "nccl", None)[0] is None
    assert floor_for(None, "dcgm", None, None) == (None, "dcgmi judges its own tests")


@pytest.mark.parametrize(
    ("args", "message"),
    [(("bw", "nccl", None), "unknown test 'bw'"), (("h2d", "mpi", None), "unknown backend 'mpi'"),
     (("h2d", None, -1.0), "cannot be negative")],
)  # fmt: skip
def test_bad_input_is_named(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        floor_for(BOARD, *args)


def test_a_site_file_sets_a_board_floor(tmp_path: Path) -> None:
    site = tmp_path / "gpugate.yaml"
    site.write_text("boards:\n  h200-sxm-8:\n    match: [H200]\n    qualify_busbw_gbps: 350\n")
    config = load_config(str(site))
    board = config.boards["h200-sxm-8"]
    assert floor_for(board, "allreduce", "nccl", None, board_name="h200-sxm-8") == (
        350.0,
        "board h200-sxm-8 qualify_busbw_gbps",
    )
    assert load_config("/dev/null").boards["h200-sxm-8"].qualify_busbw_gbps == 225.0


def test_the_node_expectations_carry_the_board_floors(tmp_path: Path) -> None:
    from factories import make_facts, make_gpu

    from gpugate.checks.expect import expectations

    site = tmp_path / "gpugate.yaml"
    site.write_text("boards:\n  h200-sxm-8:\n    match: [H200]\n    qualify_h2d_gbps: 50\n")
    expected = expectations(make_facts([make_gpu(name="NVIDIA H200")]), load_config(str(site)))
    assert expected.board == "h200-sxm-8"
    assert (expected.qualify_h2d_gbps, expected.qualify_busbw_gbps) == (50.0, None)


def test_with_board_auto_the_payloads_gpu_name_picks_the_board_floor() -> None:
    from gpugate.qualify.judge import _floor

    config = load_config(str(paths.CONFIG / "gpugate.yaml"))
    assert config.board == "auto"
    # The most specific pattern wins: "H200 NVL" is a PCIe card with no NVLink floor.
    assert _floor(config, "allreduce", "nccl", None, "NVIDIA H200") == (
        225.0, "board h200-sxm-8 qualify_busbw_gbps")  # fmt: skip
    assert _floor(config, "allreduce", "nccl", None, "NVIDIA H200 NVL")[0] is None
    assert _floor(config, "h2d", None, None, "NVIDIA A100-SXM4-80GB")[0] == 15.0
    # No name (gloo, or an old payload): the median alone, as before.
    assert _floor(config, "allreduce", "nccl", None, None)[0] is None


def test_every_cited_board_floor_is_below_its_links_raw_rate() -> None:
    # Half the per-direction rate (config/gpugate.yaml): NVLink 4 450, NVLink 5 900, PCIe Gen5 63.
    config = load_config(str(paths.CONFIG / "gpugate.yaml"))
    raw = {"h100-sxm-8": 450, "h200-sxm-8": 450, "b200-8": 900, "a100-sxm-8": 300}
    for name, rate in raw.items():
        assert config.boards[name].qualify_busbw_gbps == rate / 2
    assert config.boards["h100-sxm-8"].qualify_h2d_gbps < 63

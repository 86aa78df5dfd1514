"""Pairwise qualification: the rounds, and naming a slow node or a slow link (issue 17)."""

from __future__ import annotations

import itertools

import pytest

from gpugate.qualify.pairs import judge_bandwidth, judge_pairs, pair_rounds, threshold


def all_pairs(nodes: list[str], fast: float = 40.0, slow: dict | None = None) -> dict:
    """Every pair at `fast` GB/s except those in `slow` ({(a, b): value})."""
    values = {p: fast for p in itertools.combinations(nodes, 2)}
    # A slow pair may be named in either order: it replaces that pair, never adds a fifth one.
    values.update({tuple(sorted(pair)): v for pair, v in (slow or {}).items()})
    return values


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8])
def test_rounds_cover_every_pair_once_with_no_node_twice_in_a_round(count: int) -> None:
    nodes = [f"n{i}" for i in range(count)]
    rounds = pair_rounds(nodes)
    seen = [frozenset(p) for r in rounds for p in r]
    assert sorted(map(sorted, seen)) == sorted(
        map(sorted, map(frozenset, itertools.combinations(nodes, 2)))
    )
    assert len(seen) == len(set(seen))
    for r in rounds:
        members = [n for p in r for n in p]
        assert len(members) == len(set(members))
    # The circle method needs no more rounds than that: n-1 (even) or n (odd).
    assert len(rounds) == (count - 1 if count % 2 == 0 else count)


def test_rounds_of_one_node_are_empty_and_duplicates_are_refused() -> None:
    assert pair_rounds(["n1"]) == []
    with pytest.raises(ValueError, match="named twice: n1"):
        pair_rounds(["n1", "n2", "n1"])


def test_three_nodes_one_slow_names_the_node_not_its_partners() -> None:
    verdict = judge_pairs(
        all_pairs(["a", "b", "c"], slow={("a", "b"): 9.0, ("c", "a"): 11.0}), None, 0.8
    )
    assert verdict["suspects"] == ["a"]
    assert verdict["links"] == [] and verdict["undecided"] == []
    assert verdict["slow_pairs"] == [["a", "b"], ["a", "c"]]
    assert "a is slow with every partner" in verdict["text"]
    assert "b is" not in verdict["text"] and "c is" not in verdict["text"]


def test_four_nodes_one_slow_link_names_the_link_and_no_node() -> None:
    verdict = judge_pairs(all_pairs(["a", "b", "c", "d"], slow={("c", "b"): 12.0}), None, 0.8)
    assert verdict["links"] == [["b", "c"]]
    assert verdict["suspects"] == [] and verdict["undecided"] == []
    assert "the link between b and c" in verdict["text"]


def test_two_nodes_a_slow_pair_is_undecided_and_says_why() -> None:
    verdict = judge_pairs({("a", "b"): 5.0}, 20.0, 0.8)
    assert verdict["slow_pairs"] == [["a", "b"]]
    assert verdict["suspects"] == [] and verdict["links"] == []
    assert verdict["undecided"] == [["a", "b"]]
    assert "node or link cannot be told apart" in verdict["text"]


def test_all_healthy_names_nothing() -> None:
    verdict = judge_pairs(all_pairs(["a", "b", "c", "d"]), 30.0, 0.8)
    assert (verdict["slow_pairs"], verdict["suspects"], verdict["links"], verdict["undecided"]) == (
        [],
        [],
        [],
        [],
    )
    assert verdict["text"] == "every pair reaches 32.00 GB/s"


def test_a_pair_without_result_counts_as_slow() -> None:
    verdict = judge_pairs(
        all_pairs(["a", "b", "c"], slow={("a", "b"): None, ("a", "c"): None}), None, 0.8
    )
    assert verdict["suspects"] == ["a"]


def test_every_pair_below_the_floor_blames_no_single_node() -> None:
    verdict = judge_pairs(all_pairs(["a", "b", "c"]), 100.0, 0.8)
    assert verdict["suspects"] == [] and verdict["links"] == []
    assert len(verdict["undecided"]) == 3
    assert "the floor or the shared fabric" in verdict["text"]


def test_judge_bandwidth_against_the_median_when_the_floor_is_lower() -> None:
    verdicts = judge_bandwidth({"a": 100.0, "b": 98.0, "c": 60.0}, 50.0, 0.8)
    assert verdicts["a"][0] and verdicts["b"][0]
    ok, why = verdicts["c"]
    assert not ok
    assert why == "60.00 GB/s is below 0.8 x the median 98.00 GB/s = 78.40 GB/s"


def test_judge_bandwidth_against_the_floor_when_it_is_higher() -> None:
    # All alike (the median passes them all), but the board's floor fails every one.
    verdicts = judge_bandwidth({"a": 40.0, "b": 41.0}, 80.0, 0.8)
    assert [v[0] for v in verdicts.values()] == [False, False]
    assert verdicts["a"][1] == "40.00 GB/s is below the floor 80.00 GB/s"
    assert judge_bandwidth({"a": 81.0}, 80.0, 0.8)["a"] == (
        True,
        "81.00 GB/s reaches the floor 80.00 GB/s",
    )


def test_threshold_refuses_a_fraction_outside_zero_to_one() -> None:
    with pytest.raises(ValueError, match=r"within 0\.\.1, got 80"):
        threshold([1.0], None, 80)

"""Pairwise bandwidth: which node pairs run in each round, and which node or link is slow.

Every pair of nodes runs one all-reduce between the two (a round holds disjoint pairs, so the
pairs of one round run at the same time without sharing a node). A node slow with every
partner is the suspect, not its partners; a pair slow while both of its nodes are fast with
someone else names the link between them (cable, switch port, NIC); with only one partner to
compare against, a slow pair cannot tell a node from its link, and says so.
"""

from __future__ import annotations

from statistics import median

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def pair_rounds(nodes: list[str]) -> list[list[tuple[str, str]]]:
    """Round-robin rounds: every pair exactly once, no node twice in one round."""
    if len(set(nodes)) != len(nodes):
        dups = sorted({n for n in nodes if nodes.count(n) > 1})
        raise ValueError(f"pair_rounds: node(s) named twice: {', '.join(dups)}")
    # The circle method: fix the first seat, rotate the others; an odd count sits one out.
    seats: list[str | None] = list(nodes) + ([None] if len(nodes) % 2 else [])
    rounds = []
    for _ in range(len(seats) - 1):
        half = len(seats) // 2
        pairs = [(seats[i], seats[-1 - i]) for i in range(half)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return [r for r in rounds if r]


def threshold(values: list[float], floor: float | None, fraction: float) -> float:
    """The bar a value must reach: the floor, or that fraction of the median if higher."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction of the median must be within 0..1, got {fraction}")
    relative = fraction * median(values) if values else 0.0
    return max(floor or 0.0, relative)


def _bar_text(bar: float, floor: float | None, fraction: float, values: list[float]) -> str:
    if floor is not None and floor >= bar:
        return f"the floor {floor:.2f} GB/s"
    return f"{fraction:g} x the median {median(values):.2f} GB/s = {bar:.2f} GB/s"


def judge_bandwidth(
    values: dict[str, float], floor: float | None, fraction: float
) -> dict[str, tuple[bool, str]]:
    """Per node: (ok, why) of its bandwidth against max(floor, fraction * median)."""
    numbers = list(values.values())
    bar = threshold(numbers, floor, fraction)
    said = _bar_text(bar, floor, fraction, numbers)
    verdicts = {}
    for node, value in values.items():
        ok = value >= bar
        verdicts[node] = (ok, f"{value:.2f} GB/s {'reaches' if ok else 'is below'} {said}")
    return verdicts


def _key(pair: tuple[str, str]) -> list[str]:
    return sorted(pair)


def judge_pairs(
    pairs: dict[tuple[str, str], float | None], floor: float | None, fraction: float
) -> dict[str, Any]:
    """Name the slow pairs, the suspect nodes (slow with every partner, at least two) and the
    slow links (both nodes fast elsewhere); a pair with no result (None) counts as slow."""
    # The reference is each node's best pair, not the median pair: with three nodes and one
    # slow, two of the three pairs are slow and their median is the slow value itself.
    best: dict[str, float] = {}
    for pair, value in pairs.items():
        for node in pair:
            if value is not None:
                best[node] = max(best.get(node, value), value)
    bar = threshold(list(best.values()), floor, fraction)
    slow = {tuple(_key(p)) for p, v in pairs.items() if v is None or v < bar}
    partners: dict[str, list[tuple[str, ...]]] = {}
    for pair in pairs:
        for node in pair:
            partners.setdefault(node, []).append(tuple(_key(pair)))
    fast_elsewhere = {n for n, ps in partners.items() if any(p not in slow for p in ps)}
    suspects = sorted(n for n, ps in partners.items() if n not in fast_elsewhere and len(ps) >= 2)
    everyone = len(partners) >= 3 and len(suspects) == len(partners)
    if everyone:  # no healthy pair to compare with: a floor too high or a shared fabric fault
        suspects = []
    links: list[list[str]] = []
    undecided: list[list[str]] = []
    for slow_pair in sorted(slow):
        if everyone or not any(n in suspects for n in slow_pair):
            both_fine = all(n in fast_elsewhere for n in slow_pair)
            (links if both_fine and not everyone else undecided).append(list(slow_pair))
    text = _pairs_text(slow, suspects, links, undecided, everyone, bar)
    return {
        "slow_pairs": [list(p) for p in sorted(slow)],
        "suspects": suspects,
        "links": links,
        "undecided": undecided,
        "threshold_gbps": bar,
        "text": text,
    }


def _pairs_text(
    slow: set[Any],
    suspects: list[str],
    links: list[Any],
    undecided: list[Any],
    everyone: bool,
    bar: float,
) -> str:
    """One paragraph an admin reads: who is slow and what to look at."""
    if not slow:
        return f"every pair reaches {bar:.2f} GB/s"
    said = [f"{len(slow)} slow pair(s) below {bar:.2f} GB/s"]
    said += [f"{n} is slow with every partner: the suspect" for n in suspects]
    said += [f"look at the link between {a} and {b} (both fast with others)" for a, b in links]
    if everyone:
        said.append("every pair is slow: the floor or the shared fabric, not one node")
    else:
        said += [
            f"{a} and {b} are slow together and have no other partner to compare with: "
            "node or link cannot be told apart"
            for a, b in undecided
        ]
    return "; ".join(said)

"""How sure a verdict is, and what else the text could mean: `confidence` and `alternatives`.

The ranking (`rank._rank`) always names one category; these rules say whether the lines that
decided it settle the question. They read the live signals (fallout and late precursors
already set aside), the winning tier and its lines:

- ``high``: a deciding line is FATAL and specific (its signature's specificity is at least
  SPECIFIC, 55: above the table's default of 50) or is a hardware line root read itself (the
  kernel log), and no rule below lowers it.
- ``medium``: the verdict stands on weaker ground: the deciding lines are precursors only (NCCL
  WARN lines before the job died), or generic (category ``other``, or specificity under
  GENERIC, 50), or a FATAL line of another category sits one tier step below the winner
  (either could be the first; not ``other``, and not two causes that are both the cluster's),
  or an Xid of another category came first on the same GPU (an application Xid, then a
  hardware-class one), or the failing rank is ambiguous
  (the deciding lines name several ranks for a fault that happens on one rank).
- ``low``: only MINOR lines decided (a lone informational Xid, a SIGTERM notice), or two
  categories of the same tier, of different kinds, disagree (the first line wins the ranking,
  but the text cannot decide between them), or an ``other`` stands only on lines that say a
  process ended badly and not why (signatures.END_ONLY: a signal, an exit code, an MPI abort,
  a launcher's banner). `unknown` and a traceback at the end are low too (ending.py).

The hooks act on ``high`` only: the epilog's metrics count a medium or low verdict as
``uncertain``, and the requeue never takes one for an infrastructure cause.

`alternatives` lists the next categories, most likely first (highest tier, then earliest
line): each ``{"category", "tier", "evidence": [{"file", "line", "text"}, ...]}`` with up to
EVIDENCE_PER_ALTERNATIVE lines.
"""

from __future__ import annotations

from gpugate.checks.kernel_lines import read_line
from gpugate.diagnosis import signatures as S
from gpugate.diagnosis.categories import TIERS, is_infrastructure, kind
from gpugate.diagnosis.verdict import KERNEL_LOG
from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any, Protocol

    class Signal(Protocol):
        """rank.Signal, as read here (rank imports this module, so not the other way)."""

        @property
        def file(self) -> int: ...  # read-only: a frozen Record's fields are
        @property
        def line(self) -> int: ...
        @property
        def match(self) -> S.Match: ...

        @property
        def tier(self) -> int: ...


HIGH, MEDIUM, LOW = "high", "medium", "low"
LEVELS = (HIGH, MEDIUM, LOW)
# 50 is the signature table's default: a line that says "something failed", not what. A
# signature above it names a kind of failure (the NCCL WARN kinds, a CPU allocator failure);
# below it the line is generic (an exit code, "operations have failed or timed out").
SPECIFIC = 55  # a signature at least this specific names its category by itself
GENERIC = 50
ALTERNATIVES_MAX = 3
EVIDENCE_PER_ALTERNATIVE = 3
# Faults that happen on one rank: several ranks named for them leave the origin open. The
# NCCL symptoms are printed by every rank, so many ranks are expected there.
ONE_RANK_CATEGORIES = frozenset(
    {"cuda_oom", "host_oom", "gpu_xid_user_app", "illegal_memory_access"}
)


class Assessment(Record):
    """The confidence of a verdict, why, and the runners-up."""

    level: str
    why: str = ""
    alternatives: tuple[Any, ...] = ()  # of {"category", "tier", "evidence": [...]}
    undecided: tuple[Any, ...] = ()  # categories the text cannot decide between (low), winner first


def assess(
    live: Sequence[Signal],
    winners: Sequence[Signal],
    top: int,
    rank: int | None,
    names: list[str],
    sources: list[str],
) -> Assessment:
    """Confidence and alternatives from the live signals and the winning tier's lines.

    `live` and `winners` are `rank.Signal`s (file index, line, match, tier); `top` is the
    winning tier, `rank` the failing rank named (None when none), `names`/`sources` per file.
    """
    category = winners[0].match.category or "other"
    others = _by_category(s for s in live if (s.match.category or "other") != category)
    alternatives = tuple(_alternative(c, sigs, names) for c, sigs in others[:ALTERNATIVES_MAX])
    level, why, undecided = _level(winners, top, rank, others, sources)
    return Assessment(level=level, why=why, alternatives=alternatives, undecided=undecided)


def _level(
    winners: Sequence[Signal],
    top: int,
    rank: int | None,
    others: list[tuple[str, list[Signal]]],
    sources: list[str],
) -> tuple[str, str, tuple[Any, ...]]:
    """(level, why, undecided): the first rule that holds, from low to high."""
    category = winners[0].match.category or "other"
    if all(s.match.strength == S.MINOR for s in winners):
        return LOW, "only minor lines decided", ()
    rivals = [c for c, sigs in others if _tier(sigs) == top and kind(c) != kind(category)]
    if rivals:
        return LOW, f"{rivals[0]} is as likely", (category, *rivals)
    fatal = [s for s in winners if s.match.strength == S.FATAL]
    if not fatal:
        return MEDIUM, "only precursor lines decided", ()
    if category == "other" and all(s.match.signature in S.END_ONLY for s in fatal):
        return LOW, "only lines saying the run ended badly decided, none says why", ()
    best = max(s.match.specificity for s in fatal)
    trusted_hardware = kind(category) == "hardware" and any(
        sources[s.file] == KERNEL_LOG for s in fatal
    )
    if category == "other" or (best < GENERIC and not trusted_hardware):
        return MEDIUM, "a generic line decided", ()
    steps = sorted({t for t in TIERS.values() if t < top}, reverse=True)
    below = steps[0] if steps else None
    # `other` is no rival (a generic line beside a specific one adds nothing), nor are two
    # causes that are both the cluster's (an Xid 79 and Slurm's NODE_FAIL call for one action).
    close = [c for c, sigs in others if c != "other" and below is not None
             and _fatal_tier(sigs) == below
             and not (is_infrastructure(c) and is_infrastructure(category))]  # fmt: skip
    if close:
        return MEDIUM, f"{close[0]} is one tier below", (category, close[0])
    earlier = _earlier_xid(winners, others)
    if earlier:
        return MEDIUM, f"an Xid of {earlier} came first on the same GPU", (category, earlier)
    ranks = {s.match.rank for s in winners if s.match.rank is not None}
    if category in ONE_RANK_CATEGORIES and rank is None and len(ranks) > 1:
        return MEDIUM, "the failing rank is ambiguous", ()
    if best >= SPECIFIC or trusted_hardware:
        return HIGH, "a specific fatal line decided", ()
    return MEDIUM, "no specific line decided", ()


def _earlier_xid(winners: Sequence[Signal], others: list[tuple[str, list[Signal]]]) -> str | None:
    """A category whose Xid came before the winner's first Xid on the same GPU, if any.

    A hardware-class Xid right after an application Xid on one GPU (13 then 109, 31 then 45)
    is often its consequence: the order alone does not say which one is the root.
    """
    first: dict[tuple[int, str], int] = {}
    for s in winners:
        gpu = _xid_gpu(s)
        if gpu is not None:
            first[(s.file, gpu)] = min(s.line, first.get((s.file, gpu), s.line))
    for category, sigs in others if first else ():
        for s in sigs:
            gpu = _xid_gpu(s)
            if gpu is not None and s.line < first.get((s.file, gpu), -1):
                return category
    return None


def _xid_gpu(s: Signal) -> str | None:
    """The PCI address of a fatal Xid line (None for any other line)."""
    m = s.match
    if m.xid is None or m.strength != S.FATAL:
        return None
    event = read_line(m.text)
    pci: str | None = getattr(event, "pci", None) or None
    return pci


def _tier(signals: list[Signal]) -> int:
    return max(s.tier for s in signals)


def _fatal_tier(signals: list[Signal]) -> int | None:
    tiers = [s.tier for s in signals if s.match.strength == S.FATAL]
    return max(tiers) if tiers else None


def _by_category(signals: Iterable[Signal]) -> list[tuple[str, list[Signal]]]:
    """(category, its signals) for each category, highest tier then earliest line first."""
    groups: dict[str, list[Signal]] = {}
    for s in signals:
        groups.setdefault(s.match.category or "other", []).append(s)
    for sigs in groups.values():
        sigs.sort(key=lambda s: (-s.tier, s.file, s.line))
    return sorted(groups.items(), key=lambda g: (-g[1][0].tier, g[1][0].file, g[1][0].line))


def _alternative(category: str, signals: list[Signal], names: list[str]) -> dict[str, Any]:
    """One runner-up as JSON: its category, tier and first distinct lines."""
    lines: list[dict[str, Any]] = []
    seen: set[str] = set()
    for s in signals:
        if s.match.text not in seen and len(lines) < EVIDENCE_PER_ALTERNATIVE:
            seen.add(s.match.text)
            lines.append({"file": names[s.file], "line": s.line, "text": s.match.text})
    return {"category": category, "tier": signals[0].tier, "evidence": lines}


def note(a: Assessment) -> str:
    """The summary's last sentence: what the text cannot decide, or '' when it can."""
    if a.undecided:
        return f" The text cannot decide between {' and '.join(a.undecided)}."
    if a.level != HIGH:
        return f" Confidence {a.level}: {a.why}."
    return ""

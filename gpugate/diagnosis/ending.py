"""How the logs show the run ending: `no_failure` needs positive evidence (issue 43).

The ranking (rank.py) answers `no_failure` when no line is decisive. That alone is no evidence
of success: a log cut before the end, or a failure no signature names, prints nothing decisive
either. So a quiet verdict is settled here, by what the logs show at their end:
- a success line (`signatures.COMPLETED`: the job's own last words, nccl-tests' "0 OK",
  an OSU sweep to its largest size, Slurm's `COMPLETED 0:0`) and no traceback after it: `no_failure`;
- a Python traceback with no success line after it (a crash whose exception line was cut, or
  names nothing a signature knows): `other`, that line decisive, confidence low;
- neither: `unknown`, confidence low (a fragment; never read as success).
A fatal line after the success line never reaches here: the ranking decides on it.
"""

from __future__ import annotations

from gpugate.diagnosis import signatures as S
from gpugate.diagnosis.categories import EXPLAIN
from gpugate.diagnosis.rank import Collector
from gpugate.diagnosis.verdict import Diagnosis, Evidence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NO_FAILURE, UNKNOWN, OTHER = "no_failure", "unknown", "other"
LOW = "low"
QUOTE_MAX = 160  # characters of the success line quoted in the summary


class EndingCollector(Collector):
    """A Collector that also keeps, per file, the last success line and the last traceback."""

    def __init__(self, untrusted: frozenset[Any] | set[Any] = frozenset()) -> None:
        super().__init__(untrusted)
        self.success: dict[int, tuple[int, str]] = {}  # file -> (line, text)
        self.traceback: dict[int, tuple[int, str, int | None]] = {}  # file -> (line, text, rank)

    def add(self, file: int, line: int, m: S.Match) -> None:
        """Record one match, noting success lines and tracebacks on the way."""
        if m.signature in S.COMPLETED:
            self.success[file] = (line, m.text)
        elif m.signature == "python.traceback":
            self.traceback[file] = (line, m.text, m.rank)
        super().add(file, line, m)


def settle(d: Diagnosis, col: EndingCollector, names: list[str], sources: list[str]) -> Diagnosis:
    """The verdict with a quiet `no_failure` settled by how the logs end (see the module)."""
    if d.category != NO_FAILURE:
        return d
    late = late_traceback(col)
    if late is not None:
        return _traceback_end(d, late, names, sources)
    if col.success:
        return _ended_well(d, col, names)
    return d.replace(
        category=UNKNOWN,
        confidence=LOW,
        summary=EXPLAIN[UNKNOWN][0].capitalize()
        + ". Confidence low: no line says how the run ended.",
        advice=EXPLAIN[UNKNOWN][1],
    )


def late_traceback(col: EndingCollector) -> tuple[int, int, str, int | None] | None:
    """(file, line, text, rank) of a traceback no success line follows, or None.

    A file without a success line of its own counts only when no file shows one: the job's
    own success line elsewhere (stdout beside stderr) outweighs a traceback it survived.
    """
    for file, (line, text, rank) in sorted(col.traceback.items()):
        done = col.success.get(file)
        if done is None and col.success:
            continue
        if done is None or line > done[0]:
            return file, line, text, rank
    return None


def _ended_well(d: Diagnosis, col: EndingCollector, names: list[str]) -> Diagnosis:
    """`no_failure`, its summary quoting the (last) success line."""
    file, (line, text) = max(col.success.items(), key=lambda item: item[1][0])
    head = EXPLAIN[NO_FAILURE][0].capitalize() + "."
    rest = d.summary[len(head) :] if d.summary.startswith(head) else ""
    quote = text.strip()[:QUOTE_MAX]
    return d.replace(summary=f"{head[:-1]}: {names[file]} line {line}: {quote!r}.{rest}")


def _traceback_end(
    d: Diagnosis, late: tuple[int, int, str, int | None], names: list[str], sources: list[str]
) -> Diagnosis:
    """`other`, decided by a traceback that is the last word of its log (confidence low)."""
    file, line, text, rank = late
    evidence = Evidence(file=names[file], line=line, text=text, signature="python.traceback",
                        category=OTHER, source=sources[file])  # fmt: skip
    summary = (f"{EXPLAIN[OTHER][0].capitalize()}: a Python traceback with no success line "
               f"after it (line {line})" + (f"; failing rank {rank}" if rank is not None else "")
               + ". Confidence low: only a line saying the run ended badly decided.")  # fmt: skip
    ranked: dict[str, Any] = {}
    if rank is not None:
        ranked = {"failing_rank": rank, "rank_confidence": "medium",
                  "rank_reason": f"rank {rank}: its traceback is the last word of the log"}  # fmt: skip
    return d.replace(category=OTHER, confidence=LOW, summary=summary, advice=EXPLAIN[OTHER][1],
                     evidence=(evidence,), decided_by=sources[file], **ranked)  # fmt: skip

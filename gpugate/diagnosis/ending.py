"""How the logs show the run ending: `no_failure` needs positive evidence (issue 43).

The ranking (rank.py) answers `no_failure` when no line is decisive. That alone is no evidence
of success: a log cut before the end, or a failure no signature names, prints nothing decisive
either. So a quiet verdict is settled here, by what the logs show at their end:
- a success line (`signatures.COMPLETED`: the job's own last words, nccl-tests' "0 OK",
  an OSU sweep to its largest size, Slurm's `COMPLETED 0:0`) and no traceback after it: `no_failure`;
- a Python traceback with no success line after it (a crash whose exception line was cut, or
  names nothing a signature knows): `other`, that line decisive, confidence low;
- a log whose last lines are a benchmark's message-size sweep that reached OSU's default largest
  size (`sweep_end`: no word there for a key to find, so it is read from the log's tail):
  `no_failure`, confidence low;
- neither: `unknown`, confidence low (a fragment; never read as success).
A fatal line after the success line never reaches here: the ranking decides on it.
"""

from __future__ import annotations

from gpugate.diagnosis import signatures as S
from gpugate.diagnosis.categories import EXPLAIN
from gpugate.diagnosis.rank import Collector
from gpugate.diagnosis.scan import TAIL_BYTES
from gpugate.diagnosis.verdict import Diagnosis, Evidence
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NO_FAILURE, UNKNOWN, OTHER = "no_failure", "unknown", "other"
LOW = "low"
QUOTE_MAX = 160  # characters of the success line quoted in the summary
# A message-size sweep's row: the size, one figure (bandwidth or latency), OSU's `--validation`
# verdict "Pass" at most; an `srun --label` or Open MPI tag in front is allowed.
_SWEEP_ROW = lazy(
    r"^\s*(?:\d+: |\[\d+,\d+\]<std(?:out|err)>:)?\s*(\d+)\s+\d+(?:\.\d+)?(?:\s+Pass)?\s*$"
)
# OSU micro-benchmarks' default largest message, MAX_MESSAGE_SIZE (1 << 22, util/osu_util.h):
# a sweep that reached it ran through (with `-m`, it goes on past it).
SWEEP_LARGEST = 1 << 22
SWEEP_ROWS = 8  # rows of doubling sizes that make a sweep, not a stray pair of numbers


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
    for file, tail in sorted(col.tails.items()):
        row = sweep_end(tail)
        if row is not None:
            return _swept(d, names[file], row)
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


def sweep_end(tail: bytes) -> str | None:
    """The last line of `tail` when the log ends with a size sweep that reached SWEEP_LARGEST:
    at least SWEEP_ROWS table rows whose sizes double, nothing after them; else None."""
    lines = [x for x in tail.decode("utf-8", "replace").splitlines() if x.strip()]
    if len(tail) >= TAIL_BYTES and lines:
        lines = lines[1:]  # the first may be cut
    sizes: list[int] = []
    for text in reversed(lines):
        m = _SWEEP_ROW.match(text)
        if m is None:
            break
        size = int(m.group(1))
        if sizes and size * 2 != sizes[-1]:
            break
        sizes.append(size)
        if len(sizes) >= SWEEP_ROWS:
            break
    if len(sizes) < SWEEP_ROWS or sizes[0] < SWEEP_LARGEST:
        return None
    return lines[-1].strip()


def _swept(d: Diagnosis, name: str, row: str) -> Diagnosis:
    """`no_failure`, low: the log ends with a benchmark's size sweep run through."""
    head = EXPLAIN[NO_FAILURE][0].capitalize()
    summary = (f"{head}: {name} ends with a benchmark's message-size sweep run to its largest "
               f"size ({row[:QUOTE_MAX]!r}). Confidence low: a table's end, not a line saying "
               "the run ended.")  # fmt: skip
    return d.replace(confidence=LOW, summary=summary)


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

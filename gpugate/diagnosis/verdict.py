"""The verdict of a diagnosis: the category, the lines that decided it, and where each came from.

Every input has a source (`KERNEL_LOG`, `JOB_FILE`, `LOG_FILE`). Only what root read itself
is hardware evidence (docs/flow.md): a line in a job's own file that claims a hardware fault is
text the job printed, reported beside the verdict as `untrusted`, never ranked. What was read
from each input (FileScan, made by scan.py) is here too, so that scan, rank and this module
import no circle.
"""

from __future__ import annotations

from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Where an input came from. Root read the kernel log itself; a job file is the job's own output
# (stdout, NCCL debug files: the user controls every byte); a log file is one an admin handed to
# `gpugate diagnose` without saying, taken at its word (the corpus labels rely on that).
KERNEL_LOG, JOB_FILE, LOG_FILE = "kernel log", "job file", "log file"
SOURCES = (KERNEL_LOG, JOB_FILE, LOG_FILE)
TRUSTED_SOURCES = frozenset({KERNEL_LOG, LOG_FILE})


class FileScan(Record):
    """What was read from one input."""

    path: str
    bytes: int | None = None
    hit_lines: int = 0
    engine: str | None = None
    error: str | None = None
    source: str = LOG_FILE
    offset: int = 0  # where the reading started (a tail: line numbers count from there)
    stopped: str | None = None  # "byte budget" / "time budget": the rest was not read


class Evidence(Record):
    """One decisive line and where it was."""

    file: str
    line: int
    text: str
    signature: str
    category: str | None
    source: str = LOG_FILE
    xid: int | None = None  # the line's root Xid, if it names one

    def location(self) -> dict[str, Any]:
        """Where the line was and whether its source can be hardware evidence."""
        return {"file": self.file, "line": self.line, "signature": self.signature,
                "category": self.category, "source": self.source,
                "trusted": self.source in TRUSTED_SOURCES}  # fmt: skip


class Diagnosis(Record):
    """The verdict: category, root Xid, failing rank, and the lines that decided it."""

    category: str
    xid: int | None = None
    failing_rank: int | None = None
    # Why that rank (e.g. "rank 2: the only rank in torchrun's failure table"), how sure (high
    # only when the origin line itself names the one rank), other ranks another shape named, and
    # the rank's node where the log (or the job's layout, see gpugate.slurm.layout) names it.
    rank_reason: str | None = None
    rank_confidence: str | None = None
    rank_alternatives: tuple[Any, ...] = ()  # of {"rank", "reason"}
    failing_node: str | None = None
    summary: str = ""
    advice: str = ""
    evidence: tuple[Evidence, ...] = ()
    signals: dict[str, Any] = {}  # category -> matching lines
    files: tuple[FileScan, ...] = ()
    # The source of the line that decided the category (None for no_failure and unknown).
    decided_by: str | None = None
    # Lines of a job's own files that claim a hardware fault: reported, never ranked.
    untrusted: tuple[Evidence, ...] = ()
    # What the job's output says when taken at its word (set only when it claimed something).
    job_output_category: str | None = None
    job_output_xid: int | None = None
    # How sure the verdict is (confidence.LEVELS) and the next categories with their lines
    # (see gpugate/diagnosis/confidence.py). No failure: high on a clean log, else medium;
    # unknown: low (ending.py).
    confidence: str = "medium"
    alternatives: tuple[
        Any, ...
    ] = ()  # of {"category", "tier", "evidence": [{"file", "line", "text"}]}

    @property
    def trusted(self) -> bool:
        """Whether the deciding line came from a source root read (or an admin vouched for)."""
        return self.decided_by in TRUSTED_SOURCES

    def to_json(self) -> dict[str, Any]:
        """The `--json` object (evidence as plain lines, their places and sources beside them)."""
        out = {
            "category": self.category,
            "xid": self.xid,
            "failing_rank": self.failing_rank,
            "failing_node": self.failing_node,
            "rank_reason": self.rank_reason,
            "rank_confidence": self.rank_confidence,
            "rank_alternatives": [dict(a) for a in self.rank_alternatives],
            "summary": self.summary,
            "advice": self.advice,
            "decided_by": self.decided_by,
            "trusted": self.trusted,
            "confidence": self.confidence,
            "alternatives": [dict(a) for a in self.alternatives],
            "evidence": [e.text for e in self.evidence],
            "evidence_locations": [e.location() for e in self.evidence],
            "untrusted": [
                dict(e.location(), text=e.text, claim=claim_text(e)) for e in self.untrusted
            ],
            "job_output_category": self.job_output_category or self.category,
            "job_output_xid": self.job_output_xid if self.untrusted else self.xid,
            "signals": dict(self.signals),
            "files": [f.to_dict() for f in self.files],
            "bytes_scanned": sum(f.bytes or 0 for f in self.files),
        }
        errors = [f"{f.path}: {f.error}" for f in self.files if f.error]
        if errors:
            out["errors"] = errors
        return out


def claim_text(e: Evidence) -> str:
    """What a claim is, in the words the reports use."""
    what = f"Xid {e.xid}" if e.xid is not None else (e.category or "a hardware fault")
    return f"job output claiming {what} (not trusted)"

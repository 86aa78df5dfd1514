"""What the epilog's as-user reader child answers (hooks/collect._read_and_diagnose, run by
userfiles.as_user): the tails of the job's files, what could not be read, and the diagnosis.

The answer crosses a process as JSON written by a child running as the job's user: it is read
into these records (`from_json` checks every key's type) before root uses any of it. The
diagnosis is the `gpugate diagnose --json` object (docs/interfaces.md) plus the time the
decisive lines say the node failed; `diagnosis.json` in the bundle is its `to_json()`.
"""

from __future__ import annotations

from gpugate.jsonrecord import JsonRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar


class JobDiagnosis(JsonRecord):
    """The diagnosis of the job's files and root's kernel lines (the diagnose --json object)."""

    category: str | None = None
    xid: int | None = None
    failing_rank: int | None = None
    failing_node: str | None = None
    rank_reason: str | None = None
    rank_confidence: str | None = None
    rank_alternatives: list[Any] = []
    summary: str | None = None
    advice: str | None = None
    decided_by: str | None = None
    trusted: bool = False
    confidence: str | None = None
    alternatives: list[Any] = []
    evidence: list[str] = []
    evidence_locations: list[Any] = []
    untrusted: list[dict[str, Any]] = []
    job_output_category: str | None = None
    job_output_xid: int | None = None
    signals: dict[str, Any] = {}
    files: list[Any] = []
    bytes_scanned: int = 0
    errors: list[str] | None = None
    first_failure_at: str | None = None

    _omit = frozenset({"errors"})
    _doc: ClassVar[dict[str, str]] = {
        "first_failure_at": "UTC: when the decisive lines say the node failed (null without a "
        "full date)",
    }  # the others: `gpugate diagnose --json` (docs/interfaces.md)


class ChildDiagnosis(JsonRecord):
    """The reader child's answer."""

    tails: dict[str, str] = {}
    errors: list[str] = []
    diagnosis: JobDiagnosis = JobDiagnosis()

    _doc: ClassVar[dict[str, str]] = {
        "tails": "path -> the tail of that file (this run's part)",
        "errors": "the files that could not be read, and why",
        "diagnosis": "the diagnosis (JobDiagnosis)",
    }

"""The controller's records (store/controller_view.py): a node's decision record, a line of the
job's digest, and the digest; what the node epilog writes and EpilogSlurmctld reads.

Every release wrote `state` in a record; its other keys are written only when known (a running
record has its deadline, a done one its summary's decision fields): each absent key reads as
null. A digest names its job, run, count and nodes; each node's entry only the fields that are
set. `docs/interfaces.md` shows these tables (`field_table`).
"""

from __future__ import annotations

from gpugate.clock import parse_utc
from gpugate.jsonrecord import JsonRecord
from gpugate.store.summary import CHECKPOINT_KEYS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

RUNNING, DONE = "running", "done"
# What the controller decides on (gpugate/gate/requeue.py cause, suspicion.vote, stale_note),
# copied from the bundle's summary. No log line, no path of the user's, no kernel line.
SUMMARY_FIELDS = (
    "job_id", "node", "restart", "category", "category_trusted", "confidence", "xid",
    "hardware_fault", "first_hardware_error_at", "first_failure_at", "checkpoint_age_s",
    "checkpoint_stale", "checkpoint_message", "flightrec_dumps", "job_start", "job_end",
    "failing_node",  # the failing rank's node (the suspect vote points at it when known)
    "kind", "drill",  # a drill's run: the controller marks what it writes DRILL <id> too
)  # fmt: skip
# The digest: what each node's entry keeps (the decision fields, no flight recorder, no
# checkpoint text).
DIGEST_FIELDS = (
    "category", "category_trusted", "confidence", "hardware_fault", "first_hardware_error_at",
    "first_failure_at", "failing_node", "kind", "drill",
)  # fmt: skip
# With a bundle, a done record has every summary field, null where the summary had null.
_WITH_BUNDLE = frozenset(SUMMARY_FIELDS) - CHECKPOINT_KEYS


class ControllerRecord(JsonRecord):
    """One node's record of one run: running (with its deadline), then done (its decision)."""

    state: str
    deadline: float | None = None
    job_id: str | None = None
    node: str | None = None
    restart: int | None = None
    category: str | None = None
    category_trusted: bool | None = None
    confidence: str | None = None
    xid: int | None = None
    hardware_fault: bool | None = None
    first_hardware_error_at: str | None = None
    first_failure_at: str | None = None
    checkpoint_age_s: float | None = None
    checkpoint_stale: bool | None = None
    checkpoint_message: str | None = None
    flightrec_dumps: int | None = None
    job_start: str | None = None
    job_end: str | None = None
    failing_node: str | None = None
    kind: str | None = None
    drill: str | None = None
    bundle: bool | None = None
    why: str | None = None
    error: str | None = None
    flightrec: dict[str, Any] | None = None
    run: int | None = None
    sluid: str | None = None
    written_at: float | None = None
    partial: bool | None = None

    _doc: ClassVar[dict[str, str]] = {
        "state": "`running` (the epilog started) or `done`",
        "deadline": "a running record: when its epilog ends at the latest (epoch)",
        "job_id": "the summary's (a done record with a bundle; so are the keys down to `drill`)",
        "node": "the node (always, added on write)",
        "restart": "the run",
        "category": "the failure category (also without a bundle)",
        "category_trusted": "decided by a line root read itself",
        "confidence": "the diagnosis's (also without a bundle)",
        "xid": "the deciding Xid",
        "hardware_fault": "the node's own evidence shows one (also without a bundle)",
        "first_hardware_error_at": "UTC",
        "first_failure_at": "UTC",
        "checkpoint_age_s": "only for a job with `gpugate:ckpt=`",
        "checkpoint_stale": "as above",
        "checkpoint_message": "as above, the checkpoint directory not named",
        "flightrec_dumps": "how many dumps were read",
        "job_start": "UTC",
        "job_end": "UTC",
        "failing_node": "the failing rank's node",
        "kind": "`job` or `drill`",
        "drill": "the drill's id",
        "bundle": "a done record: whether a bundle was written",
        "why": "without a bundle: why the end was abnormal",
        "error": "the epilog did not finish",
        "flightrec": "the flight recorder's compact records and refusals",
        "run": "the run (always, added on write)",
        "sluid": "the run's SLUID where Slurm gave one (`SLURM_JOB_SLUID`): the controller "
        "takes no record of another SLUID for this run's",
        "written_at": "epoch (always, added on write)",
        "partial": "never written: the controller's stand-in for a record the digest spoke for",
    }

    def _omitted(self) -> set[str]:
        # Keys written only when known; with a bundle, every field the summary had.
        keep = _WITH_BUNDLE if self.bundle is True else frozenset()
        return {f for f in self._fields if getattr(self, f) is None and f not in keep}


class DigestEntry(JsonRecord):
    """A node's line in the job's digest: its decision fields that are set, nothing else."""

    category: str | None = None
    category_trusted: bool | None = None
    confidence: str | None = None
    hardware_fault: bool | None = None
    first_hardware_error_at: str | None = None
    first_failure_at: str | None = None
    failing_node: str | None = None
    kind: str | None = None
    drill: str | None = None

    _doc: ClassVar[dict[str, str]] = {
        f: "the done record's, when set (not null, false or empty)" for f in DIGEST_FIELDS
    }

    @classmethod
    def of(cls, record: ControllerRecord) -> DigestEntry:
        """A done record's line: its decision fields that are set."""
        return cls(**{k: getattr(record, k) for k in DIGEST_FIELDS})

    def _omitted(self) -> set[str]:
        return {f for f in self._fields if f == "extra" or getattr(self, f) in (None, False, "")}


class Digest(JsonRecord):
    """`@digest-r<run>.json`: the done nodes' entries of one run of a job."""

    job_id: str
    run: int
    sluid: str | None = None
    done: int
    nodes: dict[str, DigestEntry]

    _omit = frozenset({"sluid"})  # only where Slurm gave one
    _doc: ClassVar[dict[str, str]] = {
        "job_id": "the job",
        "run": "its restart count",
        "sluid": "the run's SLUID, where Slurm gave one (a digest of another is not this run's)",
        "done": "how many nodes it names",
        "nodes": "node -> its entry (DigestEntry)",
    }


def suspect_node(summaries: list[ControllerRecord]) -> str | None:
    """The node whose evidence shows the first hardware error (earliest time), if any.

    In a multi-node job every rank times out; the node that failed first is the cause.
    """
    hardware = [s for s in summaries if s.hardware_fault]
    if not hardware:
        return None
    hardware.sort(key=lambda s: (s.first_hardware_error_at or "~", s.node or ""))
    return hardware[0].node


def first_failure(summaries: list[ControllerRecord], node: str) -> float | None:
    """When `node`'s own record says it failed (epoch), or None."""
    own = (parse_utc(s.first_failure_at) for s in summaries if s.node == node)
    return next((t for t in own if t is not None), None)


def stale_note(summaries: list[ControllerRecord]) -> str | None:
    """The first stale checkpoint's line of the run's records (a requeued job's AdminComment says it), or None."""
    return next((s.checkpoint_message for s in summaries
                 if s.checkpoint_stale is True and s.checkpoint_message), None)  # fmt: skip

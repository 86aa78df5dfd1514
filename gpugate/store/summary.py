"""A bundle's `summary.json`: the record the epilog (EvidenceSummary) or a qualification
(QualifySummary) writes, and every reader gets (store/evidence.read_summary).

Every release since the first bundle (2026-11-29, d4a4ed4) wrote `job_id` and `node` (a
qualification: `job` and `node`); every other key came later or may be absent from a partial
summary, and reads as its default. `docs/interfaces.md` shows these tables (`field_table`).
"""

from __future__ import annotations

from gpugate.jsonrecord import JsonRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

# What a bundle is of (its summary's `kind`): a job's run (the epilog), a qualification
# (gpugate qualify, filed under its job's id) or a job's run that ended under a fault drill.
KINDS = ("job", "qualify", "drill")
CHECKPOINT_KEYS = frozenset({"checkpoint_age_s", "checkpoint_stale", "checkpoint_message"})


class SummaryJob(JsonRecord):
    """A summary's `job`: what Slurm said of the job at its end (`scontrol show job`), or, when
    Slurm could not say, the environment's word and `slurm_error`. The job's comment is read
    (its `gpugate:ckpt=`) but never written: it is the user's text."""

    job_id: str | None = None
    user: str | None = None
    uid: int | None = None
    gid: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    batch_host: str | None = None
    nodes: list[str] | None = None
    state: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    restarts: int | None = None
    work_dir: str | None = None
    comment: str | None = None
    start_time: int | None = None
    end_time: int | None = None
    slurm_error: str | None = None

    _doc: ClassVar[dict[str, str]] = {
        "job_id": "the Slurm job id",
        "user": "the job's user",
        "uid": "its uid",
        "gid": "its gid",
        "stdout": "the job's output file (null: none, or /dev/null)",
        "stderr": "its error file",
        "batch_host": "the node that ran the batch script",
        "nodes": "the job's nodes, expanded",
        "state": "Slurm's job state at the end",
        "exit_code": "the job's exit code",
        "exit_signal": "the signal that ended it (0: none)",
        "restarts": "how often Slurm restarted it",
        "work_dir": "its working directory",
        "comment": "never written (the user's text)",
        "start_time": "this run's start (epoch)",
        "end_time": "its end (epoch)",
        "slurm_error": "why Slurm could not say (then only the environment's fields and stdout)",
    }
    _SLURMS = ("stderr", "batch_host", "nodes", "state", "exit_code", "exit_signal", "restarts",
               "work_dir", "start_time", "end_time")  # fmt: skip

    def _omitted(self) -> set[str]:
        # Slurm's fields are written together, or none of them when Slurm could not say.
        if self.slurm_error is not None:
            return {"comment", *self._SLURMS}
        return {"comment", "slurm_error"}


class CheckpointAtEnd(JsonRecord):
    """A summary's `checkpoint`: the job's newest complete checkpoint at its end, as the
    epilog measured it (gpugate/checkpoints/freshness.py), floats to the millisecond."""

    ckpt_dir: str
    max_age_s: float
    path: str | None = None
    mtime: float | None = None
    age_s: float | None = None
    at_risk_s: float | None = None
    gpu_hours: float | None = None
    stale: bool = False
    error: str | None = None
    at: str | None = None

    _doc: ClassVar[dict[str, str]] = {
        "ckpt_dir": "the directory the job declared (`gpugate:ckpt=`)",
        "max_age_s": "the policy: `checkpoints.max_age_s`",
        "path": "the newest complete checkpoint (null: none)",
        "mtime": "its time: its newest file's mtime (epoch)",
        "age_s": "the job's end minus that time",
        "at_risk_s": "the end minus the later of that time and the run's start",
        "gpu_hours": "the work at risk, in GPU-hours",
        "stale": "older than the policy",
        "error": "why it could not be measured",
        "at": "`mtime` in UTC",
    }


class EvidenceSummary(JsonRecord):
    """A job's run on one node, as its epilog saw it (kind `job` or `drill`)."""

    kind: str | None = None
    drill: str | None = None
    job_id: str
    node: str | None
    restart: int = 0
    sluid: str | None = None
    user: str | None = None
    why: str | None = None
    exit_code2: str | None = None
    gpus: list[int] | None = None
    node_gpus: int | None = None
    category: str | None = None
    category_source: str | None = None
    category_trusted: bool = False
    confidence: str | None = None
    xid: int | None = None
    failing_rank: int | None = None
    failing_node: str | None = None
    rank_reason: str | None = None
    rank_confidence: str | None = None
    summary_text: str | None = None
    job_output_category: str | None = None
    job_output_xid: int | None = None
    untrusted_claims: list[Any] = []
    hardware_fault: bool = False
    hardware_findings: list[str] = []
    first_hardware_error_at: str | None = None
    first_failure_at: str | None = None
    suspected_node: str | None = None
    counter_changes: list[str] = []
    action: str | None = None
    drain_reason: str | None = None
    job: SummaryJob | None = None
    read_errors: list[str] = []
    kernel_log_lost: str | None = None
    collected_at: str | None = None
    facts_time: str | None = None
    job_start: str | None = None
    job_end: str | None = None
    faults_outside_job: list[str] = []
    checkpoint_age_s: float | None = None
    checkpoint_stale: bool | None = None
    checkpoint_message: str | None = None
    checkpoint: CheckpointAtEnd | None = None
    flightrec_dumps: int = 0
    bundle: str | None = None
    files: list[str] = []

    _omit = frozenset({"checkpoint"} | CHECKPOINT_KEYS)
    _doc: ClassVar[dict[str, str]] = {
        "kind": "`job`, or `drill` when the run ended under a fault drill's overlay; absent "
        "before kinds (read by `bundle_kind`)",
        "drill": "the drill's id (kind `drill`), else null",
        "job_id": "the Slurm job id",
        "node": "the node's Slurm name",
        "restart": "the job's restart count (the bundle is `<node>-r<restart>`)",
        "sluid": "`SLURM_JOB_SLUID`, this run's unique id (Slurm 25.11 on; a requeue gets a new "
        "one); absent where Slurm gave none",
        "user": "the job's user",
        "why": "why the end was abnormal",
        "exit_code2": "`SLURM_JOB_EXIT_CODE2` (`exit:signal`)",
        "gpus": "the job's GPUs here (`SLURM_JOB_GPUS`); null: not known",
        "node_gpus": "the node's GPU count",
        "category": "the diagnosis's failure category; never `no_failure` (nor `unknown`) for a "
        "job Slurm says failed: `other` when its logs name no cause",
        "category_source": "the source of the deciding line",
        "category_trusted": "the deciding line is root's own (kernel log)",
        "confidence": "`high`/`medium`/`low`; absent before it existed (the requeue then "
        "takes the category as high)",
        "xid": "the deciding Xid",
        "failing_rank": "the failing rank the log names",
        "failing_node": "the log's word, else the job's node when it had one",
        "rank_reason": "why that rank",
        "rank_confidence": "`high` or `medium`; null without a rank",
        "summary_text": "the diagnosis in one line",
        "job_output_category": "what the job's own output claims (never trusted)",
        "job_output_xid": "the Xid the job's output claims",
        "untrusted_claims": "the claims of the job's output, set aside",
        "hardware_fault": "the node's own evidence shows one, new since the job's prolog, on "
        "the job's GPUs or node-wide",
        "hardware_findings": "those faults' messages",
        "first_hardware_error_at": "UTC time of the first fresh kernel line of a fault",
        "first_failure_at": "UTC time the decisive lines say this node failed",
        "suspected_node": "this node when it has a hardware fault",
        "counter_changes": "counter changes since the prolog, one line each",
        "action": "what the epilog did (`drained`, `none`, ...)",
        "drain_reason": "the drain reason it wrote",
        "job": "the job's record, without its comment (SummaryJob)",
        "read_errors": "the job's files that could not be read",
        "kernel_log_lost": "kernel records lost unread since the prolog",
        "collected_at": "when the epilog collected (UTC)",
        "facts_time": "the facts' own `collected_at`",
        "job_start": "this run's start (UTC)",
        "job_end": "this run's end (UTC)",
        "faults_outside_job": "new faults on GPUs outside the job's allocation",
        "checkpoint_age_s": "the newest complete checkpoint's age at the end (only for a job "
        "with `gpugate:ckpt=`)",
        "checkpoint_stale": "older than `checkpoints.max_age_s` (as above)",
        "checkpoint_message": "the admin's line about it (as above)",
        "checkpoint": "where and what was measured (as above; CheckpointAtEnd)",
        "flightrec_dumps": "how many flight-recorder dumps were read",
        "bundle": "the bundle's directory (added on write)",
        "files": "the bundle's members (added on write)",
    }

    def _omitted(self) -> set[str]:
        # The checkpoint's keys are written together, only for a job that declared one.
        omit = set(self._omit) if self.checkpoint is None else set()
        # sluid only where Slurm gave one (25.11 on): a bundle without it is written as before.
        omit |= {"sluid"} if self.sluid is None else set()
        return omit | {"job"} if self.job is None else omit


class QualifySummary(JsonRecord):
    """A qualification's verdict on one node (kind `qualify`, filed under its job's id)."""

    job: str
    node: str
    kind: str | None = None
    run_id: str | None = None
    level: int | None = None
    tests_run: list[str] = []
    passed: bool = False
    why: Any = None
    tests: list[Any] = []
    job_ids: list[str] = []
    action: str | None = None
    reservation: str | None = None
    user: str | None = None
    when: float | None = None
    trigger: str | None = None
    outcome: str | None = None
    hardware_fault: bool = False
    fault_kind: str | None = None
    failure: str | None = None
    bundle: str | None = None
    files: list[str] = []

    _doc: ClassVar[dict[str, str]] = {
        "job": "the qualification job's id (the bundle's directory)",
        "node": "the node qualified",
        "kind": "`qualify`",
        "run_id": "the qualification run",
        "level": "its level",
        "tests_run": "the tests asked",
        "passed": "every test passed",
        "why": "why not",
        "tests": "each test's result",
        "job_ids": "the qualification's jobs",
        "action": "what followed (resumed, drained, ...)",
        "reservation": "the reservation it ran in",
        "user": "`root`",
        "when": "epoch seconds",
        "trigger": "what asked for it; empty for an admin",
        "outcome": "`passed` / `failed` / `not_qualified`",
        "hardware_fault": "true only on hardware evidence (DCGM's hardware verdict, a "
        "bandwidth below its bar)",
        "fault_kind": "`hardware`, `software`, `config` or `error`",
        "failure": "the first failing test and its detail",
        "bundle": "the bundle's directory (added on write)",
        "files": "the bundle's members (added on write)",
    }


def bundle_kind(summary: EvidenceSummary | QualifySummary | dict[str, Any]) -> str:
    """job / qualify / drill: the summary's `kind`; a bundle written before kinds: job, or
    qualify when it has a qualification's fields (run_id, tests_run)."""
    if isinstance(summary, QualifySummary):
        return "qualify"
    if isinstance(summary, EvidenceSummary):
        kind, drill, qualify = summary.kind, summary.drill, False
    else:
        kind, drill = summary.get("kind"), summary.get("drill")
        qualify = "run_id" in summary and "tests_run" in summary
    if kind in KINDS:
        return str(kind)
    if qualify:
        return "qualify"
    return "drill" if isinstance(drill, str) and drill else "job"


def summary_from_json(obj: object, where: str = "summary.json") -> EvidenceSummary | QualifySummary:
    """The summary's record (a qualification's by its kind or fields); ValueError when invalid."""
    if isinstance(obj, dict) and bundle_kind(obj) == "qualify":
        return QualifySummary.from_json(obj, where)
    return EvidenceSummary.from_json(obj, where)

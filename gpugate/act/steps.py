"""The steps a decision returns: what a hook will do to the world, as plain data.

A hook gathers, checks and decides; its decision is a plan (a tuple of these steps), and
gpugate/act/execute.py carries it out. A step only says what to do: no Slurm, no file, no
clock here, so a plan can be built, compared in a test and printed by `--dry-run`.

`when` ties a step to the plan's drain: "" runs always, DRAINED only once this plan's Drain
took the node (and no Undo gave it back), NOT_HELD unless the drain budget held the drain back
(a refusal then would only make Slurm drain the node itself, "Prolog error"), HELD only when it
did (counted before the drain, or undone beyond the budget after it). LIFTED and NOT_LIFTED tie
a step to the plan's Lift the same way: whether the resume went through or was refused.
"""

from __future__ import annotations

from gpugate import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.checks.facts import Gpu
    from gpugate.checks.findings import Finding
    from gpugate.gate.requeue import JobEnd, RequeueDecision
    from gpugate.slurm.records import NodeInfo
    from gpugate.store.healing import Healing

ALWAYS = ""
DRAINED = "drained"
NOT_HELD = "not_held"
HELD = "held"
LIFTED = "lifted"
NOT_LIFTED = "not_lifted"


class Step(record.Record):
    """One thing to do; `when` says on what it depends (ALWAYS, DRAINED, NOT_HELD)."""

    KIND = "step"  # the step's kind in reports: drain, undo, refuse, requeue, isolate, note, record
    when: str = ALWAYS

    def describe(self) -> str:
        """The step in a few words, for the report and `--dry-run`."""
        return self.KIND


class Drain(Step):
    """Drain `node` with gpugate's `reason` for `check`, within the drain budget (counted
    first); an admin's drain is never replaced (SlurmControl.drain)."""

    KIND = "drain"
    node: str
    check: str
    reason: str

    def describe(self) -> str:
        return f"drain {self.node}: {self.reason}"


class Undo(Step):
    """Once concurrent drains have landed, undo this plan's drain if it ranks beyond the budget."""

    KIND = "undo"
    node: str
    check: str
    when: str = DRAINED

    def describe(self) -> str:
        return f"undo the drain of {self.node} if beyond the budget"


class Isolate(Step):
    """After gpugate drained `node`: take only the faulty GPU(s) out (`isolate.unit: gpu`)."""

    KIND = "isolate"
    node: str
    failing: tuple[Finding, ...] = ()
    gpus: tuple[Gpu, ...] | None = None
    boot_id: str | None = None
    when: str = DRAINED

    def describe(self) -> str:
        return f"isolate the faulty GPU(s) of {self.node} (isolate.unit: gpu)"


class Lift(Step):
    """Resume gpugate's drain of the node in `info` (Slurm's record, as the decision read it)
    through `gpugate resume`'s checked and audited path (admin.resume.check_then_resume: the
    node's checks again, the qualification, the audit log, as `who`); with `put_back`, put its
    isolated GPU(s) back first (restore_isolated). The resume may be refused (the checks fail
    now): what follows says `when` LIFTED or NOT_LIFTED."""

    KIND = "lift"
    info: NodeInfo
    why: str
    who: str = "gpugate health"
    put_back: bool = False

    def describe(self) -> str:
        what = "put back the isolated GPU(s) of" if self.put_back else "resume"
        return f"{what} {self.info.name} (checked, audited): {self.why}"


class Attempt(record.Record):
    """What became of a Lift, or of `gpugate resume`: done or refused, why, the check result
    and the failing messages (admin/resume.py makes it; here, below both, so the executor
    reports it without importing the admin)."""

    resumed: bool
    why: str  # what was wrong when refused, else empty
    result: str | None = None  # "<status> (<where the facts came from>)" once checks ran
    failing: tuple[str, ...] = ()  # messages of the failing findings (printed before a refusal)


class Refuse(Step):
    """Refuse the job on this node: a note for its epilog (the job never ran here); the
    prolog's non-zero exit, which makes Slurm requeue it, follows from this step."""

    KIND = "refuse"
    job_id: str
    reason: str
    when: str = NOT_HELD

    def describe(self) -> str:
        return f"refuse job {self.job_id}"


class Requeue(Step):
    """Requeue `job_id` (scontrol requeue)."""

    KIND = "requeue"
    job_id: str

    def describe(self) -> str:
        return f"scontrol requeue {self.job_id}"


class Exclude(Step):
    """Keep a requeued job off `nodes` (its own ExcNodeList; a node it asks for by name, -w,
    is left alone by the adapter: the job would wait for good)."""

    KIND = "requeue"
    job_id: str
    nodes: tuple[str, ...]

    def describe(self) -> str:
        return f"exclude {','.join(self.nodes)}"


class StartNow(Step):
    """Clear a requeued job's +120 s BeginTime once it is pending (a detached child waits)."""

    KIND = "requeue"
    job_id: str

    def describe(self) -> str:
        return "start now (once pending)"


class Note(Step):
    """A comment for people: a job's AdminComment (`target` "job", replaced, or "job+" added
    to what is there) or a node's Comment ("node")."""

    KIND = "note"
    target: str  # job / job+ / node
    name: str
    text: str
    label: str = ""  # how the report names it ("checkpoint age comment"); "" says the target

    def describe(self) -> str:
        if self.label:
            return self.label
        return "node comment" if self.target == "node" else "admin comment"


class NoteBeside(Step):
    """Why a finished job was not requeued, in a note beside its output, written as its user
    (Slurm takes no AdminComment on a finished job)."""

    KIND = "note"
    job: JobEnd
    decision: RequeueDecision

    def describe(self) -> str:
        return "note beside the job's output"


class TellHeld(Step):
    """Tell people the drain budget held the drain of `node` back: the node's Comment (what
    gpugate would have done, `reasons.budget_comment`), the loud `DRAIN BUDGET EXCEEDED` line
    in gpugate's log and the `budget_exceeded` event. Like RecordHeld, due only once the
    Drain (or the Undo) found the drain held (`when` HELD); the reason wanted and why it was
    held are the drain's outcome's. A dry run says it would, and writes nothing."""

    KIND = "note"
    node: str
    when: str = HELD

    def describe(self) -> str:
        return (
            f"say the held drain of {self.node} (node comment, log line, event) "
            "if the budget holds it back"
        )


class Record(Step):  # the step kind named "record" (gpugate.record.Record is the base of all)
    """Bookkeeping: a line in a store (what the subclasses say). Never changes a decision."""

    KIND = "record"


class RecordDrain(Record):
    """The drain in the history (`gpugate nodes`, the RMA and false-drain counts)."""

    node: str
    reason: str
    check: str
    hook: str
    boot_id: str | None = None  # repair evidence: a lift after a new boot followed a reboot
    job: str | None = None
    category: str | None = None
    xid: int | None = None
    bundle: str | None = None
    gpu: str | None = None  # the failing GPU's serial (else UUID): its repeats count to its RMA

    def describe(self) -> str:
        return f"history: drain of {self.node}"


class RecordHeld(Record):
    """The drain the budget held back, in the history's held entries (what `gpugate nodes`,
    report, evidence and resume show as "would drain (budget)").

    The budget is counted when the Drain runs (and again when the Undo settles), so whether
    a drain is held is known only then: the plan says "if held, record it" (`when` HELD) and
    names the node; the reason wanted and why it was held are the drain's outcome's, handed
    to this step by the executor. A dry run counts nothing: it says it would record one if
    the budget holds the drain back, and writes nothing.
    """

    node: str
    when: str = HELD

    def describe(self) -> str:
        return f"record the held drain of {self.node} if the budget holds it back"


class RecordHealing(Record):
    """The health check's entry for gpugate's drain of a node (store/healing.py): the check,
    its fault class, since when, the boot then, the passing runs counted since."""

    entry: Healing

    def describe(self) -> str:
        e = self.entry
        return f"healing: {e.node} ({e.check}, {e.fault}), {e.passes} passing run(s)"


class ForgetHealing(Record):
    """The node's healing entry dropped (its drain lifted, or no longer gpugate's)."""

    node: str

    def describe(self) -> str:
        return f"healing: forget {self.node}"


class RecordUnknownXids(Record):
    """Xids outside NVIDIA's catalog, in the history `gpugate nodes` reads (they never drain)."""

    node: str
    xids: tuple[int, ...]
    hook: str
    job: str | None = None

    def describe(self) -> str:
        return f"history: unknown Xids {', '.join(map(str, self.xids))}"


class RecordMetrics(Record):
    """The run in the metrics textfile (`admin.metrics_file`)."""

    node: str | None
    hook: str
    run: dict[str, Any] = {}

    def describe(self) -> str:
        return "metrics"


class RecordEvent(Record):
    """The hook's line in events.jsonl (under `directory`, the state or controller directory)."""

    directory: str
    hook: str
    fields: dict[str, Any] = {}

    def describe(self) -> str:
        return "event"


class Say(Record):
    """One line for the daemon's log (slurmd's, slurmctld's): what was decided and done."""

    text: str

    def describe(self) -> str:
        return "log line"


Plan = tuple[Step, ...]

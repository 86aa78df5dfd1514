"""The history's lines (store/history.py, store/held.py): one record per JSON line.

Every release wrote `node` and `when` (epoch seconds) on every line; the other keys came with
their kind of line or later, and an absent one reads as its default. `docs/interfaces.md`
shows these tables (`field_table`).
"""

from __future__ import annotations

from gpugate.jsonrecord import JsonRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

_COMMON = {
    "node": "the node's Slurm name",
    "when": "epoch seconds",
    "at": "the same time, UTC ISO",
}


class NodeEntry(JsonRecord):
    """A history line: of one node, at one time."""

    node: str
    when: float
    at: str | None = None


class DrainEntry(NodeEntry):
    """`drains.jsonl`: a drain gpugate set."""

    check: str | None = None
    reason: str | None = None
    category: str | None = None
    xid: int | None = None
    bundle: str | None = None
    job: str | None = None
    hook: str | None = None
    boot_id: str | None = None
    drill: str | None = None
    gpu: str | None = None

    _omit = frozenset({"drill", "gpu"})
    _doc: ClassVar[dict[str, str]] = {
        **_COMMON,
        "check": "the check id (the reason's)",
        "reason": "the drain reason",
        "category": "the bundle's failure category (an epilog's drain)",
        "xid": "the deciding Xid",
        "bundle": "the evidence bundle's directory",
        "job": "the job whose hook drained",
        "hook": "`prolog`, `epilog`, `health`, `qualify`",
        "boot_id": "the node's boot when drained (a lift after a new boot followed a reboot)",
        "drill": "a fault drill's id: its drain counts toward no RMA, repeat or false drain "
        "(written only for a drill's)",
        "gpu": "the failing GPU the drain names: its serial, else its UUID (written when known; "
        "the same GPU failing again counts toward its RMA)",
    }


class AuditEntry(NodeEntry):
    """`audit.jsonl`: a resume, a refused one, or a repair (`gpugate resume`, healing)."""

    who: str | None = None
    why: str | None = None
    result: Any = None
    forced: bool = False
    resumed: bool = True
    reason: str | None = None
    boot_id: str | None = None
    repair: str | None = None
    qualification: dict[str, Any] | None = None

    _omit = frozenset({"boot_id", "repair", "qualification"})
    _doc: ClassVar[dict[str, str]] = {
        **_COMMON,
        "who": "the admin (the sudo caller)",
        "why": "the admin's words",
        "result": "the checks' result before the resume",
        "forced": "`--force`",
        "resumed": "false: refused, or a repair noted",
        "reason": "the drain reason the node had",
        "boot_id": "the node's boot when lifted (when known)",
        "repair": "a repair done on the drained node (`gpu reset`; when done)",
        "qualification": "the qualification the lift rests on (when one did)",
    }


class HeldEntry(NodeEntry):
    """`held.jsonl`: a drain the budget held back."""

    check: str | None = None
    reason: str
    why: str | None = None

    _doc: ClassVar[dict[str, str]] = {
        **_COMMON,
        "check": "the check id",
        "reason": "the drain reason gpugate wanted",
        "why": "why the budget refused it",
    }


class UnknownXidsEntry(NodeEntry):
    """`unknown-xids.jsonl`: Xids outside NVIDIA's catalog that one hook run saw."""

    xids: list[int]
    job: str | None = None
    hook: str | None = None

    _doc: ClassVar[dict[str, str]] = {
        **_COMMON,
        "xids": "the codes (sorted, at most 64)",
        "job": "the job whose hook saw them",
        "hook": "the hook",
    }


# The steps, in the order a repair goes (gpugate/gate/ladder.py decides most).
DRAIN = "drain"  # gpugate drained the node (the check, the reason, the bundle)
HELD = "held"  # the drain budget held gpugate's drain back
RESET = "reset"  # nvidia-smi -r on the failing GPUs
RECHECK = "recheck"  # the checklist after a reset or a reboot
REBOOT = "reboot"  # scontrol reboot ASAP nextstate=DOWN asked of Slurm
WAIT = "wait"  # a step waits for the node's jobs to end (job-safe: IDLE+DRAIN only)
QUALIFY = "qualify"  # a qualification started, passed or failed
RESUME = "resume"  # the node went back in service
REFUSED = "refused"  # a resume that did not happen, and why
RMA = "rma"  # the same GPU or check failed again: replace the part; stays drained
ADMIN = "admin"  # a person's act on gpugate's drain (a manual resume, a drain of theirs)
LEDGER_STEPS = (
    DRAIN,
    HELD,
    RESET,
    RECHECK,
    REBOOT,
    WAIT,
    QUALIFY,
    RESUME,
    REFUSED,
    RMA,
    ADMIN,
)


class LedgerEntry(NodeEntry):
    """`ledger.jsonl`: one step of a node's repair loop (gpugate/store/ledger.py)."""

    step: str
    who: str
    why: str = ""
    outcome: str = ""
    evidence: str | None = None
    check: str | None = None
    gpu: str | None = None
    reason: str | None = None

    _omit = frozenset({"evidence", "check", "gpu", "reason"})
    _doc: ClassVar[dict[str, str]] = {
        **_COMMON,
        "step": "drain, held, reset, recheck, reboot, wait, qualify, resume, refused, "
        "rma or admin (store/ledger.py)",
        "who": "who took it: `gpugate <hook>`, or the admin (the sudo caller)",
        "why": "why it was taken",
        "outcome": "what came of it (drained, requested, passed, failed, resumed, ...)",
        "evidence": "what it rests on: an evidence bundle, a qualification run (when any)",
        "check": "the check id the step concerns (when one)",
        "gpu": "the GPU it concerns: its serial, else its UUID (when one)",
        "reason": "the node's drain reason at the time (when drained)",
    }

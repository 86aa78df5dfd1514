"""What the epilog found and did (EpilogResult): epilog.py makes it, collect.py records it.

Its own module, below both, so that the two import no circle.
"""

from __future__ import annotations

from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class EpilogResult(Record):
    """What the epilog found and did."""

    abnormal: bool
    why: str
    bundle: str | None = None
    category: str | None = None
    xid: int | None = None
    failing_rank: int | None = None
    # The failing rank's node: named by the log, else the job's only node.
    failing_node: str | None = None
    confidence: str | None = None  # the diagnosis's: the metrics count only high under category
    hardware_fault: bool = False
    hardware_checks: tuple[Any, ...] = ()  # the failing hardware check ids (for the metrics)
    drained: bool = False
    reason: str | None = None
    check: str | None = None  # the check the drain reason names (passed on, never parsed back)
    boot_id: str | None = None  # this boot's id, for the drain's history entry
    gpu: str | None = None  # the failing GPU's serial (else UUID) the drain names, when known
    blocked_by: str | None = None  # the drain was not done: "admin", "budget" or "error"
    duration_s: float = 0.0
    # The newest complete checkpoint's age at the end (jobs that declared gpugate:ckpt=DIR).
    checkpoint_age_s: float | None = None
    checkpoint_stale: bool = False
    # Kernel records lost unread since the prolog (kernel.xid unknown): an Xid may be unseen.
    kernel_log_lost: str | None = None
    # False where the prolog refused the job here: no run ended, none to count in the metrics.
    ran: bool = True
    steps: tuple[str, ...] = ()  # what the executor did, step by step (gpugate/act/execute.py)

"""The one policy: (phase, findings) -> a decision. No I/O here."""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Policy

ALLOW = "allow"
WARN = "warn"
DRAIN = "drain"


class Decision(Record):
    """What to do with the node: allow, warn (allow, report loudly) or drain."""

    status: str  # ok / warn / fail: the node's health as the policy sees it
    action: str  # allow / warn / drain
    failing: tuple  # the findings that make it fail (worst first)
    warnings: tuple  # findings reported as warnings (including policy-mapped ones)
    report_only: bool = False


def effective_status(f: F.Finding, policy: Policy) -> str:
    """A finding's status after the policy: unknown mapped, warn_only checks capped at warn."""
    status = f.status
    if status == F.UNKNOWN:
        status = policy.unknown
    if status == F.FAIL and f.check in policy.warn_only:
        status = F.WARN
    return status


def decide(
    findings: list[F.Finding], policy: Policy, phase: str = "check", may_drain: bool = True
) -> Decision:
    """Fold findings into one decision for `phase` (check, prolog, epilog).

    `may_drain` False caps a failure at warn (the epilog's `drain_on_hardware: false`), as
    `report_only` does for every phase.
    """
    failing, warnings = [], []
    for f in findings:
        status = effective_status(f, policy)
        if status == F.FAIL:
            failing.append(f)
        elif status == F.WARN:
            warnings.append(f)
    if failing:
        status = F.FAIL
        action = DRAIN if may_drain and not policy.report_only else WARN
    elif warnings:
        status, action = F.WARN, WARN
    else:
        status, action = F.OK, ALLOW
    return Decision(
        status=status,
        action=action,
        failing=tuple(failing),
        warnings=tuple(warnings),
        report_only=policy.report_only,
    )

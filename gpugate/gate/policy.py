"""The one policy: (phase, findings) -> a decision. No I/O here.

Staged roll-out (issue 45): a check may act (drain, refuse the job) everywhere (ACTING), only
report (REPORT_ONLY: `policy.report_only`, or the check in `policy.report_only_checks`), or act
only on the nodes of the canary's partitions and report elsewhere (CANARY: `policy.canary`).
A failure that only reports is reported as `report_only` reports it (the node's status is
fail, in the log line, the event, the metrics and the bundle) and never drains.
"""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.registry import selects
from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection

    from gpugate.config.schema import Policy

ALLOW = "allow"
WARN = "warn"
DRAIN = "drain"

# A check's roll-out stage (rollout()), as the report and `gpugate check` show it.
ACTING = "acting"
REPORT_ONLY = "report-only"
CANARY = "canary-only"


class Decision(Record):
    """What to do with the node: allow, warn (allow, report loudly) or drain."""

    status: str  # ok / warn / fail: the node's health as the policy sees it
    action: str  # allow / warn / drain
    # The failures that act (worst first): they drain the node, refuse a job, hold a drain
    # (healing, `gpugate resume`); under `policy.report_only` they are reported instead.
    failing: tuple[F.Finding, ...]
    warnings: tuple[F.Finding, ...]  # findings reported as warnings (including policy-mapped ones)
    report_only: bool = False
    # Failures of checks whose own stage keeps them from acting here (staged_out): reported
    # as report_only reports them (the status is fail), never drained for, never holding a
    # drained node out of service: a check not proven yet must not keep a node from its jobs.
    reported: tuple[F.Finding, ...] = ()

    @property
    def failures(self) -> tuple[F.Finding, ...]:
        """Every failure: acting or only reported."""
        return self.failing + self.reported


def effective_status(f: F.Finding, policy: Policy) -> str:
    """A finding's status after the policy: unknown mapped, warn_only checks capped at warn."""
    status = f.status
    if status == F.UNKNOWN:
        status = policy.unknown
    if status == F.FAIL and f.check in policy.warn_only:
        status = F.WARN
    return status


def rollout(check: str, policy: Policy) -> str:
    """The check's roll-out stage: ACTING, REPORT_ONLY or CANARY (acts in the canary only)."""
    if policy.report_only or selects(policy.report_only_checks, check):
        return REPORT_ONLY
    if selects(policy.canary.checks, check):
        return CANARY
    return ACTING


def staged_out(check: str, policy: Policy, partitions: Collection[str] | None) -> bool:
    """Whether the check's own stage keeps its failure from acting on a node in `partitions`
    (None: not known): listed in `report_only_checks`, or a canary check outside the canary.

    A canary check acts only where a partition is known to be the canary's: where none is
    known (`gpugate check` outside a job) it reports, the safe side for a check not proven yet.
    """
    if selects(policy.report_only_checks, check):
        return True
    if selects(policy.canary.checks, check):
        wanted = policy.canary.partitions
        return not any(p in wanted for p in partitions or ())
    return False


def decide(
    findings: list[F.Finding],
    policy: Policy,
    phase: str = "check",
    may_drain: bool = True,
    partitions: Collection[str] | None = None,
) -> Decision:
    """Fold findings into one decision for `phase` (check, prolog, epilog, health).

    `may_drain` False caps a failure at warn (the epilog's `drain_on_hardware: false`), as
    `report_only` does for every phase. `partitions`: the partitions that decide where a
    canary check acts (the job's in the prolog and epilog, the node's in health; None: unknown).
    """
    failing: list[F.Finding] = []
    reported: list[F.Finding] = []
    warnings: list[F.Finding] = []
    for f in findings:
        status = effective_status(f, policy)
        if status == F.FAIL:
            (reported if staged_out(f.check, policy, partitions) else failing).append(f)
        elif status == F.WARN:
            warnings.append(f)
    if failing:
        status = F.FAIL
        action = DRAIN if may_drain and not policy.report_only else WARN
    elif reported:
        status, action = F.FAIL, WARN
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
        reported=tuple(reported),
    )


def job_partitions(value: str | None) -> tuple[str, ...] | None:
    """SLURM_JOB_PARTITION's names (`a,b` where a job was submitted to several), None if unset."""
    names = tuple(p.strip() for p in (value or "").split(",") if p.strip())
    return names or None

"""Findings: what a check says about the node, one line each."""

from __future__ import annotations

from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypedDict

    from typing_extensions import Unpack  # typeshed's: the checker's alone

    class Extra(TypedDict, total=False):
        """A finding's optional fields, so a misspelt `gpuu=3` is a type error."""

        gpu: int | None
        value: object
        limit: object
        source: str | None


OK = "ok"
WARN = "warn"
FAIL = "fail"
UNKNOWN = "unknown"  # the check could not be evaluated; the policy says what that means

# Worst first: used to sort findings and to fold them into one status.
SEVERITY = {FAIL: 0, UNKNOWN: 1, WARN: 2, OK: 3}


class Finding(Record):
    """One result of one check. `message` starts with the check id (grep-able in logs)."""

    check: str
    status: str
    message: str
    gpu: int | None = None
    value: object = None  # the measured value, for JSON consumers
    limit: object = None  # the threshold it was compared with
    # The fact source an unknown finding lacked ("nvml", "kernel_log"...): `gpugate check`
    # folds a whole missing source into one line. Not in the JSON form (its contract is fixed).
    source: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form: the contract keys first, `gpu` only where it concerns one GPU."""
        out: dict[str, Any] = {"check": self.check, "status": self.status, "message": self.message}
        if self.gpu is not None:
            out["gpu"] = self.gpu
        if self.value is not None:
            out["value"] = self.value
        if self.limit is not None:
            out["limit"] = self.limit
        return out


def finding(check: str, status: str, detail: str, **extra: Unpack[Extra]) -> Finding:
    """A finding whose message is `<check id>: <detail>`."""
    return Finding(check=check, status=status, message=f"{check}: {detail}", **extra)


def ok(check: str, detail: str, **extra: Unpack[Extra]) -> Finding:
    """A passing finding."""
    return finding(check, OK, detail, **extra)


def warn(check: str, detail: str, **extra: Unpack[Extra]) -> Finding:
    """A warning: reported, never drains."""
    return finding(check, WARN, detail, **extra)


def fail(check: str, detail: str, **extra: Unpack[Extra]) -> Finding:
    """A failure: the node should not take the job."""
    return finding(check, FAIL, detail, **extra)


def unknown(check: str, detail: str, **extra: Unpack[Extra]) -> Finding:
    """The check could not be evaluated (its facts are missing)."""
    return finding(check, UNKNOWN, detail, **extra)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Problems first, then by check id and GPU."""
    return sorted(
        findings,
        key=lambda f: (SEVERITY.get(f.status, 9), f.check, -1 if f.gpu is None else f.gpu),
    )

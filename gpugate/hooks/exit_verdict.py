"""Slurm's own word on how the job ended, over a log diagnosis that found no cause (issue 43).

The logs are read from their tail and may be cut, quiet or misleading; Slurm's exit code is not.
A job Slurm says failed (epilog.abnormal_end: exit code, signal, a failed step) is never filed
as `no_failure` nor left `unknown`: it is `other`, "the job failed and its logs name no cause",
confidence low. A job Slurm says ended 0:0 whose logs show neither a failure nor an end
(`unknown`) ended well: that exit code is the positive evidence `no_failure` needs.
"""

from __future__ import annotations

from gpugate.diagnosis.categories import EXPLAIN

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.hooks.child_answer import JobDiagnosis

QUIET = frozenset({"no_failure", "unknown"})


def with_slurm_exit(d: JobDiagnosis, failed: str | None, exit_code2: str | None) -> JobDiagnosis:
    """The diagnosis, settled by Slurm's exit where the logs named no cause.

    `failed` is why Slurm's codes say the job failed (abnormal_end), None when they do not;
    `exit_code2` is SLURM_JOB_EXIT_CODE2 (`exit:signal`), "0:0" for a clean exit.
    """
    if d.category not in QUIET:
        return d
    if failed is not None:
        said = f" Its logs said: {d.summary}" if d.summary else ""
        return d.replace(
            category="other",
            confidence="low",
            summary=f"The job failed ({failed}) and its logs name no cause.{said}",
            advice=EXPLAIN["other"][1],
        )
    if d.category == "unknown" and exit_code2 == "0:0":
        return d.replace(
            category="no_failure",
            confidence="medium",
            summary="Slurm's exit code 0:0 says the job ended well; its logs show no failure.",
            advice=EXPLAIN["no_failure"][1],
        )
    return d

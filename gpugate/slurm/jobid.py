"""Slurm job ids, parsed once: a plain `14`, an array task `14_1`, a het component `14+1`.

Every backend parses the id it is given here and nowhere else. Text is never handed to
`int()` unless it is a plain id: Python reads `int("1_4")` as 14 (underscores are digit
separators), which once sent pyslurm's requeue of array task `14_1` to job 141.
"""

from __future__ import annotations

from gpugate.record import Record
from gpugate.regex import lazy

# ASCII digits only, the whole text (fullmatch: `$` would let "14\n" through, `\d` "١٤"); at
# most 10 digits, so no id can be read as an option, hold a space, or be a 5000-digit int.
_JOB_ID = lazy(r"([0-9]{1,10})(?:([_+])([0-9]{1,10}))?")
_MAX = 0xFFFFFFFF  # Slurm's job ids and task ids are uint32_t
ARRAY_TASK, HET_COMPONENT = "_", "+"


class JobId(Record):
    """A Slurm job id: `job` alone (plain), or `job` `sep` `task` (array task `_`, het `+`)."""

    job: int
    sep: str = ""  # "", ARRAY_TASK or HET_COMPONENT
    task: int | None = None  # the array task id or het component offset

    def __str__(self) -> str:
        return f"{self.job}{self.sep}{self.task}" if self.task is not None else str(self.job)

    @property
    def plain(self) -> int | None:
        """The id as an integer when it is a plain job id; None for an array task or het part."""
        return self.job if self.task is None else None


def parse_job_id(value: int | str | JobId) -> JobId:
    """`14`, `"14"`, `"14_1"`, `"14+1"` as a JobId; ValueError naming `value` for anything else."""
    if isinstance(value, JobId):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)  # a negative int fails below, as "-1" does
    elif isinstance(value, str):
        text = value
    else:
        raise ValueError(f"not a Slurm job id: {value!r}")
    m = _JOB_ID.fullmatch(text)
    if not m:
        raise ValueError(f"not a Slurm job id: {value!r}")
    job, sep, task = int(m.group(1)), m.group(2) or "", m.group(3)
    if job > _MAX or (task is not None and int(task) > _MAX):
        raise ValueError(f"not a Slurm job id (over 2^32): {value!r}")
    return JobId(job=job, sep=sep, task=None if task is None else int(task))

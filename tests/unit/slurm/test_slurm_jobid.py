"""Job ids parsed once (`gpugate/slurm/jobid.py`): plain, array task, het component, refusals."""

from __future__ import annotations

import pytest

from gpugate.slurm.control import valid_job_id
from gpugate.slurm.jobid import JobId, parse_job_id


@pytest.mark.parametrize(
    ("value", "job", "sep", "task", "plain", "text"),
    [
        (14, 14, "", None, 14, "14"),
        ("14", 14, "", None, 14, "14"),
        ("14_1", 14, "_", 1, None, "14_1"),
        ("14+1", 14, "+", 1, None, "14+1"),
        ("14_0", 14, "_", 0, None, "14_0"),
        ("1_4", 1, "_", 4, None, "1_4"),  # not 14, as int("1_4") would have it
        (4294967295, 4294967295, "", None, 4294967295, "4294967295"),
    ],
)
def test_parse(value: object, job: int, sep: str, task: int | None, plain, text: str) -> None:
    jid = parse_job_id(value)  # type: ignore[arg-type]
    assert (jid.job, jid.sep, jid.task, jid.plain, str(jid)) == (job, sep, task, plain, text)
    assert valid_job_id(value) == text  # type: ignore[arg-type]
    assert parse_job_id(jid) is jid
    assert parse_job_id(str(jid)) == jid


@pytest.mark.parametrize(
    "value",
    [
        "1_",
        "_1",
        "-1",
        -1,
        "1_4_5",
        "1+2_3",
        " 14",
        "14 ",
        "14\n",  # `$` in a regex would have let this through
        "",
        "+1",
        "1__4",
        "1_+4",
        "14.0",
        "0x14",
        "--help",
        "4;reboot",
        "\uff11\uff14",  # fullwidth digits: int() reads them, Slurm does not
        "\u0661\u0664",  # Arabic-Indic digits
        "4294967296",  # over uint32
        "14_4294967296",
        "9" * 5000,
        True,
        14.0,
        None,
    ],
)
def test_refuse(value: object) -> None:
    with pytest.raises(ValueError, match="not a Slurm job id") as err:
        parse_job_id(value)  # type: ignore[arg-type]
    assert repr(value)[:40] in str(err.value)  # the message names the input
    with pytest.raises(ValueError):
        valid_job_id(value)  # type: ignore[arg-type]


def test_a_job_id_is_a_record() -> None:
    assert parse_job_id("14_1") == JobId(job=14, sep="_", task=1)
    assert parse_job_id("14_1") != parse_job_id("14+1") != parse_job_id("141")
    assert len({parse_job_id("14"), parse_job_id(14)}) == 1

"""What Slurm tells a hook through its environment (see docs/slurm-facts.md)."""

from __future__ import annotations

import os
import re

from gpugate.node import node_name
from gpugate.record import Record
from gpugate.regex import lazy


class HookEnv(Record):
    """The job and node a hook runs for."""

    node: str | None = None
    job_id: str | None = None
    user: str | None = None
    uid: int | None = None
    gid: int | None = None
    gpus: tuple[int, ...] | None = None  # the job's GPUs on this node; None: not known / all
    comment: str = ""
    nodelist: str | None = None
    num_nodes: int | None = None
    restart_count: int = 0
    work_dir: str | None = None
    stdout: str | None = None
    exit_code: int | None = None  # SLURM_JOB_EXIT_CODE: the raw wait status
    exit_code2: str | None = None  # SLURM_JOB_EXIT_CODE2: "exit:signal"
    derived_ec: int | None = None  # SLURM_JOB_DERIVED_EC: raw, highest of the steps
    context: str | None = None  # prolog_slurmd, epilog_slurmd, prolog_task, epilog_slurmctld
    start_time: int | None = None  # epoch; Slurm 23.x+ only (SLURM_JOB_START_TIME)
    end_time: int | None = None  # epoch; the real end in the epilog (SLURM_JOB_END_TIME)
    sluid: str | None = None  # SLURM_JOB_SLUID (25.11+): this run of the job, unique; None before
    # SLURM_JOB_PARTITION, in the Prolog and the Epilog alike (docs/slurm-facts.md): where a
    # canary check acts (gate/policy.py), read without a Slurm call.
    partition: str | None = None


# SchedMD/slurm src/common/sluid.h: "s" and 13 characters of Crockford's Base32, printed upper
# case (print_sluid). Anything else is not taken: it ends up in records and paths.
_SLUID = lazy(r"s[0-9A-HJKMNP-TV-Z]{13}")


def sluid_of(value: str | None) -> str | None:
    """`value` if it is a SLUID (`s3H1M96THB9700`), else None (absent or malformed)."""
    if value and _SLUID.fullmatch(value.strip()):
        return value.strip()
    return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _gpus(value: str | None) -> tuple[int, ...] | None:
    # SLURM_JOB_GPUS is "0,1" (indices of this node's GPUs); absent for jobs without GPUs.
    if not value:
        return None
    try:
        out = [int(v) for v in re.findall(r"\d+", value)]
    except ValueError:  # thousands of digits are no GPU index (and int() refuses them)
        return None
    return tuple(out) or None


def from_environ(environ: dict[str, str] | None = None) -> HookEnv:
    """Read the hook environment (the Slurm variables; anything absent stays None)."""
    e = os.environ if environ is None else environ

    return HookEnv(
        node=e.get("SLURMD_NODENAME") or node_name(),
        job_id=e.get("SLURM_JOB_ID") or e.get("SLURM_JOBID"),
        user=e.get("SLURM_JOB_USER"),
        uid=_int(e.get("SLURM_JOB_UID")),
        gid=_int(e.get("SLURM_JOB_GID")),
        gpus=_gpus(e.get("SLURM_JOB_GPUS")),
        comment=e.get("SLURM_JOB_COMMENT", ""),
        # SLURM_JOB_NODELIST only exists from 23.x on; SLURM_NODELIST everywhere.
        nodelist=e.get("SLURM_JOB_NODELIST") or e.get("SLURM_NODELIST"),
        num_nodes=_int(e.get("SLURM_JOB_NUM_NODES")),
        restart_count=_int(e.get("SLURM_JOB_RESTART_COUNT") or e.get("SLURM_RESTART_COUNT")) or 0,
        work_dir=e.get("SLURM_JOB_WORK_DIR"),
        stdout=e.get("SLURM_JOB_STDOUT"),
        exit_code=_int(e.get("SLURM_JOB_EXIT_CODE")),
        exit_code2=e.get("SLURM_JOB_EXIT_CODE2"),
        derived_ec=_int(e.get("SLURM_JOB_DERIVED_EC")),
        context=e.get("SLURM_SCRIPT_CONTEXT"),
        start_time=_int(e.get("SLURM_JOB_START_TIME")),
        end_time=_int(e.get("SLURM_JOB_END_TIME")),
        sluid=sluid_of(e.get("SLURM_JOB_SLUID")),
        partition=e.get("SLURM_JOB_PARTITION") or None,
    )


def comment_tokens(comment: str) -> dict[str, str]:
    """`gpugate:skip gpugate:ckpt=/data/run1` in a job's --comment -> {"skip": "", "ckpt": ...}.

    Only `gpugate:` tokens count; the rest of the comment is the user's own.
    """
    out: dict[str, str] = {}
    # A key starts with a letter (`gpugate:_` or `gpugate:__` names nothing).
    for m in re.finditer(r"(?:^|[\s,;])gpugate:([a-z][a-z_]*)(?:=([^\s,;]*))?", comment or ""):
        out[m.group(1)] = m.group(2) or ""
    return out


NO_FR = "no-fr"  # `--comment gpugate:no-fr`


def fr_opted_out(comment: str | None) -> bool:
    """Whether the job's comment holds `gpugate:no-fr` as a token of its own (no flight
    recorder for this job: the TaskProlog exports nothing, the prolog notes it for it).

    comment_tokens reads it as the key "no" (a key is letters and '_'), the same as
    `gpugate:no-ckpt`, so the whole token is matched here.
    """

    return bool(re.search(r"(?:^|[\s,;])gpugate:no-fr(?=$|[\s,;])", comment or ""))

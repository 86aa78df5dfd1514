"""`scontrol show node|job` text, one-line (`-o`) or multi-line, 21.08 to 25.11 (pure, no I/O).

The adapter (`cli.py`) runs scontrol and hands the text in; the recorded output of each
version is under `tests/fixtures/slurm/`.
"""

from __future__ import annotations

import time

from gpugate.regex import lazy
from gpugate.slurm.hostlist import NULLS, expand_lenient
from gpugate.slurm.jobid import parse_job_id
from gpugate.slurm.records import (
    JobInfo,
    NodeInfo,
    ended_at,
    gres_gpu_count,
    gres_gpu_type,
    job_reason,
    split_state,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

# A key: capitalised, may hold `:` or `/` parts (`AllocNode:Sid`, `CPUs/Task`, `ReqB:S:C:T`).
_KEY_NAME = r"[A-Z][A-Za-z0-9_]*(?:[:/][A-Za-z0-9_*]+)*"
_KEY = lazy(rf"(?:(?<=\s)|^)({_KEY_NAME})=")
# Values that hold free text (spaces, even `Word=`): they end only at a key Slurm prints.
_FREE_TEXT = frozenset(
    {"Reason", "Comment", "AdminComment", "SystemComment", "Extra", "JobName", "OS"}
    | {"Command", "WorkDir", "StdOut", "StdErr", "StdIn", "ReservationName", "SubmitLine"}
)
# Keys of `scontrol show node|job` (src/api/node_info.c, src/scontrol/info_job.c, 21.08-26.05;
# 26.05 adds a job's SubmitLine= and Exclusive=, seen on 26.05.5).
_KNOWN_KEYS = frozenset(
    """NodeName Arch CpuBind CoresPerSocket CPUAlloc CPUEfctv CPUTot CPULoad AvailableFeatures
    ActiveFeatures Gres GresDrain GresUsed NodeAddr NodeHostName Port Version OS RealMemory
    AllocMem FreeMem Sockets Boards CoreSpecCount CPUSpecList MemSpecLimit State ThreadsPerCore
    TmpDisk Weight Owner MCS_label NextState Partitions BootTime SlurmdStartTime LastBusyTime
    ResumeAfterTime CfgTRES AllocTRES CapWatts CurrentWatts AveWatts LowestJoules
    ConsumedJoules ExtSensorsJoules ExtSensorsWatts ExtSensorsTemp Reason ReservationName
    Comment Extra InstanceId InstanceType Topology TLSCertLastRenewal
    JobId ArrayJobId ArrayTaskId ArrayTaskThrottle HetJobId HetJobOffset JobName HetJobIdSet
    UserId GroupId Priority Nice Account QOS WCKey JobState FailedNode Dependency Requeue
    Restarts BatchFlag Reboot ExitCode DerivedExitCode RunTime TimeLimit TimeMin SubmitTime
    EligibleTime AccrueTime ResizeTime StartTime EndTime Deadline CronJob CrontabSpec
    PreemptEligibleTime PreemptTime SuspendTime SecsPreSuspend LastSchedEval Scheduler
    Partition AllocNode:Sid ReqNodeList ExcNodeList NodeList SchedNodeList BatchFeatures
    BatchHost StepMgrEnabled FedOrigin FedViableSiblings FedActiveSiblings NumNodes NumCPUs
    NumTasks CPUs/Task ReqB:S:C:T TRES ReqTRES Socks/Node NtasksPerN:B:S:C CoreSpec
    ThreadSpec JOB_GRES Nodes CPU_IDs Mem GRES MinCPUsNode MinMemoryNode MinMemoryCPU
    MinMemoryTRES MinTmpDiskNode Features DelayBoot ClusterFeatures Prefer Reservation
    OverSubscribe Contiguous Licenses LicensesAlloc Network Command WorkDir AdminComment
    SystemComment StdErr StdIn StdOut Switches BurstBuffer BurstBufferState CpuFreqMin
    CpuFreqMax CpuFreqGov OOMKillStep CpusPerTres MemPerTres TresBind TresFreq TresPerJob
    TresPerNode TresPerSocket TresPerTask MailUser MailType NtasksPerTRES Container
    ContainerID SELinuxContext ResvPorts Power SegmentSize SubmitLine Exclusive""".split()  # noqa: SIM905 (a word list reads best)
)
# `scontrol show node` appends ` [user@time]` to the reason's first line (node_info.c); the
# anchor must be followed by the end or the next key, so a `[a@b]` inside the text is kept.
_USER_TIME = lazy(r" \[([^\[\]@\s]*)@([^\[\]\s]+)\]")
_REASON_END = lazy(rf"{_USER_TIME.pattern}(?=\s*$|\s+{_KEY_NAME}=)")
# A node's Comment is free text that gpugate writes (gpugate/isolate/comment.py, with a
# finding's message in it): scontrol prints only these keys after it (node_info.c,
# `slurm_sprint_node_table`: Comment, Extra, InstanceId/InstanceType, ReservationName), so no
# other `Key=` in the text can end it.
NODE_FREE_TEXT_ENDS = {
    "Comment": frozenset({"Extra", "InstanceId", "InstanceType", "ReservationName"})
}
# 26.05 prints a job's sbatch command line (SubmitLine=, the user's own words: `--wrap=...
# Partition=x`, `--comment=... Comment=y`) between Command= and WorkDir= (seen on 26.05.5,
# tests/fixtures/slurm/26.05-debian-sid/): only WorkDir= ends it, so no `Key=` the user typed
# becomes a field. (A user who types ` WorkDir=` itself still ends it early: text has no
# escape; `scontrol show job --json` does.)
JOB_FREE_TEXT_ENDS = {"SubmitLine": frozenset({"WorkDir"})}


def parse_kv(line: str, ends: Mapping[str, frozenset[str]] | None = None) -> dict[str, str]:
    """Split one `scontrol -o` record into {key: value}; values keep their inner spaces.

    `ends`: for a free-text key, the only keys that can end it (NODE_FREE_TEXT_ENDS); other
    free-text keys end at any key Slurm prints.
    """
    ends = ends or {}
    matches = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    i = 0
    while i < len(matches):
        key, start = matches[i].group(1), matches[i].end()
        anchor = _REASON_END.search(line, start) if key == "Reason" else None
        if anchor:
            end = anchor.end()
            j = next(
                (k for k in range(i + 1, len(matches)) if matches[k].start() >= end), len(matches)
            )
        else:
            j = i + 1
            if key in _FREE_TEXT:
                enders = ends.get(key, _KNOWN_KEYS)
                while j < len(matches) and matches[j].group(1) not in enders:
                    j += 1
            end = matches[j].start() if j < len(matches) else len(line)
        out.setdefault(key, line[start:end].strip())
        i = j
    return out


def _records(text: str, first_key: str) -> list[str]:
    """One string per record, for one-line (`-o`) and multi-line output alike."""
    records: list[list[str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(first_key + "=") or not records:
            records.append([line])
        else:
            records[-1].append(line)
    return [" ".join(r) for r in records if r[0].startswith(first_key + "=")]


def parse_show_node_text(text: str) -> list[NodeInfo]:
    """Parse `scontrol show node [-o]` output into NodeInfo, one per node."""
    return [_node_from_kv(parse_kv(rec, NODE_FREE_TEXT_ENDS)) for rec in _records(text, "NodeName")]


def _node_from_kv(kv: dict[str, str]) -> NodeInfo:
    state, flags = split_state(kv.get("State", "UNKNOWN"))
    reason, user, when = _split_reason(kv.get("Reason", ""))
    return NodeInfo(
        name=kv["NodeName"],
        state=state,
        flags=flags,
        reason=reason,
        reason_user=user,
        reason_time=when,
        partitions=tuple(p for p in kv.get("Partitions", "").split(",") if p and p not in NULLS),
        gres_gpus=gres_gpu_count(kv.get("Gres")),
        gpu_type=gres_gpu_type(kv.get("Gres")),
        cpus=_int(kv.get("CPUTot")) or None,
        comment=_text(kv.get("Comment")),
    )


def _split_reason(value: str) -> tuple[str, str, int | None]:
    # The last ` [user@time]` is Slurm's; text after it is the reason's continuation lines.
    found = list(_USER_TIME.finditer(value))
    if not found:
        return value.strip(), "", None
    m = found[-1]
    text = f"{value[: m.start()].strip()} {value[m.end() :].strip()}".strip()
    return text, m.group(1), _text_time(m.group(2))


def _text_time(value: str) -> int | None:
    """Epoch of scontrol's ISO local time (the adapter sets SLURM_TIME_FORMAT=standard)."""

    try:
        return int(time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def parse_show_jobs_text(
    text: str, expand: Callable[[str], list[str]] | None = None
) -> list[JobInfo]:
    """Parse `scontrol show job [-o]` output into JobInfo, one per job record."""
    expand = expand or expand_lenient
    return [
        _job_from_kv(parse_kv(rec, JOB_FREE_TEXT_ENDS), expand) for rec in _records(text, "JobId")
    ]


def parse_show_job_text(text: str, expand: Callable[[str], list[str]] | None = None) -> JobInfo:
    """Parse the first job of `scontrol show job [-o]` output; ValueError when there is none."""
    jobs = parse_show_jobs_text(text, expand)
    if not jobs:
        raise ValueError("no JobId= record in scontrol output")
    return jobs[0]


def _job_from_kv(kv: dict[str, str], expand: Callable[[str], list[str]]) -> JobInfo:
    user, _, uid = kv.get("UserId", "").partition("(")
    code, _, sig = kv.get("ExitCode", "0:0").partition(":")
    return JobInfo(
        job_id=_plain_job_id(kv["JobId"]),
        user=user,
        uid=_int(uid.rstrip(")")),
        state=kv.get("JobState", ""),
        reason=job_reason(_text(kv.get("Reason"))),
        nodes=tuple(expand(_text(kv.get("NodeList")))),
        batch_host=_text(kv.get("BatchHost")),
        stdout=_text(kv.get("StdOut")),
        stderr=_text(kv.get("StdErr")),
        work_dir=_text(kv.get("WorkDir")),
        exit_code=_int(code) or 0,
        exit_signal=_int(sig) or 0,
        restarts=_int(kv.get("Restarts")) or 0,
        comment=_text(kv.get("Comment")),
        admin_comment=_text(kv.get("AdminComment")),
        excluded_nodes=tuple(expand(_text(kv.get("ExcNodeList")))),
        requeue=kv.get("Requeue") == "1",
        partition=_text(kv.get("Partition")),
        required_nodes=tuple(expand(_text(kv.get("ReqNodeList")))),
        end_time=ended_at(_text_time(kv.get("EndTime") or "")),  # running: the expected end
        start_time=ended_at(_text_time(kv.get("StartTime") or "")),  # pending: a forecast
    )


def _plain_job_id(text: str) -> int:
    # scontrol's JobId= is always the plain id (an array task prints ArrayJobId/ArrayTaskId).
    plain = parse_job_id(text).plain
    if plain is None:
        raise ValueError(f"JobId={text!r} is not a plain job id")
    return plain


def _int(value: str | None) -> int | None:
    # ASCII digits only: int() also reads "1_0" as 10 and " 7 " as 7.
    text = (value or "").removeprefix("-")
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        return None
    return int(value or "")


def _text(value: str | None) -> str:
    return "" if value is None or value in NULLS else value

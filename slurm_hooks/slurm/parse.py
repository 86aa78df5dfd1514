"""Pure parsers for what Slurm prints: `scontrol show node|job` text, every JSON shape, hostlists.

No I/O here: the adapter (`slurm.py`) runs the commands and hands the text in. Shapes covered
(all recorded under `tests/fixtures/slurm/`):

- `scontrol show node|job` text, one-line (`-o`) or multi-line, 22.05 to 25.11.
- `nodes` records: `sinfo --json` 21.08/22.05 (`state` a lower-case string plus
  `state_flags`), `scontrol show node --json` and slurmrestd 23.11+ (`state` an upper-case
  list, times as `{set, infinite, number}`).
- `sinfo` records: `sinfo --json` 23.02+ (aggregated: `node.state`, `nodes.nodes`, `reason`
  an object).
- `jobs` records: `squeue --json` 22.05 (`job_state` a string, `exit_code` an int) and
  `squeue`/`scontrol show job --json`/slurmrestd 23.11+ (lists and objects).
"""

from __future__ import annotations

import json
import re

from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

GPUGATE_PREFIX = "gpugate:"

# A node is out of service when its base state or a flag says so; never because it has a
# reason: 24.11 keeps the reason on a resumed, idle node (reference/slurm-in-ci.md).
_OUT_OF_SERVICE = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})
_BASE_STATES = frozenset(
    {"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "END"}
    | {"DRAINED", "DRAINING", "FAIL", "FAILING", "COMPLETING"}  # sinfo's combined names
)
# sinfo's short suffixes on a state (`idle*`, `down~`), as flag names.
_STATE_SUFFIX = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "!": "POWER_DOWN",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "$": "MAINTENANCE",
    "-": "PLANNED",
}
_NULLS = frozenset({"", "(null)", "None"})
# The job reason after a failed prolog when Slurm holds the job (the default; job_mgr.c
# `_job_requeue_op`, JOB_LAUNCH_FAILED): "launch failed requeued held", as scontrol prints it.
LAUNCH_FAILED_REASONS = frozenset({"launch_failed_requeued_held"})
# 24.11 stores the prolog's failure as the job's exit code (job_mgr.c `prolog_complete`:
# exit_code = prolog_rc = ESLURMD_PROLOG_FAILED, 4022 in slurm_errno.h), which scontrol and
# SLURM_JOB_EXIT_CODE2 print as `0:54` (4022 & 0x7f). 22.05 leaves `0:0`.
PROLOG_FAILED_SIGNAL = 54


class NodeInfo(Record):
    """One node as Slurm reports it: base state, flags and the drain reason."""

    name: str
    state: str  # base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, ...
    flags: tuple = ()  # upper case: ("DRAIN",), ("RESERVED", "DRAIN", "NOT_RESPONDING")
    reason: str = ""  # without the `[user@time]` that `scontrol show node` appends
    reason_user: str = ""
    reason_time: int | None = None  # epoch seconds
    partitions: tuple = ()  # the partitions the node is in (the drain budget counts per partition)

    @property
    def drained(self) -> bool:
        """True when DRAIN/DOWN/FAIL is set (the state or a flag), whatever the reason says."""
        return self.state in _OUT_OF_SERVICE or any(f in _OUT_OF_SERVICE for f in self.flags)

    @property
    def gpugate_owned(self) -> bool:
        """True when the reason is one gpugate wrote."""
        return self.reason.startswith(GPUGATE_PREFIX)


class JobInfo(Record):
    """The parts of a job that gpugate reads: who, where, its files, how it ended."""

    job_id: int
    user: str = ""
    uid: int | None = None
    state: str = ""  # PENDING, RUNNING, COMPLETED, ...
    reason: str = ""  # Slurm's state reason, spaces as underscores (as scontrol prints it)
    nodes: tuple = ()  # expanded host names
    batch_host: str = ""
    stdout: str = ""
    stderr: str = ""
    work_dir: str = ""
    exit_code: int = 0
    exit_signal: int = 0
    restarts: int = 0
    comment: str = ""
    admin_comment: str = ""
    excluded_nodes: tuple = ()  # expanded host names
    requeue: bool = False
    partition: str = ""
    required_nodes: tuple = ()  # `-w`/ReqNodeList, expanded host names
    end_time: int | None = None  # epoch; None while the job has not ended (or was requeued)

    @property
    def back_in_queue(self) -> bool:
        """Slurm has put the job back in the queue itself (a failed prolog or launch, a node
        failure with --requeue, an admin's requeue).

        Seen on 22.05 from EpilogSlurmctld: such a job prints JobState=COMPLETING (the
        PENDING|COMPLETING bits; the PENDING comes once the hook is done) and EndTime=Unknown,
        where a job that ended prints COMPLETING with its EndTime.
        """
        state = self.state.upper()
        return state in ("PENDING", "REQUEUED", "REQUEUE_HOLD") or (
            state == "COMPLETING" and self.end_time is None
        )

    @property
    def launch_failed(self) -> bool:
        """Slurm's own word that the job's prolog (or launch) failed on a node."""
        return self.reason in LAUNCH_FAILED_REASONS or (self.exit_code, self.exit_signal) == (
            0,
            PROLOG_FAILED_SIGNAL,
        )


# ---------------------------------------------------------------------------------- hostlists


class HostlistError(ValueError):
    """A hostlist expression the pure parser does not understand."""


_RANGE = re.compile(r"^(\d{1,18})(?:-(\d{1,18}))?$")
# More names than any cluster has, or more bracket groups than any naming scheme: a typo or
# hostile input, refused before it costs memory (or recursion depth).
_MAX_HOSTS = 100_000
_MAX_GROUPS = 8


def hostlist_expand(expr: str) -> list[str]:
    """Expand `gpu-[01-03,07],other` to names, in order; raise HostlistError when unsure."""
    expr = (expr or "").strip()
    if expr in _NULLS:
        return []
    names: list[str] = []
    for item in _split_top_level(expr):
        if item.count("[") > _MAX_GROUPS:
            raise HostlistError(f"more than {_MAX_GROUPS} bracket groups in {item!r}")
        names.extend(_expand_item(item))
        if len(names) > _MAX_HOSTS:
            raise HostlistError(f"more than {_MAX_HOSTS} names in {expr!r}")
    return names


def _split_top_level(expr: str) -> list[str]:
    items, depth, current = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expr!r}")
        if depth == 0 and (ch == "," or ch.isspace()):
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise HostlistError(f"unbalanced '[' in {expr!r}")
    items.append("".join(current))
    return [i for i in items if i]


def _expand_item(item: str) -> list[str]:
    # "rack[1-2]-n[01-02]" expands as a product, like Slurm's multi-bracket hostlists.
    head, bracket, rest = item.partition("[")
    if not bracket:
        return [item]
    body, closing, tail = rest.partition("]")
    if not closing:
        raise HostlistError(f"unbalanced '[' in {item!r}")
    tails = _expand_item(tail)
    numbers = _expand_ranges(body, item)
    if len(numbers) * len(tails) > _MAX_HOSTS:
        raise HostlistError(f"more than {_MAX_HOSTS} names in {item!r}")
    return [f"{head}{n}{t}" for n in numbers for t in tails]


def _expand_ranges(body: str, item: str) -> list[str]:
    out = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise HostlistError(f"cannot read range {part!r} in {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo) or len(out) + int(hi) - int(lo) > _MAX_HOSTS:
            raise HostlistError(f"bad range {part!r} in {item!r}")
        # Slurm pads to the width of the lower bound: [08-10] -> 08 09 10.
        out.extend(f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
    return out


def _expand_lenient(expr: str) -> list[str]:
    try:
        return hostlist_expand(expr)
    except HostlistError:
        return [expr]


# ------------------------------------------------------------------------- key=value text

# A key: capitalised, may hold `:` or `/` parts (`AllocNode:Sid`, `CPUs/Task`, `ReqB:S:C:T`).
_KEY_NAME = r"[A-Z][A-Za-z0-9_]*(?:[:/][A-Za-z0-9_*]+)*"
_KEY = re.compile(rf"(?:(?<=\s)|^)({_KEY_NAME})=")
# Values that hold free text (spaces, even `Word=`): they end only at a key Slurm prints.
_FREE_TEXT = frozenset(
    {"Reason", "Comment", "AdminComment", "SystemComment", "Extra", "JobName", "OS"}
    | {"Command", "WorkDir", "StdOut", "StdErr", "StdIn", "ReservationName"}
)
# Keys of `scontrol show node|job` (src/api/node_info.c, src/scontrol/info_job.c, 21.08-25.11).
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
    ContainerID SELinuxContext ResvPorts Power SegmentSize""".split()  # noqa: SIM905 (a word list reads best)
)
# `scontrol show node` appends ` [user@time]` to the reason's first line (node_info.c); the
# anchor must be followed by the end or the next key, so a `[a@b]` inside the text is kept.
_USER_TIME = re.compile(r" \[([^\[\]@\s]*)@([^\[\]\s]+)\]")
_REASON_END = re.compile(rf"{_USER_TIME.pattern}(?=\s*$|\s+{_KEY_NAME}=)")


def parse_kv(line: str) -> dict[str, str]:
    """Split one `scontrol -o` record into {key: value}; values keep their inner spaces."""
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
                while j < len(matches) and matches[j].group(1) not in _KNOWN_KEYS:
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
    return [_node_from_kv(parse_kv(rec)) for rec in _records(text, "NodeName")]


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
        partitions=tuple(p for p in kv.get("Partitions", "").split(",") if p and p not in _NULLS),
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
    import time

    try:
        return int(time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def parse_show_jobs_text(
    text: str, expand: Callable[[str], list[str]] | None = None
) -> list[JobInfo]:
    """Parse `scontrol show job [-o]` output into JobInfo, one per job record."""
    expand = expand or _expand_lenient
    return [_job_from_kv(parse_kv(rec), expand) for rec in _records(text, "JobId")]


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
        job_id=int(kv["JobId"]),
        user=user,
        uid=_int(uid.rstrip(")")),
        state=kv.get("JobState", ""),
        reason=_text(kv.get("Reason")),
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
        end_time=_text_time(kv.get("EndTime") or ""),
    )


# ----------------------------------------------------------------------------------- states


def split_state(
    state: str | list | tuple | None, extra_flags: Iterable[str] = ()
) -> tuple[str, tuple]:
    """("IDLE", ("DRAIN",)) from "IDLE+DRAIN", ["IDLE", "DRAIN"], "idle*" or "idle" + flags."""
    parts = state.split("+") if isinstance(state, str) else list(state or [])
    names: list[str] = []
    for part in [*parts, *extra_flags]:
        word, trailing = str(part).strip().upper(), []
        while word and word[-1] in _STATE_SUFFIX:
            trailing.insert(0, _STATE_SUFFIX[word[-1]])
            word = word[:-1]
        names.extend(([word] if word else []) + trailing)
    names = list(dict.fromkeys(names))  # drop repeats, keep order
    if not names:
        return "UNKNOWN", ()
    base = next((n for n in names if n in _BASE_STATES), names[0])
    return base, tuple(n for n in names if n != base)


# ------------------------------------------------------------------------------------- JSON


def _json_shape(parse: Callable) -> Callable:
    """`parse`, raising ValueError (as for text that is not JSON) on JSON of another shape."""

    def wrapped(text: str, *args: object, **kwargs: object) -> list:
        try:
            return parse(text, *args, **kwargs)
        except (AttributeError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            raise ValueError(f"not Slurm's JSON: {type(exc).__name__}: {exc}") from None

    wrapped.__doc__ = parse.__doc__
    return wrapped


@_json_shape
def parse_nodes_json(text: str) -> list[NodeInfo]:
    """Parse any JSON with node records: `nodes` (scontrol/slurmrestd, 21.08-22.05 sinfo) or
    `sinfo` (23.02+ sinfo)."""
    doc = json.loads(text)
    if isinstance(doc.get("sinfo"), list):
        return _dedupe(_nodes_from_sinfo_record(r) for r in doc["sinfo"])
    return _dedupe([_node_from_record(r)] for r in doc.get("nodes") or [])


def parse_sinfo_json(text: str) -> list[NodeInfo]:
    """Parse `sinfo --json` of any version (21.08-25.11) into one NodeInfo per node."""
    return parse_nodes_json(text)


def _dedupe(groups: Iterable[list[NodeInfo]]) -> list[NodeInfo]:
    # sinfo repeats a node once per partition; the first record wins.
    seen: dict[str, NodeInfo] = {}
    for group in groups:
        for node in group:
            seen.setdefault(node.name, node)
    return list(seen.values())


def _node_from_record(rec: dict) -> NodeInfo:
    state, flags = split_state(rec.get("state"), rec.get("state_flags") or ())
    reason = rec.get("reason") or ""
    partitions = tuple(p for p in rec.get("partitions") or () if isinstance(p, str))
    if isinstance(reason, dict):  # defensive: the sinfo-record shape
        return _with_reason_object(rec["name"], state, flags, reason, partitions)
    return NodeInfo(
        name=rec["name"],
        state=state,
        flags=flags,
        reason=reason.strip(),
        reason_user=rec.get("reason_set_by_user") or "",
        reason_time=_epoch(rec.get("reason_changed_at")),
        partitions=partitions,
    )


def _nodes_from_sinfo_record(rec: dict) -> list[NodeInfo]:
    state, flags = split_state((rec.get("node") or {}).get("state"))
    names = (rec.get("nodes") or {}).get("nodes") or []
    reason = rec.get("reason") or {}
    if isinstance(reason, str):
        reason = {"description": reason}
    partition = (rec.get("partition") or {}).get("name")
    partitions = (partition,) if isinstance(partition, str) and partition else ()
    return [_with_reason_object(name, state, flags, reason, partitions) for name in names]


def _with_reason_object(
    name: str, state: str, flags: tuple, reason: dict, partitions: tuple = ()
) -> NodeInfo:
    return NodeInfo(
        name=name,
        state=state,
        flags=flags,
        reason=(reason.get("description") or "").strip(),
        reason_user=reason.get("user") or "",
        reason_time=_epoch(reason.get("time")),
        partitions=partitions,
    )


@_json_shape
def parse_jobs_json(text: str, expand: Callable[[str], list[str]] | None = None) -> list[JobInfo]:
    """Parse `squeue --json`, `scontrol show job --json` or slurmrestd `/jobs` (22.05-25.11)."""
    expand = expand or _expand_lenient
    return [_job_from_record(r, expand) for r in json.loads(text).get("jobs") or []]


def _job_from_record(rec: dict, expand: Callable[[str], list[str]]) -> JobInfo:
    state = rec.get("job_state") or ""
    if isinstance(state, list):
        state = state[0] if state else ""
    code, sig = _json_exit(rec.get("exit_code"))
    reason = rec.get("state_description") or rec.get("state_reason") or ""
    return JobInfo(
        job_id=int(rec["job_id"]),
        user=rec.get("user_name") or "",
        uid=_number(rec.get("user_id")),
        state=state,
        reason=job_reason(reason),
        nodes=tuple(expand(rec.get("nodes") or "")),
        batch_host=rec.get("batch_host") or "",
        stdout=rec.get("stdout_expanded") or rec.get("standard_output") or "",
        stderr=rec.get("stderr_expanded") or rec.get("standard_error") or "",
        work_dir=rec.get("current_working_directory") or "",
        exit_code=code,
        exit_signal=sig,
        restarts=_number(rec.get("restart_cnt")) or 0,
        comment=rec.get("comment") or "",
        admin_comment=rec.get("admin_comment") or "",
        excluded_nodes=tuple(expand(rec.get("excluded_nodes") or "")),
        requeue=bool(rec.get("requeue")),
        partition=rec.get("partition") or "",
        required_nodes=tuple(expand(rec.get("required_nodes") or "")),
        end_time=ended_at(_epoch(rec.get("end_time"))),
    )


def ended_at(epoch: int | None) -> int | None:
    """A job's end time, None while it has not ended.

    JSON and pyslurm give a pending or running job its expected end (start + time limit);
    scontrol prints `EndTime=Unknown` for it, and 0 for a job put back in the queue.
    """
    import time

    return epoch if epoch and epoch <= time.time() else None


def job_reason(text: str | None) -> str:
    """A job's state reason as scontrol prints it: whitespace as underscores (info_job.c)."""
    return re.sub(r"\s", "_", (text or "").strip())


def _json_exit(value: object) -> tuple[int, int]:
    """(exit code, signal) from 23.11+'s object or 22.05's integer."""
    if isinstance(value, dict):
        rc = value.get("return_code")
        sig = (value.get("signal") or {}).get("id")
        return _number(rc) or 0, _number(sig) or 0
    raw = _number(value) or 0
    # 22.05 prints a plain integer (only 0 seen in the recorded samples); a raw wait status
    # (>255) is decoded the way scontrol prints ExitCode=code:signal.
    return ((raw >> 8) & 0xFF, raw & 0x7F) if raw > 255 else (raw, 0)


def _number(value: object) -> int | None:
    """An int from a plain number or 23.11+'s {set, infinite, number}; None when unset."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _epoch(value: object) -> int | None:
    n = _number(value)
    return n if n else None  # Slurm writes 0 for "never"


def _int(value: str | None) -> int | None:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _text(value: str | None) -> str:
    return "" if value is None or value in _NULLS else value

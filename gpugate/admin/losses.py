"""What failures cost, for `gpugate report`: the bundles of the window, the requeue decisions
(EpilogSlurmctld's lines in events.jsonl) and GPU-hours lost by cause.

GPU-hours lost, per bundle (one job, node and run): the job's GPUs on that node times the
time from the last complete checkpoint (the one the epilog recorded at the end, as the job's
user; else the one the requeue found, by its modification time when the report can see it;
never before the run's start: earlier work was lost, and counted, in the run before) to the
failure; the run's start when there is no checkpoint. Everything read
here is untrusted: a summary that is not what the epilog writes is skipped, never raised.

Only a job's bundle is a failed run. A bundle's kind (store/summary.bundle_kind) keeps the
others apart: a qualification (`gpugate qualify`: passed, failed with its DCGM or bandwidth
reason, or not qualified) and a drill (a job's run that ended under a fault drill: a simulated
fault, never a failure nor "undiagnosed"); `read_bundles` reads them all.
"""

from __future__ import annotations

import os

from gpugate.clock import parse_utc
from gpugate.log import read_events
from gpugate.record import Record
from gpugate.store.evidence import INDEX_DIR, read_index, read_summary
from gpugate.store.summary import EvidenceSummary, QualifySummary, bundle_kind

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, TypeVar

    from gpugate.log import Event

    _T = TypeVar("_T")

UNDIAGNOSED = "undiagnosed"  # a bundle whose diagnosis named no category
EVENTS = "events.jsonl"  # gpugate.log's file in the state directory
REQUEUE_HOOK = "epilog-slurmctld"
MATCH_SLACK_S = 600.0  # a requeue line written this long before the bundle's time still matches

HOW_COMPUTED = (
    "GPU-hours lost = the job's GPUs on the node \u00d7 the time from its last complete "
    "checkpoint (the one the epilog recorded at the job's end, else the one the requeue found, "
    "by its modification time; never before the run's start) to the failure; from the run's start when there is no checkpoint or this report "
    "cannot read it. One term per bundle (job, node, run), "
    "summed by the bundle's failure category. A job whose GPUs on the node are unknown counts "
    "the node's GPUs."
)


def _time(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        return float(value)
    return parse_utc(value) if isinstance(value, str) else None


def bundle_paths(evidence_dir: str, since: float) -> list[str]:
    """The bundles indexed since `since` (relative paths `<job>/<node>-r<n>`), oldest first."""
    try:
        names = sorted(os.listdir(os.path.join(evidence_dir, INDEX_DIR)))
    except OSError:  # no evidence yet, or not readable by this user
        return []
    found = []
    for name in names:
        node = name[: -len(".jsonl")] if name.endswith(".jsonl") else ""
        read = read_index(evidence_dir, node) if node and not node.startswith(".") else None
        for e in read.entries if read else ():
            if e.at >= since and ".old-" not in e.path:
                found.append((e.at, e.path))
    return [p for _, p in sorted(found)]


class Qualification(Record):
    """A qualification bundle's outcome (passed / failed / not_qualified), its label, and why."""

    outcome: str
    label: str
    why: str | None
    fault_kind: str | None
    hardware_fault: bool
    run_id: str | None


class Bundle(Record):
    """One readable bundle of the window: job, node, run, kind, category, GPUs, times, its
    recorded checkpoint; a qualification's outcome, a drill's id; once costed (`costed`) its
    requeue decision and GPU-hours lost, and the page's link to it (`href`)."""

    path: str  # `<job>/<node>-r<n>`, under the evidence root
    job: str
    node: str
    kind: str  # job, qualify, drill (store/summary.bundle_kind)
    restart: int = 0
    sluid: str | None = None  # the run's SLURM_JOB_SLUID, where Slurm gave one
    user: str | None = None  # the job's user (admin/reliability.py counts distinct users)
    failing_node: str | None = None  # the failing rank's node, where the diagnosis found it
    category: str = UNDIAGNOSED
    gpus: int | None = None  # the job's GPUs on the node (unknown: the node's)
    start: float | None = None  # the run's start (epoch)
    failed: float | None = None  # its failure (first failure, job end, or collection)
    recorded_checkpoint: str | None = None  # the checkpoint the epilog measured at the end
    recorded_checkpoint_at: float | None = None
    checkpoint_age_s: float | None = None
    checkpoint_stale: bool = False
    qualification: Qualification | None = None  # kind qualify
    drill: str | None = None  # kind drill: its id
    hardware_findings: tuple[str, ...] = ()  # kind drill: the simulated fault's findings
    # costed(): the requeue decision after the run and what the failure cost.
    checkpoint: str | None = None
    requeued: bool | None = None
    gpu_hours: float | None = None
    lost_from: float | None = None
    from_checkpoint: bool = False
    href: str | None = None  # the report page's link to the bundle


def read_bundles(evidence_dir: str, since: float) -> list[Bundle]:
    """One record per readable bundle of the window, each with its `kind` (job, qualify,
    drill): job, node, run, category, GPUs, times; a qualification's outcome; a drill's id."""
    out = []
    for rel in bundle_paths(evidence_dir, since):
        s = read_summary(os.path.join(evidence_dir, rel))
        if s is None:
            continue
        job, node = rel.split("/", 1)[0], s.node or rel.split("/", 1)[1]
        if isinstance(s, QualifySummary):
            out.append(Bundle(path=rel, job=job, node=node, kind=bundle_kind(s),
                              failed=_time(s.when), qualification=qualification(s)))  # fmt: skip
        else:
            out.append(_run(rel, job, node, s))
    return _drilled_runs(out)


def _run(rel: str, job: str, node: str, s: EvidenceSummary) -> Bundle:
    """A job's (or a drill's) run: restart, category, GPUs, times, its checkpoint, the drill."""
    kind = bundle_kind(s)
    ckpt = s.checkpoint
    drill = kind == "drill"
    return Bundle(
        path=rel, job=job, node=node, kind=kind, restart=s.restart, sluid=s.sluid,
        user=s.user or (s.job.user if s.job else None), failing_node=s.failing_node,
        category=s.category or UNDIAGNOSED, gpus=_gpus(s), start=_time(s.job_start),
        failed=_time(s.first_failure_at) or _time(s.job_end) or _time(s.collected_at),
        # The checkpoint the epilog measured at the end (freshness.py), when the bundle has one.
        recorded_checkpoint=ckpt.path if ckpt else None,
        recorded_checkpoint_at=_time(ckpt.mtime) if ckpt else None,
        checkpoint_age_s=_time(s.checkpoint_age_s), checkpoint_stale=s.checkpoint_stale is True,
        drill=s.drill if drill else None,
        hardware_findings=tuple(s.hardware_findings) if drill else (),
    )  # fmt: skip


def _drilled_runs(bundles: list[Bundle]) -> list[Bundle]:
    """A run of a job that a drill killed is the drill's on every node: the other nodes' ranks
    died of it (an NCCL timeout) outside the drill's overlay, and their bundles say job."""
    # A run is its job, restart count and SLUID: a reused job id's earlier job is another.
    drills = {(b.job, b.restart, b.sluid): b.drill for b in bundles if b.kind == "drill"}
    return [b.replace(kind="drill", drill=drills[b.job, b.restart, b.sluid], hardware_findings=())
            if b.kind == "job" and (b.job, b.restart, b.sluid) in drills else b
            for b in bundles]  # fmt: skip


def read_failures(evidence_dir: str, since: float) -> list[Bundle]:
    """The window's failed runs: the bundles of kind job (read_bundles)."""
    return [b for b in read_bundles(evidence_dir, since) if b.kind == "job"]


QUALIFY_LABELS = {"passed": "passed qualification", "failed": "qualification failure",
                  "not_qualified": "not qualified"}  # fmt: skip


def qualification(summary: QualifySummary) -> Qualification:
    """A qualification bundle's outcome (passed / failed / not_qualified), its label, and why:
    the first failure (DCGM's or the bandwidth's detail) for a failure, the verdict's why
    otherwise. Bundles written before `outcome` are read from passed and their tests."""
    tests = [t for t in summary.tests if isinstance(t, dict)]
    bad = [t for t in tests if t.get("ok") is False]
    outcome = summary.outcome
    if outcome not in QUALIFY_LABELS:
        outcome = "passed" if summary.passed else "failed" if bad else "not_qualified"
    why = summary.failure if outcome == "failed" else None
    if not why:
        first = bad[0] if bad and outcome == "failed" else None
        why = f"{first.get('test')}: {first.get('detail')}" if first else summary.why
    return Qualification(outcome=outcome, label=QUALIFY_LABELS[outcome],
                         why=str(why) if why else None, fault_kind=summary.fault_kind,
                         hardware_fault=summary.hardware_fault, run_id=summary.run_id)  # fmt: skip


def _gpus(summary: EvidenceSummary) -> int | None:
    # The job's GPU indices on the node; unknown (an older bundle, no SLURM_JOB_GPUS): the node's.
    if summary.gpus is not None:
        return len(summary.gpus)
    count = summary.node_gpus
    return count if count is not None and count >= 0 else None


class Requeue(Record):
    """One EpilogSlurmctld decision (its events.jsonl line), with its time as epoch seconds
    and the keys the readers use, typed (a value of another type reads as not given)."""

    event: Event  # the line as written
    when: float
    job: str
    restarts: int | None = None  # the run it decided on
    requeue: bool | None = None
    why: str | None = None
    category: str | None = None
    suspects: tuple[str, ...] = ()
    checkpoint: str | None = None  # where EpilogSlurmctld found the newest complete one
    ckpt_dir: str | None = None
    said: str | None = None  # what the user was told

    def to_json(self) -> dict[str, Any]:
        """The line as written, and `when` (for `gpugate evidence --json`)."""
        return dict(self.event.to_json(), when=self.when)

    def resumed_from(self) -> tuple[str | None, str]:
        """(checkpoint path or None, words) for what this decision's run resumed from."""
        return resumed_from(self.checkpoint, self.requeue is True, self.ckpt_dir)


def decision(e: Event, when: float | None = None) -> Requeue | None:
    """The decision of an `epilog-slurmctld` line (None: no job named, or no time)."""
    when = _time(e.time) if when is None else when
    x = e.extra
    job = x.get("job")
    if when is None or not isinstance(job, str):
        return None
    restarts = x.get("restarts")
    suspects = x.get("suspects")
    return Requeue(
        event=e, when=when, job=job,
        restarts=restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else None,
        requeue=_of(x.get("requeue"), bool), why=_of(x.get("why"), str),
        category=_of(x.get("category"), str),
        suspects=tuple(map(str, suspects)) if isinstance(suspects, list) else (),
        checkpoint=_of(x.get("checkpoint"), str), ckpt_dir=_of(x.get("ckpt_dir"), str),
        said=_of(x.get("said"), str),
    )  # fmt: skip


def _of(value: object, kind: type[_T]) -> _T | None:
    return value if isinstance(value, kind) else None


def requeue_events(dirs: str | Sequence[str], since: float) -> list[Requeue]:
    """EpilogSlurmctld's decisions since `since`, oldest first (events.jsonl, newest 32 MiB of
    each directory: the controller's, and state_dir where older releases wrote them)."""
    out = []
    for directory in (dirs,) if isinstance(dirs, str) else dict.fromkeys(dirs):
        out += _requeue_lines(directory, since)
    return sorted(out, key=lambda e: e.when)


def _requeue_lines(directory: str, since: float) -> list[Requeue]:
    try:
        found = read_events(directory, REQUEUE_HOOK)
    except OSError:
        return []
    out = []
    for e in found:
        when = _time(e.time)
        d = decision(e, when) if when is not None and when >= since else None
        if d is not None:
            out.append(d)
    return out


def resumed_from(path: str | None, requeue: bool, ckpt_dir: str | None) -> tuple[str | None, str]:
    """(checkpoint path or None, words) for what a requeue decision's run resumed from.

    The path only where EpilogSlurmctld looked it up (as root, as the job's user). With
    SlurmUser=slurm it cannot: the job's TaskProlog, running as the job's user on the new
    node, picks the newest complete checkpoint itself and writes it nowhere root or SlurmUser
    reads, so which one is unknown here, never "none"."""
    if path:
        return path, path
    if not requeue:
        return None, "-"
    if ckpt_dir:
        return None, (f"unknown: the newest complete checkpoint in {ckpt_dir}, picked by the "
                      "job's TaskProlog as the job's user")  # fmt: skip
    return None, ("unknown: no checkpoint directory in the job's comment (its TaskProlog also "
                  "reads GPUGATE_CKPT_DIR from the job's environment)")  # fmt: skip


def checkpoint_time(path: object) -> float | None:
    """A checkpoint's modification time, when this user can see it (None otherwise)."""
    if not isinstance(path, str) or not path.startswith("/"):
        return None  # no checkpoint, or an older release's "(not visible here: ...)"
    try:
        return os.stat(path).st_mtime
    except (OSError, ValueError):
        return None


def match_requeue(failure: Bundle, events: Sequence[Requeue]) -> Requeue | None:
    """The requeue decision taken after this bundle's run: same job (and run, when it says)."""
    for e in events:
        if e.job != failure.job:
            continue
        if e.restarts is not None:
            if e.restarts == failure.restart:
                return e
            continue
        if failure.failed is None or e.when >= failure.failed - MATCH_SLACK_S:
            return e
    return None


def lost_gpu_hours(
    failure: Bundle, checkpoint_at: float | None
) -> tuple[float | None, float | None]:
    """(GPU-hours lost, from when) for one bundle; (None, None) when its times are unknown."""
    start, failed, gpus = failure.start, failure.failed, failure.gpus
    if failed is None or gpus is None:
        return None, None
    frm = start
    if checkpoint_at is not None and (start is None or checkpoint_at > start):
        frm = checkpoint_at
    if frm is None:
        return None, None
    return gpus * max(0.0, failed - frm) / 3600.0, frm


def costed(
    failures: Sequence[Bundle],
    events: Sequence[Requeue],
    stat: Callable[[object], float | None] = checkpoint_time,
) -> list[Bundle]:
    """Each failure with its requeue decision, checkpoint, GPU-hours lost and their start."""
    out = []
    for f in failures:
        e = match_requeue(f, events)
        ckpt = e.checkpoint if e else None
        # The epilog's own record (read as the job's user at the end) before an mtime read now.
        at = f.recorded_checkpoint_at
        if at is not None:
            ckpt = f.recorded_checkpoint or ckpt
        else:
            at = stat(ckpt)
        hours, frm = lost_gpu_hours(f, at)
        out.append(f.replace(checkpoint=ckpt, requeued=e.requeue if e else None,
                             gpu_hours=hours, lost_from=frm,
                             from_checkpoint=at is not None and frm == at))  # fmt: skip
    return out


def by_category(costs: Sequence[Bundle]) -> list[tuple[str, int, float]]:
    """(category, bundles, GPU-hours lost) per category, most GPU-hours first."""
    acc: dict[str, tuple[int, float]] = {}
    for c in costs:
        n, h = acc.get(c.category, (0, 0.0))
        acc[c.category] = (n + 1, h + (c.gpu_hours or 0.0))
    rows = [(k, n, h) for k, (n, h) in acc.items()]
    return sorted(rows, key=lambda r: (-r[2], -r[1], r[0]))

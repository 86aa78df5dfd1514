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
from gpugate.store.evidence import INDEX_DIR, read_index, read_summary
from gpugate.store.summary import EvidenceSummary, QualifySummary, bundle_kind

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

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


def read_bundles(evidence_dir: str, since: float) -> list[dict[str, Any]]:
    """One record per readable bundle of the window, each with its `kind` (job, qualify,
    drill): job, node, run, category, GPUs, times; a qualification's outcome; a drill's id."""
    out = []
    for rel in bundle_paths(evidence_dir, since):
        s = read_summary(os.path.join(evidence_dir, rel))
        if s is None:
            continue
        job, node = rel.split("/", 1)[0], s.node or rel.split("/", 1)[1]
        record: dict[str, Any] = {"path": rel, "job": job, "node": node, "kind": bundle_kind(s)}
        if isinstance(s, QualifySummary):
            record.update(restart=0, category=UNDIAGNOSED, gpus=None, start=None,
                          failed=_time(s.when), **_recorded_checkpoint(None), **qualification(s))  # fmt: skip
        else:
            record.update(_run(s))
        out.append(record)
    return _drilled_runs(out)


def _run(s: EvidenceSummary) -> dict[str, Any]:
    """A job's (or a drill's) run: restart, category, GPUs, times, its checkpoint, the drill."""
    out = {
        "restart": s.restart, "category": s.category or UNDIAGNOSED, "gpus": _gpus(s),
        "start": _time(s.job_start),
        "failed": _time(s.first_failure_at) or _time(s.job_end) or _time(s.collected_at),
        **_recorded_checkpoint(s),
    }  # fmt: skip
    if bundle_kind(s) == "drill":
        out.update(drill=s.drill, hardware_findings=list(s.hardware_findings))
    return out


def _drilled_runs(bundles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run of a job that a drill killed is the drill's on every node: the other nodes' ranks
    died of it (an NCCL timeout) outside the drill's overlay, and their bundles say job."""
    drills = {(b["job"], b["restart"]): b.get("drill") for b in bundles if b["kind"] == "drill"}
    for b in bundles:
        if b["kind"] == "job" and (b["job"], b["restart"]) in drills:
            b.update(kind="drill", drill=drills[b["job"], b["restart"]], hardware_findings=[])
    return bundles


def read_failures(evidence_dir: str, since: float) -> list[dict[str, Any]]:
    """The window's failed runs: the bundles of kind job (read_bundles)."""
    return [b for b in read_bundles(evidence_dir, since) if b["kind"] == "job"]


QUALIFY_LABELS = {"passed": "passed qualification", "failed": "qualification failure",
                  "not_qualified": "not qualified"}  # fmt: skip


def qualification(summary: QualifySummary) -> dict[str, Any]:
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
    return {"outcome": outcome, "label": QUALIFY_LABELS[outcome],
            "why": str(why) if why else None, "fault_kind": summary.fault_kind,
            "hardware_fault": summary.hardware_fault, "run_id": summary.run_id}  # fmt: skip


def _recorded_checkpoint(summary: EvidenceSummary | None) -> dict[str, Any]:
    """The checkpoint the epilog measured at the end (freshness.py), when the bundle has one."""
    ckpt = (summary.checkpoint if summary else None) or {}
    path = ckpt.get("path")
    return {"recorded_checkpoint": path if isinstance(path, str) else None,
            "recorded_checkpoint_at": _time(ckpt.get("mtime")),
            "checkpoint_age_s": _time(summary.checkpoint_age_s if summary else None),
            "checkpoint_stale": summary.checkpoint_stale is True if summary else False}  # fmt: skip


def _gpus(summary: EvidenceSummary) -> int | None:
    # The job's GPU indices on the node; unknown (an older bundle, no SLURM_JOB_GPUS): the node's.
    if summary.gpus is not None:
        return len(summary.gpus)
    count = summary.node_gpus
    return count if count is not None and count >= 0 else None


def requeue_events(dirs: str | Sequence[str], since: float) -> list[dict[str, Any]]:
    """EpilogSlurmctld's decisions since `since`, oldest first (events.jsonl, newest 32 MiB of
    each directory: the controller's, and state_dir where older releases wrote them)."""
    out = []
    for directory in (dirs,) if isinstance(dirs, str) else dict.fromkeys(dirs):
        out += _requeue_lines(directory, since)
    return sorted(out, key=lambda e: e["when"])


def _requeue_lines(directory: str, since: float) -> list[dict[str, Any]]:
    try:
        found = read_events(directory, REQUEUE_HOOK)
    except OSError:
        return []
    out = []
    for e in found:
        when = _time(e.time)
        if when is None or when < since or not isinstance(e.extra.get("job"), str):
            continue
        out.append(dict(e.to_json(), when=when))
    return out


def resumed_from(event: dict[str, Any]) -> tuple[str | None, str]:
    """(checkpoint path or None, words) for what a requeue decision's run resumed from.

    The path only where EpilogSlurmctld looked it up (as root, as the job's user). With
    SlurmUser=slurm it cannot: the job's TaskProlog, running as the job's user on the new
    node, picks the newest complete checkpoint itself and writes it nowhere root or SlurmUser
    reads, so which one is unknown here, never "none"."""
    path, ckpt_dir = event.get("checkpoint"), event.get("ckpt_dir")
    if isinstance(path, str) and path:
        return path, path
    if event.get("requeue") is not True:
        return None, "-"
    if isinstance(ckpt_dir, str) and ckpt_dir:
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


def match_requeue(failure: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The requeue decision taken after this bundle's run: same job (and run, when it says)."""
    for e in events:
        if e["job"] != failure["job"]:
            continue
        run = e.get("restarts")
        if isinstance(run, int) and not isinstance(run, bool):
            if run == failure["restart"]:
                return e
            continue
        if failure["failed"] is None or e["when"] >= failure["failed"] - MATCH_SLACK_S:
            return e
    return None


def lost_gpu_hours(
    failure: dict[str, Any], checkpoint_at: float | None
) -> tuple[float | None, float | None]:
    """(GPU-hours lost, from when) for one bundle; (None, None) when its times are unknown."""
    start, failed, gpus = failure["start"], failure["failed"], failure["gpus"]
    if failed is None or gpus is None:
        return None, None
    frm = start
    if checkpoint_at is not None and (start is None or checkpoint_at > start):
        frm = checkpoint_at
    if frm is None:
        return None, None
    return gpus * max(0.0, failed - frm) / 3600.0, frm


def costed(
    failures: list[dict[str, Any]],
    events: list[dict[str, Any]],
    stat: Callable[[object], float | None] = checkpoint_time,
) -> list[dict[str, Any]]:
    """Each failure with its requeue decision, checkpoint, GPU-hours lost and their start."""
    out = []
    for f in failures:
        e = match_requeue(f, events)
        ckpt = e.get("checkpoint") if e else None
        # The epilog's own record (read as the job's user at the end) before an mtime read now.
        at = f.get("recorded_checkpoint_at")
        if at is not None:
            ckpt = f.get("recorded_checkpoint") or ckpt
        else:
            at = stat(ckpt)
        hours, frm = lost_gpu_hours(f, at)
        out.append(dict(f, checkpoint=ckpt, requeued=e.get("requeue") if e else None,
                        gpu_hours=hours, lost_from=frm,
                        from_checkpoint=at is not None and frm == at))  # fmt: skip
    return out


def by_category(costs: Sequence[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """(category, bundles, GPU-hours lost) per category, most GPU-hours first."""
    acc: dict[str, list[Any]] = {}
    for c in costs:
        slot = acc.setdefault(c["category"], [0, 0.0])
        slot[0] += 1
        slot[1] += c["gpu_hours"] or 0.0
    rows = [(k, n, h) for k, (n, h) in acc.items()]
    return sorted(rows, key=lambda r: (-r[2], -r[1], r[0]))

"""Prometheus metrics as a node_exporter textfile (`admin.metrics_file`), written atomically.

Series (every one labelled with the Slurm `node`):

- `gpugate_node_healthy` gauge: 1 when the last checks passed and this run drained nothing.
- `gpugate_check_status{check}` gauge, one per check: 0 ok, 1 warn, 2 fail, 3 unknown (could
  not be evaluated). One series per check rather than one per (check, status): alerts read
  `== 2`, and a status change never leaves a stale series behind.
- `gpugate_prolog_duration_seconds` gauge: the last prolog's own run time.
- `gpugate_drains_total{check}`, `gpugate_diagnoses_total{category}` (a verdict of medium or
  low confidence counts as category "uncertain"), `gpugate_job_ends_total{result}` (ok /
  failed: each job run as the epilog judged it by its own end; a requeued run that completes
  is an ok),
  `gpugate_unknown_xids_total{xid}`, `gpugate_internal_errors_total`, `gpugate_drain_budget_exceeded_total` counters.
- `gpugate_false_drains_total{check}` counter: drains lifted (by `gpugate resume` or by
  healing) with no repair since the drain (history.lifted_without_repair); a drill's drain is
  never one.
- Fault drills (gpugate/drill): a hook run under a drill's overlay (reasons.drill_mark) counts
  its drain in `gpugate_drill_drains_total{check}`, not in gpugate_drains_total; its diagnosis
  in no category; its job end as `gpugate_job_ends_total{result="drill"}`, not as failed.
  `gpugate_drill_active` gauge: 1 when the node's last run saw a drill's overlay, 0 after the
  next run without one (absent on a node never drilled): the alert rules keep quiet on it.
- `gpugate_last_run_timestamp_seconds{hook}` gauge.
- `gpugate_isolated_gpus` gauge: the GPUs gpugate took out of the node's service (isolate.unit:
  gpu, gpugate/isolate/), set by the isolation and its reversal through note_isolated(); 0 once
  they are back. Absent on a node that never had one.
- `gpugate_checkpoint_age_seconds` gauge: at the last measured job end on the node (an
  abnormal end of a job with `gpugate:ckpt=DIR`), how old its newest complete checkpoint was;
  `gpugate_checkpoint_stale_ends_total` counter: such ends over `checkpoints.max_age_s`.
- Each check's roll-out stage and false-drain rate over the history window (issue 45), in
  their own file beside it (CHECKS_FILE), rewritten whole by `gpugate report` on the host that
  runs it; labelled `check` only (the cluster's history, no node; a check id or "other"):
  `gpugate_check_rollout{check}` gauge (0 acting, 1 canary-only, 2 report-only),
  `gpugate_check_window_drains{check}` and `gpugate_check_window_false_drains{check}` gauges,
  `gpugate_check_false_drain_ratio{check}` gauge (false drains / drains lifted through
  gpugate; absent while none is lifted). admin/rollout.py says how each is counted.
- The fleet reliability figures of the history window (issue 46, admin/reliability.py: MTBF
  per node, board, check and fleet, repeat offenders, jobs that failed only on one node,
  GPU-hours lost per cause, the drain reason grammar's version), in RELIABILITY_FILE beside
  it, rewritten whole by `gpugate report` (write_beside); the families after
  gpugate_check_false_drain_ratio below, each label bounded (the comment there says how).
- Qualification (`gpugate qualify`, issue 17), in their own file beside it (QUALIFY_FILE: the
  admin host that runs qualifications writes the series of every node it qualified):
  `gpugate_qualify_bandwidth_gbps{test}` gauge (the last run's value: allreduce busbw, h2d's
  slowest GPU, pair: the node's slowest pair), `gpugate_qualify_last_pass_timestamp_seconds`
  gauge, `gpugate_qualify_runs_total{result}` counter (passed / failed / not_qualified: a run
  that proved nothing, e.g. a step not run, is neither a pass nor a failure).

The file is the only state: each update reads the previous file back, so counters keep
counting across runs (a lost file restarts them at 0, which Prometheus reads as a counter
reset). Prologs and epilogs of several jobs can run at once, so the read-modify-write holds an
flock on a lock file of its own in `<state_dir>/locks/` (root's only), never in node_exporter's
directory: any user can open a 0644 file there read-only, and flock it, and a fold that waited
on it froze every hook of the node (issue 25, attack 8). The lock is tried for at most
locks.METRICS_WAIT_S: a metric is never worth a hook's time, so without the lock the update is
skipped, said in slurmd's log and counted (a file in `metrics.skipped.d/` in the state
directory, added to `gpugate_metrics_skipped_total` by the next update). The new file is
written to a hidden temporary name in the same directory and renamed over the old one (node_exporter reads only
`*.prom`).
"""

from __future__ import annotations

import os
import re
import stat
import time

from gpugate import log
from gpugate.fsutil import (
    FileLock,
    atomic_write,
    lock_file,
    open_private,
    open_regular,
    private_dir,
)
from gpugate.regex import lazy
from gpugate.slurm.reasons import drill_mark
from gpugate.store import locks
from gpugate.store.dirs import CHECKS_FILE as CHECKS_FILE  # beside admin.metrics_file
from gpugate.store.dirs import QUALIFY_FILE as QUALIFY_FILE  # beside admin.metrics_file
from gpugate.store.dirs import RELIABILITY_FILE as RELIABILITY_FILE  # beside admin.metrics_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config
    from gpugate.store.qualify import QualifyEntry

UNCERTAIN = "uncertain"  # gpugate_diagnoses_total's category for a medium or low verdict
STATUS_VALUE = {"ok": 0, "warn": 1, "fail": 2, "unknown": 3}
# Folding several findings of one check (one per GPU): the worst wins, and "could not
# evaluate" is worse than a warning (it could be hiding a failure).
_WORST_FIRST = ("fail", "unknown", "warn", "ok")

# name -> (type, help, the labels after `node`). Also the order of the file.
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "gpugate_node_healthy": (
        "gauge", "1 when the node passed gpugate's last checks and was not drained, else 0.", ()),
    "gpugate_check_status": (
        "gauge", "Last status of each check: 0 ok, 1 warn, 2 fail, 3 unknown (not evaluated).",
        ("check",)),
    "gpugate_prolog_duration_seconds": (
        "gauge", "Run time of the last gpugate prolog on this node.", ()),
    "gpugate_drains_total": (
        "counter", "Drains gpugate set on this node, by the check that failed.", ("check",)),
    "gpugate_diagnoses_total": (
        "counter", "Abnormal job ends diagnosed by the epilog, by failure category.",
        ("category",)),
    "gpugate_job_ends_total": (
        "counter", "Job runs ended on this node, as the epilog judged each run by its own end: "
        "ok or failed (drill: ended under a fault drill).", ("result",)),
    "gpugate_unknown_xids_total": (
        "counter", "Xids not in NVIDIA's catalog seen by a prolog on this node (warned, kept).",
        ("xid",)),
    "gpugate_internal_errors_total": (
        "counter", "Runs in which gpugate itself failed (logged in the state directory).", ()),
    "gpugate_drain_budget_exceeded_total": (
        "counter", "Drains gpugate did not do because the drain budget was spent.", ()),
    "gpugate_metrics_skipped_total": (
        "counter", "Hook runs whose metrics update was skipped: the textfile's lock was busy.",
        ()),
    "gpugate_drill_drains_total": (
        "counter", "Drains a fault drill (gpugate drill) set on this node, by check: never a "
        "fault, never in gpugate_drains_total.", ("check",)),
    "gpugate_drill_active": (
        "gauge", "1 when gpugate's last run on this node saw a fault drill's overlay, else 0.",
        ()),
    "gpugate_false_drains_total": (
        "counter", "Drains of this node lifted without any repair (no new boot, no GPU reset "
        "recorded), by the check that drained it.", ("check",)),
    "gpugate_isolated_gpus": (
        "gauge", "GPUs gpugate took out of this node's service (isolated), 0 once back.", ()),
    "gpugate_last_run_timestamp_seconds": (
        "gauge", "Unix time of the last run of each gpugate hook.", ("hook",)),
    "gpugate_checkpoint_age_seconds": (
        "gauge", "Age of the newest complete checkpoint at the last measured job end here.", ()),
    "gpugate_checkpoint_stale_ends_total": (
        "counter", "Job ends here whose work since the newest complete checkpoint was over "
        "checkpoints.max_age_s.", ()),
    "gpugate_check_rollout": (
        "gauge", "Each check's roll-out stage: 0 acting, 1 canary-only (acts in the canary "
        "partitions), 2 report-only (never drains).", ("check",)),
    "gpugate_check_window_drains": (
        "gauge", "Drains gpugate set for each check in the history window (drills not counted).",
        ("check",)),
    "gpugate_check_window_false_drains": (
        "gauge", "Drains of each check in the history window lifted with no repair since.",
        ("check",)),
    "gpugate_check_false_drain_ratio": (
        "gauge", "False drains / drains lifted through gpugate, per check, in the history "
        "window.", ("check",)),
    # RELIABILITY_FILE (`gpugate report`, admin/reliability.py has the definitions): gauges of
    # the history window. Labels stay bounded: node (the cluster's nodes), board (the GPU
    # types slurm.conf's Gres names), check (registered check ids, else "other"), cause (the
    # diagnosis categories, "undiagnosed", else "other").
    "gpugate_reason_grammar_version": (
        "gauge", "Version of the drain reason grammar gpugate writes (docs/interfaces.md).", ()),
    "gpugate_fleet_window_failures": (
        "gauge", "Failures (outages gpugate's drains started) in the history window, all nodes.",
        ()),
    "gpugate_fleet_in_service_hours": (
        "gauge", "Node-hours in service in the history window, all nodes.", ()),
    "gpugate_fleet_mtbf_hours": (
        "gauge", "Mean time between failures of the fleet's nodes: node-hours in service per "
        "failure in the history window.", ()),
    "gpugate_board_window_failures": (
        "gauge", "Failures in the history window of the nodes of each board (Gres GPU type).",
        ("board",)),
    "gpugate_board_mtbf_hours": (
        "gauge", "Mean time between failures per node of each board, in the history window.",
        ("board",)),
    "gpugate_check_window_failures": (
        "gauge", "Failures each check started in the history window.", ("check",)),
    "gpugate_check_mtbf_hours": (
        "gauge", "Fleet node-hours in service per failure of each check, in the history window.",
        ("check",)),
    "gpugate_node_window_failures": (
        "gauge", "Failures of the node in the history window (nodes with one or more).",
        ("node",)),
    "gpugate_node_mtbf_hours": (
        "gauge", "Hours in service per failure of the node in the history window.", ("node",)),
    "gpugate_node_repeat_drains": (
        "gauge", "Drains of a repeat offender (drained twice or more) in the history window.",
        ("node",)),
    "gpugate_node_failed_only_here_jobs": (
        "gauge", "Jobs that failed on the node and later completed elsewhere, in the window.",
        ("node",)),
    "gpugate_node_failed_only_here_users": (
        "gauge", "Distinct users of the jobs that failed only on the node, in the window.",
        ("node",)),
    "gpugate_cause_window_gpu_hours_lost": (
        "gauge", "GPU-hours lost to failed job runs in the history window, by failure cause.",
        ("cause",)),
    "gpugate_cause_window_failed_runs": (
        "gauge", "Failed job runs (bundles) in the history window, by failure cause.",
        ("cause",)),
    "gpugate_qualify_bandwidth_gbps": (
        "gauge", "Bandwidth (GB/s) the node's last qualification measured, by test.", ("test",)),
    "gpugate_qualify_last_pass_timestamp_seconds": (
        "gauge", "Unix time of the node's last passed qualification.", ()),
    "gpugate_qualify_runs_total": (
        "counter", "Qualifications of the node, by result (passed / failed / not_qualified).",
        ("result",)),
}  # fmt: skip
JOB_END_RESULTS = ("ok", "failed", "drill")
SKIPPED_DIR = (
    "metrics.skipped.d"  # in state_dir: one empty file per skipped update, until folded in
)
_SKIPPED_MAX = 10_000  # skips kept beyond this are dropped: the lock is stuck, the log says so

_SAMPLE = lazy(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = lazy(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}

if TYPE_CHECKING:  # for annotations only
    Key = tuple[str, tuple[tuple[str, str], ...]]  # (name, ((label, value), ...))
    Samples = dict[Key, float]
READ_MAX = 4 * 1024 * 1024


def escape_label(value: str) -> str:
    """A label value as the exposition format wants it: `\\`, `"` and newlines escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def parse_samples(text: str) -> Samples:
    """Read the samples of gpugate's families back from a textfile (others are ignored)."""
    out: Samples = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in FAMILIES:
            continue
        labels = tuple(
            (k, re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], v))
            for k, v in _LABEL.findall(m.group(2) or "")
        )
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            continue
    return out


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(value)


def render(samples: Samples) -> str:
    """The textfile: HELP and TYPE lines, then the family's samples, sorted."""
    lines = []
    for name, (kind, text, _) in FAMILIES.items():
        rows = sorted((labels, v) for (n, labels), v in samples.items() if n == name)
        if not rows:
            continue
        lines += [f"# HELP {name} {_escape_help(text)}", f"# TYPE {name} {kind}"]
        for labels, value in rows:
            body = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
            lines.append(
                f"{name}{{{body}}} {_number(value)}" if body else f"{name} {_number(value)}"
            )
    return "\n".join(lines) + "\n"


def check_statuses(
    findings: Iterable[Finding | dict[str, str]] | Mapping[str, str] | None,
) -> dict[str, str]:
    """{check: worst status} from findings (objects or dicts with check/status) or a mapping."""
    if findings is None:
        return {}
    if hasattr(findings, "items"):
        return dict(findings.items())
    worst: dict[str, str] = {}
    for f in findings:
        check = f["check"] if isinstance(f, dict) else f.check
        status = f["status"] if isinstance(f, dict) else f.status
        old = worst.get(check)
        if old is None or _rank(status) < _rank(old):
            worst[check] = status
    return worst


def _rank(status: str) -> int:
    return _WORST_FIRST.index(status) if status in _WORST_FIRST else 1


def apply_run(
    samples: Samples,
    node: str,
    hook: str,
    findings: Iterable[Finding | dict[str, str]] | Mapping[str, str] | None = None,
    duration_s: float | None = None,
    drained_check: str | None = None,
    category: str | None = None,
    internal_error: bool = False,
    now: float | None = None,
    confidence: str | None = None,
    budget_exceeded: bool = False,
    unknown_xids: Iterable[int] = (),
    false_drain_check: str | None = None,
    checkpoint_age_s: float | None = None,
    checkpoint_stale: bool = False,
    skipped: int = 0,
    job_end: str | None = None,
    drill: str | None = None,
) -> Samples:
    """The samples after one hook run (pure: the file handling is in update_metrics);
    `skipped`: earlier updates skipped since the last one (their lock was busy); `drill`: the
    drill whose overlay the run saw (its drain, diagnosis and job end are the drill's)."""
    # Only this node's series: a renamed node must not keep reporting under its old name.
    out = {k: v for k, v in samples.items() if dict(k[1]).get("node") == node}
    n: tuple[tuple[str, str], ...] = (("node", node),)
    key: Key
    statuses = check_statuses(findings)
    if statuses and hook == "prolog":
        # The prolog runs the whole checklist: a check that no longer runs (disabled) goes.
        out = {k: v for k, v in out.items() if k[0] != "gpugate_check_status"}
    for check, status in statuses.items():
        out[("gpugate_check_status", (*n, ("check", check)))] = STATUS_VALUE.get(status, 3)
    if drill:  # a simulated fault: no real drain, diagnosis or failed job to count
        category = None
        job_end = "drill" if job_end else None
    key = ("gpugate_drill_active", n)
    if drill or key in out:  # a node never drilled gets no series
        out[key] = 1 if drill else 0
    if drained_check:
        family = "gpugate_drill_drains_total" if drill else "gpugate_drains_total"
        key = (family, (*n, ("check", drained_check)))
        out[key] = out.get(key, 0) + 1
    if category:
        # Only a high-confidence verdict counts under its category: alerts on a category
        # (ecc_error) act on high confidence only, as the requeue does. A medium or low one
        # counts as "uncertain", not under an extra `confidence` label: the family keeps its
        # one label, so existing series, queries and files read back stay as they were.
        # (None: a caller that knows no confidence, counted as before.)
        if confidence not in (None, "high"):
            category = UNCERTAIN
        key = ("gpugate_diagnoses_total", (*n, ("category", category)))
        out[key] = out.get(key, 0) + 1
    if job_end in JOB_END_RESULTS:  # the epilog: this run's own end (ok / failed)
        key = ("gpugate_job_ends_total", (*n, ("result", job_end)))
        out[key] = out.get(key, 0) + 1
    for code in unknown_xids:
        key = ("gpugate_unknown_xids_total", (*n, ("xid", str(int(code)))))
        out[key] = out.get(key, 0) + 1
    if false_drain_check:  # a lift with no repair since the drain (store/outcomes.py)
        key = ("gpugate_false_drains_total", (*n, ("check", false_drain_check)))
        out[key] = out.get(key, 0) + 1
    key = ("gpugate_internal_errors_total", n)
    out[key] = out.get(key, 0) + (1 if internal_error else 0)
    key = ("gpugate_drain_budget_exceeded_total", n)
    out[key] = out.get(key, 0) + (1 if budget_exceeded else 0)
    key = ("gpugate_metrics_skipped_total", n)
    out[key] = out.get(key, 0) + max(0, int(skipped))
    _note_checkpoint(out, n, checkpoint_age_s, checkpoint_stale)
    if duration_s is not None and hook == "prolog":
        out[("gpugate_prolog_duration_seconds", n)] = round(float(duration_s), 6)
    out[("gpugate_last_run_timestamp_seconds", (*n, ("hook", hook)))] = round(
        time.time() if now is None else now, 3
    )
    if drained_check:
        out[("gpugate_node_healthy", n)] = 0
    elif statuses:
        fails = any(v == 2 for (name, _), v in out.items() if name == "gpugate_check_status")
        out[("gpugate_node_healthy", n)] = 0 if fails else 1
    else:
        out.setdefault(("gpugate_node_healthy", n), 1)
    return out


def _note_checkpoint(
    out: Samples, n: tuple[tuple[str, str], ...], age_s: float | None, stale: bool
) -> None:
    """The checkpoint series of one job end: the age (last value) and the stale ends."""
    if age_s is not None:
        out[("gpugate_checkpoint_age_seconds", n)] = round(float(age_s), 3)
    if stale:
        key = ("gpugate_checkpoint_stale_ends_total", n)
        out[key] = out.get(key, 0) + 1


def apply_isolated(samples: Samples, node: str, count: int) -> Samples:
    """The samples with the node's isolated-GPU gauge set to `count` (pure)."""
    # Only this node's series, as apply_run: a renamed node must not keep reporting.
    out = {k: v for k, v in samples.items() if dict(k[1]).get("node") == node}
    out[("gpugate_isolated_gpus", (("node", node),))] = max(0, int(count))
    return out


def note_isolated(config: Config, node: str | None, count: int) -> bool:
    """For the isolation and its reversal on the node: set gpugate_isolated_gpus to `count`
    in `admin.metrics_file`, never raising (as note_run); True if written."""
    path = config.admin.metrics_file
    if not path or not node or not os.path.isdir(os.path.dirname(path) or "."):
        return False
    try:
        written = _fold(path, config.state_dir, lambda prev: apply_isolated(prev, node, count))
    except Exception as exc:  # the isolation is done; a metric must not undo it
        log.error(config.state_dir, f"isolate: could not update {path}", exc)
        return False
    if not written:
        _skipped(config.state_dir, path, "isolate")
    return written


def qualify_result(entry: QualifyEntry) -> str:
    """passed / failed (a test failed) / not_qualified (nothing failed, something unproven)."""
    if entry.passed:
        return "passed"
    failed = any(t.ok is False for t in entry.tests)
    return "failed" if failed else "not_qualified"


def apply_qualification(samples: Samples, entries: Iterable[QualifyEntry]) -> Samples:
    """The samples after qualifications recorded as gpugate/store/qualify.py entries (pure)."""
    out = dict(samples)
    for e in entries:
        n = (("node", e.node),)
        key = ("gpugate_qualify_runs_total", (*n, ("result", qualify_result(e))))
        out[key] = out.get(key, 0) + 1
        if e.passed:
            out[("gpugate_qualify_last_pass_timestamp_seconds", n)] = round(float(e.when), 3)
        measured: dict[str, float] = {}
        for t in e.tests:
            value = t.value_gbps
            if value is not None and e.node in (t.nodes or [e.node]):
                name = t.test  # several pairs: the node's slowest one
                measured[name] = min(float(value), measured.get(name, float("inf")))
        for name, value in measured.items():
            out[("gpugate_qualify_bandwidth_gbps", (*n, ("test", name)))] = round(value, 3)
    return out


def note_qualification(config: Config, entries: list[QualifyEntry]) -> bool:
    """Fold recorded qualifications into QUALIFY_FILE beside `admin.metrics_file`, never
    raising (as note_run: nothing without node_exporter's directory); True if written."""
    path = config.admin.metrics_file
    if not path or not entries or not os.path.isdir(os.path.dirname(path) or "."):
        return False
    path = os.path.join(os.path.dirname(path) or ".", QUALIFY_FILE)
    try:
        written = _fold(path, config.state_dir, lambda prev: apply_qualification(prev, entries))
    except Exception as exc:  # the qualification is recorded; a metric must not undo it
        log.error(config.state_dir, f"qualify: could not update {path}", exc)
        return False
    if not written:
        _skipped(config.state_dir, path, "qualify")
    return written


ROLLOUT_VALUE = {"acting": 0, "canary-only": 1, "report-only": 2}


def check_rate_samples(rows: Iterable[Mapping[str, Any]]) -> Samples:
    """The per-check samples (pure): each row has check, rollout, drains, false_drains, rate."""
    out: Samples = {}
    for row in rows:
        c = (("check", str(row["check"])),)
        out[("gpugate_check_rollout", c)] = ROLLOUT_VALUE.get(str(row["rollout"]), 0)
        out[("gpugate_check_window_drains", c)] = int(row["drains"])
        out[("gpugate_check_window_false_drains", c)] = int(row["false_drains"])
        if row.get("rate") is not None:
            out[("gpugate_check_false_drain_ratio", c)] = round(float(row["rate"]), 6)
    return out


def note_check_rates(config: Config, rows: Iterable[Mapping[str, Any]]) -> str | None:
    """Write CHECKS_FILE beside `admin.metrics_file` (write_beside)."""
    return write_beside(config, CHECKS_FILE, check_rate_samples(rows))


def write_beside(config: Config, name: str, samples: Samples) -> str | None:
    """Write the file `name` beside `admin.metrics_file`, whole and atomically (gauges of the
    window: nothing to fold), never raising; its path if written, None when there is no such
    directory (no node_exporter here) or the write failed (said in the log)."""
    path = config.admin.metrics_file
    if not path or not os.path.isdir(os.path.dirname(path) or "."):
        return None
    path = os.path.join(os.path.dirname(path) or ".", name)
    try:
        atomic_write(path, render(samples), mode=0o644)
    except Exception as exc:  # a metric must never fail the report
        log.error(config.state_dir, f"report: could not write {path}", exc)
        return None
    return path


def _fold(path: str, state_dir: str, change: Callable[[Samples], Samples]) -> bool:
    """Read the textfile back, change its samples and write it again (locked, atomic); False
    when the lock was not had within locks.METRICS_WAIT_S (nothing written)."""
    lock = FileLock(lock_file(state_dir, locks.metrics_lock(path)), wait_s=locks.METRICS_WAIT_S)
    with lock:
        if not lock.held:
            return False
        try:
            # gpugate's series are a few KB; a bigger file is not ours to parse whole.
            fd = open_regular(path, follow=False)  # a FIFO in its place hangs no hook
            with os.fdopen(fd, encoding="utf-8") as fh:
                previous = parse_samples(fh.read(READ_MAX))
        except (OSError, UnicodeDecodeError):
            previous = {}
        atomic_write(path, render(change(previous)), mode=0o644)
    return True


def update_metrics(
    path: str,
    node: str,
    hook: str,
    findings: Iterable[Finding | dict[str, str]] | Mapping[str, str] | None = None,
    *,
    state_dir: str,
    **run: Any,
) -> bool:
    """Fold one hook run into the textfile at `path` (locked, atomic); OSError on failure,
    False when skipped (the lock, in `state_dir`, was busy: counted, and folded into
    gpugate_metrics_skipped_total by the next update).

    `findings` are this run's (with the policy's effective status where it differs): the
    prolog's replace every check's status, other hooks' update only the checks they name.
    `run` holds apply_run()'s other keywords (duration_s, drained_check, category, ...).
    """

    def change(previous: Samples) -> Samples:
        skipped = _take_skipped(state_dir)  # under the lock: counted once
        return apply_run(previous, node, hook, findings, skipped=skipped, **run)

    if _fold(path, state_dir, change):
        return True
    _skipped(state_dir, path, hook)  # every caller's skip is counted, not only the hooks'
    return False


def note_run(config: Config, node: str | None, hook: str, **run: Any) -> bool:
    """For the hooks: update_metrics() at `admin.metrics_file`, never raising; True if written.

    Nothing is written when the setting is null or its directory is missing (no
    node_exporter on this node): creating /var/lib/node_exporter would only hide that.
    """
    path = config.admin.metrics_file
    if not path or not node or not os.path.isdir(os.path.dirname(path) or "."):
        return False
    # Under a drill's overlay (checks/sources gather marks it): the run's counts are the drill's.
    run.setdefault("drill", drill_mark())
    try:
        written = update_metrics(path, node, hook, state_dir=config.state_dir, **run)
    except Exception as exc:  # metrics must never fail a hook, nor undo what it decided
        log.error(config.state_dir, f"{hook}: could not update {path}", exc)
        return False
    return written


def _skipped(state_dir: str, path: str, hook: str) -> None:
    """Say and count one skipped update (one empty file in SKIPPED_DIR; best effort)."""
    log.say(f"{hook}: metrics not updated: the lock of {path} was busy over "
            f"{locks.METRICS_WAIT_S:g} s (counted in gpugate_metrics_skipped_total)")  # fmt: skip
    try:
        folder = private_dir(os.path.join(state_dir, SKIPPED_DIR), 0o700)
        if len(os.listdir(folder)) >= _SKIPPED_MAX:
            return
        name = f"{os.getpid()}.{time.monotonic_ns()}"
        os.close(open_private(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except (OSError, ValueError):
        pass


def _take_skipped(state_dir: str) -> int:
    """How many updates were skipped since the last fold, each taken once (under the lock).

    One file per skip, counted as it is removed: a skip written while the count runs is
    either removed and counted now or left for the next fold. (A byte count in one file,
    read then truncated, lost the byte appended between the two.)
    """
    folder = os.path.join(state_dir, SKIPPED_DIR)
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return 0
        names = os.listdir(folder)
    except OSError:
        return 0  # none skipped (no folder), or unreadable: nothing to add
    taken = 0
    for name in names[:_SKIPPED_MAX]:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            continue
        taken += 1
    return taken

"""`gpugate report --html FILE`: failures and their cost, drains, evidence, requeues and repeat
offenders as one HTML page; `--json`: the same window's runs, qualifications, drills and drain
records as one JSON object on stdout."""

from __future__ import annotations

import json
import os
import sys
import time

from gpugate.admin import losses, reliability, reliability_page, report
from gpugate.admin import nodes as admin
from gpugate.admin.rollout import check_rates
from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, make_parser
from gpugate.commands import add_cluster_options
from gpugate.config import load_config
from gpugate.store import history, ledger
from gpugate.store.drills import drill_records
from gpugate.store.held import held_entries
from gpugate.store.history import drill_of
from gpugate.store.metrics import RELIABILITY_FILE, note_check_rates, write_beside
from gpugate.store.outcomes import check_record, drill_drains
from gpugate.store.suspects import FlagEntry, flags

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser
    from typing import Any

    from gpugate.admin.losses import Bundle, Requeue
    from gpugate.admin.nodes import IsolatedOn, NodeRow
    from gpugate.admin.reliability import Figures
    from gpugate.config.schema import Config
    from gpugate.store.drills import DrillEntry
    from gpugate.store.entries import AuditEntry, DrainEntry
    from gpugate.store.qualify import QualifyEntry


def parser() -> ArgumentParser:
    """Options of `gpugate report`."""
    p = make_parser(
        "gpugate report",
        "Write one self-contained HTML page (inline CSS, no script, no external asset): the "
        "drained nodes with reasons, suggested actions and evidence paths; job failures and "
        "GPU-hours lost by cause (from the evidence bundles), each failed run with a link to "
        "its bundle, the requeue decisions and the checkpoint each run resumed from, the drains "
        "the budget held back; the nodes drained repeatedly in the history window, and a "
        "timeline of drains and resumes (the drain history and the audit log), with charts; "
        "the GPUs isolated from their nodes (isolate.unit: gpu) and the GPU-hours those nodes "
        "kept serving; fleet reliability: mean time between failures per node, board (the "
        "GPU type Slurm's Gres names) and check, and the jobs that failed only on one node "
        "(also as gauges in gpugate-reliability.prom beside admin.metrics_file). "
        "Qualifications and fault drills are kept apart from failed runs, and drills' drains "
        "from the false-drain counts. --json prints the window's failed runs, qualifications, "
        "drills, drains by check, isolated_gpus, gpu_hours_kept_serving, "
        "gpu_hours_lost_by_cause, repeat_offenders and reliability as one JSON object. "
        "Exit 0; 1 when Slurm could not be read (the page is still "
        "written, from the history alone, and says so).",
    )
    p.add_argument("--html", metavar="FILE", help="write the page here")
    p.add_argument("--json", action="store_true",
                   help="print the window's runs, qualifications, drills and drains as JSON")  # fmt: skip
    add_cluster_options(p, "history window")
    return p


def main(argv: list[str]) -> int:
    """Run `gpugate report`."""
    p = parser()
    args = p.parse_args(argv)
    if not args.html and not args.json:
        p.error("give --html FILE, --json, or both")
    config = load_config(args.config)
    window = config.admin.history_window_days if args.window_days is None else args.window_days
    notice, groups = None, []
    try:
        slurm = None if args.sinfo_json else admin.cli_backend(config)
        groups = admin.read_node_groups(slurm, args.sinfo_json, admin.wants_comments(config))
    except admin.NodesUnavailable as exc:
        notice = f"{exc}. Drained nodes are missing; the history below is complete."
    except (OSError, ValueError) as exc:
        print(f"gpugate report: {args.sinfo_json}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    where = history.history_dir(config)
    drains = history.drains(where)
    rows = admin.rows_for(config, groups, drained_only=True, window_days=window, drains=drains)
    # A node kept in service with isolated GPUs has its own section, not a drained node's row.
    rows = [r for r in rows if r.drained or r.action != admin.NONE]
    page_dir = os.path.dirname(os.path.abspath(args.html or "."))
    costs, others = window_bundles(config, window, page_dir)
    drills = drill_entries(config)
    isolated = admin.isolated_gpus(groups)
    resumes = history.resumes(where)  # read once: a bad line is said once
    note_rates(config, window, drains, resumes, rows, groups)
    decisions = losses.requeue_events(events_dirs(config), history.window_start(window))
    fig = fleet_figures(window, drains, resumes, rows, groups, costs, decisions)
    note_reliability(config, window, fig, drains, costs)
    if args.json:
        print_json(config, window, costs, others, drains, resumes, rows, groups, isolated, fig)
        if not args.html:
            return EXIT_UNHEALTHY if notice else EXIT_OK
    page = report.render_html(
        rows,
        drains,
        resumes,
        window_days=window,
        total_nodes=sum(len(names) for _, names in groups) if groups else None,
        notice=notice,
        held=held_entries(where),
        costs=costs,
        requeues=decisions,
        qualifications=qualification_entries(where),
        flags=suspect_flags(history.read_dirs(config)),
        others=others,
        drills=drills,
        isolated=isolated,
        policy=config.policy,
        ledger=ledger.entries(where),
        reliability=reliability_page.sections(fig),
    )
    try:
        report.write_report(args.html, page)
    except OSError as exc:  # a missing directory, no permission, a full disk
        print(f"gpugate report: cannot write {args.html}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    # With --json too, stdout holds only the JSON.
    print(f"gpugate report: wrote {args.html}: {len(rows)} drained node(s); {tally(costs, others)}",
          file=sys.stderr if args.json else sys.stdout)  # fmt: skip
    if notice:
        print(f"gpugate report: {notice}", file=sys.stderr)
        return EXIT_UNHEALTHY
    return EXIT_OK


def window_record(
    window: float,
    drains: list[DrainEntry],
    resumes: list[AuditEntry],
    rows: list[NodeRow],
    groups: list[Any],
) -> dict[str, dict[str, int]]:
    """Each check's record over the window (store/outcomes.py), with Slurm's drained nodes
    where they could be read."""
    drained_now = {r.node for r in rows if r.drained} if groups else None
    return check_record(drains, resumes, history.window_start(window), drained_now)


def note_rates(
    config: Config,
    window: float,
    drains: list[DrainEntry],
    resumes: list[AuditEntry],
    rows: list[NodeRow],
    groups: list[Any],
) -> None:
    """Each check's stage and false-drain rate into the metrics file beside admin.metrics_file
    (store/metrics.py: note_check_rates), where node_exporter reads this host's textfiles."""
    rates = check_rates(window_record(window, drains, resumes, rows, groups), config.policy)
    note_check_rates(config, [{"check": r.check, **r.to_json()} for r in rates])


def fleet_figures(
    window: float,
    drains: list[DrainEntry],
    resumes: list[AuditEntry],
    rows: list[NodeRow],
    groups: list[Any],
    costs: list[Bundle],
    decisions: list[Requeue],
) -> Figures:
    """The window's reliability figures (admin/reliability.py): every node Slurm lists with
    its board, the drained ones as Slurm shows them (both unknown when Slurm was not read)."""
    boards = {name: info.gpu_type or reliability.UNKNOWN_BOARD
              for info, names in groups for name in names} if groups else None  # fmt: skip
    drained_now = {r.node for r in rows if r.drained} if groups else None
    return reliability.figures(drains, resumes, costs, decisions, history.window_start(window),
                               time.time(), boards, drained_now)  # fmt: skip


def note_reliability(
    config: Config, window: float, fig: Figures, drains: list[DrainEntry], costs: list[Bundle]
) -> None:
    """The figures as gauges in RELIABILITY_FILE beside admin.metrics_file (store/metrics.py)."""
    since = history.window_start(window)
    repeat = {o.node: o.drains for o in report.repeat_offenders(drains, since)}
    write_beside(config, RELIABILITY_FILE,
                 reliability.samples(fig, losses.by_category(costs), repeat))  # fmt: skip


def qualification_entries(where: str) -> list[QualifyEntry]:
    """The qualification records (gpugate/store/qualify.py), for the page; none when they
    cannot be read."""
    from gpugate.store.qualify import qualifications

    try:
        return qualifications(where)
    except OSError:  # the page shows the rest; the section says none was recorded
        return []


def events_dirs(config: Config) -> tuple[str, ...]:
    """Where hooks record their runs: the nodes' state_dir and the controller's directory."""
    return tuple(dict.fromkeys((config.state_dir, history.controller_dir(config))))


def suspect_flags(where: str | tuple[str, ...]) -> list[FlagEntry]:
    """The suspect flags (gpugate/store/suspects.py); none when they cannot be read."""

    try:
        return flags(where)
    except OSError:
        return []


def window_bundles(
    config: Config, window_days: float, page_dir: str
) -> tuple[list[Bundle], list[Bundle]]:
    """(the window's failed runs, costed; its qualification and drill bundles), each with a
    link from the page."""
    since = history.window_start(window_days)
    bundles = losses.read_bundles(config.evidence_dir, since)
    failures = [b for b in bundles if b.kind == "job"]
    costs = losses.costed(failures, losses.requeue_events(events_dirs(config), since))
    others = [b for b in bundles if b.kind != "job"]

    def linked(b: Bundle) -> Bundle:
        return b.replace(href=report.bundle_href(config.evidence_dir, b.path, page_dir))

    return [linked(c) for c in costs], [linked(o) for o in others]


def drill_entries(config: Config) -> list[DrillEntry]:
    """The drill records (drills.jsonl), for the page; none when they cannot be read."""
    try:
        return drill_records(config)
    except OSError:
        return []


def tally(costs: list[Bundle], others: list[Bundle]) -> str:
    """`2 failed run(s), 3 qualification(s) (1 passed, 1 failed, 1 not qualified), 1 drill run(s)`."""
    quals = [o.qualification for o in others if o.kind == "qualify" and o.qualification]
    outcomes = {k: sum(1 for q in quals if q.outcome == k)
                for k in ("passed", "failed", "not_qualified")}  # fmt: skip
    drills = sum(1 for o in others if o.kind == "drill")
    return (f"{len(costs)} failed run(s), {len(quals)} qualification(s) ({outcomes['passed']} "
            f"passed, {outcomes['failed']} failed, {outcomes['not_qualified']} not qualified), "
            f"{drills} drill run(s)")  # fmt: skip


def run_json(c: Bundle) -> dict[str, Any]:
    """A failed run as `--json` prints it (`failed_runs`)."""
    return {"path": c.path, "job": c.job, "node": c.node, "restart": c.restart,
            "category": c.category, "gpus": c.gpus, "gpu_hours": c.gpu_hours,
            "requeued": c.requeued, "checkpoint": c.checkpoint, "kind": "job"}  # fmt: skip


def other_json(o: Bundle) -> dict[str, Any]:
    """A qualification's or a drill's bundle as `--json` prints it: a qualification's outcome
    keys, a drill's id and findings, each only on its own kind."""
    out: dict[str, Any] = {"path": o.path, "job": o.job, "node": o.node, "kind": o.kind}
    q, drill = o.qualification, o.kind == "drill"
    if q is not None:
        out.update(outcome=q.outcome, label=q.label, why=q.why, fault_kind=q.fault_kind,
                   hardware_fault=q.hardware_fault, run_id=q.run_id)  # fmt: skip
    if drill:
        out["drill"] = o.drill
    out["category"] = o.category
    if drill:
        out["hardware_findings"] = list(o.hardware_findings)
    out["at"] = history.iso(o.failed)
    return out


def print_json(
    config: Config,
    window: float,
    costs: list[Bundle],
    others: list[Bundle],
    drains: list[DrainEntry],
    resumes: list[AuditEntry],
    rows: list[NodeRow],
    groups: list[Any],
    isolated: list[IsolatedOn] | None = None,
    fig: Figures | None = None,
) -> None:
    """The window as one JSON object: failed runs (kind job only), qualifications, drills,
    each check's drains (drills' apart: never false drains), the isolated GPUs and the
    GPU-hours their nodes kept serving."""
    since = history.window_start(window)
    isolated = isolated or []
    kept = report.kept_serving(isolated, since, time.time())
    record = window_record(window, drains, resumes, rows, groups)
    doc = {
        "window_days": window,
        "failed_runs": [run_json(c) for c in costs],
        "qualifications": [other_json(o) for o in others if o.kind == "qualify"],
        "drills": [other_json(o) for o in others if o.kind == "drill"],
        "drains_by_check": record,
        "false_drains": sum(v["lifted_unrepaired"] for v in record.values()),
        "false_drain_rates": {r.check: r.to_json() for r in check_rates(record, config.policy)},
        "drill_drains": [{"node": d.node, "at": d.at, "check": d.check, "reason": d.reason,
                          "drill": drill_of(d)}
                         for d in drill_drains(drains, since)],
        "isolated_gpus": [i.to_json() for i in isolated],
        "gpu_hours_kept_serving": round(sum(kept.values()), 3),
        "gpu_hours_lost_by_cause": {c: {"failed_runs": n, "gpu_hours": round(h, 3)}
                                    for c, n, h in losses.by_category(costs)},
        "repeat_offenders": [{"node": o.node, "drains": o.drains, "checks": o.checks}
                             for o in report.repeat_offenders(drains, since)],
        "reliability": fig.to_json() if fig else None,
    }  # fmt: skip
    json.dump(doc, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")

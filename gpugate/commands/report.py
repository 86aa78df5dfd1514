"""`gpugate report --html FILE`: failures and their cost, drains, evidence, requeues and repeat
offenders as one HTML page."""

from __future__ import annotations

import os
import sys

from gpugate.admin import losses, report
from gpugate.admin import nodes as admin
from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, make_parser
from gpugate.commands import add_cluster_options
from gpugate.config import load_config
from gpugate.store import history
from gpugate.store.held import held_entries
from gpugate.store.suspects import flags

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser
    from typing import Any

    from gpugate.config.schema import Config


def parser() -> ArgumentParser:
    """Options of `gpugate report`."""
    p = make_parser(
        "gpugate report",
        "Write one self-contained HTML page (inline CSS, no script, no external asset): the "
        "drained nodes with reasons, suggested actions and evidence paths; job failures and "
        "GPU-hours lost by cause (from the evidence bundles), each failed run with a link to "
        "its bundle, the requeue decisions and the checkpoint each run resumed from, the drains "
        "the budget held back; the nodes drained repeatedly in the history window, and a "
        "timeline of drains and resumes (the drain history and the audit log), with charts. "
        "Exit 0; 1 when Slurm could not be read (the page is still "
        "written, from the history alone, and says so).",
    )
    p.add_argument("--html", metavar="FILE", required=True, help="write the page here")
    add_cluster_options(p, "history window")
    return p


def main(argv: list[str]) -> int:
    """Run `gpugate report`."""
    args = parser().parse_args(argv)

    config = load_config(args.config)
    window = config.admin.history_window_days if args.window_days is None else args.window_days
    notice, groups = None, []
    try:
        slurm = None if args.sinfo_json else admin.cli_backend(config)
        groups = admin.read_node_groups(slurm, args.sinfo_json)
    except admin.NodesUnavailable as exc:
        notice = f"{exc}. Drained nodes are missing; the history below is complete."
    except (OSError, ValueError) as exc:
        print(f"gpugate report: {args.sinfo_json}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    where = history.history_dir(config)
    drains = history.drains(where)
    rows = admin.rows_for(config, groups, drained_only=True, window_days=window, drains=drains)
    page = report.render_html(
        rows,
        drains,
        history.resumes(where),
        window_days=window,
        total_nodes=sum(len(names) for _, names in groups) if groups else None,
        notice=notice,
        held=held_entries(where),
        costs=failure_costs(config, window, os.path.dirname(os.path.abspath(args.html))),
        requeues=losses.requeue_events(events_dirs(config), history.window_start(window)),
        qualifications=qualification_entries(where),
        flags=suspect_flags(history.read_dirs(config)),
    )
    try:
        report.write_report(args.html, page)
    except OSError as exc:  # a missing directory, no permission, a full disk
        print(f"gpugate report: cannot write {args.html}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"gpugate report: wrote {args.html}: {len(rows)} drained node(s)")
    if notice:
        print(f"gpugate report: {notice}", file=sys.stderr)
        return EXIT_UNHEALTHY
    return EXIT_OK


def qualification_entries(where: str) -> list[dict[str, Any]]:
    """The qualification records (gpugate/store/qualify.py); none when they cannot be read."""
    from gpugate.store.qualify import qualifications

    try:
        return qualifications(where)
    except OSError:  # the page shows the rest; the section says none was recorded
        return []


def events_dirs(config: Config) -> tuple[str, ...]:
    """Where hooks record their runs: the nodes' state_dir and the controller's directory."""
    return tuple(dict.fromkeys((config.state_dir, history.controller_dir(config))))


def suspect_flags(where: str | tuple[str, ...]) -> list[dict[str, Any]]:
    """The suspect flags (gpugate/store/suspects.py); none when they cannot be read."""

    try:
        return flags(where)
    except OSError:
        return []


def failure_costs(config: Config, window_days: float, page_dir: str) -> list[dict[str, Any]]:
    """The window's bundles with their requeue, GPU-hours lost and a link from the page."""
    since = history.window_start(window_days)
    failures = losses.read_failures(config.evidence_dir, since)
    costs = losses.costed(failures, losses.requeue_events(events_dirs(config), since))
    for c in costs:
        c["href"] = report.bundle_href(config.evidence_dir, c["path"], page_dir)
    return costs

"""`gpugate nodes`: every node's state, reason, evidence and suggested action, most urgent first."""

from __future__ import annotations

import gc
import json
import sys

from gpugate.admin import ledger_view as view
from gpugate.admin import nodes as admin
from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, make_parser
from gpugate.commands import add_cluster_options
from gpugate.config import load_config
from gpugate.store import history, ledger
from gpugate.store.outcomes import render_record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser, Namespace
    from typing import Any

    from gpugate.config.schema import Config


def parser() -> ArgumentParser:
    """Options of `gpugate nodes`."""
    p = make_parser(
        "gpugate nodes",
        "One table of the cluster's nodes from one `sinfo --json` call (or `scontrol -o show "
        "node` where sinfo has no JSON): state, drain reason, who set it and when, whether "
        "gpugate owns the drain, the failing check and the category of the newest evidence, how "
        "often gpugate drained the node in the history window, the Xids outside NVIDIA's catalog "
        "its prologs reported in that window (warned, never drained), and the suggested action (reset "
        "GPU, reboot, reseat/check cables, RMA candidate). Most urgent first. GPUs isolated "
        "from their node (isolate.unit: gpu; the node's Comment) are listed below the table "
        "(JSON: each row's isolated_gpus). With NODE: that node's row and its repair ledger "
        "(the newest 30 steps: drain, reset, reboot, qualify, resume, RMA, an admin's act; "
        "JSON: `ledger`). With --rma: the RMA list, from the ledger alone (no Slurm read). "
        "Exit 0, or 1 when Slurm cannot be read.",
    )
    p.add_argument("node", nargs="?", metavar="NODE",
                   help="one node: its row and its repair ledger")  # fmt: skip
    p.add_argument(
        "--rma",
        action="store_true",
        help="the RMA list: nodes whose last verdict is to replace a part (an RMA step no "
        "admin act or resume followed), with the GPU, the check, since when, and how often "
        "that part was drained in the window (its check on the node, its GPU on any node)",
    )
    p.add_argument(
        "--drained",
        action="store_true",
        help="only drained, down or failed nodes (and those gpugate "
        "holds partly out: held-back drains, suspects, isolated GPUs)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--stats", action="store_true", help="also each check's record in the window: "
                   "drains, lifted after repair, lifted without repair, still drained")  # fmt: skip
    add_cluster_options(p, "count drains over this many days")
    return p


def main(argv: list[str]) -> int:
    """Run `gpugate nodes`."""
    args = parser().parse_args(argv)

    # A listing of a large cluster allocates a few hundred thousand objects (the parsed JSON,
    # the rows), none in a cycle: the collector's passes over them are pure cost here.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(args)
    finally:
        if was_enabled:
            gc.enable()


def _run(args: Namespace) -> int:
    config = load_config(args.config)
    window = args.window_days
    if window is None:
        window = config.admin.history_window_days
    if args.rma:
        return _rma(config, window, args.json)
    try:
        slurm = None if args.sinfo_json else admin.cli_backend(config)
        groups = admin.read_node_groups(slurm, args.sinfo_json, admin.wants_comments(config))
    except admin.NodesUnavailable as exc:
        print(f"gpugate nodes: {exc}", file=sys.stderr)
        return EXIT_UNHEALTHY
    except (OSError, ValueError) as exc:  # the --sinfo-json file
        print(f"gpugate nodes: {args.sinfo_json}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.node:  # one node: its row (if Slurm lists it) and its ledger
        groups = [(first, [args.node]) for first, names in groups if args.node in names]
    rows = admin.rows_for(config, groups, drained_only=args.drained, window_days=window)
    stats = admin.check_stats(config, groups, window) if args.stats else None
    steps = view.node_lines(ledger.entries(config, args.node), args.node) if args.node else None
    if args.json:
        meta: dict[str, Any] = {"generated_at": admin.now_iso(), "window_days": window}
        if stats is not None:
            meta["stats"] = stats
        if steps is not None:
            meta["ledger"] = [view.line_json(e) for e in steps]
        head = json.dumps(meta)
        sys.stdout.write(f'{head[:-1]}, "nodes": {admin.rows_json(rows)}}}\n')
    else:
        sys.stdout.write(admin.render_table(rows))
        isolated = admin.render_isolated(rows)
        if isolated:
            sys.stdout.write("\nIsolated GPUs (out of Slurm's count, the node serves the rest):\n")
            sys.stdout.write(isolated)
        if stats is not None:
            sys.stdout.write("\n" + render_record(stats, window))
        if steps is not None:
            sys.stdout.write("\n" + view.render_lines(args.node, steps))
    return EXIT_OK


def _rma(config: Config, window: float, as_json: bool) -> int:
    """`gpugate nodes --rma`: the RMA list from the ledger and the drain history."""
    where = history.history_dir(config)
    items = view.rma_list(ledger.entries(where), history.drains(where),
                          history.window_start(window))  # fmt: skip
    if as_json:
        doc = {"generated_at": admin.now_iso(), "window_days": window,
               "rma": [i.to_json() for i in items]}  # fmt: skip
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        sys.stdout.write(view.render_rma(items))
    return EXIT_OK

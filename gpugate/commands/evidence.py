"""`gpugate evidence NODE|JOBID`: the evidence bundles of a node or a job, newest first."""

from __future__ import annotations

import os
import sys

from gpugate import names
from gpugate.admin import losses
from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, make_parser
from gpugate.clock import parse_utc
from gpugate.config import load_config
from gpugate.flightrec.culprit import job_culprit
from gpugate.store import history
from gpugate.store.evidence import list_bundles, node_bundle_paths, read_summary
from gpugate.store.held import HELD_LABEL, held_entries, held_now
from gpugate.store.summary import EvidenceSummary, QualifySummary, bundle_kind
from gpugate.text import dumps, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser
    from typing import Any

    from gpugate.admin.losses import Requeue
    from gpugate.config.schema import Config
    from gpugate.flightrec.records import Culprit
    from gpugate.store.entries import HeldEntry

# What a bundle's summary says, in the order shown.
FIELDS = ("job_id", "node", "restart", "sluid", "collected_at", "category", "xid", "failing_rank",
          "failing_node", "rank_reason",
          "suspected_node", "action", "drain_reason", "why", "summary_text")  # fmt: skip


def parser() -> ArgumentParser:
    """Options of `gpugate evidence`."""
    p = make_parser(
        "gpugate evidence",
        "The evidence bundles the epilog wrote for a node (found through the node's index, "
        "EVIDENCE_DIR/.index/NODE.jsonl, and the drain history; by scanning EVIDENCE_DIR/*/NODE-r* "
        "where the node has no index) or for a job, newest first: category, Xid, failing rank, "
        "action taken, why, and the directory holding the raw files. An argument of digits is a "
        "job id (use --node for a node named by digits). Exit 1 when there are none, 2 when "
        "NODE|JOBID is neither one node name nor one job id.",
    )
    p.add_argument("target", metavar="NODE|JOBID", help="a node name or a Slurm job id")
    p.add_argument("--node", action="store_true", help="TARGET is a node name, even if numeric")
    p.add_argument(
        "--scan",
        action="store_true",
        help="also list every job directory (finds a node's bundles written before its index)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--config", metavar="FILE", help="site config")
    return p


def node_bundles(config: Config, node: str, scan: bool = False) -> tuple[list[str], list[str]]:
    """Bundle directories of one node (its index, or a scan without one, plus those the
    history names), and notes on how they were found."""
    found, notes = node_bundle_paths(config.evidence_dir, node, scan=scan)
    named = [e.bundle for e in history.drains(history.history_dir(config), node)]
    more = {p for p in named if p and os.path.isdir(p)}
    return sorted(set(found) | more), notes


def job_bundles(config: Config, job: str) -> list[str]:
    """Bundle directories of one job (every node and run)."""
    return list_bundles(config.evidence_dir, job)


def admin_only(config: Config, job: str | None = None) -> str | None:
    """Why this user may not read the bundles (EVIDENCE_DIR, or the job's directory, exists
    but is closed to them), or None: then "no bundles" is the truth, not a permission."""
    top = config.evidence_dir
    places = [top] if job is None else [top, os.path.join(top, job)]
    for place in places:
        try:
            os.stat(place)
        except FileNotFoundError:
            return None
        except PermissionError:  # a directory above it is closed
            pass
        else:
            if os.access(place, os.R_OK | os.X_OK):
                continue
        group = config.epilog.evidence_group
        who = f"root and group {group}" if group else "root (epilog.evidence_group: null)"
        return (f"admin-only: {place} is readable by {who}, not by this user (bundles hold other "
                "users' logs); ask an admin, or run it as one")  # fmt: skip
    return None


def describe(bundle: str) -> dict[str, Any]:
    """A bundle's summary fields, its path and the raw files in it."""
    summary = read_summary(bundle)
    written = summary.to_json() if summary is not None else {}
    out: dict[str, Any] = {k: written.get(k) for k in FIELDS}
    out["path"] = bundle
    if isinstance(summary, QualifySummary):
        out["job_id"] = summary.job  # a qualification's bundle names its job so
    # job, qualify (gpugate qualify) or drill (a run under a fault drill: a simulated fault)
    out["bundle_kind"] = bundle_kind(summary) if summary is not None else None
    out["drill"] = summary.drill if isinstance(summary, EvidenceSummary) else None
    out["files"] = (summary.files if summary is not None else None) or sorted(_members(bundle))
    if summary is None:
        out["why"] = "summary.json missing or unreadable"
    out["dumps_note"] = dumps_note(out["files"])
    return out


# Flight-recorder dumps are pickles the job's user wrote: unpickled by an admin (torchfrtrace
# calls pickle.load) they run the user's code as the admin.
DUMPS_KEPT = ("the flight-recorder dumps were the job user's (pickles); gpugate kept only "
              "their parsed JSON (flightrec.json, flightrec/*.json)")  # fmt: skip
DUMPS_RAW = ("holds raw flight-recorder dumps from an older gpugate ({names}): the job user's "
             "pickles, never to be unpickled (torchfrtrace, pickle.load, torch.load run "
             "their code as you); delete them")  # fmt: skip


def dumps_note(files: list[Any]) -> str | None:
    """What an admin must know of the bundle's flight-recorder members, or None."""
    names = [str(f) for f in files if isinstance(f, str)]
    raw = [f for f in names if f.startswith("flightrec/") and not f.endswith(".json")]
    if raw:
        return DUMPS_RAW.format(names=", ".join(raw[:4]) + (", ..." if len(raw) > 4 else ""))
    if "flightrec.json" in names:
        return DUMPS_KEPT + "; never unpickle a raw dump: it runs the user's code as you"
    return None


def _members(bundle: str) -> list[str]:
    try:
        return [n for n in os.listdir(bundle) if not n.startswith(".")]
    except OSError:
        return []


# Bundles written before the epilog told the budget's refusal apart said this for any drain
# not done; the held-drain history (store/held.py) says which of them the budget held back.
_OLD_WORDS = "drain refused (not gpugate's)"


def mark_held(items: list[dict[str, Any]], held: list[HeldEntry]) -> list[dict[str, Any]]:
    """Bundles whose drain the budget held back (a held entry of the same node and reason
    within history.SAME_EVENT_S of the bundle) say so: action HELD_LABEL, and why."""
    out = []
    for d in items:
        when = parse_utc(d.get("collected_at"))
        match = next((e for e in reversed(held) if d.get("drain_reason")
                      and e.node == d.get("node") and e.reason == d["drain_reason"]
                      and (when is None or abs(e.when - when) < history.SAME_EVENT_S)), None)  # fmt: skip
        if match is not None and d.get("action") in (_OLD_WORDS, HELD_LABEL):
            d = dict(d, action=HELD_LABEL, held_why=match.why)
        out.append(d)
    return out


def newest_first(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Newest bundle first: by the time the epilog collected it, then by its run number."""
    return sorted(items, key=lambda d: (d["collected_at"] or "", d["restart"] or 0, d["path"]),
                  reverse=True)  # fmt: skip


def render(target: str, items: list[dict[str, Any]], held: HeldEntry | None = None) -> str:
    """A short block per bundle, newest first; `held`: the node's standing held-back drain."""
    items = [{k: _line(v) for k, v in d.items()} for d in items]
    lines = [f"{len(items)} evidence bundle(s) for {target}, newest first:"]
    if held:
        lines[0:0] = [f"{target}: {HELD_LABEL} since {_line(held.at)}: {_line(held.why)}; "
                      f"wanted: {_line(held.reason)}", ""]  # fmt: skip
    for d in items:
        xid = "-" if d["xid"] is None else d["xid"]
        rank = "-" if d["failing_rank"] is None else d["failing_rank"]
        if d.get("failing_node"):
            rank = f"{rank} on {d['failing_node']}"
        what = {"qualify": " [qualification]", "drill": f" [DRILL {d.get('drill') or '?'}: "
                "a simulated fault]"}.get(str(d.get("bundle_kind")), "")  # fmt: skip
        lines += [
            "",
            f"job {d['job_id'] or '?'} on {d['node'] or '?'} (run {d['restart'] or 0}"
            + (f", SLUID {d['sluid']}" if d.get("sluid") else "")
            + f"), collected {d['collected_at'] or '?'}{what}",
            f"  category: {d['category'] or '-'}    xid: {xid}    failing rank: {rank}",
            f"  action:   {d['action'] or '-'}" + (f" ({d['drain_reason']})" if d["drain_reason"] else ""),
            f"  why:      {d['why'] or '-'}",
            *([f"  rank:     {d['rank_reason']}"] if d.get("rank_reason") else []),
            *([f"  held back: {d['held_why']}"] if d.get("held_why") else []),
            *([f"  cause:    {d['summary_text']}"] if d["summary_text"] else []),
            f"  raw files: {d['path']}/  ({', '.join(d['files'])})",
            *([f"  dumps:    {d['dumps_note']}"] if d.get("dumps_note") else []),
        ]  # fmt: skip
    return "\n".join(lines) + "\n"


def _line(value: object) -> object:
    # Summaries quote logs and name users' files: escape sequences, bidi overrides and
    # newlines are shown escaped (`\x1b`), never sent to the admin's terminal.

    if isinstance(value, (list, tuple)):
        return [_line(v) for v in value]
    if not isinstance(value, str):
        return value
    text = printable(value)
    return text if len(text) <= 2000 else text[:1997] + "..."


def main(argv: list[str]) -> int:
    """Run `gpugate evidence`."""
    args = parser().parse_args(argv)

    target = args.target
    # Digits (and '_') without --node mean a job id: `1_2_3` is a bad one, not a node name.
    is_job = not args.node and bool(target) and not target.strip("0123456789_")
    try:
        (names.job_id if is_job else names.node_name)(target)
    except names.BadName as exc:
        return names.refuse(
            "gpugate evidence", f"{exc}; give one node name or one job id", EXIT_USAGE
        )
    config = load_config(args.config)
    notes: list[str] = []
    if is_job:
        bundles = job_bundles(config, target)
    else:
        bundles, notes = node_bundles(config, target, scan=args.scan)
    what = "job" if is_job else "node"
    decisions = job_decisions(config, target) if is_job else []
    if not bundles and decisions:  # what the controller decided stands without any bundle
        return _print_decisions_only(target, decisions, args.json)
    if not bundles and (locked := admin_only(config, target if is_job else None)):
        return names.refuse("gpugate evidence", locked, EXIT_UNHEALTHY)
    if not bundles:
        # Not found is one line, whatever was noticed on the way.
        extra = f" ({'; '.join(notes)})" if notes else ""
        return names.refuse("gpugate evidence", f"no evidence bundles for {what} {target} under "
                            f"{config.evidence_dir}{extra}", EXIT_UNHEALTHY)  # fmt: skip
    for note in notes:
        names.refuse("gpugate evidence: note", note, 0)
    where = history.history_dir(config)
    items = mark_held(newest_first([describe(b) for b in bundles]), held_entries(where))
    held = None if is_job else held_now(config, target).get(target)
    fr = _flight_recorder(one_run(bundles, items)) if is_job else None
    if args.json:
        out = {
            "target": target,
            "kind": what,
            "would_drain": held.to_json() if held else None,
            "bundles": items,
        }
        if is_job:  # the rank the others waited for, from the dumps the epilog read
            out["flight_recorder"] = fr.to_json() if fr else None
            out["decisions"] = [d.to_json() for d in decisions]

        sys.stdout.write(dumps(out, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(render(target, items, held))
        if fr is not None and fr.text:
            sys.stdout.write(f"\nflight recorder: {_line(fr.text)}\n")
        sys.stdout.write(render_decisions(decisions))
    return EXIT_OK


def job_decisions(config: Config, job: str) -> list[Requeue]:
    """EpilogSlurmctld's decisions on `job`, oldest first (its events in controller_dir, and
    in state_dir where an older release wrote them)."""

    dirs = tuple(dict.fromkeys((config.state_dir, history.controller_dir(config))))
    return [e for e in losses.requeue_events(dirs, 0.0) if e.job == job]


def decision_line(e: Requeue) -> str:
    """One decision: `run 0 (2026-12-01T10:00:00Z): requeued: infrastructure failure (...)`."""
    said = e.said or f"{'requeued' if e.requeue else 'not requeued'}: {e.why or '?'}"
    run = "?" if e.restarts is None else e.restarts
    return f"run {run} ({e.event.time}): {said}"


def render_decisions(decisions: list[Requeue]) -> str:
    """The controller's decisions block ("" when there are none)."""
    if not decisions:
        return ""
    lines = ["", "controller decisions (EpilogSlurmctld), oldest first:"]
    lines += [f"  {_line(decision_line(e))}" for e in decisions]
    return "\n".join(lines) + "\n"


def _print_decisions_only(target: str, decisions: list[Requeue], as_json: bool) -> int:
    if as_json:
        out = {"target": target, "kind": "job", "bundles": [],
               "decisions": [d.to_json() for d in decisions]}  # fmt: skip
        sys.stdout.write(dumps(out, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(f"0 evidence bundles for job {target}." + render_decisions(decisions))
    return EXIT_OK


def one_run(bundles: list[str], items: list[dict[str, Any]]) -> list[str]:
    """The bundles of the newest item's SLUID (and those naming none): a reused job id's
    earlier job is another run, whose dumps must not be merged with this one's."""
    sluid = items[0].get("sluid") if items else None
    if not sluid:
        return bundles
    other = {d["path"] for d in items if d.get("sluid") and d.get("sluid") != sluid}
    return [b for b in bundles if b not in other]


def _flight_recorder(bundles: list[str]) -> Culprit | None:
    """The job's flight-recorder culprit over its bundles' flightrec.json, or None."""

    return job_culprit(bundles)

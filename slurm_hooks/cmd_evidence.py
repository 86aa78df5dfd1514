"""`gpugate evidence NODE|JOBID`: the evidence bundles of a node or a job, newest first."""

from __future__ import annotations

import glob
import json
import os
import re
import sys

from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, make_parser

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser

    from gpugate.config.schema import Config

_JOB = re.compile(r"^[0-9]+(?:_[0-9]+)?$")
_NODE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
# What a bundle's summary says, in the order shown.
FIELDS = ("job_id", "node", "restart", "collected_at", "category", "xid", "failing_rank",
          "suspected_node", "action", "drain_reason", "why", "summary_text")  # fmt: skip


def parser() -> ArgumentParser:
    """Options of `gpugate evidence`."""
    p = make_parser(
        "gpugate evidence",
        "The evidence bundles the epilog wrote for a node (found through the drain history and "
        "by scanning EVIDENCE_DIR/*/NODE-r*) or for a job, newest first: category, Xid, failing "
        "rank, action taken, why, and the directory holding the raw files. An argument of "
        "digits is a job id (use --node for a node named by digits). Exit 1 when there are none.",
    )
    p.add_argument("target", metavar="NODE|JOBID", help="a node name or a Slurm job id")
    p.add_argument("--node", action="store_true", help="TARGET is a node name, even if numeric")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--config", metavar="FILE", help="site config")
    return p


def node_bundles(config: Config, node: str) -> list[str]:
    """Bundle directories of one node: those the history names plus a scan of the root."""
    from gpugate.slurm_hooks import history

    named = [e.get("bundle") for e in history.drains(history.history_dir(config), node)]
    pattern = os.path.join(glob.escape(config.evidence_dir), "*", f"{glob.escape(node)}-r*")
    found = {p for p in glob.glob(pattern) if ".old-" not in p and os.path.isdir(p)}
    found.update(p for p in named if p and os.path.isdir(p))
    return list(found)


def job_bundles(config: Config, job: str) -> list[str]:
    """Bundle directories of one job (every node and run)."""
    from gpugate.slurm_hooks.evidence import list_bundles

    return list_bundles(config.evidence_dir, job)


def describe(bundle: str) -> dict:
    """A bundle's summary fields, its path and the raw files in it."""
    from gpugate.slurm_hooks.evidence import read_summary

    summary = read_summary(bundle) or {}
    out = {k: summary.get(k) for k in FIELDS}
    out["path"] = bundle
    out["files"] = summary.get("files") or sorted(_members(bundle))
    if not summary:
        out["why"] = "summary.json missing or unreadable"
    return out


def _members(bundle: str) -> list[str]:
    try:
        return [n for n in os.listdir(bundle) if not n.startswith(".")]
    except OSError:
        return []


def newest_first(items: list[dict]) -> list[dict]:
    """Newest bundle first: by the time the epilog collected it, then by its run number."""
    return sorted(items, key=lambda d: (d["collected_at"] or "", d["restart"] or 0, d["path"]),
                  reverse=True)  # fmt: skip


def render(target: str, items: list[dict]) -> str:
    """A short block per bundle, newest first."""
    items = [{k: _line(v) for k, v in d.items()} for d in items]
    lines = [f"{len(items)} evidence bundle(s) for {target}, newest first:"]
    for d in items:
        xid = "-" if d["xid"] is None else d["xid"]
        rank = "-" if d["failing_rank"] is None else d["failing_rank"]
        lines += [
            "",
            f"job {d['job_id'] or '?'} on {d['node'] or '?'} (run {d['restart'] or 0}), "
            f"collected {d['collected_at'] or '?'}",
            f"  category: {d['category'] or '-'}    xid: {xid}    failing rank: {rank}",
            f"  action:   {d['action'] or '-'}" + (f" ({d['drain_reason']})" if d["drain_reason"] else ""),
            f"  why:      {d['why'] or '-'}",
            f"  raw files: {d['path']}/  ({', '.join(d['files'])})",
        ]  # fmt: skip
        if d["summary_text"]:
            lines.insert(-1, f"  cause:    {d['summary_text']}")
    return "\n".join(lines) + "\n"


def _line(value: object) -> object:
    # Summaries quote logs: keep escape sequences and newlines out of the admin's terminal.
    if not isinstance(value, str):
        return value
    from gpugate.slurm_hooks.slurm import clean_text

    return clean_text(value, 2000)


def main(argv: list[str]) -> int:
    """Run `gpugate evidence`."""
    args = parser().parse_args(argv)
    from gpugate.config import load_config

    config = load_config(args.config)
    target = args.target
    is_job = not args.node and bool(_JOB.match(target))
    if not is_job and not _NODE.match(target):
        parser().error(f"not a node name or job id: {target!r}")
    bundles = job_bundles(config, target) if is_job else node_bundles(config, target)
    if not bundles:
        what = "job" if is_job else "node"
        print(f"gpugate evidence: no evidence bundles for {what} {target} under "
              f"{config.evidence_dir}", file=sys.stderr)  # fmt: skip
        return EXIT_UNHEALTHY
    items = newest_first([describe(b) for b in bundles])
    if args.json:
        out = {"target": target, "kind": "job" if is_job else "node", "bundles": items}
        sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(render(target, items))
    return EXIT_OK

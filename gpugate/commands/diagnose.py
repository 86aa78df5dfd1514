"""`gpugate diagnose`: name why a job died from its logs (report for people, --json for scripts)."""

from __future__ import annotations

import argparse
import sys

from gpugate.cli import EXIT_OK, EXIT_USAGE
from gpugate.diagnosis import multinode
from gpugate.diagnosis.engine import diagnose
from gpugate.diagnosis.verdict import JOB_FILE, KERNEL_LOG, LOG_FILE, claim_text
from gpugate.slurm.layout import node_of_rank, valid_spec
from gpugate.text import dumps, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.diagnosis.verdict import Diagnosis


def parser() -> argparse.ArgumentParser:
    """Options of `gpugate diagnose`."""
    p = argparse.ArgumentParser(
        prog="gpugate diagnose",
        description="Name why a training job died from its logs (job stdout/stderr, with kernel "
        "log lines mixed in or as another file). Plain, gzip'd, or `-` for stdin. Exit 0 when a "
        "diagnosis was made (no_failure and unknown included), 2 on a usage error or an unreadable log (the "
        "others are still read).",
    )
    p.add_argument("logs", nargs="*", metavar="LOG", help="log file, .gz, or - for stdin")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--kernel-log",
        action="append",
        default=[],
        metavar="FILE",
        help="the node's kernel log (dmesg output, as root read it): trusted hardware evidence; "
        "may be given more than once",
    )
    p.add_argument(
        "--job-output",
        action="store_true",
        help="the LOG files are a job's own output (the epilog's mode): a hardware fault they "
        "claim (an Xid, ECC or NVLink line) is reported as not trusted and never decides the "
        "category; only --kernel-log can",
    )
    p.add_argument(
        "--engine",
        choices=("auto", "grep", "python"),
        default="auto",
        help="line prefilter: grep for large files when available (default), or Python",
    )
    p.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME=GLOB",
        help="the LOG files matching GLOB are node NAME's (several nodes: the report names the "
        "node that failed first; without it a file's node is its directory's name, or the node "
        "an evidence bundle directory recorded); may be given more than once",
    )
    p.add_argument(
        "--nodelist",
        metavar="HOSTLIST",
        help="the job's nodes in order (SLURM_JOB_NODELIST, e.g. gpu[01-04]): with "
        "--tasks-per-node, the failing rank's node when the log does not name it",
    )
    p.add_argument(
        "--tasks-per-node",
        metavar="N",
        help="ranks per node under Slurm's block layout: 8, or SLURM_TASKS_PER_NODE's 8(x4) / "
        "2(x3),1 (torchrun: its --nproc-per-node, nodes in --node-rank order)",
    )
    return p  # fmt: skip


def main(argv: list[str]) -> int:
    """Run `gpugate diagnose`."""
    p = parser()
    args = p.parse_args(argv)
    if not args.logs and not args.kernel_log:
        p.error("give at least one LOG or --kernel-log FILE")
    if args.tasks_per_node is not None and not args.nodelist:
        p.error("--tasks-per-node needs --nodelist")
    if args.tasks_per_node is not None and not valid_spec(args.tasks_per_node):
        p.error(f"--tasks-per-node: not a count or the 8(x4) form: {args.tasks_per_node!r}")

    own = JOB_FILE if args.job_output else LOG_FILE
    sources = [own] * len(args.logs) + [KERNEL_LOG] * len(args.kernel_log)
    try:
        patterns = [multinode.parse_node_option(v) for v in args.node]
        groups = multinode.group_inputs(
            list(zip([*args.logs, *args.kernel_log], sources)), patterns
        )
    except (multinode.InputError, OSError) as exc:
        p.error(str(exc))
    if groups is not None:
        return _several_nodes(groups, args)
    result = diagnose([*args.logs, *args.kernel_log], engine=args.engine, sources=sources)
    if result.failing_node is None and args.nodelist:
        node = node_of_rank(result.failing_rank, args.nodelist, args.tasks_per_node)
        result = result.replace(failing_node=node)

    failed = [f for f in result.files if f.error]
    for f in failed:
        print(f"gpugate diagnose: cannot read {printable(f.path)}: {printable(f.error)}",
              file=sys.stderr)  # fmt: skip
    if len(failed) < len(result.files):
        if args.json:
            sys.stdout.write(dumps(result.to_json(), indent=2) + "\n")
        else:
            sys.stdout.write(render(result))
    return EXIT_USAGE if failed else EXIT_OK


def _several_nodes(groups: list[Any], args: argparse.Namespace) -> int:
    """Diagnose each node alone, then report the job: the node that failed first, and each node."""
    results = multinode.diagnose_nodes(groups, engine=args.engine)
    files = [f for r in results for f in r.diagnosis.files]
    failed = [f for f in files if f.error]
    for f in failed:
        print(f"gpugate diagnose: cannot read {printable(f.path)}: {printable(f.error)}",
              file=sys.stderr)  # fmt: skip
    if len(failed) < len(files):
        out = dumps(multinode.job_json(results), indent=2) + "\n" if args.json else None
        sys.stdout.write(out or multinode.render_job(results, render))
    return EXIT_USAGE if failed else EXIT_OK


def render(d: Diagnosis) -> str:
    """A short report: verdict, explanation, what to do, Xid, rank, evidence with file:line."""
    lines = [
        f"diagnosis: {d.category}",
        f"  {printable(d.summary)}",
        f"  what to do: {printable(d.advice)}",
        f"  xid: {'-' if d.xid is None else d.xid}    "
        f"failing rank: {'-' if d.failing_rank is None else d.failing_rank}"
        + ("" if d.failing_node is None else f" on {printable(d.failing_node)}")
        + ("" if d.rank_reason is None else f" ({d.rank_confidence}: {printable(d.rank_reason)})"),
        f"  confidence: {d.confidence}" + _alternatives(d),
    ]
    if d.evidence:
        lines.append(f"  evidence (decided by the {d.decided_by}):")
        # An admin's own LOG needs no label; a kernel log or a job's file says which it is.
        lines += [f"    {printable(e.file)}:{e.line}: {printable(e.text)}" + ("" if e.source == LOG_FILE else
                  f"    [{e.source}]") for e in d.evidence]  # fmt: skip
    if d.untrusted:
        lines.append("  not trusted (printed by the job, never hardware evidence):")
        lines += [f"    {printable(e.file)}:{e.line}: {printable(claim_text(e))}: {printable(e.text)}"
                  for e in d.untrusted]  # fmt: skip
    return "\n".join(lines) + "\n"


def _alternatives(d: Diagnosis) -> str:
    """The runners-up on the confidence line: `    else: nccl_timeout (log:12), other (log:40)`."""
    named = [f"{a['category']} ({printable(a['evidence'][0]['file'])}:{a['evidence'][0]['line']})"
             if a.get("evidence") else a["category"] for a in d.alternatives]  # fmt: skip
    return f"    else: {', '.join(named)}" if named else ""

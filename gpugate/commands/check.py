"""`gpugate check`: run the checklist and report (table for people, --json for scripts)."""

from __future__ import annotations

import os
import sys
import time

from gpugate.checks.run import run_checks
from gpugate.checks.sources import gather, replay_path
from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, make_parser, quick_options
from gpugate.config import load_config
from gpugate.gate.budget import budget_warnings
from gpugate.gate.policy import (
    ACTING,
    CANARY,
    DRAIN,
    Decision,
    decide,
    effective_status,
    job_partitions,
    rollout,
)
from gpugate.node import node_hint, node_name
from gpugate.text import dumps, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser
    from typing import Any

    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config, Policy
    from gpugate.slurm.control import SlurmControl


# What parser() defines, for quick_options (tests/unit/commands/test_cli.py holds the two to the same answers).
OPTIONS: dict[str, tuple[str, ...]] = {
    "values": ("--facts", "--config", "--node"),
    "switches": ("--json", "--dry-run"),
    "lists": ("--only",),
}


def parser() -> ArgumentParser:
    """Options of `gpugate check`."""
    p = make_parser(
        "gpugate check",
        "Run the preflight checklist on this node, or on a replayed snapshot. "
        "Exit 0 healthy (warnings allowed), 1 unhealthy (a drain would follow), 2 usage or "
        "configuration error.",
    )
    p.add_argument(
        "--facts", metavar="FILE", help="replay this YAML snapshot instead of the hardware"
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="site config (default: $GPUGATE_CONFIG, else /etc/gpugate/gpugate.yaml)",
    )
    p.add_argument("--node", metavar="NAME",
                   help="Slurm's name of this node, for facts_file's {node} and its Gres "
                   "(default: SLURMD_NODENAME, else the short host name)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dry-run", action="store_true",
                   help="also say what the prolog would do on this verdict (drain, undo beyond "
                   "the budget, isolate), changing nothing")  # fmt: skip
    p.add_argument(
        "--only", metavar="ID", action="append", help="run only this check id (repeatable)"
    )
    return p  # fmt: skip


def main(argv: list[str], slurm: SlurmControl | None = None) -> int:
    """Run `gpugate check`; live, `slurm` answers the Gres count (default: one bounded scontrol)."""
    args = quick_options(argv, **OPTIONS) or parser().parse_args(argv)
    started = time.perf_counter()

    config = load_config(args.config)
    node = args.node or node_name()
    try:
        facts = gather(config, node, snapshot=args.facts)
    except (OSError, ValueError) as exc:
        if args.facts or not config.facts_file or os.path.exists(replay_path(config, node) or ""):
            raise
        # facts_file's {node} made a name no file has: say where the name came from.
        raise type(exc)(f"{exc} (facts_file, for {node_hint(node)})") from exc
    if not args.facts:  # live: judge the GPU count by Slurm's Gres, as the prolog does
        # Late: a replayed snapshot needs no Slurm adapter (gpugate/startup.py).
        from gpugate.slurm.choose import with_slurm_gres

        facts = with_slurm_gres(config, node, facts, slurm)
    findings = run_checks(facts, config, only=args.only)
    # Inside a job (an admin's srun), a canary check acts as the prolog would judge it there.
    partitions = job_partitions(os.environ.get("SLURM_JOB_PARTITION"))
    decision = decide(findings, config.policy, partitions=partitions)
    duration = time.perf_counter() - started
    plan = would_do(config, node, decision) if args.dry_run else None
    if args.json:
        out = {
            "status": decision.status,
            "node": facts.node,
            "action": decision.action,
            "findings": [
                {
                    **f.to_json(),
                    "effective_status": effective_status(f, config.policy),
                    "rollout": rollout(f.check, config.policy),
                }
                for f in findings
            ],
            "source_errors": facts.source_errors or {},
            "duration_s": round(duration, 6),
            "budget_warnings": budget_warnings(config.budget),
        }
        if plan is not None:
            out["plan"] = plan

        sys.stdout.write(dumps(out, indent=2) + "\n")
    else:
        sys.stdout.write(render_table(facts.node, decision, findings, duration, config.policy))
        for warning in budget_warnings(config.budget):  # the drain budget cannot act
            sys.stdout.write(f"  WARN    drain budget: {warning}\n")
        for line in plan or ():
            sys.stdout.write(f"  PLAN    {printable(line)}\n")
    return EXIT_UNHEALTHY if decision.status == "fail" else EXIT_OK


def would_do(config: Config, node: str, decision: Decision) -> list[str]:
    """What the prolog's executor would do on this decision, said and not done (a dry run)."""
    # Late: only --dry-run plans (gpugate/startup.py).
    from gpugate.act.execute import Hands, execute
    from gpugate.act.plans import drain_steps

    if decision.action != DRAIN:
        return []
    plan = drain_steps(node, list(decision.failing))
    return execute(plan, Hands(config), dry_run=True).lines()


def render_table(
    node: str | None,
    decision: Decision,
    findings: list[Finding],
    duration: float,
    policy: Policy | None = None,
) -> str:
    """One line per finding, problems first, under a one-line verdict; with `policy`, each
    failure of a check that does not act everywhere says so (gate/policy.py: rollout)."""
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.status] = counts.get(f.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    head = f"{printable(node or '?')}: {decision.status.upper()} ({summary}) in {duration * 1000:.0f} ms"
    lines = [head]
    folded = missing_sources(findings)
    shown: set[str | None] = set()
    for f in findings:
        group = folded.get(f.source or "") if f.status == "unknown" else None
        if group is None:
            stage = stage_note(f.check, policy) if policy and f.status == "fail" else ""
            lines.append(f"  {f.status.upper():<7} {printable(f.message)}{stage}")
        elif f.source not in shown:  # the whole source in one line, where its first check was
            shown.add(f.source)
            lines.append(f"  {'UNKNOWN':<7} {printable(group)}")
    return "\n".join(lines) + "\n"


def stage_note(check: str, policy: Policy) -> str:
    """` [report-only]`, ` [canary-only: acts in a, b]`, or "" for a check that acts."""
    stage = rollout(check, policy)
    if stage == ACTING:
        return ""
    if stage == CANARY:
        return f" [{stage}: acts in {printable(', '.join(policy.canary.partitions))}]"
    return f" [{stage}]"


def missing_sources(findings: list[Any]) -> dict[str, str]:
    """Source -> one line for each fact source that left two or more checks unknown."""
    by_source: dict[str, list[Any]] = {}
    for f in findings:
        if f.status == "unknown" and f.source:
            by_source.setdefault(f.source, []).append(f)
    out = {}
    for source, group in by_source.items():
        if len(group) < 2:
            continue  # one check: its own message says it best
        # Each message is "<check>: <what> missing: <why>" (or "not judged: <why>"): the why.
        why = group[0].message.partition(": ")[2].rpartition("missing: ")[2]
        why = why.removeprefix("not judged: ") or "?"
        out[source] = f"source {source} missing: {len(group)} checks not judged ({why})"
    return out

"""`gpugate selftest`: run each installed hook wrapper as Slurm would, report what would break."""

from __future__ import annotations

import json
import os
import sys

from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, make_parser

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.admin.selftest import Host

DEFAULT_HOOKS_DIR = "/usr/libexec/gpugate"


def main(argv: list[str], host: Host | None = None) -> int:
    """Run the selftest; 0 all ok, 1 something would break (a requeue lost, a hook failed), 2
    usage. `host`: this host's system files and Slurm (None: the real ones)."""
    from gpugate.admin.selftest import HOST, selftest

    p = make_parser("gpugate selftest", "Run each installed hook wrapper on this node the way "
                    "Slurm would (Prolog, Epilog, HealthCheckProgram as root; TaskProlog as a "
                    "job user; EpilogSlurmctld as SlurmUser) with GPUGATE_SELFTEST=1, in which "
                    "the hooks take no action; check what SlurmUser must reach and the Slurm "
                    "settings requeues rely on (JobRequeue, nohold_on_prolog_fail, SLURM_CONF "
                    "for the hooks Slurm gives none, the qualify partition) and which qualify "
                    "steps this host can run; report what would break with the fix.")  # fmt: skip
    p.add_argument("--hooks-dir", default=DEFAULT_HOOKS_DIR, metavar="DIR",
                   help=f"where the wrappers are (default {DEFAULT_HOOKS_DIR})")  # fmt: skip
    p.add_argument("--user", default="nobody", help="the job user for the TaskProlog (nobody)")
    p.add_argument("--slurm-user", metavar="NAME",
                   help="SlurmUser for EpilogSlurmctld (default: `scontrol show config`)")  # fmt: skip
    p.add_argument("--node", metavar="NAME",
                   help="Slurm's name of this node, given to the hooks as slurmd would "
                   "(default: SLURMD_NODENAME, else the short host name)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="per hook (60)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    args = p.parse_args(argv)
    if not os.path.isdir(args.hooks_dir):
        print(f"gpugate selftest: no hook wrappers: {args.hooks_dir} is no directory "
              "(--hooks-dir DIR names where they are)", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    if args.timeout <= 0:
        print("gpugate selftest: --timeout must be positive", file=sys.stderr)
        return EXIT_USAGE
    users = {"root": "root", "job": args.user, "slurm": args.slurm_user}
    reports = selftest(args.hooks_dir, users, node=args.node, timeout=args.timeout,
                       host=host or HOST)  # fmt: skip
    broken = any(r.status == "broken" for r in reports)
    if args.json:
        hooks = [r.to_dict() for r in reports if r.hook not in ("site", "qualify")]
        site = [r.to_dict() for r in reports if r.hook == "site"]
        steps = [r.to_dict() for r in reports if r.hook == "qualify"]
        print(json.dumps({"ok": not broken, "hooks": hooks, "site": site[0] if site else None,
                          "qualify": steps[0] if steps else None}, indent=2))  # fmt: skip
    else:
        print(render(reports))
    return EXIT_UNHEALTHY if broken else EXIT_OK


def render(reports: list[Any]) -> str:
    """The report for a terminal: a line per hook, then each problem and its fix."""
    lines = []
    for r in reports:
        who = {"site": f"({r.user}, qualify)", "qualify": f"({r.user})"}.get(r.hook, f"as {r.user}")
        head = f"{r.hook:<17} {who:<15} {r.status}"
        lines.append(head + (f" ({r.note})" if r.note else ""))
        for problem in r.problems:
            lines += [f"    - {problem.what}", f"      fix: {problem.fix}"]
        for problem in r.warnings:
            lines += [f"    - warning: {problem.what}", f"      fix: {problem.fix}"]
    broken = [r.hook for r in reports if r.status == "broken"]
    if any(r.hook == "qualify" and r.status == "warning" for r in reports):
        # A warning, not a break: such a step is "not run" in a qualification, never a drain.
        lines.append("some qualify steps cannot run on this host (warnings above)")
    if any(r.hook == "site" and r.status == "warning" for r in reports):
        lines.append("qualify's ranks per node do not fit the nodes (warning above): "
                     "nothing would break")  # fmt: skip
    if not broken:
        lines.append("all hooks ok; Slurm's settings ok")
    else:
        lines.append(f"would break: {', '.join(broken)}")
    return "\n".join(lines)

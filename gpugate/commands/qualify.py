"""`gpugate qualify NODE...`: qualify nodes with DCGM and bandwidth tests run as Slurm jobs.

Root only. The work is gpugate/qualify/run.py (qualify_nodes); this prints its per-node table
and the pair verdict. `--step dcgm` (hidden) is what a qualification job runs on its node.
Exit 0 when every node passed, 1 when one failed or could not be qualified, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

from gpugate.child import cli_command
from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, make_parser
from gpugate.config import load_config
from gpugate.names import refuse
from gpugate.qualify.dcgm import dcgm_step
from gpugate.qualify.sweep import sweep_config
from gpugate.slurm.control import SlurmError
from gpugate.slurm.hostlist import HostlistError, hostlist_expand

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser, Namespace
    from collections.abc import Callable
    from typing import Any

    from gpugate.config.schema import Config
    from gpugate.qualify.records import QualifyRun
    from gpugate.slurm.control import SlurmControl

    MakeSlurm = Callable[[Config], SlurmControl]

PROG = "gpugate qualify"


def parser() -> ArgumentParser:
    """Options of `gpugate qualify`."""

    p = make_parser(PROG, "Qualify nodes (root only): one exclusive Slurm job per node (DCGM "
                    "diagnostics, all-reduce bandwidth, host-to-device copies), then pairwise "
                    "all-reduce jobs; failing nodes are drained ('gpugate: qualify: ...'), "
                    "drained nodes that pass stay drained unless --resume-passed. Exit 0 all "
                    "passed, 1 not all, 2 usage.")  # fmt: skip
    p.add_argument("nodes", metavar="NODE", nargs="*", help="nodes (Slurm hostlists allowed)")
    p.add_argument("--level", type=int, help="dcgmi diag -r LEVEL, 1-4 (default qualify.level)")
    p.add_argument("--tests", help="comma-separated: dcgm,allreduce,h2d,pairs (default: all)")
    p.add_argument("--reservation", help="run in this reservation (default qualify.reservation)")
    p.add_argument("--qos", help="the jobs' QOS (default qualify.qos)")
    p.add_argument("--partition", help="the jobs' partition (default qualify.partition)")
    p.add_argument("--wait-s", type=float, help="bound on each phase (default qualify.wait_s)")
    p.add_argument("--idle", action="store_true",
                   help="a sweep (docs/qualify.md: scrontab): nodes Slurm shows IDLE, not drained, "
                   "the longest unqualified first, as low-priority jobs (qualify.sweep_qos, "
                   "sweep_nice)")  # fmt: skip
    p.add_argument("--max-nodes", type=int, metavar="N", help="with --idle: at most N nodes")
    p.add_argument("--nice", type=int, metavar="N",
                   help="sbatch --nice for the jobs (default qualify.sweep_nice with --idle)")  # fmt: skip
    p.add_argument("--resume-passed", action="store_true",
                   help="resume gpugate-drained nodes that pass (audited)")  # fmt: skip
    p.add_argument("--trigger", default="", metavar="TEXT",
                   help="why this run (kept in qualify.jsonl and the bundle; a suspect flag's "
                   "detail when gpugate starts it)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="the run as one JSON object")
    p.add_argument("--no-wait", action="store_true",
                   help="run in the background; outcomes go to qualify.jsonl and the log")  # fmt: skip
    p.add_argument("--config", metavar="FILE", help="site config")
    for hidden in ("--step", "--dcgmi", "--node", "--out", "--timeout"):  # inside the job
        p.add_argument(hidden, help=argparse.SUPPRESS)
    return p


def main(argv: list[str], make_slurm: MakeSlurm | None = None) -> int:
    """Run `gpugate qualify`; `make_slurm` makes the Slurm backend (default: the site's)."""
    args = parser().parse_args(argv)
    if args.step:
        return step(args)
    if os.geteuid() != 0:
        return refuse(PROG, "qualification is for root only (it reserves, drains and resumes "
                      "nodes)", EXIT_USAGE)  # fmt: skip
    if bool(args.nodes) == bool(args.idle):
        return refuse(PROG, "name at least one NODE, or --idle (not both)", EXIT_USAGE)

    config = load_config(args.config)
    if config.qualify is None:
        return refuse(PROG, "the configuration has no qualify: section", EXIT_USAGE)

    try:  # a sweep's priority first: --qos and the others below still override it
        config = sweep_config(config, args.nice, args.idle)
    except ValueError as exc:
        return refuse(PROG, exc, EXIT_USAGE)
    over = {k: getattr(args, k) for k in ("reservation", "qos", "partition") if getattr(args, k)}
    assert config.qualify is not None  # checked above; sweep_config keeps the section
    config = config.replace(qualify=config.qualify.replace(**over))
    # Every usage error before anything runs, --no-wait included: its child would only log it.
    try:
        request = check_args(args, config, make_slurm)
    except ValueError as exc:  # QualifyError, a hostlist Slurm cannot read either
        return refuse(PROG, exc, EXIT_USAGE)
    except SlurmError as exc:
        return refuse(PROG, f"Slurm: {exc}", EXIT_UNHEALTHY)
    if args.no_wait:
        return background(argv, config.state_dir)
    return run(args, config, request, make_slurm)


def check_args(
    args: Namespace, config: Config, make_slurm: MakeSlurm | None = None
) -> tuple[list[str], list[str] | None, int]:
    """(nodes, tests or None for the config's, level) from the command line; QualifyError (a
    ValueError) for a usage error: no test, an unknown one, a bad level, a node named twice."""
    from gpugate.qualify.run import QualifyError, check_request, choose_tests

    assert config.qualify is not None  # main() refuses a config without the section
    tests = None
    if args.tests is not None:  # `--tests ""` or `--tests ,` names no test: not "the default"
        tests = [t.strip() for t in args.tests.split(",") if t.strip()]
        if not tests:
            raise QualifyError("--tests names no test: choose from dcgm, allreduce, h2d, pairs")
    level = args.level if args.level is not None else config.qualify.level
    if not 1 <= level <= 4:
        raise QualifyError(f"--level must be 1 to 4 (dcgmi diag -r), not {level}")
    if args.max_nodes is not None and args.max_nodes < 1:
        raise QualifyError(f"--max-nodes must be at least 1, got {args.max_nodes}")
    if args.max_nodes is not None and not args.idle:
        raise QualifyError("--max-nodes goes with --idle (the nodes named are all qualified)")
    if args.idle:
        choose_tests(config, tests)  # the nodes come from Slurm when the run starts
        return [], tests, level
    nodes = expand_nodes(args.nodes, config, make_slurm)
    twice = sorted(n for n, times in Counter(nodes).items() if times > 1)
    if twice:
        raise QualifyError(f"node(s) named twice: {', '.join(twice)}")
    check_request(config, nodes, tests)
    return nodes, tests, level


def expand_nodes(
    exprs: list[str], config: Config, make_slurm: MakeSlurm | None = None
) -> list[str]:
    """The NODE arguments' names; Slurm (`scontrol show hostnames`) only for what gpugate's own
    hostlist parser cannot read."""
    names: list[str] = []
    for expr in exprs:
        try:
            names += hostlist_expand(expr)
        except HostlistError:
            names += slurm_for(config, make_slurm).expand_hostlist(expr)
    return names


def slurm_for(config: Config, make_slurm: MakeSlurm | None) -> SlurmControl:
    """The backend `make_slurm` makes, by default the site's (choose.backend_for)."""
    # Late: the adapter only when Slurm is asked (gpugate/startup.py).
    from gpugate.slurm.choose import backend_for

    return (make_slurm or backend_for)(config)


def run(
    args: Namespace,
    config: Config,
    request: tuple[list[str], list[str] | None, int],
    make_slurm: MakeSlurm | None = None,
) -> int:
    """Qualify the nodes, print the outcome; the exit code."""
    from gpugate.qualify.run import QualifyError, qualify_nodes

    slurm = slurm_for(config, make_slurm)
    nodes, tests, level = request
    previous = _terminate_as_exit()
    try:
        if args.idle:
            from gpugate.qualify.sweep import select_idle

            nodes = select_idle(config, slurm, args.max_nodes)
            if not nodes:
                print(f"{PROG}: no idle node to qualify")
                return EXIT_OK
        result = qualify_nodes(config, slurm, nodes, level, tests,
                               resume_passed=args.resume_passed, wait_s=args.wait_s,
                               trigger=args.trigger or ("sweep" if args.idle else ""),
                               progress=_printer(args.json))  # fmt: skip
    except (QualifyError, ValueError) as exc:
        return refuse(PROG, exc, EXIT_USAGE)
    except SlurmError as exc:
        return refuse(PROG, f"Slurm: {exc}", EXIT_UNHEALTHY)
    finally:
        _restore(previous)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1, default=str))
    else:
        print(table(result))
    passed = all(v["passed"] for v in result.verdicts.values())
    return EXIT_OK if passed else EXIT_UNHEALTHY


def _printer(as_json: bool) -> Callable[[str], None]:
    """Progress lines: stdout for a person, stderr under --json (stdout is the JSON alone)."""
    stream = sys.stderr if as_json else sys.stdout

    def say(line: str) -> None:
        print(f"{PROG}: {line}", file=stream, flush=True)

    return say


def _terminate_as_exit() -> dict[int, Any]:
    """SIGTERM/SIGHUP end the run through its `finally` (nodes drained again, reservation gone)."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    return {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def table(result: QualifyRun) -> str:
    """The per-node table (PASS/FAIL, each test's value against its floor, the job ids) and
    the pair verdict."""
    lines = [f"qualification {result.run_id} (level {result.level}; {', '.join(result.tests)};"
             f" reservation {result.reservation or 'none'})"]  # fmt: skip
    for node in result.nodes:
        v = result.verdicts[node]
        word = "PASS" if v["passed"] else "FAIL" if v["failed"] else "NOT QUALIFIED"
        lines.append(f"{node:<12} {word:<13} jobs {', '.join(v['job_ids']) or '-'}"
                     f"  -> {v.get('action', '')}")  # fmt: skip
        for t in v["tests"]:
            mark = {True: "ok", False: "FAIL", None: "--"}[t.ok]
            value = "" if t.value_gbps is None else f"{t.value_gbps:.2f} GB/s"
            floor = "" if t.floor_gbps is None else f"floor {t.floor_gbps:.2f}"
            lines.append(f"    {mark:<4} {t.test:<9} {value:>12} {floor:>12}  {t.detail}")
        if not v["passed"]:
            lines.append(f"    why: {_why(v)}")
    if result.pairs:
        lines.append(f"pairs: {result.pairs.get('text', '')}")
    return "\n".join(lines)


def _why(verdict: dict[str, Any]) -> str:
    """A failure's why in full; a node not qualified names its steps shown above (each line
    already has its reason and fix), unless something else kept it from a pass."""
    unshown = [t.test for t in verdict["tests"] if t.ok is None]
    if verdict["failed"] or not unshown:
        return str(verdict["why"])
    return f"not qualified: {', '.join(dict.fromkeys(unshown))} not run or not judged (above)"


def background(argv: list[str], state_dir: str) -> int:
    """--no-wait: the same qualification in a detached process; where its output goes."""

    from gpugate.fsutil import private_dir

    logs = private_dir(os.path.join(state_dir, "qualify"), 0o700, gid=-1)
    path = os.path.join(logs, time.strftime("%Y%m%dT%H%M%S.log", time.gmtime()))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rest = [a for a in argv if a != "--no-wait"]
    proc = subprocess.Popen([*cli_command(), "qualify", *rest],
                            stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, close_fds=True,
                            start_new_session=True)  # fmt: skip
    os.close(fd)
    print(f"{PROG}: running in the background (pid {proc.pid}); its output: {path}; each "
          "node's outcome goes to qualify.jsonl, the drain history and the evidence store")  # fmt: skip
    return EXIT_OK


def step(args: Namespace) -> int:
    """`--step dcgm`: inside a qualification job, run DCGM on this node, write its result."""
    if args.step != "dcgm" or not args.out or not args.node:
        return refuse(PROG, "--step dcgm needs --node and --out", EXIT_USAGE)
    from gpugate.fsutil import atomic_write

    try:
        level = int(args.level or 1)
        timeout = float(args.timeout) if args.timeout else None
    except ValueError:
        return refuse(PROG, "--timeout must be a number of seconds", EXIT_USAGE)
    result = dcgm_step(level, args.dcgmi or "dcgmi", timeout, args.node,
                       os.environ.get("SLURM_JOB_ID"))  # fmt: skip
    atomic_write(args.out, json.dumps(result.to_json(), default=str) + "\n", 0o600)
    return EXIT_OK if result.ok is not False else EXIT_UNHEALTHY

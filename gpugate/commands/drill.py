"""`gpugate drill NODE --fault F [--minutes N]`: a fault drill on this node, followed and recorded.

The article's monthly routine: inject a fault on purpose and watch whether the system recovers
by itself. The fault is an overlay over this node's real facts (gpugate/drill/__init__.py) for a
bounded window; the training job running here is killed as the fault would kill it (its
batch step gets SIGKILL), or with no job the health check runs at once. Then it follows what
gpugate and Slurm do: the drain (a reason that says DRILL), the requeue of the job elsewhere
from its checkpoint, the end of the window, the resume of the drain the drill owns. Each
step's time goes into the drill record (`drills.jsonl`), with pass or fail.
"""

from __future__ import annotations

import json
import os
import sys
import time

from gpugate.admin.losses import decision, resumed_from
from gpugate.admin.resume import Request, check_then_resume
from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, make_parser
from gpugate.config import load_config
from gpugate.drill import FAULTS, DrillError, end_drill, start_drill
from gpugate.hooks.health import run_health
from gpugate.log import read_events
from gpugate.names import refuse
from gpugate.node import node_hint, node_name, not_this_node
from gpugate.slurm.control import NodeNotFound, SlurmError, SlurmMissing
from gpugate.store.drills import DrillStep, drill_records, record_drill, records_path
from gpugate.store.history import controller_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser, Namespace
    from collections.abc import Callable
    from typing import Any, TypeVar

    _T = TypeVar("_T")

    from gpugate.config.schema import Config
    from gpugate.drill import DrillWindow
    from gpugate.slurm.control import SlurmControl
    from gpugate.store.drills import DrillEntry

PROG = "gpugate drill"
POLL_S = 1.0
GRACE_S = 90.0  # after the window: for the requeued job to start and the node to come back


def parser() -> ArgumentParser:
    """Options of `gpugate drill`."""
    p = make_parser(PROG, "Inject a simulated fault into this node's facts for a bounded window "
                    "(root only), follow the drain, the requeue and the resume, and record the "
                    "drill. --report lists past drills; --end ends the open drill now. Exit 0 "
                    "passed, 1 failed, 2 usage.")  # fmt: skip
    p.add_argument("node", metavar="NODE", nargs="?", help="this node (drills never touch another)")
    p.add_argument("--fault", choices=list(FAULTS), help="the fault to simulate")
    p.add_argument("--minutes", type=float, default=10.0,
                   help="the window (at most drill.max_minutes; default 10)")  # fmt: skip
    p.add_argument("--report", action="store_true", help="list past drills")
    p.add_argument("--json", action="store_true", help="with --report: the records as JSON")
    p.add_argument("--end", action="store_true", help="end the open drill now (and resume)")
    p.add_argument("--config", metavar="FILE", help="site config")
    return p


def main(argv: list[str]) -> int:
    """Run `gpugate drill`."""

    args = parser().parse_args(argv)
    if args.report:
        return report(load_config(args.config), args.node, args.json)
    if os.geteuid() != 0:
        return refuse(PROG, "drills are for root only (they drain nodes and kill jobs)", EXIT_USAGE)
    config = load_config(args.config)
    if args.end:
        if args.node and args.node != node_name():
            return refuse(PROG, f"{not_this_node(args.node)}; run --end on the drilled node",
                          EXIT_USAGE)  # fmt: skip
        return end_now(config)
    problem = usage_problem(args)
    if problem:
        return refuse(PROG, problem, EXIT_USAGE)
    try:
        drill = start_drill(config, args.node, args.fault, args.minutes)
    except (DrillError, OSError) as exc:
        return refuse(PROG, exc, EXIT_USAGE)
    say(f"DRILL {drill.id}: {FAULTS[drill.fault][0]} on {drill.node} "
        f"for {args.minutes:g} min")  # fmt: skip
    entry = follow(config, drill, Ops(config))
    for step in entry.steps:
        say(f"  {step.at}  +{step.after_s:.1f} s  {step.step}: {step.detail}")
    say(f"DRILL {drill.id}: {'PASS' if entry.passed else 'FAIL: ' + entry.why}")
    return EXIT_OK if entry.passed else EXIT_UNHEALTHY


def usage_problem(args: Namespace) -> str | None:
    """What is wrong with a drill's NODE and --fault, or None."""

    if not args.node or not args.fault:
        return "give NODE and --fault (or --report, or --end)"
    if args.node != node_name():
        return (f"{not_this_node(args.node)}; run the drill on the node itself, a drill never "
                "touches another node")  # fmt: skip
    return None


def say(message: str) -> None:
    """One line on stdout."""
    print(message, flush=True)


# ---------------------------------------------------------------------------- Slurm side


class Ops:
    """What a drill asks of Slurm (a class, so the unit tests can replace it)."""

    def __init__(self, config: Config) -> None:
        from gpugate.slurm.choose import backend

        self.config = config
        self.slurm: SlurmControl = backend(config.slurm.backend, timeout=config.slurm.timeout_s)

    def _run(self, argv: list[str]) -> str:
        from gpugate.runner import command_env, run

        result = run(argv, self.config.slurm.timeout_s, env=command_env())
        if not result.ok:
            raise DrillError(result.describe())
        return result.stdout

    def running_jobs(self, node: str) -> list[str]:
        """The ids of the jobs running on `node`."""
        out = self._run(["squeue", "-h", "-t", "R", "-w", node, "-o", "%A"])
        return [line.strip() for line in out.splitlines() if line.strip()]

    def kill(self, job: str) -> None:
        """Kill the job's batch step, as a fault kills the training process (the job fails)."""
        self._run(["scancel", "--batch", "--signal=KILL", job])

    def health(self, node: str) -> str:
        """Run the health check here now (a node with no job); what it did."""

        return run_health(self.config, node, self.slurm).action

    def node(self, node: str) -> tuple[bool, str]:
        """(drained, reason) of `node`."""
        info = self.slurm.node(node)
        return info.drained, info.reason

    def job(self, job: str) -> tuple[str, int, tuple[Any, ...], str]:
        """(state, restarts, nodes, AdminComment) of `job`."""
        info = self.slurm.job(job)
        return info.state, info.restarts, info.nodes, info.admin_comment

    def resume(self, node: str, drill_id: str) -> tuple[bool, str]:
        """Resume `node` through `gpugate resume`'s checks and audit; (resumed, why not)."""

        request = Request(node=node, why=f"drill {drill_id} ended", who="gpugate drill")
        attempt = check_then_resume(self.config, self.slurm, self.slurm.node(node), request)
        return attempt.resumed, attempt.why


# ---------------------------------------------------------------------------- the follow


class Steps:
    """The drill's steps, each with its time and seconds since the drill started."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.items: list[DrillStep] = []

    def add(
        self,
        step: str,
        detail: str = "",
        *,
        fault: str | None = None,
        job: str | None = None,
        nodes: list[str] | None = None,
        checkpoint: str | None = None,
    ) -> None:
        """One step, now."""
        now = time.time()
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        self.items.append(DrillStep(step=step, at=at, when=round(now, 3),
                                    after_s=round(now - self.start, 1), detail=detail,
                                    fault=fault, job=job, nodes=nodes, checkpoint=checkpoint))  # fmt: skip

    def has(self, step: str) -> bool:
        """Whether `step` happened."""
        return any(s.step == step for s in self.items)


def wait_for(what: Callable[[], _T | None], until: float) -> _T | None:
    """Poll `what()` until it returns something true or `until` passes; its last answer."""
    while True:
        try:
            got = what()
        except Exception:  # Slurm busy or the job between states: ask again
            got = None
        if got or time.time() >= until:
            return got
        time.sleep(POLL_S)


def follow(config: Config, drill: DrillWindow, ops: Ops) -> DrillEntry:
    """Drive and watch one drill from injection to resume; its record (written)."""

    steps = Steps(drill.start)
    steps.add("injected", FAULTS[drill.fault][0], fault=drill.fault)
    node, mark = drill.node, f"DRILL {drill.id}"
    jobs = strike(ops, node, steps)
    reason = wait_for(lambda: drilled_reason(ops, node, mark), drill.end)
    if reason:
        steps.add("drained", str(reason))
    for job, before in jobs.items():
        follow_job(config, ops, node, (job, before), steps, drill.end + GRACE_S)
    time.sleep(max(0.0, drill.end - time.time()))
    end_drill(config)
    steps.add("window_ended", "overlay removed")
    if reason:
        resumed = wait_for(lambda: lift(ops, node, drill.id, mark), time.time() + GRACE_S)
        if resumed:
            steps.add("resumed", f"{node} back in service{resumed.removeprefix('yes')}")
    why = verdict(steps, jobs)
    return record_drill(config, drill, steps.items, not why, why)


def strike(ops: Ops, node: str, steps: Steps) -> dict[str, int]:
    """What the fault does at once: kill the jobs running here, or run the health check.

    Returns each killed job's restart count before the kill."""
    jobs: dict[str, int] = {}
    try:
        running = ops.running_jobs(node)
    except DrillError as exc:
        steps.add("error", f"cannot list the jobs on {node}: {exc}")
        return jobs
    for job in running:
        try:
            jobs[job] = ops.job(job)[1]
            ops.kill(job)
            steps.add("job_killed", f"job {job}: batch step sent SIGKILL", job=job)
        except Exception as exc:  # recorded: the drill goes on and fails the requeue step
            jobs.pop(job, None)
            steps.add("error", f"cannot kill job {job}: {exc}", job=job)
    if not running:
        steps.add("health_check", f"no job on {node}: health check ran ({ops.health(node)})")
    return jobs


def drilled_reason(ops: Ops, node: str, mark: str) -> str | None:
    """The node's drain reason when it is drained by this drill."""
    drained, reason = ops.node(node)
    return reason if drained and mark in reason else None


def lift(ops: Ops, node: str, drill_id: str, mark: str) -> str | None:
    """Resume the drill's drain through `gpugate resume`'s checks: "yes" when done, "yes (...)"
    when it was already gone (Slurm's ResumeAfter, set by SlurmControl.drain, came first), None
    when not resumed (yet)."""
    drained, reason = ops.node(node)
    if not drained:
        return "yes (already lifted: Slurm's ResumeAfter, or the health run)"
    if mark not in reason:
        return None  # someone else's drain now: not the drill's to lift
    return "yes" if ops.resume(node, drill_id)[0] else None


def follow_job(
    config: Config, ops: Ops, node: str, killed: tuple[str, int], steps: Steps, until: float
) -> None:
    """Wait for the killed job to run again elsewhere; add the step with its checkpoint."""
    job, before = killed

    def elsewhere() -> tuple[tuple[str, ...], str] | None:
        state, restarts, nodes, comment = ops.job(job)
        # The killed run, requeued, shows COMPLETING with Restarts already counted until its
        # epilogs end, and on 24.11 a poll once saw such a state with no nodes at all (the drill
        # then recorded a requeue "on" nowhere): only a run with nodes is the new run.
        moved = restarts > before and state in ("RUNNING", "COMPLETING", "COMPLETED")
        return (nodes, comment) if moved and nodes and node not in nodes else None

    found = wait_for(elsewhere, until)
    if not found:
        steps.add("not_requeued", f"job {job} did not run again on another node", job=job)
        return
    nodes, comment = found
    ckpt, words = requeue_checkpoint(config, job, comment)
    steps.add("requeued", f"job {job} on {','.join(nodes)} from {words}",
              job=job, nodes=list(nodes), checkpoint=ckpt)  # fmt: skip


UNKNOWN = ("unknown: neither EpilogSlurmctld's event line nor the job's AdminComment "
           "names it")  # fmt: skip


def requeue_checkpoint(config: Config, job: str, comment: str) -> tuple[str | None, str]:
    """(checkpoint or None, words): what EpilogSlurmctld requeued `job` from (its event line,
    else its comment). None when not known here: with SlurmUser=slurm only the job's
    TaskProlog (as the job's user) sees which checkpoint it hands out."""

    # The controller's own directory first (where it writes), then state_dir (older releases).
    for directory in (controller_dir(config), config.state_dir):
        try:
            events = read_events(directory, "epilog-slurmctld")
        except OSError:
            continue
        for e in reversed(events):
            d = decision(e, 0.0)  # any time: the newest line of the job
            if d is not None and d.job == job and d.requeue:
                return d.resumed_from()
    for marker in ("resume from ", "resumes from the newest complete checkpoint in "):
        if marker in comment:
            found = comment.split(marker, 1)[1].split(";")[0].split(" | ")[0].strip()
            found = found.removesuffix(", found by the job's TaskProlog")
            if marker.startswith("resume "):
                return found, found
            return None, resumed_from(None, True, found)[1]
    return None, UNKNOWN


def verdict(steps: Steps, jobs: dict[str, int]) -> str:
    """Why the drill failed ("" when it passed): each expected step must have happened."""
    expected = ["drained"] + (["requeued"] * bool(jobs)) + ["resumed"]
    missing = [s for s in expected if not steps.has(s)]
    if missing:
        return f"no {missing[0]} step"
    requeued = sum(1 for s in steps.items if s.step == "requeued")
    return "" if requeued == len(jobs) else f"{len(jobs) - requeued} job(s) not requeued"


# ---------------------------------------------------------------------------- --end, --report


def end_now(config: Config, ops: Ops | None = None) -> int:
    """`--end`: close the open drill and resume the drain a drill set on this node.

    With no drill open it still resumes a drill's drain: one the drill command could not lift
    because it died (its window closed by itself; only the drain was left)."""

    drill = end_drill(config)
    node = drill.node if drill else node_name()
    mark = f"DRILL {drill.id}" if drill else "gpugate: DRILL "
    if drill:
        say(f"DRILL {drill.id}: ended early")

    try:
        ops = ops or Ops(config)
        reason = drilled_reason(ops, node, mark)
    except SlurmError as exc:
        if isinstance(exc, (NodeNotFound, SlurmMissing)) or _no_slurm_here(exc):
            return refuse(PROG, f"{node} is not a Slurm node here ({exc}): run --end on the "
                          "drilled node itself, where scontrol and SLURM_CONF reach slurmctld "
                          f"({node_hint(node, '')})", EXIT_USAGE)  # fmt: skip
        # slurmctld away: the drain, if any, stays until it answers
        return refuse(PROG, f"cannot ask Slurm about {node}: {exc}; run --end again later",
                      EXIT_UNHEALTHY)  # fmt: skip
    if not reason:
        if drill:
            return EXIT_OK
        return refuse(PROG, f"no drill is open and {node} has no drill's drain", EXIT_UNHEALTHY)
    resumed, why = ops.resume(node, drill.id if drill else "left over")
    say(f"{node}: {'resumed' if resumed else 'not resumed: ' + why} ({reason})")
    return EXIT_OK if resumed else EXIT_UNHEALTHY


def _no_slurm_here(exc: BaseException) -> bool:
    """scontrol ran but has no slurm.conf to read: this host is no configured Slurm node."""
    return "Could not establish a configuration source" in str(exc)


def report(config: Config, node: str | None, as_json: bool) -> int:
    """`--report`: past drills, oldest first."""

    path = records_path(config)
    if os.path.exists(path) and not os.access(path, os.R_OK):
        return refuse(PROG, f"cannot read {path} (root's and the admin group's)", EXIT_UNHEALTHY)
    records = drill_records(config, node)
    if as_json:
        json.dump([r.to_json() for r in records], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    if not records:
        say("no drills recorded")
    for r in records:
        steps = ", ".join(f"{s.step} +{s.after_s:g}s" for s in r.steps)
        outcome = "PASS" if r.passed else f"FAIL ({r.why})"
        say(f"{r.id}  {r.node}  {r.fault}  {outcome}  {steps}")
    return EXIT_OK

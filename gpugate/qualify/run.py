"""`qualify_nodes`: qualify nodes as Slurm jobs, judge them, and act on the drains (issue 17).

One exclusive job per node (DCGM, the all-reduce inside the node, host-to-device copies), then
pairwise jobs, one round of disjoint pairs at a time (pairs.pair_rounds), each phase bounded
by `qualify.wait_s` (a job still pending or running then is cancelled and reported). The
result files are judged (judge.py) and every node's outcome is recorded: qualify.jsonl
(gpugate/store/qualify.py), an evidence bundle under the node job's id, and the drain history
for a node drained.

Drained nodes take no job, not even in a reservation. So gpugate creates a MAINT reservation
on the nodes (Users=root), resumes its own drained nodes into it, runs the jobs there, and then
drains every node that failed (`gpugate: qualify: <why> (job N)`) and, unless resume_passed,
drains the passing ones again with their earlier reasons, before deleting the reservation.
Whatever fails on the way (a Slurm error, a signal, a bug), the `finally` drains every node it
took again and deletes the reservation: a drained node is never left schedulable.

The drain budget: a node that was drained before stays drained (the budget counts it already);
a node newly found failing is drained by the executor's plan (settle.drain_plan), within the
budget, like every drain gpugate makes on its own. Qualification is proof, but a scheduled
sweep (`qualify --idle`) with a wrong floor would otherwise drain the fleet; over budget the
node keeps its Comment and the held entry (`gpugate nodes` shows it), and the failure is
recorded all the same.
"""

from __future__ import annotations

import math
import os
import time

from gpugate import log
from gpugate.fstree import remove_tree
from gpugate.qualify import jobs, progress
from gpugate.qualify import judge as J
from gpugate.qualify.pairs import pair_rounds
from gpugate.qualify.records import Job, QualifyRun
from gpugate.qualify.settle import settle
from gpugate.regex import lazy
from gpugate.slurm.control import JobNotFound, SlurmError, valid_node_name
from gpugate.store.history import current_user
from gpugate.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.config.schema import Config, Qualify
    from gpugate.qualify.progress import Progress
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.records import NodeInfo

TESTS = ("dcgm", "allreduce", "h2d", "pairs")
POLL_S = 2.0
# Job states after which a job runs no more (squeue(1), JOB STATE CODES).
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "GONE"})  # fmt: skip


class QualifyError(ValueError):
    """A qualification cannot start: bad nodes, tests or config; the message says which."""


class Ops:
    """The Slurm calls of a run beyond SlurmControl's (a class, so unit tests replace it), and
    how often a run asks for its jobs' states."""

    poll_s: float = POLL_S

    def __init__(self, slurm: SlurmControl) -> None:
        self.slurm = slurm

    def submit(self, argv: list[str]) -> str:
        """sbatch --parsable; the job id."""
        return self.slurm.cli.call(*argv).strip().split(";")[0]

    def state(self, job_id: str) -> tuple[str, str]:
        """(JobState, Reason); GONE when Slurm no longer knows the job."""
        try:
            job = self.slurm.job(job_id)
        except JobNotFound:
            return "GONE", ""
        return job.state.split()[0] if job.state else "PENDING", job.reason

    def cancel(self, job_id: str) -> None:
        """scancel the job."""
        self.slurm.cli.call("scancel", job_id)

    def create_reservation(self, name: str, nodes: list[str], minutes: int) -> None:
        """A MAINT reservation of the nodes for root, from now (scontrol(1), reservations)."""
        self.slurm.cli.scontrol(
            "create", "reservation", f"ReservationName={name}", f"Nodes={','.join(nodes)}",
            "Users=root", "StartTime=now", f"Duration={minutes}", "Flags=MAINT,IGNORE_JOBS",
        )  # fmt: skip

    def delete_reservation(self, name: str) -> None:
        """scontrol delete ReservationName=NAME."""
        self.slurm.cli.scontrol("delete", f"ReservationName={name}")


def check_request(config: Config, nodes: list[str], tests: list[str] | None) -> list[str]:
    """The tests to run (config's by default); QualifyError for bad nodes, tests, config."""
    if config.qualify is None:
        raise QualifyError("the configuration has no qualify: section")
    if not nodes:
        raise QualifyError("name at least one node")
    for node in nodes:
        try:
            valid_node_name(node)
        except ValueError as exc:
            raise QualifyError(str(exc)) from None
    if len(set(nodes)) != len(nodes):
        raise QualifyError("a node is named twice")
    return choose_tests(config, tests)


def choose_tests(config: Config, tests: list[str] | None) -> list[str]:
    """The tests to run in their order (config's by default); QualifyError for none or unknown."""
    assert config.qualify is not None  # the callers refuse a config without the section
    chosen = list(config.qualify.tests if tests is None else tests)
    unknown = [t for t in chosen if t not in TESTS]
    if unknown or not chosen:
        raise QualifyError(f"unknown test(s) {', '.join(unknown) or '(none given)'}: "
                           f"choose from {', '.join(TESTS)}")  # fmt: skip
    return [t for t in TESTS if t in chosen]


# A node whose slurmd does not answer starts no job (sinfo(1) NODE STATE CODES `*`); unless power
# saving has it off or on its way (`~`, `#`, `%`, `!`): Slurm powers such a node up for a job.
_POWER_FLAGS = frozenset({"POWERED_DOWN", "POWERING_UP", "POWERING_DOWN", "POWER_DOWN", "POWER_UP"})


def check_nodes(qc: Qualify, infos: dict[str, NodeInfo], nodes: list[str]) -> None:
    """QualifyError, before anything is reserved or submitted, for a job Slurm cannot start.

    sbatch accepts a job asking more tasks per node than the node has CPUs and keeps it PENDING
    (Reason=PartitionConfig or Resources) until qualify.wait_s cancels it: an hour by default.
    A pair job asks the ranks of its node with fewer GPUs, so every node passing covers them.
    """
    problems = []
    for node in nodes:
        info = infos[node]
        ranks, cpus = jobs.ntasks_for(qc, info.gres_gpus, info.cpus), info.cpus
        if cpus and ranks > cpus:  # only a set qualify.ntasks_per_node: a default fits the CPUs
            problems.append(f"{node} has {cpus} CPUs; qualify.ntasks_per_node is {ranks}: set "
                            f"qualify.ntasks_per_node to at most {cpus}")  # fmt: skip
        if "NOT_RESPONDING" in info.flags and not _POWER_FLAGS.intersection(info.flags):
            problems.append(f"{node} is {info.state}+NOT_RESPONDING (its slurmd does not answer): "
                            "Slurm starts no job there; see `scontrol show node`")  # fmt: skip
        if qc.partition and info.partitions and qc.partition not in info.partitions:
            problems.append(f"{node} is not in partition {qc.partition} (qualify.partition or "
                            f"--partition; it is in {','.join(info.partitions)})")  # fmt: skip
    if problems:
        raise QualifyError("no job could start: " + "; ".join(problems))


# Run directories kept under state_dir/qualify/ (the newest, by their time-stamped names): each
# run's results also live in the nodes' evidence bundles, which have their own retention, so a
# weekly sweep never fills the state directory.
KEEP_RUNS = 50


_RUN_NAME = lazy(r"\d{8}T\d{12}-[0-9a-f]{6}")


def new_run(state_dir: str, keep: int = KEEP_RUNS) -> tuple[str, str]:
    """(run id, its root-only directory state_dir/qualify/<run id>); the oldest runs pruned."""
    from gpugate.fsutil import private_dir

    # Microseconds in the name: runs sort by when they began, even within one second.
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now * 1e6) % 1_000_000:06d}"
    run_id = stamp + "-" + os.urandom(3).hex()
    parent = private_dir(os.path.join(state_dir, "qualify"), 0o700, gid=-1)
    prune_runs(parent, keep - 1)
    return run_id, private_dir(os.path.join(parent, run_id), 0o700, gid=-1)


def prune_runs(parent: str, keep: int) -> list[str]:
    """Remove all but the newest `keep` run directories under `parent`; return those removed."""

    runs = sorted(n for n in os.listdir(parent) if _RUN_NAME.fullmatch(n))
    removed = []
    for name in runs[: max(0, len(runs) - keep)]:
        if remove_tree(os.path.join(parent, name)):
            removed.append(name)
    return removed


def qualify_nodes(
    config: Config,
    slurm: SlurmControl,
    nodes: list[str],
    level: int,
    tests: list[str] | None,
    *,
    resume_passed: bool = False,
    requested_by: str = "",
    wait_s: float | None = None,
    ops: Ops | None = None,
    trigger: str = "",
    progress: Progress | None = None,
) -> QualifyRun:
    """Qualify `nodes` at DCGM `level` with `tests` (None: the config's); judge, record, act.
    `progress` gets a line per job submitted and, while waiting, per job still going."""
    chosen = check_request(config, nodes, tests)
    if not 1 <= level <= 4:
        raise QualifyError(f"--level must be 1 to 4 (dcgmi diag -r), not {level}")
    infos = slurm.nodes(nodes)
    unknown = [n for n in nodes if n not in infos]
    if unknown:
        raise QualifyError(f"Slurm does not know node(s) {', '.join(unknown)}")
    foreign = [f"{n} ({infos[n].reason or infos[n].state})" for n in nodes
               if infos[n].drained and not infos[n].gpugate_owned]  # fmt: skip
    if foreign:
        raise QualifyError(f"not drained by gpugate: {', '.join(foreign)}; gpugate lifts only "
                           "its own drains, even for a qualification")  # fmt: skip
    assert config.qualify is not None  # check_request refused a config without the section
    check_nodes(config.qualify, infos, nodes)
    ops = ops or Ops(slurm)
    run = _Run(config, slurm, ops, list(nodes), level, chosen, infos, wait_s)
    run.progress = progress
    run.trigger = trigger  # what asked for it (a suspect flag, an admin): in each record
    return run.go(resume_passed, requested_by or _who())


def _who() -> str:
    return current_user()


class _Run:
    """The state of one run while it goes (the nodes taken, the jobs submitted)."""

    def __init__(self, config: Config, slurm: SlurmControl, ops: Ops, nodes: list[str],
                 level: int, tests: list[str], infos: dict[str, Any], wait_s: float | None) -> None:  # fmt: skip
        self.config, self.slurm, self.ops = config, slurm, ops
        assert config.qualify is not None  # qualification runs only with a qualify: section
        self.qc: Qualify = config.qualify
        self.nodes, self.level, self.tests, self.infos = nodes, level, tests, infos
        self.wait_s = self.qc.wait_s if wait_s is None else float(wait_s)
        self.drained = {n: infos[n].reason for n in nodes if infos[n].drained}
        self.run_id, self.run_dir = new_run(config.state_dir)
        self.reservation: str | None = self.qc.reservation
        self.own_reservation: str | None = None
        self.taken: list[str] = []  # drained nodes resumed into the reservation
        self.settled: set[str] = set()  # taken nodes whose drain is decided
        self.jobs: dict[str, Job] = {}  # by name, their latest state
        self.trigger = ""
        self.progress: Progress | None = None

    def go(self, resume_passed: bool, by: str) -> QualifyRun:
        """Reserve, resume, run, judge, act; the finally puts back whatever is left."""

        try:
            self._reserve()
            for node in self.drained:
                self.slurm.resume(node)
                self.taken.append(node)
            node_jobs = self._phase([((n,), jobs.node_script(self.run_dir, n, self.tests,
                                      self.qc, self.level, self._ntasks((n,))), n)
                                     for n in self.nodes])  # fmt: skip
            ran = [j.nodes[0] for j in node_jobs if j.started]
            pair_jobs = self._pairs(ran) if "pairs" in self.tests else []
            verdicts, pairs = J.judge_all(self.config, self.run_dir, node_jobs, pair_jobs,
                                          self.tests)  # fmt: skip
            run = QualifyRun(run_id=self.run_id, nodes=self.nodes, verdicts=verdicts,
                             pairs=pairs, reservation=self.reservation, run_dir=self.run_dir,
                             level=self.level, tests=self.tests)  # fmt: skip
            settle(self, run, resume_passed, by)
            return run
        finally:
            self._put_back()

    def _reserve(self) -> None:
        # A drained node may only be resumed into a reservation only root can use: gpugate's.
        # Without one, a site reservation serves; so does none for a low-priority sweep (nice > 0):
        # its jobs wait behind the users' instead of holding their nodes for the whole run.
        if not self.drained and (self.reservation or self.qc.nice):
            return
        phases = 1 + (len(self.nodes) if "pairs" in self.tests else 0)
        minutes = phases * math.ceil(self.wait_s / 60) + 10  # the backstop if gpugate dies
        name = f"gpugate-qualify-{self.run_id}"
        self.ops.create_reservation(name, self.nodes, minutes)
        self.own_reservation = self.reservation = name

    def _gpus(self, nodes: tuple[str, ...]) -> int | None:
        gpus = [self.infos[n].gres_gpus for n in nodes]
        return min(gpus) if all(gpus) else None

    def _ntasks(self, nodes: tuple[str, ...]) -> int:
        cpus = [self.infos[n].cpus for n in nodes]
        return jobs.ntasks_for(self.qc, self._gpus(nodes), min(cpus) if all(cpus) else None)

    def _pairs(self, nodes: list[str]) -> list[Job]:
        """Every pair of the nodes that ran, one round of disjoint pairs at a time."""

        done: list[Job] = []
        for round_ in pair_rounds(nodes) if len(nodes) >= 2 else []:
            done += self._phase([(pair, jobs.pair_script(self.run_dir, pair, self.qc,
                                  self._ntasks(pair)), f"pair-{pair[0]}-{pair[1]}")
                                 for pair in round_])  # fmt: skip
        return done

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def _phase(self, work: list[tuple[tuple[str, ...], str, str]]) -> list[Job]:
        """Submit every job of one phase at once, wait for all (bounded); the jobs as ended."""
        for nodes, script, name in work:
            job = self.jobs[name] = self._submit(nodes, script, name)
            self._say(f"job {job.job_id} submitted: {','.join(nodes)}" if job.job_id else
                      f"{','.join(nodes)}: {job.note}")  # fmt: skip
        names = [name for _, _, name in work]
        start = time.monotonic()
        deadline, next_say = start + self.wait_s, start + progress.EVERY_S
        while True:
            running = [n for n in names if _going(self.jobs[n])]
            for name in running:
                job = self.jobs[name]
                assert job.job_id is not None  # _going: a refused job has none and is never asked
                state, reason = self.ops.state(job.job_id)
                self.jobs[name] = job.replace(state=state, note=reason,
                                              started=job.started or state != "PENDING")  # fmt: skip
            running = [n for n in names if _going(self.jobs[n])]
            now = time.monotonic()
            if not running or now >= deadline:
                break
            if now >= next_say:
                next_say = now + progress.EVERY_S
                for name in running:
                    self._say(progress.job_line(self.jobs[name], deadline - now))
            time.sleep(self.ops.poll_s)
        for name in running:
            self.jobs[name] = self._cancel(self.jobs[name])
            job = self.jobs[name]
            self._say(f"job {job.job_id} on {','.join(job.nodes)}: {job.note}")
        return [self.jobs[n] for n in names]

    def _submit(self, nodes: tuple[str, ...], script: str, name: str) -> Job:
        path = os.path.join(self.run_dir, f"{name}.sh")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        with os.fdopen(fd, "w") as fh:
            fh.write(script)
        output = os.path.join(self.run_dir, f"{name}.out")
        argv = jobs.sbatch_argv(path, list(nodes), self.qc, self._ntasks(nodes), output,
                                self.reservation, self._gpus(nodes))  # fmt: skip
        try:
            job_id = self.ops.submit(argv)
        except SlurmError as exc:
            return Job(name=name, nodes=nodes, job_id=None, output=output, state="REFUSED",
                       note=f"sbatch refused the job: {log_line(exc)}")  # fmt: skip
        return Job(name=name, nodes=nodes, job_id=job_id, output=output)

    def _cancel(self, job: Job) -> Job:
        assert job.job_id is not None  # only a job Slurm took is waited for (_going)
        why = (f"ran past qualify.wait_s ({self.wait_s:g} s): cancelled" if job.started else
               progress.never_started(job, self.wait_s))  # fmt: skip
        try:
            self.ops.cancel(job.job_id)
        except SlurmError as exc:
            why += f" (scancel failed: {log_line(exc)})"
        return job.replace(state="CANCELLED", note=why)

    def _put_back(self) -> None:
        """Cancel what still runs, drain again every node taken and not settled, unreserve."""
        for job in self.jobs.values():
            if job.job_id and job.state not in ENDED:
                try:
                    self.ops.cancel(job.job_id)
                except Exception as exc:  # keep going: the drains below matter more
                    log.error(self.config.state_dir, f"qualify: scancel {job.job_id}", exc)
        for node in self.taken:
            if node in self.settled:
                continue
            try:
                self.slurm.drain(node, self.drained[node])
            except Exception as exc:
                log.error(self.config.state_dir,
                          f"qualify: COULD NOT DRAIN {node} AGAIN ({self.drained[node]})", exc)  # fmt: skip
        if self.own_reservation:
            try:
                self.ops.delete_reservation(self.own_reservation)
            except Exception as exc:
                log.error(self.config.state_dir,
                          f"qualify: could not delete reservation {self.own_reservation}", exc)  # fmt: skip


def _going(job: Job) -> bool:
    """Whether the job is Slurm's and not ended: a job sbatch refused has no id and is over."""
    return job.job_id is not None and job.state not in ENDED


def log_line(exc: BaseException) -> str:
    """An exception as one short line."""

    return " ".join(printable(exc).split())[:300]

"""EpilogSlurmctld: the controller's requeue flow (`gpugate epilog-slurmctld` calls it).

The decision is the gate's (gpugate/gate/requeue.py); this gathers what it needs, asks it, and
acts on the answer.

EpilogSlurmctld runs as SlurmUser (`slurm` on Debian and RHEL). It reads only the node
epilogs' decision records (gpugate/store/controller_view.py) and writes only to controller_dir
(its events, votes, flags, locks and log: gpugate.store.history.controller_dir).
"""

from __future__ import annotations

import os

from gpugate import log
from gpugate.act.execute import Hands, execute
from gpugate.act.plans import requeue_steps, requeued_notes
from gpugate.gate.flightrec_votes import culprit_comment, with_culprit
from gpugate.gate.requeue import (
    JobEnd,
    decide_requeue,
    ended_well,
    needs_evidence,
    pins,
    refusals,
    requested,
    resume_point,
    user_name,
    wait_for_summaries,
)
from gpugate.gate.suspicion import vote as cast_vote
from gpugate.gate.suspicion import wants_votes
from gpugate.slurm.choose import backend_for
from gpugate.slurm.cli import expand_hostlist
from gpugate.slurm.hookenv import comment_tokens, from_environ
from gpugate.slurm.reasons import mark_drill
from gpugate.store.controller_view import hostlist
from gpugate.store.history import controller_dir
from gpugate.store.view_records import ControllerRecord, stale_note

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpugate.child import Detach
    from gpugate.config.schema import Config
    from gpugate.gate.requeue import JobEnd
    from gpugate.slurm.control import SlurmControl
    from gpugate.store.controller_view import ReadAccount


def job_from_env(environ: dict[str, str] | None = None) -> JobEnd:
    """What EpilogSlurmctld's environment says (it carries the comment and the node list)."""
    env = from_environ(environ)
    return JobEnd(job_id=env.job_id or "", uid=env.uid, gid=env.gid, comment=env.comment,
                  restarts=env.restart_count, sluid=env.sluid, exit_code2=env.exit_code2,
                  nodes=tuple(expand_hostlist(env.nodelist)) if env.nodelist else ())  # fmt: skip


class Edges:
    """What run_requeue reads and writes beside Slurm: the nodes' records (waited for), the
    suspect vote, the job's newest checkpoint (the real ones by default; tests pass stand-ins)."""

    def __init__(
        self,
        records: Callable[
            [Config, JobEnd, float, list[ReadAccount] | None],
            tuple[list[ControllerRecord], dict[str, str]],
        ] = wait_for_summaries,
        vote: Callable[
            [Config, JobEnd, list[ControllerRecord], str | None], str | None
        ] = cast_vote,
        checkpoint: Callable[[Config, JobEnd, str | None], str | None] = resume_point,
    ) -> None:
        self.records, self.vote, self.checkpoint = records, vote, checkpoint


EDGES = Edges()


def run_requeue(
    config: Config,
    job: JobEnd,
    slurm: SlurmControl,
    wait_s: float,
    dry_run: bool = False,
    accounts: list[ReadAccount] | None = None,
    cannot_write: str | None = None,
    detach: Detach | None = None,
    edges: Edges = EDGES,
) -> tuple[Any, ...]:
    """Gather the evidence, decide, act; returns (decision, steps done). `accounts` gets
    what was read of the records and what not; `cannot_write` (writable_problem's line) is
    told to a requeued job too; `detach` starts the job's start-when-pending poller
    (default gpugate.child.detach); `edges`: what is read and written beside Slurm."""
    # A failed multi-node job's bundles are waited for to vote on its suspect, too.
    wait = needs_evidence(job, config) or wants_votes(job, config)
    accounts = [] if accounts is None else accounts
    summaries, unreadable = edges.records(config, job, wait_s if wait else 0, accounts)
    for account in accounts:
        if account.not_read or account.digest not in (None, "used"):
            # What the decision did not see, said where the admin looks (slurmctld's log).
            log.say(f"epilog-slurmctld job {job.job_id}: {account.describe()}")
    for problem in dict.fromkeys(unreadable.values()):  # plainly, in slurmctld's log
        log.say(f"epilog-slurmctld job {job.job_id}: {problem}")
    drill = drill_of(summaries)
    # The drill's mark travels in the node's decision record (this process read no overlay):
    # the AdminComment and the event line then say `DRILL <id>`, as the node's drain does.
    mark_drill(drill)
    decision = decide_requeue(job, summaries, config, unreadable if wait else None)
    if summaries:  # the flight recorder's culprit node, where root's evidence agrees
        named = with_culprit(config, job, summaries, decision.suspects)
        decision = decision.replace(suspects=named)
    if not dry_run and not drill:  # a simulated fault names no suspect
        try:
            voted = edges.vote(config, job, summaries, decision.category)
        except Exception as exc:  # a vote must never cost the job its requeue
            voted = f"suspect vote failed: {type(exc).__name__}: {exc}"
        if voted:
            log.say(f"epilog-slurmctld job {job.job_id}: {voted}")
            log.event(controller_dir(config), "vote", job=job.job_id, said=voted)
    if decision.slurm_requeued:
        decision = decision.replace(refused_on=refusals(job, slurm))
    if decision.requeue:
        _, _, ckpt_dir = requested(comment_tokens(job.comment), config)
        decision = decision.replace(checkpoint=edges.checkpoint(config, job, ckpt_dir),
                                    ckpt_dir=ckpt_dir)  # fmt: skip
    # Decided: the plan (act/plans.requeue_steps), carried out or, dry, only said.
    plan = requeue_steps(decision, job, config, pins(slurm, job.job_id, decision, config))
    if decision.requeue:  # pending again: the job takes an AdminComment
        plan += requeued_notes(job.job_id, told_notes(job, summaries, unreadable, cannot_write))
    hands = Hands(config, slurm, hook="epilog-slurmctld", detach=detach)
    done = execute(plan, hands, dry_run=dry_run, kept=None).lines()  # logged below, by the caller
    return decision, done


def told_notes(
    job: JobEnd,
    summaries: list[ControllerRecord],
    unreadable: dict[str, str],
    cannot_write: str | None,
) -> list[tuple[str, str | None]]:
    """What a requeued job's AdminComment also says, each (the report's name for it, the
    text or None): a stale checkpoint, the flight recorder's culprit, which node's record
    could not be read, and that the decisions could not be recorded."""
    return [("checkpoint age comment", stale_note(summaries)),
            ("flight recorder comment", culprit_comment(job, summaries)),
            ("admin comment: a record unreadable", next(iter(unreadable.values()), None)),
            ("admin comment: controller_dir unwritable", cannot_write)]  # fmt: skip


def drill_of(summaries: list[ControllerRecord]) -> str | None:
    """The drill a run's nodes ended under (their records' `drill`), or None."""
    return next((s.drill for s in summaries if s.kind == "drill" and s.drill), None)


def run_epilog_slurmctld(
    config: Config,
    make_slurm: Callable[[Config], SlurmControl] | None = None,
    detach: Detach | None = None,
) -> int:
    """The controller epilog for the job in this environment: decide, act, record (exit 0).

    `make_slurm` makes the Slurm adapter (default: the site's backend); `detach` as run_requeue's.
    """
    job = job_from_env()
    if not job.job_id:
        return 0
    slurm = (make_slurm or backend_for)(config)
    try:
        info = slurm.job(job.job_id)
        job = job.replace(
            state=info.state,
            restarts=info.restarts,
            uid=job.uid if job.uid is not None else info.uid,
            # Slurm's own word on a failed prolog (a state file on the node cannot reach here).
            requeued=info.back_in_queue,
            launch_failed=info.launch_failed,
            admin_comment=info.admin_comment,
            stdout=info.stdout or "",
        )
    except Exception as exc:  # decide from the environment alone
        log.say(f"epilog-slurmctld job {job.job_id}: cannot read the job from Slurm: {exc}")
    where = controller_dir(config)
    cannot_write = writable_problem(where)
    if cannot_write:  # said before deciding: the decision itself will not be recorded
        log.say(f"epilog-slurmctld job {job.job_id}: {cannot_write}")
    accounts: list[ReadAccount] = []
    wait_s = config.requeue.wait_for_bundles_s
    decision, done = run_requeue(config, job, slurm, wait_s, accounts=accounts,
                                 cannot_write=cannot_write, detach=detach)  # fmt: skip
    read = accounts[0] if accounts else None
    log.say(f"epilog-slurmctld job {job.job_id}: {decision.describe()} ({'; '.join(done)})")
    # `ended_well` and `nodes`: which run completed where (admin/reliability.py: a job that
    # failed on one node and completed elsewhere). `state` is mostly COMPLETING here.
    log.event(where, "epilog-slurmctld", job=job.job_id, restarts=job.restarts, sluid=job.sluid,
              state=job.state or None, ended_well=ended_well(job),
              nodes=hostlist(job.nodes) if job.nodes else None,
              requeue=decision.requeue, slurm=slurm.kind,
              why=decision.why, category=decision.category, suspects=list(decision.suspects),
              refused_on=list(decision.refused_on), told=decision.tell,
              said=decision.describe() if decision.tell else None,
              unreadable=decision.unreadable or None,
              checkpoint=decision.checkpoint, ckpt_dir=decision.ckpt_dir,
              records=read.describe() if read else None,
              not_read=hostlist(read.not_read) if read and read.not_read else None,
              not_read_count=len(read.not_read) if read else None,
              steps=done, pid=os.getpid())  # fmt: skip
    return 0


def writable_problem(directory: str) -> str | None:
    """None when this process can write `directory` (made if missing); else the plain line."""
    from gpugate.fsutil import STATE_DIR_MODE, private_dir

    try:
        if not os.path.isdir(directory):
            private_dir(directory, STATE_DIR_MODE, gid=-1)
        if os.path.islink(directory):
            raise NotADirectoryError(f"{directory}: a symlink")
        if os.access(directory, os.W_OK | os.X_OK):
            return None
        why = "permission denied"
    except OSError as exc:
        why = exc.strerror or str(exc)
    who = user_name()
    return (f"cannot write {directory} as {who}: give it to {who} (chown {who} {directory}; "
            f"the package does) or set controller_dir to a directory {who} owns [{why}]; the "
            "decisions are not recorded for gpugate report")  # fmt: skip

"""`gpugate epilog-slurmctld` (EpilogSlurmctld) and the shared requeue flow."""

from __future__ import annotations

import os

from gpugate import log
from gpugate.checkpoints.freshness import tell_stale
from gpugate.commands import run_hook_command
from gpugate.flightrec.votes import tell_culprit, with_culprit
from gpugate.slurm_hooks.hookenv import comment_tokens, from_environ
from gpugate.slurm_hooks.requeue import (
    JobEnd,
    apply,
    decide_requeue,
    needs_evidence,
    refusals,
    requested,
    resume_point,
    wait_for_summaries,
)
from gpugate.slurm_hooks.slurm.choose import backend
from gpugate.slurm_hooks.slurm.cli import expand_hostlist
from gpugate.slurm_hooks.suspicion import vote as cast_vote
from gpugate.slurm_hooks.suspicion import wants_votes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config
    from gpugate.slurm_hooks.requeue import JobEnd
    from gpugate.slurm_hooks.slurm.control import SlurmControl


def main(argv: list[str]) -> int:
    """Run the controller epilog."""
    return run_hook_command("epilog-slurmctld", argv, _body)


def job_from_env(environ: dict[str, str] | None = None) -> JobEnd:
    """What EpilogSlurmctld's environment says (it carries the comment and the node list)."""
    env = from_environ(environ)
    return JobEnd(job_id=env.job_id or "", uid=env.uid, gid=env.gid, comment=env.comment,
                  restarts=env.restart_count, exit_code2=env.exit_code2,
                  nodes=tuple(expand_hostlist(env.nodelist)) if env.nodelist else ())  # fmt: skip


def run_requeue(
    config: Config, job: JobEnd, slurm: SlurmControl, wait_s: float, dry_run: bool = False
) -> tuple:
    """Gather the evidence, decide, act; returns (decision, steps done)."""
    # A failed multi-node job's bundles are waited for to vote on its suspect, too.
    wait = needs_evidence(job, config) or wants_votes(job, config)
    summaries = wait_for_summaries(config, job, wait_s if wait else 0)
    decision = decide_requeue(job, summaries, config)
    if summaries:  # the flight recorder's culprit node, where root's evidence agrees
        named = with_culprit(config, job, summaries, decision.suspects)
        decision = decision.replace(suspects=named)
    if not dry_run:
        try:
            voted = cast_vote(config, job, summaries, decision.category)
        except Exception as exc:  # a vote must never cost the job its requeue
            voted = f"suspect vote failed: {type(exc).__name__}: {exc}"
        if voted:
            log.say(f"epilog-slurmctld job {job.job_id}: {voted}")
            log.event(config.state_dir, "vote", job=job.job_id, said=voted)
    if decision.slurm_requeued:
        decision = decision.replace(refused_on=refusals(job, slurm))
    if decision.requeue:
        _, _, ckpt_dir = requested(comment_tokens(job.comment), config)
        decision = decision.replace(checkpoint=resume_point(config, job, ckpt_dir))
    done = apply(decision, slurm, job, config, dry_run=dry_run)
    if decision.requeue and not dry_run:  # pending again: the job takes an AdminComment
        told = [tell_stale(slurm, job.job_id, summaries), tell_culprit(config, slurm, job)]
        done += [t for t in told if t]
    return decision, done


def _body(config: Config) -> int:

    job = job_from_env()
    if not job.job_id:
        return 0
    slurm = backend(config.slurm.backend, timeout=config.slurm.timeout_s)
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
        )
    except Exception as exc:  # decide from the environment alone
        log.say(f"epilog-slurmctld job {job.job_id}: cannot read the job from Slurm: {exc}")
    decision, done = run_requeue(config, job, slurm, config.requeue.wait_for_bundles_s)
    log.say(f"epilog-slurmctld job {job.job_id}: {decision.describe()} ({'; '.join(done)})")
    log.event(config.state_dir, "epilog-slurmctld", job=job.job_id, restarts=job.restarts,
              requeue=decision.requeue,
              why=decision.why, category=decision.category, suspects=list(decision.suspects),
              refused_on=list(decision.refused_on),
              checkpoint=decision.checkpoint, steps=done, pid=os.getpid())  # fmt: skip
    return 0

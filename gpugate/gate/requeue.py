"""Requeue after an infrastructure failure, from the newest complete checkpoint, off bad nodes.

The decision (pure, `decide_requeue`) takes what the controller knows: the job's request
(`--comment` tokens), its end (exit code, Slurm's job state), its restart count, and the node
epilogs' decision records (gpugate/store/controller_view.py: never the bundles, which SlurmUser
may not read). User errors are never requeued; neither is a job out of restarts. Evidence the
controller cannot read is never taken for "no infrastructure fault": the decision says so.
"""

from __future__ import annotations

import os
import pwd
import time

from gpugate.child import detach as detach_child
from gpugate.diagnosis.categories import is_infrastructure
from gpugate.record import Record
from gpugate.slurm.choose import backend as slurm_backend
from gpugate.slurm.hookenv import comment_tokens
from gpugate.slurm.reasons import refused_nodes
from gpugate.slurm.records import PROLOG_FAILED_SIGNAL
from gpugate.store import controller_view
from gpugate.store.view_records import ControllerRecord, suspect_node
from gpugate.userfiles import as_user

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypedDict

    from gpugate.child import Detach
    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl
    from gpugate.store.controller_view import ReadAccount

# Slurm's own verdicts on the job (JobState) that settle the question without logs.
USER_STATES = frozenset({"TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "DEADLINE", "PREEMPTED"})
INFRA_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})
ENDED_WELL = "the job ended well (exit 0:0)"


class JobEnd(Record):
    """What the controller knows about a finished job."""

    job_id: str
    uid: int | None = None
    gid: int | None = None
    comment: str = ""
    restarts: int = 0
    # SLURM_JOB_SLUID of the run that ended (25.11+; Slurm gives the next run a new one only
    # once this run has completed, batch_requeue_fini): the nodes' records of another SLUID
    # are an earlier job's under a reused id, never this run's.
    sluid: str | None = None
    state: str | None = None  # Slurm's JobState: FAILED, NODE_FAIL, TIMEOUT, CANCELLED, ...
    exit_code2: str | None = None
    nodes: tuple[str, ...] = ()
    # What Slurm itself says (scontrol show job, read by EpilogSlurmctld): the job is back in
    # the queue already, its prolog or launch failed, and the AdminComment as it stands.
    requeued: bool = False
    launch_failed: bool = False
    admin_comment: str = ""
    stdout: str = (
        ""  # the job's StdOut path (Slurm's, expanded): its "not requeued" note goes beside
    )


if TYPE_CHECKING:

    class Common(TypedDict):
        """The fields every decision of one job shares (typed, so `**base` is checked)."""

        category: str | None
        suspects: tuple[str, ...]
        restarts: int
        max_restarts: int

else:
    Common = dict


class RequeueDecision(Record):
    """Whether to requeue, why, where not to run, and where to resume."""

    requeue: bool
    why: str
    category: str | None = None
    suspects: tuple[str, ...] = ()
    checkpoint: str | None = None
    restarts: int = 0
    max_restarts: int = 0
    # Whether the job's AdminComment gets this decision: never for a job that ended well, did
    # not opt in or that Slurm requeued itself (the prolog's refusal stays the explanation).
    tell: bool = False
    slurm_requeued: bool = False
    refused_on: tuple[str, ...] = ()  # nodes whose gpugate prolog refused the job, now drained
    pinned: tuple[str, ...] = ()  # suspects the job asks for by name (-w): not excluded
    # The job's checkpoint directory, said when the controller could not look into it.
    ckpt_dir: str | None = None
    # Node -> why its decision record could not be read (as SlurmUser, say).
    unreadable: dict[str, Any] = {}

    def describe(self) -> str:
        """One line for logs and the job's AdminComment."""
        verb = "requeued" if self.requeue else "not requeued"
        text = f"{verb}: {self.why}"
        if self.requeue:
            text += f"; restart {self.restarts + 1}/{self.max_restarts}"
            excluded = [n for n in self.suspects if n not in self.pinned]
            if excluded:
                text += f"; excluded {','.join(excluded)}"
            if self.pinned:
                pins = ",".join(self.pinned)
                text += f"; kept the -w pin on {pins} (not excluded: the job waits for {pins})"
            if self.checkpoint:
                text += f"; resume from {self.checkpoint}"
            elif self.ckpt_dir:
                text += (f"; resumes from the newest complete checkpoint in {self.ckpt_dir}, "
                         "found by the job's TaskProlog")  # fmt: skip
        return text


def requested(tokens: dict[str, str], config: Config) -> tuple[bool, int, str | None]:
    """(opted in, max restarts, checkpoint dir) from the job's `gpugate:` comment tokens."""
    rq = config.requeue
    opted = ("requeue" in tokens or "ckpt" in tokens) or not rq.opt_in
    wanted = tokens.get("restarts", "")
    limit = int(wanted) if wanted.isdigit() else rq.max_restarts
    return opted, min(limit, rq.max_restarts_limit), tokens.get("ckpt") or None


def cause(
    job: JobEnd, summaries: list[ControllerRecord]
) -> tuple[str | None, tuple[str, ...], bool]:
    """(category, suspect nodes, infrastructure?) from Slurm's verdict and the bundles."""
    hardware = tuple(sorted({s.node for s in summaries if s.hardware_fault and s.node}))
    first = suspect_node(summaries)
    suspects = (first, *(n for n in hardware if n != first)) if first else ()
    # Only root's evidence can make a cause the cluster's: a node's own failing checks
    # (hardware_fault), or a category decided by a line root read itself (category_trusted,
    # written by the epilog). A bundle whose infrastructure category has no such mark (a job
    # that printed Xid 79, an older bundle) is no evidence of anything; nor is one the
    # diagnosis was not sure of (confidence medium or low: the text could mean another cause).
    categories = [s.category for s in summaries if s.category
                  and (not is_infrastructure(s.category) or sure_infrastructure(s))]  # fmt: skip
    state = (job.state or "").upper()
    if state in INFRA_STATES:
        return "slurm_node_failure", suspects, True
    if state in USER_STATES:
        return state.lower(), suspects, False
    if hardware:
        hw = [c for c in categories if is_infrastructure(c)]
        return (hw[0] if hw else "gpu_xid_hardware"), suspects, True
    infra = [c for c in categories if is_infrastructure(c)]
    if infra:
        return infra[0], suspects, True
    return (categories[0] if categories else None), suspects, False


def sure_infrastructure(summary: ControllerRecord) -> bool:
    """Whether a bundle's category can be a cluster cause: decided by root's lines, and sure.

    A bundle from before confidence existed has none: its trusted category counts as before.
    """
    return summary.category_trusted is True and summary.confidence in (None, "high")


def decide_requeue(
    job: JobEnd,
    summaries: list[ControllerRecord],
    config: Config,
    unreadable: dict[str, Any] | None = None,
) -> RequeueDecision:
    """The decision for one finished job (no I/O); `unreadable`: node -> why its record
    could not be read (then no evidence is not "no fault")."""
    opted, limit, _ = requested(comment_tokens(job.comment), config)
    category, suspects, infra = cause(job, summaries)
    base = Common(category=category, suspects=suspects, restarts=job.restarts, max_restarts=limit)
    if slurm_requeued(job):
        # EpilogSlurmctld also runs after a failed prolog, when Slurm has requeued the job itself.
        why = "Slurm requeued the job already" + (
            " (its prolog failed on a node)" if job.launch_failed else ""
        )
        return RequeueDecision(requeue=False, why=why, slurm_requeued=True, **base)
    if ended_well(job):
        # Whatever a bundle says (a fault the prolog already knew, one on another job's GPUs):
        # the run did what it was asked, and running it again would only lose its result.
        return RequeueDecision(requeue=False, why=ENDED_WELL, **base)
    if not opted:
        return RequeueDecision(
            requeue=False, why="the job did not opt in (gpugate:ckpt= or gpugate:requeue)", **base
        )
    # An opted-in job that failed hears why it was not requeued; one that ended well, nothing.
    tell = ended_abnormally(job)
    if not infra and unreadable:
        why = next(iter(unreadable.values()))
        return RequeueDecision(requeue=False, why=why, tell=tell, unreadable=dict(unreadable),
                               **base)  # fmt: skip
    if not infra:
        what = category or "no evidence of an infrastructure fault"
        why = f"not an infrastructure failure ({what})"
        return RequeueDecision(requeue=False, why=why, tell=tell, **base)
    if job.restarts >= limit:
        why = f"{category}, but no restarts left ({job.restarts}/{limit})"
        return RequeueDecision(requeue=False, why=why, tell=tell, **base)
    return RequeueDecision(
        requeue=True, why=f"infrastructure failure ({category})", tell=True, **base
    )


def slurm_requeued(job: JobEnd) -> bool:
    """Whether Slurm put the job back in the queue itself before this hook ran."""
    state = (job.state or "").upper()
    # 24.11's EpilogSlurmctld sees the prolog's failure as the exit code (see slurm_parse).
    prolog_code = job.exit_code2 == f"0:{PROLOG_FAILED_SIGNAL}"
    return state == "PENDING" or job.requeued or job.launch_failed or prolog_code


def ended_well(job: JobEnd) -> bool:
    """This run ended with exit 0:0 and Slurm calls it completed: never requeued, whatever the
    bundles say. EpilogSlurmctld reads the state while the job is still COMPLETING (scontrol
    prints COMPLETING over the final state until the epilogs are done), so that counts too."""
    state = (job.state or "").upper()
    done = state in ("COMPLETED", "COMPLETING") and not (job.requeued or job.launch_failed)
    return done and job.exit_code2 == "0:0"


def ended_abnormally(job: JobEnd) -> bool:
    """A node failure or a non-zero exit (the env's SLURM_JOB_EXIT_CODE2; unknown counts)."""
    return (job.state or "").upper() in INFRA_STATES or job.exit_code2 != "0:0"


def needs_evidence(job: JobEnd, config: Config) -> bool:
    """Whether to wait for the node epilogs' bundles, or decide at once.

    Waiting keeps the job COMPLETING: never for jobs that did not opt in, ended well, or were
    already requeued by Slurm.
    """
    state = (job.state or "").upper()
    if not requested(comment_tokens(job.comment), config)[0] or state == "COMPLETED":
        return False
    return not slurm_requeued(job) and ended_abnormally(job)


def wait_for_summaries(
    config: Config, job: JobEnd, wait_s: float, accounts: list[ReadAccount] | None = None
) -> tuple[list[ControllerRecord], dict[str, str]]:
    """(the nodes' done records for this run of the job, node -> why unreadable).

    Waits until every node epilog has ended (its record done, or past its deadline): a record
    not there yet up to `wait_s`, a running one up to its deadline (at most wait_s plus
    epilog.deadline_s in all). The records are all the controller reads, never the bundles;
    of a job over requeue.max_records nodes, at most that many in full (the others' decision
    fields from the job's digest). `accounts` gets what was read and what not.
    """
    if not job.nodes or not job.job_id:
        return [], {}
    cap = wait_s + config.epilog.deadline_s if wait_s > 0 else 0.0
    try:
        summaries, problems, _, account = controller_view.read_records(
            config.evidence_dir, job.job_id, job.nodes, job.restarts, wait_s, cap,
            max_records=config.requeue.max_records, sluid=job.sluid,
        )  # fmt: skip
    except (OSError, ValueError) as exc:  # a node name unfit for a path, say
        return [], {"*": f"cannot read the decision records: {exc}"}
    if accounts is not None:
        accounts.append(account)
    return summaries, {n: cannot_read(why) for n, why in problems.items()}


def cannot_read(problem: str) -> str:
    """The plain line for a record this process cannot read: where, as whom, and the fix."""
    who = user_name()
    what, _, why = problem.removeprefix("cannot read ").partition(": ")
    return (f"cannot read {what} as {who}: let {who} pass through it and its parents up to "
            f"evidence_dir (chmod o+x), and give controller-view/ to {who}'s group "
            "(epilog.view_group; 0750, records 0640) "
            f"[{why or 'unreadable'}]")  # fmt: skip


def user_name() -> str:
    """This process's user name (EpilogSlurmctld runs as SlurmUser), else `uid N`."""

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def resume_point(config: Config, job: JobEnd, ckpt_dir: str | None) -> str | None:
    """The newest complete checkpoint, looked up as the job's user (None when unknown).

    Unknown also where the controller cannot look (SlurmUser cannot run a task as the user;
    not mounted here): the TaskProlog finds it on the node, and the comment says so.
    """
    if not ckpt_dir:
        return None

    task = "gpugate.checkpoints.discover:latest_checkpoint_path"
    try:
        found = as_user(job.uid, job.gid, task, {"ckpt_dir": ckpt_dir}, timeout=30)
        # The child runs as the user: take only what a path can be from its answer.
        return found if isinstance(found, str) and found.startswith("/") else None
    except Exception:  # not mounted on the controller, or not root here: the TaskProlog looks
        return None


def pins(
    slurm: SlurmControl, job_id: str, decision: RequeueDecision, config: Config
) -> tuple[str, ...]:
    """The suspects a requeued job asks for by name (-w, ReqNodeList): the exclusion leaves
    them alone (SlurmControl.exclude_nodes) and the AdminComment says so; () when none, when
    nothing is excluded, or when Slurm does not answer."""
    if not (decision.requeue and decision.suspects and config.requeue.exclude_suspects):
        return ()
    try:
        required = slurm.job(job_id).required_nodes
    except Exception:  # the exclusion itself reads the job again and keeps the pins
        return ()
    return tuple(n for n in decision.suspects if n in required)


def note_path(job: JobEnd) -> str | None:
    """`<the job's StdOut directory>/gpugate-<job id>.requeue.txt`, or None when unknown."""

    if not job.stdout.startswith("/") or not job.job_id.replace("_", "").isdigit():
        return None
    return os.path.join(os.path.dirname(job.stdout), f"gpugate-{job.job_id}.requeue.txt")


def tell_user(job: JobEnd, decision: RequeueDecision) -> str:
    """Why a failed job was not requeued, in a note beside its output, written as its user.

    Slurm refuses an AdminComment on a finished job. Only root can write as the user: as
    SlurmUser the note is skipped (the decision is in `gpugate evidence JOB` and the log), and
    so is a note whose file exists and is another user's (userfiles.write_note).
    """

    path = note_path(job)
    if path is None:
        return "skipped: the job's output directory is unknown"
    if os.geteuid() != 0:
        return f"skipped: running as {user_name()}, not root (see gpugate evidence {job.job_id})"
    text = (f"gpugate: job {job.job_id} (run {job.restarts}) ended and was {decision.describe()}\n"
            f"gpugate: your admin reads more with `gpugate evidence {job.job_id}`.\n")  # fmt: skip
    task = "gpugate.userfiles:write_note"
    # `skipped: ...` where a file of another user is in the way (issue 41): said in the
    # controller's log and event line, the file left alone.
    said = as_user(job.uid, job.gid, task, {"path": path, "text": text}, timeout=10)
    return said if isinstance(said, str) else path


def refusals(job: JobEnd, slurm: SlurmControl) -> tuple[str, ...]:
    """The job's nodes whose gpugate prolog refused it and that are drained now.

    From the prolog's AdminComment (`gpugate: node N refused: ...`) when it is there, else
    from Slurm: a job Slurm requeued itself on a node drained with a gpugate reason. A node
    that refused without being drained (the drain failed) is left out: the job could land
    on it again at once, so Slurm's delay stays.
    """
    named = refused_nodes(job.admin_comment)
    candidates = list(dict.fromkeys(named)) or list(job.nodes)
    if not candidates or len(candidates) > 64:  # a refusal is one or a few nodes
        return ()
    found = []
    for name in candidates:
        try:
            node = slurm.node(name)
        except Exception:  # unknown or unreachable: not known to be drained
            node = None
        if node is not None and node.drained and node.gpugate_owned:
            found.append(name)
    return tuple(found)


def start_when_pending(
    config: Config, job_id: str, wait_s: float = 120.0, detach: Detach | None = None
) -> None:
    """Clear the requeue's +120 s BeginTime once the requeue has happened, in the background.

    A requeue asked for from EpilogSlurmctld takes effect after the hook returns, and it sets
    BeginTime then: a `StartTime=now` sent right away is overwritten. So a detached clean child
    (`detach`, default gpugate.child.detach: a fresh interpreter, not a fork of this process,
    holding none of its descriptors: slurmscriptd waits for EOF on the hook's output pipe)
    polls the job until it is pending.
    """
    kwargs = {"job_id": job_id, "backend": config.slurm.backend,
              "timeout": config.slurm.timeout_s, "wait_s": wait_s}  # fmt: skip
    (detach or detach_child)("gpugate.gate.requeue:start_now_when_pending", kwargs,
                             timeout=wait_s + 30)  # fmt: skip


def start_now_when_pending(
    job_id: str,
    backend: str,
    timeout: float,
    wait_s: float,
    slurm: SlurmControl | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """In the detached child: poll the job until Slurm has it pending, then start it now.

    `slurm` (default: the `backend` kind under `timeout`) and `sleep` are for the tests."""
    slurm = slurm or slurm_backend(backend, timeout=timeout)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if slurm.job(job_id).state == "PENDING":
                slurm.cli.start_now(job_id)
                return True
        except Exception:  # slurmctld busy or the job between states: ask again
            pass
        sleep(1)
    return False

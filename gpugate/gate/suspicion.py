"""What users write may point at a node, never take it out: votes and app Xids ask for proof.

Two things make a node a suspect without root's own evidence of a fault:
- cross-job votes (EpilogSlurmctld): the node that failed first in a failed multi-node job, by
  the time stamps of the job's log lines or the flight recorder's dumps, which the job's user
  writes;
- the application-Xid rule (the node's epilog): Xid 13/31/43 raised on one GPU by the jobs of
  several users (NVIDIA's catalog: the application's fault; its workflows suspect the GPU only
  when unrelated jobs repeat them), which one user's code can raise at will.

Neither drains. Past its threshold a node is *flagged* (gpugate/store/suspects.py): the flag
asks gpugate for a qualification of the node (`gpugate qualify NODE`, in a MAINT reservation
that waits for the node's running jobs, health.suspect_action: qualify) whose DCGM, NVML and
bandwidth results, which root reads, decide: a failure drains the node as any root-evidenced
fault does, a pass closes every vote and application Xid counted before it. Flags have their
own small allowance (health.suspect_qualify_per_day, across the cluster), and each user has a
share of it (health.suspect_qualify_per_user_per_day): a qualification is charged to every user
whose jobs counted towards the flag, and a flag whose users have all spent their share is a
review, so two users faking failures cannot spend the allowance a genuine suspect needs. Past
the allowance, and with health.suspect_action: review, the flag waits for an admin's look
(`gpugate nodes`) or the next sweep (`gpugate qualify --idle` takes flagged nodes first).

The allowance is one count only where one store sees every flag: the controller's directory
(its votes: one writer) or a shared admin.history_dir (the node epilogs' application-Xid
flags). With the node-local history (admin.history_dir unset) each node would count only its
own flags, an allowance per node: there a node's flag is a review (allowance_note, selftest).
No flag touches the drain budget: the share that hardware and checklist drains need is never
spent by what users wrote.
"""

from __future__ import annotations

import os
import time

from gpugate import log
from gpugate.child import ChildError, detach
from gpugate.diagnosis.categories import USER, kind
from gpugate.gate.flightrec_votes import first_node as fr_first_node
from gpugate.gate.requeue import USER_STATES
from gpugate.store import history
from gpugate.store import suspects as S
from gpugate.store.view_records import ControllerRecord, first_failure

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gpugate.config.schema import Config
    from gpugate.gate.requeue import JobEnd

DAY_S = 86400.0


def wants_votes(job: JobEnd, config: Config) -> bool:
    """Whether this job can cast a vote: voting on, several nodes, and it failed."""
    return (
        config.health.suspect_votes > 0
        and len(job.nodes) >= 2
        and (job.state or "").upper() != "COMPLETED"
        and job.exit_code2 != "0:0"
    )


def user_caused(
    job: JobEnd, category: str | None, summaries: list[ControllerRecord], node: str
) -> bool:
    """Whether the job ended by its user's doing: Slurm's state, its category, the node's own."""
    # scontrol says `CANCELLED by 1000` for a job a user cancelled.
    if (job.state or "").upper().split(" ")[0] in USER_STATES:
        return True
    own = [s.category for s in summaries if s.node == node]
    return any(kind(c) == USER for c in (category, *own))


def failing_node(job: JobEnd, summaries: list[ControllerRecord]) -> tuple[str, float | None] | None:
    """(node, its first failure time or None) when the bundles name one failing node of the job.

    The diagnosis names the failing rank's node where the log (torchrun's table, NCCL's prefix)
    or the job's layout tells it; bundles naming different nodes, or a node not the job's, say
    nothing.
    """
    named = {s.failing_node for s in summaries if s.failing_node is not None}
    if len(named) != 1:
        return None
    node = named.pop()
    if node not in job.nodes:
        return None
    return node, first_failure(summaries, node)


def vote(
    config: Config,
    job: JobEnd,
    summaries: list[ControllerRecord],
    category: str | None,
    now: float | None = None,
) -> str | None:
    """Cast this failed job's vote; past the threshold, flag its node. What was done, or None."""
    if not wants_votes(job, config):
        return None
    # The flight recorder's culprit, when it names one, is stronger than the time stamps; so is
    # the failing rank's node when the bundles name it (the origin, not the first to notice).
    first = (
        fr_first_node(config, job, summaries)
        or failing_node(job, summaries)
        or S.first_to_fail(summaries, job.nodes)
    )
    if first is None:
        return "no suspect (a node without a failure time, or a tie)"
    node, at = first
    if user_caused(job, category, summaries, node):
        return f"no vote: {node} failed first, by the job's own doing ({category})"
    adm, hc = config.admin, config.health
    # The controller writes its own directory (SlurmUser's), reads it with the history's.
    mine, read = history.controller_dir(config), history.read_dirs(config)
    first_at = history.iso(at) if at is not None else None
    S.record_vote(mine, node, job.job_id, category, first_at, now, uid=job.uid,
                  max_per_node=adm.history_max_per_node,
                  max_entries=adm.history_max_entries)  # fmt: skip
    open_ = S.open_votes(read, node, hc.suspect_window_h, now)
    counted, users = S.tally(open_, hc.suspect_votes_per_user)
    said = f"suspect {node} ({counted}/{hc.suspect_votes} votes, {users} user(s))"
    if counted < hc.suspect_votes:
        return said
    # One user's jobs alone never flag a node, however many: each counts at most
    # suspect_votes_per_user, and at least suspect_users_min users must have voted.
    if users < hc.suspect_users_min:
        return f"{said}; {hc.suspect_users_min} users needed: not flagged"
    jobs = [v.job for v in open_]
    flagged = point_at(config, node, "votes", S.suspect_detail(jobs, users), jobs, users, now,
                       where=mine, uids=[v.uid for v in open_])  # fmt: skip
    return f"{said}; {flagged}"


def point_at(
    config: Config,
    node: str,
    source: str,
    detail: str,
    jobs: list[str],
    users: int,
    now: float | None = None,
    where: str | None = None,
    uids: Iterable[int | None] = (),
) -> str:
    """Flag `node` and ask for its qualification (or an admin's look); what was done.

    `where`: the directory written (the controller's for its votes); default the history's.
    `uids`: the users whose jobs counted towards the flag (None: a job of unknown user).
    """
    where = where or history.history_dir(config)
    read = tuple(dict.fromkeys((where, *history.read_dirs(config))))
    now = time.time() if now is None else now
    charged_to = S.flag_uids(uids)
    action, note = choose_action(config, read, now, charged_to, cluster_wide(config, where))
    adm = config.admin
    entry = S.record_flag(where, node, source, detail, jobs, users, action, note, now,
                          max_per_node=adm.history_max_per_node,
                          max_entries=adm.history_max_entries, read_from=read,
                          uids=charged_to)  # fmt: skip
    if entry is None:
        return f"{node} is a suspect already, awaiting its qualification or an admin"
    said = f"flagged {node} suspect ({source}: {detail})"
    if action == "qualify":
        try:
            pid = start_qualification(config, node, f"suspect ({source}): {detail}")
            note = f"qualification started (pid {pid})"
        except ChildError as exc:  # the flag stays open: the sweep or an admin takes it
            note = f"qualification could not start: {exc}; awaiting an admin or the sweep"
    # The controller's event goes to its own directory; a node epilog's to its state_dir.
    events = where if where == history.controller_dir(config) else config.state_dir
    log.event(events, "suspect", node=node, source=source, detail=detail,
              jobs=jobs, users=users, action=action, note=note)  # fmt: skip
    return f"{said}; {action}: {note}" if note else f"{said}; {action}"


def cluster_wide(config: Config, where: str) -> bool:
    """Whether a flag written to `where` counts the allowance where every flag is counted.

    The controller's directory holds every vote's flag (one writer); a node epilog's flags go
    to the history, which every node shares only when admin.history_dir is set (the packaged
    default, null, is each node's own state_dir: fleet_view.share_note says the same).
    """
    return where == history.controller_dir(config) or bool(config.admin.history_dir)


def allowance_note(config: Config) -> str:
    """selftest's line: where the suspects' allowance is counted, or that node flags are reviews."""
    votes = f"the controller's vote flags in {history.controller_dir(config)}"
    if config.admin.history_dir:
        return (f"suspect allowance: counted cluster-wide in {config.admin.history_dir} "
                f"(admin.history_dir, every node's application-Xid flags; {votes})")  # fmt: skip
    return (f"suspect allowance: per node: application-Xid flags go to review (admin.history_dir "
            f"unset: no node sees another's flags; set it to shared storage to count them "
            f"cluster-wide); {votes}")  # fmt: skip


def choose_action(
    config: Config,
    where: S.Dirs,
    now: float,
    uids: Sequence[int | None] = (),
    shared: bool = True,
) -> tuple[str, str]:
    """(action, why) for a new flag: a qualification within the allowance and within the share
    of one of its users (`uids`; none: charged to nobody), else a review. `shared`: `where`
    holds every flag of the cluster (cluster_wide)."""
    hc = config.health
    if hc.suspect_action != "qualify":
        return "review", "health.suspect_action: review (an admin looks: gpugate nodes)"
    if config.qualify is None:
        return "review", "no qualify: section in the configuration"
    if os.geteuid() != 0:
        # qualify reserves, drains and resumes nodes: root's work (its sweep runs from root's cron).
        return "review", "not root here: the next `gpugate qualify --idle` takes it"
    if not shared:
        # Counted here, the allowance would be per node: every node qualified each day.
        return "review", ("node-local history: the suspects' allowance cannot be counted "
                          "cluster-wide (set admin.history_dir to shared storage)")  # fmt: skip
    since = now - DAY_S
    asked = S.qualifications_asked(where, since)
    if asked >= hc.suspect_qualify_per_day:
        return "review", (f"the suspects' allowance is spent ({asked} qualifications in 24 h, "
                          f"health.suspect_qualify_per_day {hc.suspect_qualify_per_day})")  # fmt: skip
    share = hc.suspect_qualify_per_user_per_day
    charged = S.qualifications_charged(where, since)
    if uids and all(charged.get(u, 0) >= share for u in uids):
        who = ", ".join("unknown" if u is None else str(u) for u in uids)
        return "review", (f"the share of every user who pointed at it is spent (uid {who}: "
                          f"health.suspect_qualify_per_user_per_day {share} in 24 h)")  # fmt: skip
    return "qualify", ""


def start_qualification(config: Config, node: str, trigger: str) -> int:
    """Start the node's qualification in a detached child (it outlives the hook); its pid."""
    qc = config.qualify
    assert qc is not None  # choose_action asks for a qualification only with a qualify: section
    # Two phases at most for one node (its own job; pairs need two nodes), then the settling.
    timeout = 2 * qc.wait_s + 600
    kwargs = {"node": node, "trigger": trigger[:300], "config": os.environ.get("GPUGATE_CONFIG")}
    return detach("gpugate.qualify.launch:qualify_suspect", kwargs, timeout=timeout)

"""Cross-job suspect voting: the node that failed first in failed multi-node jobs.

In a multi-node job one node's fault makes every other rank time out; that node's evidence
need not show hardware (a link that flaps, a GPU that hangs without an Xid). After each failed
multi-node job the controller epilog (EpilogSlurmctld) names the node whose bundle shows the
earliest decisive failure (`first_failure_at`, written by the node epilog from the time stamps
of its diagnosis's decisive lines; the flight recorder's culprit node instead when the bundles'
dumps name one, gpugate/flightrec/votes.py) and records that vote in `suspects.jsonl` in
`admin.history_dir`, bounded and locked like drains.jsonl (gpugate.store.history). A node that
is the suspect of `health.suspect_votes` failed jobs within `health.suspect_window_h` hours is
drained (slurm_hooks/drain.py: gpugate's reason, ownership, the drain budget) with a reason
naming those jobs. Never a guess: a node without a time, a tie within the clocks' tolerance, a
missing bundle, or a job that ended by its user's doing (cancelled, its time limit, a user-kind
category such as its own OOM) casts no vote.
"""

from __future__ import annotations

import os
import time

from gpugate import log
from gpugate.clock import parse_utc
from gpugate.diagnosis.categories import USER, kind
from gpugate.diagnosis.multinode import TOLERANCE_S, first_stamp
from gpugate.flightrec.votes import first_node as fr_first_node
from gpugate.slurm_hooks.drain import drain_node
from gpugate.slurm_hooks.requeue import USER_STATES
from gpugate.store import history

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config
    from gpugate.diagnosis.verdict import Diagnosis
    from gpugate.slurm_hooks.requeue import JobEnd
    from gpugate.slurm_hooks.slurm.control import SlurmControl

SUSPECTS = "suspects.jsonl"
CHECK = "suspect"  # the drain reason's check id: `gpugate: suspect: in jobs 101,107 (...)`
JOBS_SHOWN = 8  # job ids named in a drain reason (Slurm reasons are read truncated)


def first_failure_at(diagnosis: Diagnosis) -> str | None:
    """The UTC time of the diagnosis's earliest decisive line, when it carries a full date."""
    # first_stamp reads the line again from its file when the cleaned text lost its stamp.
    stamp = first_stamp(diagnosis)
    return stamp.iso() if stamp is not None else None


def first_to_fail(summaries: list[dict], nodes: tuple[str, ...]) -> tuple[str, float] | None:
    """(node, epoch) of the job's node that failed first, or None when that is not certain.

    Every node of the job must have a bundle with a time: a node without one may have failed
    first for all anyone knows. The earliest must lead the next by more than TOLERANCE_S.
    """
    times: dict[str, float] = {}
    for s in summaries:
        node, when = s.get("node"), parse_utc(s.get("first_failure_at"))
        if isinstance(node, str) and when is not None:
            times[node] = when
    if len(nodes) < 2 or any(n not in times for n in nodes):
        return None
    ordered = sorted((times[n], n) for n in set(nodes))
    if ordered[1][0] - ordered[0][0] <= TOLERANCE_S:
        return None
    return ordered[0][1], ordered[0][0]


def user_caused(job: JobEnd, category: str | None, summaries: list[dict], node: str) -> bool:
    """Whether the job ended by its user's doing: Slurm's state, its category, the node's own."""
    # scontrol says `CANCELLED by 1000` for a job a user cancelled.
    if (job.state or "").upper().split(" ")[0] in USER_STATES:
        return True
    own = [s.get("category") for s in summaries if s.get("node") == node]
    return any(kind(c) == USER for c in (category, *own))


def valid_vote(e: object) -> bool:
    """Whether `e` is a vote as record_vote() writes it."""
    if not history._common_ok(e, ("at", "category", "first_failure_at")):
        return False
    uid = e.get("uid")  # type: ignore[union-attr]
    if uid is not None and (type(uid) is not int or uid < 0):
        return False
    return type(e.get("job")) is str and 0 < len(e["job"]) <= 64  # type: ignore[union-attr]


def record_vote(
    state_dir: str,
    node: str,
    job: str,
    category: str | None = None,
    first_at: str | None = None,
    when: float | None = None,
    *,
    uid: int | None = None,
    max_per_node: int = history.MAX_PER_NODE,
    max_entries: int = history.MAX_ENTRIES,
) -> dict | None:
    """Add one vote against `node`; the entry, or None when this job already voted for it."""
    when = time.time() if when is None else float(when)
    entry = {"node": node, "when": round(when, 3), "at": history.iso(when), "job": job,
             "category": category, "first_failure_at": first_at, "uid": uid}  # fmt: skip
    # EpilogSlurmctld may run twice for one job (a requeue): one vote per job and node.
    same = lambda last: last.get("job") == job  # noqa: E731
    return history._add(state_dir, SUSPECTS, valid_vote, entry, same, max_per_node, max_entries)


def votes(state_dir: str, node: str | None = None, since: float | None = None) -> list[dict]:
    """Votes (against one node, or all; since an epoch time, or all), oldest first."""
    entries = history._read_lines(os.path.join(state_dir, SUSPECTS), valid_vote)
    return history._select(entries, node, since)


def voting_jobs(state_dir: str, node: str, window_h: float, now: float | None = None) -> list[str]:
    """The distinct jobs that named `node` suspect in the last `window_h` hours, oldest first."""
    since = (time.time() if now is None else now) - window_h * 3600
    return list(dict.fromkeys(v["job"] for v in votes(state_dir, node, since)))


def voting_users(state_dir: str, node: str, window_h: float, now: float | None = None) -> int:
    """How many distinct users' jobs named `node` suspect in the window (no uid: one user)."""
    since = (time.time() if now is None else now) - window_h * 3600
    return len({v.get("uid") for v in votes(state_dir, node, since)})


def suspect_detail(jobs: list[str]) -> str:
    """The drain reason's detail: `in jobs 101,107,112 (first to fail)`."""
    shown = ",".join(jobs[-JOBS_SHOWN:])
    more = f" +{len(jobs) - JOBS_SHOWN} more" if len(jobs) > JOBS_SHOWN else ""
    return f"in jobs {shown}{more} (first to fail)"


def wants_votes(job: JobEnd, config: Config) -> bool:
    """Whether this job can cast a vote: voting on, several nodes, and it failed."""
    return (
        config.health.suspect_votes > 0
        and len(job.nodes) >= 2
        and (job.state or "").upper() != "COMPLETED"
        and job.exit_code2 != "0:0"
    )


def vote(
    config: Config,
    job: JobEnd,
    summaries: list[dict],
    category: str | None,
    slurm: SlurmControl,
    now: float | None = None,
) -> str | None:
    """Cast this failed job's vote and drain its suspect past the threshold; what was done."""
    if not wants_votes(job, config):
        return None
    # The flight recorder's culprit, when it names one, is stronger than the time stamps.
    first = fr_first_node(config, job, summaries) or first_to_fail(summaries, job.nodes)
    if first is None:
        return "no suspect (a node without a failure time, or a tie)"
    node, at = first
    if user_caused(job, category, summaries, node):
        return f"no vote: {node} failed first, by the job's own doing ({category})"
    adm = config.admin
    where = history.history_dir(config)
    first_at = history.iso(at) if at is not None else None
    record_vote(where, node, job.job_id, category, first_at, now, uid=job.uid,
                max_per_node=adm.history_max_per_node,
                max_entries=adm.history_max_entries)  # fmt: skip
    jobs = voting_jobs(where, node, config.health.suspect_window_h, now)
    users = voting_users(where, node, config.health.suspect_window_h, now)
    said = f"suspect {node} ({len(jobs)}/{config.health.suspect_votes} votes)"
    if len(jobs) < config.health.suspect_votes:
        return said
    # The times come from the jobs' own files, which their users write: one user's jobs alone
    # must not be able to drain a node (Slurm's uid for the job, read by the controller).
    if users < config.health.suspect_users_min:
        return (
            f"{said}; from {users} user(s), {config.health.suspect_users_min} needed: not drained"
        )
    return f"{said}; {drain_suspect(config, slurm, node, jobs, category)}"


def drain_suspect(
    config: Config, slurm: SlurmControl, node: str, jobs: list[str], category: str | None
) -> str:
    """Drain `node` for the jobs that named it, unless it is drained already; what happened."""
    try:
        if slurm.node(node).drained:
            return f"{node} already drained: left alone"
    except Exception as exc:  # cannot tell: drain_node leaves an admin's drain alone anyway
        log.say(f"suspect {node}: cannot read the node from Slurm: {exc}")
    outcome = drain_node(slurm, node, CHECK, suspect_detail(jobs), config)
    if outcome.drained:
        history.note_drain(config, node, outcome.reason, check=CHECK, category=category,
                           job=",".join(jobs), hook="epilog-slurmctld")  # fmt: skip
    log.event(config.state_dir, "suspect", node=node, jobs=jobs, drained=outcome.drained,
              reason=outcome.reason, blocked_by=outcome.blocked_by)  # fmt: skip
    if outcome.drained:
        return f"drained {node}: {outcome.reason}"
    return f"not drained ({outcome.blocked_by}: {outcome.why})"

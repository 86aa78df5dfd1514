"""The records of suspicion: votes against a node, and the flags that ask for its qualification.

In a multi-node job one node's fault makes every other rank time out; that node's evidence
need not show hardware (a link that flaps, a GPU that hangs without an Xid). After each failed
multi-node job the controller epilog names the node whose decision record shows the earliest
decisive failure and records that vote here (`suspects.jsonl` in `controller_dir`, the
SlurmUser's, bounded and locked like drains.jsonl, gpugate.store.history; every reader merges
it with `admin.history_dir`'s, where the node epilogs' application-Xid flags and root's
resumes and qualifications are). What decides the vote (the log's time
stamps, the flight recorder's dumps) is written by the job's user, so a vote only points at a
node: gpugate/gate/suspicion.py turns enough of them into a flag (`suspect-flags.jsonl`), and a
flag asks for a root-side check (`gpugate qualify`) or an admin's look, never a drain.

Suspicion is closed by the node's newest admin resume or passed qualification (closed_at):
votes and application Xids from before it no longer count, so what users did before an admin
cleared the node cannot take it out again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence

from gpugate.clock import parse_utc
from gpugate.diagnosis.multinode import TOLERANCE_S, first_stamp
from gpugate.store import history
from gpugate.store.entries import _COMMON, NodeEntry
from gpugate.store.view_records import ControllerRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar, TypeVar

    from gpugate.diagnosis.verdict import Diagnosis

    _N = TypeVar("_N", bound=NodeEntry)

SUSPECTS = "suspects.jsonl"
FLAGS = "suspect-flags.jsonl"
JOBS_SHOWN = 8  # job ids named in a flag's detail (it is shown in Slurm-width columns)
# The users (Slurm's uids) a flag is charged to: every user whose jobs counted towards it, the
# share of each (health.suspect_qualify_per_user_per_day). More than this many users pointing
# at one node is no attack the share needs to see (a flag needs 2 or 3).
USERS_KEPT = 64
# Where a flag came from: cross-job votes, or the node's application-Xid record.
SOURCES = ("votes", "app_xid")
# What a flag asked for: a qualification run by gpugate, or an admin's look (`gpugate nodes`).
ACTIONS = ("qualify", "review")


class VoteEntry(NodeEntry):
    """`suspects.jsonl`: one failed multi-node job's vote against the node that failed first."""

    job: str
    category: str | None = None
    first_failure_at: str | None = None
    uid: int | None = None

    _doc: ClassVar[dict[str, str]] = {
        **_COMMON,
        "job": "the failed job (one vote per job and node)",
        "category": "the job's failure category",
        "first_failure_at": "the node's earliest decisive failure, UTC ISO (when known)",
        "uid": "the job's user (Slurm's uid; unknown: null)",
    }


class FlagEntry(NodeEntry):
    """`suspect-flags.jsonl`: a node flagged suspect, and what gpugate asked for."""

    source: str
    detail: str | None = None
    jobs: list[str]
    users: int
    action: str
    note: str | None = None
    uids: list[int | None] = []

    _doc: ClassVar[dict[str, str]] = {
        **_COMMON,
        "source": "`votes` (cross-job votes) or `app_xid` (the node's application-Xid record)",
        "detail": "why, in a line (`first to fail in jobs 101,107 of 2 user(s)`)",
        "jobs": f"the jobs that counted (the newest {JOBS_SHOWN})",
        "users": "how many distinct users' jobs counted",
        "action": "`qualify` (gpugate starts a qualification) or `review` (an admin looks)",
        "note": "why that action (an allowance spent, no qualify: section)",
        "uids": f"the users the qualification is charged to (at most {USERS_KEPT}; "
        "null: unknown user; absent before flags named them: charged to nobody)",
    }


def first_failure_at(diagnosis: Diagnosis) -> str | None:
    """The UTC time of the diagnosis's earliest decisive line, when it carries a full date."""
    # first_stamp reads the line again from its file when the cleaned text lost its stamp.
    stamp = first_stamp(diagnosis)
    return stamp.iso() if stamp is not None else None


def first_to_fail(
    summaries: list[ControllerRecord], nodes: tuple[str, ...]
) -> tuple[str, float] | None:
    """(node, epoch) of the job's node that failed first, or None when that is not certain.

    Every node of the job must have a bundle with a time: a node without one may have failed
    first for all anyone knows. The earliest must lead the next by more than TOLERANCE_S.
    """
    times: dict[str, float] = {}
    for s in summaries:
        when = parse_utc(s.first_failure_at)
        if s.node is not None and when is not None:
            times[s.node] = when
    if len(nodes) < 2 or any(n not in times for n in nodes):
        return None
    ordered = sorted((times[n], n) for n in set(nodes))
    if ordered[1][0] - ordered[0][0] <= TOLERANCE_S:
        return None
    return ordered[0][1], ordered[0][0]


def valid_vote(e: object) -> bool:
    """Whether `e` is a vote as record_vote() writes it."""
    if not history._common_ok(e, ("at", "category", "first_failure_at")):
        return False
    uid = e.get("uid")
    if uid is not None and (type(uid) is not int or uid < 0):
        return False
    return type(e.get("job")) is str and 0 < len(e["job"]) <= 64


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
) -> VoteEntry | None:
    """Add one vote against `node`; the entry, or None when this job already voted for it."""
    when = time.time() if when is None else float(when)
    entry = VoteEntry(node=node, when=round(when, 3), at=history.iso(when), job=job,
                      category=category, first_failure_at=first_at, uid=uid)  # fmt: skip
    # EpilogSlurmctld may run twice for one job (a requeue): one vote per job and node.
    same = lambda last: last.job == job  # noqa: E731
    return history._add(state_dir, SUSPECTS, valid_vote, entry, same, max_per_node, max_entries)


Dirs = str | Sequence[str]  # one directory, or several whose files are read together


def _merged(dirs: Dirs, name: str, kind: type[_N], valid: Callable[[object], bool]) -> list[_N]:
    """The entries of `name` in every directory (the history's, the controller's), oldest first."""
    many = (dirs,) if isinstance(dirs, str) else tuple(dict.fromkeys(dirs))
    entries = [e for d in many for e in history._read_lines(os.path.join(d, name), kind, valid)]
    return sorted(entries, key=lambda e: e.when) if len(many) > 1 else entries


def votes(state_dir: Dirs, node: str | None = None, since: float | None = None) -> list[VoteEntry]:
    """Votes (against one node, or all; since an epoch time, or all), oldest first."""
    return history._select(_merged(state_dir, SUSPECTS, VoteEntry, valid_vote), node, since)


def closed_at(state_dir: Dirs, node: str) -> float:
    """When suspicion of `node` was last closed: its newest resume or passed qualification (0: never).

    A resume that was refused (resumed false) closes nothing; any passed level does: the
    qualification ran the checks root trusts on that node after the votes were cast.
    """
    from gpugate.store.qualify import qualifications

    many = (state_dir,) if isinstance(state_dir, str) else tuple(state_dir)
    times = [e.when for d in many for e in history.resumes(d, node) if e.resumed]
    times += [e.when for d in many for e in qualifications(d, node) if e.passed]
    return max(times, default=0.0)


def open_votes(
    state_dir: Dirs, node: str, window_h: float, now: float | None = None
) -> list[VoteEntry]:
    """The votes against `node` in the window and since its suspicion was last closed, one per job."""
    since = (time.time() if now is None else now) - window_h * 3600
    since = max(since, closed_at(state_dir, node))
    return list({v.job: v for v in votes(state_dir, node, since)}.values())


def voting_jobs(state_dir: Dirs, node: str, window_h: float, now: float | None = None) -> list[str]:
    """The distinct jobs that named `node` suspect in the window (open votes), oldest first."""
    return [v.job for v in open_votes(state_dir, node, window_h, now)]


def tally(open_: list[VoteEntry], per_user: int) -> tuple[int, int]:
    """(votes counted, distinct users) of open votes, each user's jobs counted at most `per_user`.

    A vote without a uid (an older entry) counts as one unknown user's.
    """
    per: dict[int | None, int] = {}
    for v in open_:
        per[v.uid] = per.get(v.uid, 0) + 1
    return sum(min(n, per_user) for n in per.values()), len(per)


def suspect_detail(jobs: list[str], users: int) -> str:
    """A flag's detail: `first to fail in jobs 101,107,112 of 2 users`."""
    shown = ",".join(jobs[-JOBS_SHOWN:])
    more = f" +{len(jobs) - JOBS_SHOWN} more" if len(jobs) > JOBS_SHOWN else ""
    return f"first to fail in jobs {shown}{more} of {users} user(s)"


def valid_flag(e: object) -> bool:
    """Whether `e` is a flag as record_flag() writes it."""
    if not history._common_ok(e, ("at", "detail", "note")):
        return False
    assert isinstance(e, dict)
    jobs, users, uids = e.get("jobs"), e.get("users"), e.get("uids", [])
    return (
        e.get("source") in SOURCES
        and e.get("action") in ACTIONS
        and type(jobs) is list
        and all(type(j) is str for j in jobs)
        and type(users) is int
        and users >= 0
        and type(uids) is list
        and len(uids) <= USERS_KEPT
        and all(u is None or (type(u) is int and u >= 0) for u in uids)
    )


def flag_uids(uids: Iterable[int | None]) -> list[int | None]:
    """The distinct users a flag is charged to, in order (an unknown uid, None, last)."""
    distinct = set(uids)
    return sorted(distinct, key=lambda u: (u is None, u or 0))[:USERS_KEPT]


def record_flag(
    state_dir: str,
    node: str,
    source: str,
    detail: str,
    jobs: list[str],
    users: int,
    action: str,
    note: str = "",
    when: float | None = None,
    *,
    max_per_node: int = history.MAX_PER_NODE,
    max_entries: int = history.MAX_ENTRIES,
    read_from: Sequence[str] = (),
    uids: Iterable[int | None] = (),
) -> FlagEntry | None:
    """Flag `node` suspect (what asked, why, what was done); None when a flag of it is still open.

    Written to `state_dir`; `read_from`: the other directories whose resumes close a flag;
    `uids`: the users whose jobs counted towards it (a qualification is charged to each).
    """
    when = time.time() if when is None else float(when)
    entry = FlagEntry(node=node, when=round(when, 3), at=history.iso(when), source=source,
                      detail=detail, jobs=list(jobs)[-JOBS_SHOWN:], users=int(users),
                      action=action, note=note, uids=flag_uids(uids))  # fmt: skip
    if not valid_flag(entry.to_json()):
        raise ValueError(f"not a suspect flag: {entry.to_json()!r}")
    # One open flag per node: a second job pointing at a node already waiting adds nothing.
    everywhere = (state_dir, *read_from)
    still_open = lambda last: last.when > closed_at(everywhere, node)  # noqa: E731
    return history._add(state_dir, FLAGS, valid_flag, entry, still_open, max_per_node, max_entries)


def flags(state_dir: Dirs, node: str | None = None, since: float | None = None) -> list[FlagEntry]:
    """Flags (of one node, or all; since an epoch time, or all), oldest first."""
    return history._select(_merged(state_dir, FLAGS, FlagEntry, valid_flag), node, since)


def open_flags(state_dir: Dirs) -> dict[str, FlagEntry]:
    """{node: its newest flag} for the nodes whose suspicion is not closed yet."""
    newest = {e.node: e for e in flags(state_dir)}
    return {n: e for n, e in newest.items() if e.when > closed_at(state_dir, n)}


def qualifications_asked(state_dir: Dirs, since: float) -> int:
    """How many flags since `since` asked gpugate for a qualification (the suspects' allowance)."""
    return sum(1 for e in flags(state_dir, since=since) if e.action == "qualify")


def qualifications_charged(state_dir: Dirs, since: float) -> dict[int | None, int]:
    """{uid: the qualifications since `since` charged to that user} (each user's share).

    A qualification is charged to every user whose jobs counted towards its flag; a flag
    written before flags named their users (no `uids`) is charged to nobody.
    """
    charged: dict[int | None, int] = {}
    for e in flags(state_dir, since=since):
        if e.action == "qualify":
            for uid in e.uids:
                charged[uid] = charged.get(uid, 0) + 1
    return charged

"""Fleet reliability figures for `gpugate report` (issue 46): mean time between failures per
node, board and check; the jobs that failed only on one node. Pure: over the drain history,
the audit log, the evidence bundles and EpilogSlurmctld's decisions. GPU-hours lost per
cause are admin/losses.py's (by_category); repeat offenders admin/report.py's.

Definitions (docs/guide/admin-review.md, "Fleet reliability figures", says the same):

- An **outage** of a node starts at a drain gpugate set (drains.jsonl; a drill's drain is a
  simulated fault and starts none) while the node was in service, and ends at the node's
  first audited lift after it (`gpugate resume`, healing: audit.jsonl, resumed). A drain while
  the node is out (no audited lift since its last drain) is part of the same outage. With no
  audited lift at all the outage lasts until now when Slurm shows the node drained (or Slurm
  could not be read), and ends at its last drain when Slurm shows it in service (lifted
  outside gpugate, at a time no record has: its time out is counted as in service).
- A **failure** is an outage that starts in the window; its **check** is its first drain's.
- A node's **in-service hours** are the window's hours less the hours of its outages within
  the window. Every node Slurm lists counts, and every node of the history; each is taken as
  present for the whole window.
- **MTBF** = in-service hours / failures, for a node (its own), a board (the sum over its
  nodes), a check (the fleet's in-service hours / that check's failures: how often the fleet
  sees that fault) and the fleet. None (shown `-`) with no failure.
- A node's **board** is the GPU type its Slurm Gres names (`gpu:h100:8`: h100; `unknown`
  without a type).
- A job **failed only on node N** when a run of it failed with N charged (its bundle on N, of
  kind job; when a bundle of the run names the failing rank's node, only that node is
  charged) and a later run of the same job (job id; and SLUID where both sides have one)
  completed (EpilogSlurmctld's line: `ended_well`, exit 0:0 and completed, not requeued:
  gate/requeue.py ended_well) on nodes without N. Per node: those jobs
  and their distinct users; a node with at least SUSPECT_USERS users is a suspect.
"""

from __future__ import annotations

from gpugate.admin.losses import UNDIAGNOSED
from gpugate.admin.rollout import OTHER
from gpugate.checks.registry import registered
from gpugate.diagnosis.categories import CATEGORIES
from gpugate.record import Record
from gpugate.slurm.hostlist import hostlist_expand
from gpugate.slurm.reasons import REASON_GRAMMAR_VERSION
from gpugate.store.history import by_node, drill_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping, Sequence

    from gpugate.admin.losses import Bundle, Requeue
    from gpugate.store.entries import AuditEntry, DrainEntry

UNKNOWN_BOARD = "unknown"
FLEET = "fleet"
SUSPECT_USERS = 2  # "several users' jobs": one user's jobs failing may be that user's code


class Outage(Record):
    """A node out of service after gpugate drained it: from, until, the check, how it ended."""

    node: str
    start: float
    end: float
    check: str
    ended: str  # "lifted" (audited), "still drained", "outside gpugate"


def outages(
    drains: Iterable[DrainEntry],
    audit: Iterable[AuditEntry],
    now: float,
    drained_now: Collection[str] | None = None,
) -> list[Outage]:
    """Every node's outages (the module's definition), oldest first per node. `drained_now`:
    the nodes Slurm shows drained (None: unknown, an unlifted outage lasts until now)."""
    lifts = by_node(e for e in audit if e.resumed)
    out = []
    for node, entries in by_node(d for d in drains if not drill_of(d)).items():
        entries = sorted(entries, key=lambda d: d.when)
        start: DrainEntry | None = None
        for i, d in enumerate(entries):
            start = start or d
            end = entries[i + 1].when if i + 1 < len(entries) else float("inf")
            lift = next((r.when for r in lifts.get(node, ()) if d.when <= r.when < end), None)
            if lift is not None:
                out.append(Outage(node=node, start=start.when, end=lift,
                                  check=start.check or "?", ended="lifted"))  # fmt: skip
                start = None
        if start is not None:  # no audited lift after the last drain
            still = drained_now is None or node in drained_now
            out.append(Outage(node=node, start=start.when, end=now if still else entries[-1].when,
                              check=start.check or "?",
                              ended="still drained" if still else "outside gpugate"))  # fmt: skip
    return out


class Mtbf(Record):
    """One row of MTBF: what (a node, board, check or the fleet), failures, in-service hours."""

    key: str
    failures: int
    in_service_h: float
    nodes: int = 1

    @property
    def mtbf_h(self) -> float | None:
        """In-service hours per failure; None with no failure."""
        return self.in_service_h / self.failures if self.failures else None

    def to_json(self) -> dict[str, object]:
        """The row as `gpugate report --json` prints it."""
        mtbf = self.mtbf_h
        return {"failures": self.failures, "in_service_hours": round(self.in_service_h, 3),
                "nodes": self.nodes, "mtbf_hours": None if mtbf is None else round(mtbf, 3)}  # fmt: skip


def node_mtbf(
    nodes: Iterable[str], found: Sequence[Outage], since: float, now: float
) -> dict[str, Mtbf]:
    """{node: its row} for every node given and every node with an outage."""
    window = max(0.0, now - since)
    rows = {n: Mtbf(key=n, failures=0, in_service_h=window / 3600) for n in nodes}
    down: dict[str, float] = {}
    failures: dict[str, int] = {}
    for o in found:
        down[o.node] = down.get(o.node, 0.0) + max(0.0, min(o.end, now) - max(o.start, since))
        failures[o.node] = failures.get(o.node, 0) + (since <= o.start <= now)
    for node, hours_down in down.items():
        rows[node] = Mtbf(key=node, failures=failures[node],
                          in_service_h=max(0.0, window - hours_down) / 3600)  # fmt: skip
    return dict(sorted(rows.items()))


def group_mtbf(per_node: Mapping[str, Mtbf], group: Mapping[str, str]) -> list[Mtbf]:
    """One row per group (a board: `group` maps node to board, UNKNOWN_BOARD if absent), and
    FLEET last: the sums of its nodes' failures and in-service hours."""
    acc: dict[str, Mtbf] = {}
    for node, row in per_node.items():
        for key in (group.get(node) or UNKNOWN_BOARD, FLEET):
            old = acc.get(key) or Mtbf(key=key, failures=0, in_service_h=0.0, nodes=0)
            acc[key] = old.replace(failures=old.failures + row.failures, nodes=old.nodes + 1,
                                   in_service_h=old.in_service_h + row.in_service_h)  # fmt: skip
    fleet = acc.pop(FLEET, None)
    return [acc[k] for k in sorted(acc)] + ([fleet] if fleet else [])


def check_mtbf(
    per_node: Mapping[str, Mtbf], found: Sequence[Outage], since: float, now: float
) -> list[Mtbf]:
    """One row per check that started a failure in the window: the fleet's in-service hours
    over that check's failures, most frequent first."""
    fleet = sum(r.in_service_h for r in per_node.values())
    counts: dict[str, int] = {}
    for o in found:
        if since <= o.start <= now:
            counts[o.check] = counts.get(o.check, 0) + 1
    rows = [Mtbf(key=c, failures=n, in_service_h=fleet, nodes=len(per_node))
            for c, n in counts.items()]  # fmt: skip
    return sorted(rows, key=lambda r: (-r.failures, r.key))


class FailedHere(Record):
    """A node's jobs that failed only there: each job and the users whose jobs they were."""

    node: str
    jobs: tuple[str, ...]
    users: tuple[str, ...]  # distinct, known ones ("?" stands for unknown ones, counted once)

    @property
    def suspect(self) -> bool:
        """Several users' jobs failed here and completed elsewhere."""
        return len(self.users) >= SUSPECT_USERS

    def to_json(self) -> dict[str, object]:
        """The row as `gpugate report --json` prints it."""
        return {"node": self.node, "jobs": list(self.jobs), "users": list(self.users),
                "suspect": self.suspect}  # fmt: skip


class Completion(Record):
    """A run that ended well, by EpilogSlurmctld's line: job, SLUID, when, its nodes."""

    job: str
    sluid: str | None
    when: float
    nodes: frozenset[str]


def completions(decisions: Iterable[Requeue]) -> list[Completion]:
    """The runs that ended well among EpilogSlurmctld's decisions (its lines that say
    `ended_well` and name the nodes; older lines say neither and count for nothing)."""
    out = []
    for d in decisions:
        x = d.event.extra
        nodes, sluid = x.get("nodes"), x.get("sluid")
        if x.get("ended_well") is not True or not isinstance(nodes, str) or not nodes:
            continue
        try:
            names = frozenset(hostlist_expand(nodes))
        except ValueError:  # not a hostlist gpugate wrote: no proof of where it ran
            continue
        out.append(Completion(job=d.job, sluid=sluid if isinstance(sluid, str) else None,
                              when=d.when, nodes=names))  # fmt: skip
    return out


def charged(failed: Sequence[Bundle]) -> list[Bundle]:
    """The bundles that charge their node with their run's failure: a run whose bundles name
    the failing rank's node (one of the run's) charges that node's; otherwise each."""
    runs: dict[tuple[str, int, str | None], list[Bundle]] = {}
    for b in failed:
        if b.kind == "job":
            runs.setdefault((b.job, b.restart, b.sluid), []).append(b)
    out = []
    for bundles in runs.values():
        named = {b.failing_node for b in bundles} & {b.node for b in bundles}
        out += [b for b in bundles if not named or b.node in named]
    return out


def _same_job(b: Bundle, c: Completion) -> bool:
    return b.job == c.job and (b.sluid is None or c.sluid is None or b.sluid == c.sluid)


def failed_only_here(failed: Sequence[Bundle], done: Sequence[Completion]) -> list[FailedHere]:
    """Per node, the jobs that failed there and later completed on nodes without it (the
    module's definition); suspects first, then by jobs, then by name."""
    jobs: dict[str, set[str]] = {}
    users: dict[str, set[str]] = {}
    for b in charged(failed):
        at = b.failed if b.failed is not None else b.start
        if at is None:
            continue
        if any(_same_job(b, c) and c.when > at and b.node not in c.nodes for c in done):
            jobs.setdefault(b.node, set()).add(b.job)
            users.setdefault(b.node, set()).add(b.user or "?")
    rows = [FailedHere(node=n, jobs=tuple(sorted(j)), users=tuple(sorted(users[n])))
            for n, j in jobs.items()]  # fmt: skip
    return sorted(rows, key=lambda r: (-len(r.users), -len(r.jobs), r.node))


class Figures(Record):
    """The window's reliability figures: per node, per board (the fleet last), per check,
    and the nodes with jobs that failed only there."""

    nodes: dict[str, Mtbf]
    boards: list[Mtbf]
    checks: list[Mtbf]
    failed_here: list[FailedHere]

    def to_json(self) -> dict[str, object]:
        """As `gpugate report --json` prints it (`reliability`): rows with failures only for
        nodes, every board, the fleet apart."""
        boards = [b for b in self.boards if b.key != FLEET]
        fleet = next((b for b in self.boards if b.key == FLEET), None)
        return {
            "fleet": fleet.to_json() if fleet else None,
            "boards": {b.key: b.to_json() for b in boards},
            "checks": {c.key: c.to_json() for c in self.checks},
            "nodes": {n: r.to_json() for n, r in self.nodes.items() if r.failures},
            "failed_only_here": [f.to_json() for f in self.failed_here],
        }


def figures(
    drains: Sequence[DrainEntry],
    audit: Sequence[AuditEntry],
    failed: Sequence[Bundle],
    decisions: Sequence[Requeue],
    since: float,
    now: float,
    boards: Mapping[str, str] | None = None,
    drained_now: Collection[str] | None = None,
) -> Figures:
    """Every figure of the window. `boards`: {node: board} of every node Slurm lists (None:
    Slurm unread, only the history's nodes count); `failed`: the window's failed runs
    (losses.read_failures); `decisions`: EpilogSlurmctld's (losses.requeue_events)."""
    found = outages(drains, audit, now, drained_now)
    per_node = node_mtbf(boards or {}, found, since, now)
    return Figures(
        nodes=per_node,
        boards=group_mtbf(per_node, boards or {}),
        checks=check_mtbf(per_node, found, since, now),
        failed_here=failed_only_here(failed, completions(decisions)),
    )


def samples(
    fig: Figures, lost: Sequence[tuple[str, int, float]], repeat: Mapping[str, int]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The gauges of RELIABILITY_FILE (store/metrics.py FAMILIES). `lost`: losses.by_category
    rows; `repeat`: {node: drains} of the repeat offenders. Checks outside the registry sum
    under "other", causes outside the diagnosis's categories too: the labels stay bounded."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def add(name: str, label: str, key: str, value: float) -> None:
        k = (name, ((label, key),) if label else ())
        out[k] = out.get(k, 0.0) + value

    def mtbf(name: str, label: str, row: Mtbf) -> None:
        if row.mtbf_h is not None:
            out[(name, ((label, row.key),) if label else ())] = round(row.mtbf_h, 3)

    add("gpugate_reason_grammar_version", "", "", REASON_GRAMMAR_VERSION)
    for b in fig.boards:
        if b.key == FLEET:
            add("gpugate_fleet_window_failures", "", "", b.failures)
            add("gpugate_fleet_in_service_hours", "", "", round(b.in_service_h, 3))
            mtbf("gpugate_fleet_mtbf_hours", "", b)
        else:
            add("gpugate_board_window_failures", "board", b.key, b.failures)
            mtbf("gpugate_board_mtbf_hours", "board", b)
    known = registered()
    fleet_h = next((b.in_service_h for b in fig.boards if b.key == FLEET), 0.0)
    checks: dict[str, int] = {}
    for c in fig.checks:
        key = c.key if c.key in known else OTHER
        checks[key] = checks.get(key, 0) + c.failures
    for key, n in checks.items():
        add("gpugate_check_window_failures", "check", key, n)
        mtbf("gpugate_check_mtbf_hours", "check", Mtbf(key=key, failures=n, in_service_h=fleet_h))
    for node, row in fig.nodes.items():
        if row.failures:
            add("gpugate_node_window_failures", "node", node, row.failures)
            mtbf("gpugate_node_mtbf_hours", "node", row)
    for node, n in repeat.items():
        add("gpugate_node_repeat_drains", "node", node, n)
    for f in fig.failed_here:
        add("gpugate_node_failed_only_here_jobs", "node", f.node, len(f.jobs))
        add("gpugate_node_failed_only_here_users", "node", f.node, len(f.users))
    causes = {*CATEGORIES, UNDIAGNOSED}
    for cause, runs, hours in lost:
        key = cause if cause in causes else OTHER
        add("gpugate_cause_window_failed_runs", "cause", key, runs)
        add("gpugate_cause_window_gpu_hours_lost", "cause", key, round(hours, 3))
    return out

"""The report page's fleet reliability sections (admin/reliability.py's figures), each with
how it is computed beside it. Every value escaped (report.esc)."""

from __future__ import annotations

from gpugate.admin.reliability import FLEET, SUSPECT_USERS
from gpugate.admin.report import _table, esc

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpugate.admin.reliability import Figures, Mtbf

NODES_MAX = 200  # node rows shown (the worst MTBF first): the page stays readable

MTBF_HOW = (
    "MTBF = hours in service \u00f7 failures in the window. A failure is an outage that "
    "starts in the window: from a drain gpugate set on a node in service to the node's first "
    "audited lift (gpugate resume, healing); further drains before that lift are the same "
    "outage; with no audited lift the outage lasts until now while Slurm shows the node "
    "drained, and ends at its last drain when Slurm shows it in service (lifted outside "
    "gpugate: that time counts as in service). A drill's drain is no failure. Hours in "
    "service = the window's hours less the outages' hours in it, each node present for the "
    "whole window. A board (the GPU type Slurm's Gres names) sums its nodes; a check's MTBF "
    "is the fleet's hours in service \u00f7 that check's failures."
)
FAILED_HERE_HOW = (
    "A job failed only on node N when a run of it failed with N charged (its evidence bundle "
    "on N; when the run's bundles name the failing rank's node, only that node) and a later "
    "run of the same job (job id, and SLUID where known) completed on nodes without N "
    "(EpilogSlurmctld's record of the run: it ended well, exit 0:0, not requeued). Counted per node, with the jobs' "
    f"distinct users; {SUSPECT_USERS} or more users make the node a suspect: the jobs are "
    "not the cause."
)


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _rows(rows: Iterable[Mtbf], css: str = "") -> list[str]:
    return [
        f'<tr><td class="{css}">{esc(r.key)}</td><td class="n">{r.nodes}</td>'
        f'<td class="n">{r.failures}</td><td class="n">{_hours(r.in_service_h)}</td>'
        f'<td class="n">{_hours(r.mtbf_h)}</td></tr>'
        for r in rows
    ]


def sections(fig: Figures) -> list[str]:
    """The headings, the how and the tables: fleet and boards, checks, nodes, failed only here."""
    heads = ("Nodes", "Failures", "Hours in service", "MTBF (hours)")
    worst = sorted((r for r in fig.nodes.values() if r.failures),
                   key=lambda r: (r.mtbf_h or 0.0, r.key))[:NODES_MAX]  # fmt: skip
    boards = [b.replace(key="all nodes") if b.key == FLEET else b for b in fig.boards]
    here = [
        f'<tr><td class="node">{esc(f.node)}</td><td class="n">{len(f.jobs)}</td>'
        f'<td class="n">{len(f.users)}</td><td>{esc(", ".join(f.jobs))}</td>'
        f'<td class="{"false" if f.suspect else "n"}">{"suspect" if f.suspect else "-"}</td></tr>'
        for f in fig.failed_here
    ]
    return [
        '<h2 id="reliability">Fleet reliability: time between failures</h2>',
        f'<p class="meta">{esc(MTBF_HOW)}</p>',
        _table(("Board", *heads), _rows(boards), "No node is known."),
        _table(
            ("Check", "Fleet nodes", *heads[1:]), _rows(fig.checks), "No failure in the window."
        ),
        _table(("Node", *heads), _rows(worst, "node"), "No node failed in the window."),
        '<h2 id="failed-here">Jobs that failed only on one node</h2>',
        f'<p class="meta">{esc(FAILED_HERE_HOW)}</p>',
        # Users are counted, not named: the page may be served; `--json` names them.
        _table(
            ("Node", "Jobs", "Users", "Job ids", "Verdict"),
            here,
            "No job failed on one node and completed on others in the window.",
        ),
    ]

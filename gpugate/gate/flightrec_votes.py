"""The flight-recorder culprit in the controller epilog: its node votes, and may be excluded.

The dumps are the user's process's data: the culprit node only casts a suspect vote (FR is
stronger than the log's time stamps, so it is the vote's node when it names one), and votes
never drain: past their threshold they flag the node for a qualification
(gpugate/gate/suspicion.py). A requeue excludes the culprit node only when root's evidence
agrees, the node's own hardware fault in its bundle, or when open votes from earlier jobs
point at it too (an exclusion keeps one job off one node; it takes nothing out of service).
"""

from __future__ import annotations

from gpugate.flightrec.culprit import records_culprit
from gpugate.store import history
from gpugate.store.suspects import voting_jobs
from gpugate.store.view_records import ControllerRecord, first_failure

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config
    from gpugate.flightrec.records import Culprit
    from gpugate.gate.requeue import JobEnd

DECIDED = ("not_entered", "in_collective", "mismatch")  # a rank named, with a node


def culprit_node(
    job: JobEnd, summaries: list[ControllerRecord]
) -> tuple[str | None, Culprit | None]:
    """(node, culprit) of this run's decision records; node None unless a decided rank on a
    job node. The records (gpugate/store/controller_view.py) carry each node's digest."""

    try:
        found = records_culprit([(s.node, s.flightrec) for s in summaries])
    except (ValueError, TypeError):
        return None, None  # digests the culprit cannot read: no vote, no comment
    node = found.node if found else None
    if found is None or found.state not in DECIDED or node not in job.nodes:
        return None, found
    return node, found


def first_node(
    config: Config, job: JobEnd, summaries: list[ControllerRecord]
) -> tuple[str, float | None] | None:
    """(node, first_failure epoch or None) for the vote when the flight recorder names one."""

    node, _ = culprit_node(job, summaries)
    if node is None:
        return None
    return node, first_failure(summaries, node)


def with_culprit(
    config: Config, job: JobEnd, summaries: list[ControllerRecord], suspects: tuple[str, ...]
) -> tuple[str, ...]:
    """The requeue's suspects with the FR culprit node first when root's evidence agrees."""

    node, _ = culprit_node(job, summaries)
    if node is None:
        return suspects
    hardware = any(s.node == node and s.hardware_fault for s in summaries)
    where = history.read_dirs(config)
    earlier = [
        j for j in voting_jobs(where, node, config.health.suspect_window_h) if j != job.job_id
    ]
    if not hardware and not earlier:
        return suspects  # the user's dumps alone never exclude a node
    return (node, *(n for n in suspects if n != node))


def culprit_comment(job: JobEnd, summaries: list[ControllerRecord]) -> str | None:
    """The culprit's line for a requeued job's AdminComment, or None (nothing decided).

    The controller appends it once it has requeued the job (gpugate/act/plans.py
    requeued_notes). The text names the job's own dumps as its source; admin_comment makes it
    one clean, capped line (op names come from the dumps).
    """
    _, found = culprit_node(job, summaries)
    text = found.text if found else None
    if not text or found is None or found.state is None:
        return None
    return f"flight recorder (the job's dumps): {text}"

"""Decide and drain: the primitives behind a plan's drain steps (gpugate/act), for every hook.

`drain_counted` (the Drain step) drains with gpugate's reason within the drain budget
(`budget.py`): it counts before draining, then drains; `undo_beyond_budget` (the Undo step)
settles: reads Slurm again and undoes a drain that ranks beyond the budget once concurrent
drains have landed. A drain held back either way is the outcome's `held`: the plan's TellHeld
step then leaves a node Comment, a loud log line and an event (`tell_held`), and its RecordHeld
the history's entry. An admin's drain is never replaced (SlurmControl.drain).
"""

from __future__ import annotations

import sys
import time

from gpugate import log
from gpugate.drill import slurm_lift_at
from gpugate.gate.budget import check_budget, keeps_drain, warn_daily
from gpugate.record import Record
from gpugate.slurm.control import NotOurDrain
from gpugate.slurm.reasons import BUDGET_COMMENT, budget_comment, drill_end

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.facts import Gpu
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.records import NodeInfo


def drain_detail(failing: list[Finding]) -> tuple[str, str]:
    """(check id, detail) for the drain reason: the first failure, and how many more."""
    first = failing[0]
    detail = (
        first.message.split(": ", 1)[-1] if first.message.startswith(first.check) else first.message
    )
    others = len(failing) - 1
    if others:
        detail += f" (+{others} more)"
    return first.check, detail


def failing_gpu(failing: list[Finding], gpus: tuple[Gpu, ...] | None) -> str | None:
    """The identity of the GPU the drain's first failure names: its serial, else its UUID
    (None: the failure names no GPU, or the facts do not know it). Counted toward the part's
    RMA (gpugate/health/ladder.py): NVML's index moves between boots, the serial does not."""
    first = next((f for f in failing if f.gpu is not None), None)
    if first is None or not gpus:
        return None
    gpu = next((g for g in gpus if g.index == first.gpu), None)
    return (gpu.serial or gpu.uuid or None) if gpu is not None else None


class DrainOutcome(Record):
    """What became of a drain gpugate wanted."""

    reason: str
    drained: bool
    # "admin" (not our drain), "budget" (too many drains), "error" (the drain itself failed)
    blocked_by: str | None = None
    why: str = ""
    # The budget held it back (counted before the drain, or undone after it): the plan's
    # TellHeld says so (Comment, log, event) and its RecordHeld records the held entry. Not a
    # drain lifted while it settled.
    held: bool = False


def drain_counted(
    slurm: SlurmControl, node: str, reason: str, config: Config | None, check_id: str | None
) -> DrainOutcome:
    """Count the budget, then drain with `reason` (the Drain step; Undo settles it after)."""
    if config is not None:
        try:
            blocked = over_budget(slurm, node, config, check_id)
        except Exception as exc:  # cannot count: the normal action (drain this one node) stands
            note(f"drain budget unknown ({type(exc).__name__}: {exc}); draining {node}")
            blocked = None
        if blocked:
            # A held drain says so in the node's Comment (TellHeld): never on an admin's drain.
            # Read only here: a drain that goes ahead is refused by SlurmControl.drain itself,
            # so the prolog's path to a drain costs no extra node read.
            admins = admin_drain(slurm, node)
            if admins:
                note(f"not draining {node}: {admins}")
                return DrainOutcome(reason=reason, drained=False, blocked_by="admin", why=admins)
            return DrainOutcome(
                reason=reason, drained=False, blocked_by="budget", why=blocked, held=True
            )
    # A drill's drain (this process gathered under a drill's overlay) ends with its window:
    # Slurm lifts it by itself too (ResumeAfter, where Slurm has it), so even a dead drill
    # command leaves no drain behind. Every other drain of gpugate's waits for its checks.
    end = drill_end()
    try:
        change = slurm.drain(node, reason, resume_at=None if end is None else slurm_lift_at(end))
    except NotOurDrain as exc:
        note(f"not draining {node}: {exc}")
        return DrainOutcome(reason=reason, drained=False, blocked_by="admin", why=str(exc))
    if change.before is not None and BUDGET_COMMENT in change.before.comment:
        # An earlier run found no room and said "would drain" in the Comment; now it is
        # drained, that line is stale (seen when a held node was drained by its next job).
        try:
            slurm.clear_node_comment(node)
        except Exception as exc:
            note(f"could not clear the stale budget comment of {node}: {exc}")
    return DrainOutcome(reason=reason, drained=True)


def admin_drain(slurm: SlurmControl, node: str) -> str:
    """Why `node` is someone else's to keep out (drained with a reason gpugate did not
    write); "" when it is not, or cannot be read (SlurmControl.drain checks again)."""
    try:
        info = slurm.node(node)
    except Exception:
        return ""
    if info.drained and info.reason and not info.gpugate_owned:
        who = info.reason_user or "someone else"
        return f"already drained by {who} ({info.reason!r}); gpugate does not replace it"
    return ""


def undo_beyond_budget(
    slurm: SlurmControl, node: str, drained: DrainOutcome, config: Config, check_id: str | None
) -> DrainOutcome:
    """The Undo step, after drain_counted: once concurrent drains have landed, undo this one if
    it ranks beyond the budget; the drain's outcome, as it stands after."""
    try:
        undone = settle_budget(slurm, node, drained.reason, config, check_id)
    except Exception as exc:  # the drain is done; keep it
        note(f"could not settle the drain budget ({type(exc).__name__}: {exc}); drained")
        undone = None
    if undone:
        return drained.replace(drained=False, blocked_by="budget", why=undone,
                               held=undone != LIFTED)  # fmt: skip
    return drained


def isolate_after_drain(
    config: Config,
    slurm: SlurmControl,
    node: str,
    failing: list[Finding],
    gpus: tuple[Gpu, ...] | None,
    boot_id: str | None = None,
) -> str:
    """After gpugate drained `node`: start taking out only the faulty GPU(s) when the site
    asks for it (`isolate.unit: gpu`); a line for the hook's log ("" when isolation is off)."""
    if config.isolate is None or config.isolate.unit != "gpu":
        return ""
    from gpugate.isolate.apply import request  # only where a site isolates

    return request(config, slurm, node, failing, gpus, boot_id)


# Two jobs' prologs on one node can drain it together; when the other's settle undoes the drain
# beyond the budget (or an admin resumes the node) while ours waits, refusing our job would have
# Slurm drain the node itself ("Prolog error"): the job runs instead.
LIFTED = "the drain was lifted while it settled (beyond the budget, or by an admin)"


def _lifted(info: NodeInfo | None) -> bool:
    """Whether a node record shows gpugate's drain gone (None: the node is not listed)."""
    return info is not None and not (info.drained and info.gpugate_owned)


# The budget's reads of the whole cluster go through the shared view (gpugate/store/
# fleet_view.py): every count wants a read begun after it asked (one read serves all the hooks
# that asked before it began). Measured (bench/scale_storm.py): reusing a read up to 1 s old
# let a whole storm's hooks count from one early read, all drain, and most undo. A hook waits
# for another's read as long as that read may take (the adapter's timeout) and this much more.
VIEW_SLACK_S = 2.0
# When Slurm does not answer the count, Slurm's nodes as the shared view last read them, if
# this recent, still say whether a storm has filled the budget: measured (bench/scale_storm.py,
# 1,000 failing prologs), an overloaded slurmctld timed the counts out and the hooks, each
# draining what it could not count, left 658 nodes drained against a limit of 10.
LAST_VIEW_MAX_AGE_S = 300.0


def budget_nodes(slurm: SlurmControl, config: Config, since: float) -> dict[str, NodeInfo]:
    """Slurm's nodes as read at or after `since`: another hook's read when one is that fresh."""
    from gpugate.store.fleet_view import nodes_since  # only hooks that drain count

    return nodes_since(slurm, config, since, config.slurm.timeout_s + VIEW_SLACK_S)[0]


def settle_budget(
    slurm: SlurmControl, node: str, reason: str, config: Config, check: str | None = None
) -> str | None:
    """Undo this drain if, once concurrent drains have landed, it ranks beyond the budget."""
    drained_at = time.time()
    time.sleep(config.budget.settle_s)
    try:
        nodes = budget_nodes(slurm, config, since=drained_at + config.budget.settle_s)
    except Exception:
        known = _with_my_drain(config, node, reason, drained_at)
        if known is None:
            return None  # cannot tell: keep the drain (the normal action)
        nodes = known
    if _lifted(nodes.get(node)):
        return LIFTED
    verdict = keeps_drain(nodes, node, config.budget, time.time(), check)
    if verdict.allowed:
        return None
    try:
        slurm.resume(node)
    except Exception as exc:
        try:  # the other prolog on this node may have undone it a moment before us
            lifted = _lifted(slurm.node(node))
        except Exception:
            lifted = False
        if lifted:
            return LIFTED
        note(f"could not undo the drain of {node} beyond the budget: {exc}")
        return None
    return verdict.why


def _with_my_drain(
    config: Config, node: str, reason: str, drained_at: float
) -> dict[str, NodeInfo] | None:
    """Slurm did not answer the settle: the last shared read (if recent), with this drain as
    Slurm set it. The drains it shows were set before this one and rank before it, so if they
    already fill the budget this one is beyond it, whatever the read missed; None: no read."""
    from gpugate.store.fleet_view import last_view

    known = last_view(config)
    if known is None or not 0 <= time.time() - known[0] <= LAST_VIEW_MAX_AGE_S:
        return None
    nodes = dict(known[1])
    me = nodes.get(node)
    if me is None:
        return None
    flags = tuple(dict.fromkeys([*me.flags, "DRAIN"]))
    nodes[node] = me.replace(flags=flags, reason=reason, reason_time=int(drained_at))
    return nodes


def over_budget(
    slurm: SlurmControl, node: str, config: Config, check: str | None = None
) -> str | None:
    """Why this drain would exceed the budget (the plan then tells it: tell_held), or None."""
    # In a fleet-wide false alarm every node's prolog gets here in the same second: spread
    # out, the later ones see the earlier drains and stop before draining (only failing
    # hooks pay this wait).
    from random import uniform  # only a failing hook counts (2.6 ms of imports)

    time.sleep(uniform(0, config.budget.jitter_s))  # noqa: S311 (a spread, no secret)
    try:
        nodes = budget_nodes(slurm, config, since=time.time())
    except Exception as exc:
        return _count_unknown(node, config, check, exc)
    warn_daily(config, nodes)  # a partition the budget allows no drain: logged once a day
    verdict = check_budget(nodes, node, config.budget, time.time(), check)
    if verdict.allowed:
        return None
    return verdict.why


def _count_unknown(node: str, config: Config, check: str | None, exc: Exception) -> str | None:
    """Slurm did not answer the count: the last shared view decides, else drain (None)."""
    from gpugate.store.fleet_view import last_view

    now = time.time()
    known = last_view(config)
    if known is None or not 0 <= now - known[0] <= LAST_VIEW_MAX_AGE_S:
        note(f"drain budget unknown ({exc}); draining {node}")
        return None  # cannot count: the normal action (drain this one node) stands
    verdict = check_budget(known[1], node, config.budget, now, check)
    said = f"Slurm's nodes as read {now - known[0]:.0f} s ago (Slurm did not answer now: {exc})"
    if verdict.allowed:
        note(f"drain budget from {said}: within it; draining {node}")
        return None
    return f"{verdict.why}, from {said}"


def tell_held(slurm: SlurmControl, node: str, reason: str, why: str, config: Config) -> None:
    """The drain the budget held back (the TellHeld step, gpugate/act): a loud log line, an
    event and a node comment saying what gpugate would have done. The history's held entry
    is the plan's RecordHeld step; a dry run does neither."""
    log.error(
        config.state_dir, f"DRAIN BUDGET EXCEEDED: not draining {node}: {why}; wanted: {reason}"
    )
    log.event(
        config.state_dir, "budget", node=node, outcome="budget_exceeded", why=why, reason=reason
    )
    try:
        slurm.set_node_comment(node, budget_comment(why, reason))
    except Exception as exc:
        note(f"could not write the node comment: {exc}")


def note(message: str) -> None:
    """A line for slurmd's log (hook output goes there)."""
    sys.stderr.write(f"gpugate: {message}\n")

"""Check a drained node, then resume it only if it passes and gpugate drained it; audited.

`gpugate resume NODE` (gpugate/commands/resume.py) parses and prints; this holds the rules:
whose drain may be lifted, which facts may vouch for the node, and that every attempt,
resumed or refused, is appended to the audit log with who, when, why and the check result.
"""

from __future__ import annotations

import time

from gpugate import log
from gpugate.checks.run import run_checks
from gpugate.checks.sources import gather, replay_path
from gpugate.clock import parse_utc
from gpugate.node import node_name
from gpugate.record import Record
from gpugate.slurm_hooks.policy import decide
from gpugate.slurm_hooks.slurm.choose import with_slurm_gres
from gpugate.slurm_hooks.slurm.control import NotOurDrain, SlurmError
from gpugate.slurm_hooks.state import load_kernel_pos
from gpugate.store.held import HELD_LABEL, held_now
from gpugate.store.history import history_dir, record_resume
from gpugate.store.outcomes import note_lift

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.facts import Facts
    from gpugate.config.schema import Config
    from gpugate.slurm_hooks.slurm.control import NodeInfo, SlurmControl

# A snapshot passed with --facts must be this fresh to vouch for a node.
FRESH_S = 3600


class Attempt(Record):
    """One resume attempt: done or refused, why, the check result and the failing messages."""

    resumed: bool
    why: str  # what was wrong when refused, else empty
    result: str | None = None  # "<status> (<where the facts came from>)" once checks ran
    failing: tuple = ()  # messages of the failing findings (printed before a refusal)


class Request(Record):
    """What the admin asked: the node, why it can go back, --force, and --facts."""

    node: str
    why: str = ""
    force: bool = False
    facts_file: str | None = None
    who: str | None = None  # the audit's `who`; None: the user running it ("gpugate health")


def node_facts(
    config: Config, node: str, facts_file: str | None, slurm: SlurmControl | None = None
) -> tuple[Facts | None, str]:
    """The node's facts, and where they came from (or None and why not)."""
    replay = facts_file or replay_path(config, node)
    if not replay and node != node_name():
        return (
            None,
            f"run `gpugate resume` on {node} itself, or pass --facts from `gpugate facts` run there",
        )
    # Live, the kernel log from where the last check stopped: Xids the drain already acted on
    # are not judged again.
    position = load_kernel_pos(config.state_dir)
    facts = gather(config, node, position=position, snapshot=facts_file)
    if not facts_file:
        if replay:
            return facts, f"replayed {replay}"
        # Live: the GPU count Slurm was told (Gres), cached and bounded as in the prolog, so a
        # node is judged on resume as it was when drained.
        return with_slurm_gres(config, node, facts, slurm), "this node"
    age = _age(facts.collected_at)
    if age is not None and age > FRESH_S:
        return None, f"{facts_file} was collected {age / 60:.0f} min ago; take a fresh one"
    return facts, facts_file


def _age(collected_at: str | None) -> float | None:

    when = parse_utc(collected_at)
    return None if when is None else time.time() - when


def check_then_resume(
    config: Config, slurm: SlurmControl, info: NodeInfo, request: Request
) -> Attempt:
    """Run the checklist for a drained node and resume it if allowed; every attempt audited."""
    node = request.node
    if not info.gpugate_owned and not request.force:
        return _refused(config, request, info.reason, f"{node} was drained by someone else "
                        f"({info.reason_user or '?'}: {info.reason!r}); use --force to resume it anyway")  # fmt: skip
    facts, source = node_facts(config, node, request.facts_file, slurm)
    if facts is None:
        return _refused(config, request, info.reason, source)
    decision = decide(run_checks(facts, config), config.policy)
    result = f"{decision.status} ({source})"
    if decision.status == "fail" and not request.force:
        why = f"{node} still fails its checks: {decision.failing[0].message}"
        failing = tuple(f.message for f in decision.failing)
        return _refused(config, request, info.reason, why, result).replace(failing=failing)
    try:
        slurm.resume(node, force=request.force)
    except NotOurDrain as exc:
        return _refused(config, request, info.reason, str(exc), result)
    except SlurmError as exc:
        return _refused(config, request, info.reason, f"scontrol could not resume it: {exc}", result)  # fmt: skip
    lift = _audit(config, request, info.reason, result, resumed=True, boot_id=facts.boot_id)
    try:
        note_lift(config, node, lift)  # gpugate_false_drains_total when no repair shows
    except Exception as exc:  # the resume is done and audited; a count must not undo it
        log.error(config.state_dir, f"could not count the lift of {node}", exc)
    return Attempt(resumed=True, why="", result=result)


def _refused(
    config: Config, request: Request, reason: str, why: str, result: str | None = None
) -> Attempt:
    """A refusal, audited (an unwritable audit log does not hide the refusal itself)."""
    try:
        _audit(config, request, reason, f"refused: {why}" + (f"; checks {result}" if result else ""), resumed=False)  # fmt: skip
    except OSError:
        pass
    return Attempt(resumed=False, why=why, result=result)


def _audit(config: Config, request: Request, reason: str, result: str, resumed: bool,
           boot_id: str | None = None) -> dict:  # fmt: skip
    return record_resume(history_dir(config), request.node, who=request.who, why=request.why,
                         result=result, forced=request.force, reason=reason, resumed=resumed,
                         boot_id=boot_id)  # fmt: skip


def held_notice(config: Config, node: str) -> str | None:
    """For a node in service: what the budget held back, if gpugate wanted it drained."""
    entry = held_now(config, node).get(node)
    if entry is None:
        return None
    return (f"{node} is in service, but gpugate wanted it drained: {HELD_LABEL} since "
            f"{entry.get('at')}: {entry.get('why')}; wanted: {entry['reason']}")  # fmt: skip

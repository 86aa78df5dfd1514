"""Check a drained node, then resume it only if it passes and gpugate drained it; audited.

`gpugate resume NODE` (gpugate/commands/resume.py) parses and prints; this holds the rules:
whose drain may be lifted, which facts may vouch for the node, and that every attempt,
resumed or refused, is appended to the audit log with who, when, why and the check result.

Resume only after proof (issue 17): `admin.resume_qualify` names the qualification level a
drain's fault class calls for; such a drain is lifted only once a qualification of at least that
level has passed since the drain began (an earlier pass counts), or, with `--qualify`, after one
run here through `gpugate.qualify.run.qualify_nodes` has passed. The audit names its level and jobs.
"""

from __future__ import annotations

import time

from gpugate import log
from gpugate.act.steps import Attempt  # what a Lift became: the executor reports it too
from gpugate.checks.registry import fault_class
from gpugate.checks.run import run_checks
from gpugate.checks.sources import gather, replay_path
from gpugate.clock import parse_utc
from gpugate.gate.policy import decide
from gpugate.node import node_name, not_this_node
from gpugate.record import Record
from gpugate.slurm.choose import with_slurm_gres
from gpugate.slurm.control import NotOurDrain, SlurmError
from gpugate.slurm.reasons import reason_check
from gpugate.store import history
from gpugate.store.held import HELD_LABEL, held_now
from gpugate.store.history import history_dir, record_resume
from gpugate.store.outcomes import note_lift
from gpugate.store.state import load_kernel_pos

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from gpugate.act.steps import Lift
    from gpugate.checks.facts import Facts
    from gpugate.config.schema import Config
    from gpugate.qualify.records import QualifyRun
    from gpugate.slurm.control import NodeInfo, SlurmControl
    from gpugate.store.entries import AuditEntry

    class Qualify(Protocol):
        """gpugate.qualify.run.qualify_nodes as a resume calls it (tests pass a stand-in)."""

        def __call__(
            self, config: Config, slurm: SlurmControl, nodes: list[str], level: int,
            tests: list[str] | None, *, resume_passed: bool, requested_by: str,
        ) -> QualifyRun: ...  # fmt: skip


# A snapshot passed with --facts must be this fresh to vouch for a node.
FRESH_S = 3600


class Request(Record):
    """What the admin asked: the node, why it can go back, --force, and --facts."""

    node: str
    why: str = ""
    force: bool = False
    facts_file: str | None = None
    who: str | None = None  # the audit's `who`; None: the user running it ("gpugate health")
    qualify: bool = False  # run the qualification the drain calls for when none passed yet
    level: int | None = None  # --level: the level to ask for; None: the drain's own


class Proof(Record):
    """The qualification a resume rests on: passed or not, its level, run, jobs and why."""

    passed: bool
    level: int
    run_id: str | None = None
    job_ids: tuple[Any, ...] = ()
    why: str = ""
    reused: bool = False  # a pass recorded since the drain began, not run for this resume

    def text(self) -> str:
        """One line for the audit's result and the admin: `qualification level 2 passed ...`."""
        jobs = f" (job {', '.join(self.job_ids)})" if self.job_ids else ""
        verdict = "passed" if self.passed else "failed"
        earlier = ", recorded earlier" if self.reused else ""
        why = f": {self.why}" if self.why and not self.passed else ""
        return f"qualification level {self.level} {verdict}{jobs}{earlier}{why}"


def node_facts(
    config: Config, node: str, facts_file: str | None, slurm: SlurmControl | None = None
) -> tuple[Facts | None, str]:
    """The node's facts, and where they came from (or None and why not)."""
    replay = facts_file or replay_path(config, node)
    if not replay and node != node_name():
        return (
            None,
            f"run `gpugate resume` on {node} itself, or pass --facts from `gpugate facts` run "
            f"there ({not_this_node(node)})",
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
    config: Config,
    slurm: SlurmControl,
    info: NodeInfo,
    request: Request,
    qualify: Qualify | None = None,
) -> Attempt:
    """Run the checklist for a drained node and resume it if allowed; every attempt audited.
    `qualify`: what runs a qualification (None: gpugate.qualify.run.qualify_nodes)."""
    node = request.node
    if not info.gpugate_owned and not request.force:
        return _refused(config, request, info.reason, f"{node} was drained by someone else "
                        f"({info.reason_user or '?'}: {info.reason!r}); use --force to resume it anyway")  # fmt: skip
    facts, source = node_facts(config, node, request.facts_file, slurm)
    if facts is None:
        return _refused(config, request, info.reason, source)
    # A check that only reports on this node (gate/policy.py: staged_out) holds no node out.
    decision = decide(run_checks(facts, config), config.policy, partitions=info.partitions)
    result = f"{decision.status} ({source})"
    if decision.failing and not request.force:
        why = f"{node} still fails its checks: {decision.failing[0].message}"
        failing = tuple(f.message for f in decision.failing)
        return _refused(config, request, info.reason, why, result).replace(failing=failing)
    proof, refusal = qualification_gate(config, slurm, info, request, qualify)
    if proof is not None:
        result = f"{result}; {proof.text()}"
    if refusal:
        return _refused(config, request, info.reason, refusal, result, proof)
    try:
        slurm.resume(node, force=request.force)
    except NotOurDrain as exc:
        return _refused(config, request, info.reason, str(exc), result)
    except SlurmError as exc:
        return _refused(config, request, info.reason, f"scontrol could not resume it: {exc}", result)  # fmt: skip
    lift = _audit(config, request, info.reason, result, resumed=True, boot_id=facts.boot_id,
                  proof=proof)  # fmt: skip
    try:
        note_lift(config, node, lift)  # gpugate_false_drains_total when no repair shows
    except Exception as exc:  # the resume is done and audited; a count must not undo it
        log.error(config.state_dir, f"could not count the lift of {node}", exc)
    return Attempt(resumed=True, why="", result=result)


def lift(config: Config, slurm: SlurmControl, step: Lift) -> Attempt:
    """A plan's Lift (gpugate/act/steps.py), carried out through this path: the node's checks
    again, the qualification, the audit, as `step.who`; with `put_back`, its isolated GPU(s)
    put back first (restore_isolated)."""
    request = Request(node=step.info.name, why=step.why, who=step.who)
    act = restore_isolated if step.put_back else check_then_resume
    return act(config, slurm, step.info, request)


def restore_isolated(
    config: Config, slurm: SlurmControl, info: NodeInfo, request: Request
) -> Attempt:
    """Put a node's isolated GPUs back, then resume it: the node's own checks first (every
    GPU judged, the isolated one too: it goes back only once repaired), then the files and
    Slurm's count in the reverse order (gpugate.isolate.apply.restore), then the resume as
    any other, audited."""
    from gpugate.isolate.apply import restore

    node = request.node
    facts, source = node_facts(config, node, request.facts_file, slurm)
    if facts is None:
        return _refused(config, request, info.reason, source)
    decision = decide(run_checks(facts, config), config.policy, partitions=info.partitions)
    if decision.failing and not request.force:
        why = f"{node} still fails its checks: {decision.failing[0].message}"
        failing = tuple(f.message for f in decision.failing)
        result = f"{decision.status} ({source})"
        return _refused(config, request, info.reason, why, result).replace(failing=failing)
    try:
        done = restore(config, slurm, node)
    except Exception as exc:  # the node stays as it is (drained if the restore drained it)
        return _refused(config, request, info.reason, f"could not put the GPUs back: {exc}")
    attempt = check_then_resume(config, slurm, slurm.node(node), request)
    return attempt.replace(result=f"{done}; {attempt.result}" if attempt.result else done)


def qualify_level(config: Config, reason: str | None) -> int:
    """The level (0: none) `admin.resume_qualify` asks of a drain with this reason, by the fault
    class of its check (a `gpugate: qualify:` drain, like any unknown id, counts as hardware)."""

    return int(getattr(config.admin.resume_qualify, fault_class(reason_check(reason))))


def drain_began(config: Config, info: NodeInfo) -> float | None:
    """When the node's drain began: its first recorded drain since its last lift, or Slurm's
    reason time if earlier (a qualification that restores the old reason moves that time)."""
    hist = history_dir(config)
    try:
        lifts = [e.when for e in history.resumes(hist, info.name) if e.resumed]
        starts = [e.when for e in history.drains(hist, info.name, since=max(lifts, default=0))]
    except OSError:
        starts = []
    times = [t for t in (min(starts, default=None), info.reason_time) if t is not None]
    return float(min(times)) if times else None


def earlier_pass(config: Config, info: NodeInfo, level: int) -> Proof | None:
    """A qualification of at least `level` passed since the drain began (latest_pass), if any."""
    from gpugate.store.qualify import latest_pass

    since = drain_began(config, info)
    if since is None:  # no start known: no pass can be shown to be newer than the fault
        return None
    # The records live beside the drain history (gpugate/store/qualify.py): shared storage,
    # so the nodes' `gpugate health` sees a pass recorded on the admin host.
    entry = latest_pass(history_dir(config), info.name, since=since, level=level)
    if not entry:
        return None
    return Proof(passed=True, level=entry.level or level, run_id=entry.run_id,
                 job_ids=tuple(entry.job_ids), reused=True)  # fmt: skip


def qualification_gate(
    config: Config,
    slurm: SlurmControl,
    info: NodeInfo,
    request: Request,
    qualify: Qualify | None = None,
) -> tuple[Proof | None, str]:
    """The qualification this resume rests on, and why it may not go ahead ("" when it may)."""
    node, needed = info.name, qualify_level(config, info.reason)
    default = config.qualify.level if request.qualify and config.qualify else 1
    level = request.level or needed or (default if request.qualify else 0)
    if not level:
        return None, ""
    if level < needed and not request.force:
        return None, (f"{node}'s drain calls for a level-{needed} qualification, more than "
                      f"--level {level}; use --force to accept less")  # fmt: skip
    proof = earlier_pass(config, info, level)
    if proof is None and request.qualify:
        proof = run_qualification(config, slurm, node, level, request, qualify)
    if proof is None:
        if request.force:
            return None, ""
        return None, (f"{node}'s drain ({info.reason!r}) calls for a level-{level} qualification "
                      f"first: run `gpugate resume {node} --qualify` (or --force)")  # fmt: skip
    return proof, "" if proof.passed else f"{node} {proof.text()}; it stays drained"


def run_qualification(
    config: Config,
    slurm: SlurmControl,
    node: str,
    level: int,
    request: Request,
    qualify: Qualify | None = None,
) -> Proof:
    """Qualify the drained node now; it stays drained (failed: `gpugate: qualify: ...`).
    `qualify`: None: gpugate.qualify.run.qualify_nodes (imported here: resume rarely needs it)."""
    if qualify is None:
        from gpugate.qualify.run import qualify_nodes

        qualify = qualify_nodes
    try:
        if config.qualify is None:
            raise ValueError("the config has no qualify: section")
        # resume_passed=False: a passing node is drained again with its own reason, and the
        # caller resumes it (ownership checked, one audit entry naming level and jobs); with
        # True the run would resume it and audit the lift itself, and this resume a second time.
        run = qualify(config, slurm, [node], level, list(config.qualify.tests),
                            resume_passed=False, requested_by=request.who or history.current_user())  # fmt: skip
    except Exception as exc:  # qualify_nodes re-drains what it took; the resume just refuses
        proof = Proof(passed=False, level=level, why=f"could not run: {type(exc).__name__}: {exc}")
        keep_drained(slurm, node, proof)
        return proof
    verdict = run.verdicts.get(node) or {}
    jobs = tuple(str(j) for j in verdict.get("job_ids") or ())
    passed = verdict.get("passed") is True
    proof = Proof(passed=passed, level=level, run_id=run.run_id, job_ids=jobs,
                  why="" if passed else failed_test(verdict))  # fmt: skip
    if not passed:
        keep_drained(slurm, node, proof)
    return proof


def failed_test(verdict: dict[str, Any]) -> str:
    """The first failed test of a node's verdict and its job (`dcgm: ... (job 12)`), else its why."""
    for test in verdict.get("tests") or ():
        if test.ok is False:
            job = f" (job {test.job_id})" if test.job_id else ""
            return f"{test.test}: {test.detail or 'failed'}{job}"
    return str(verdict.get("why") or "no verdict for the node")


def keep_drained(slurm: SlurmControl, node: str, proof: Proof) -> None:
    """A failed qualification never leaves the node schedulable: drain it if it is not."""
    try:
        if not slurm.node(node).drained:
            jobs = f" (job {', '.join(proof.job_ids)})" if proof.job_ids else ""
            slurm.drain(node, f"gpugate: qualify: {proof.why}{jobs}"[:250])
    except Exception as exc:  # the refusal stands; the admin reads why in the audit
        log.error(None, f"could not check that {node} stayed drained", exc)


def _refused(
    config: Config, request: Request, reason: str, why: str, result: str | None = None,
    proof: Proof | None = None,
) -> Attempt:  # fmt: skip
    """A refusal, audited (an unwritable audit log does not hide the refusal itself)."""
    try:
        _audit(config, request, reason, f"refused: {why}" + (f"; checks {result}" if result else ""), resumed=False, proof=proof)  # fmt: skip
    except OSError:
        pass
    return Attempt(resumed=False, why=why, result=result)


def _audit(config: Config, request: Request, reason: str, result: str, resumed: bool,
           boot_id: str | None = None, proof: Proof | None = None) -> AuditEntry:  # fmt: skip
    return record_resume(history_dir(config), request.node, who=request.who, why=request.why,
                         result=result, forced=request.force, reason=reason, resumed=resumed,
                         boot_id=boot_id, qualification=proof.to_dict() if proof else None)  # fmt: skip


def held_notice(config: Config, node: str) -> str | None:
    """For a node in service: what the budget held back, if gpugate wanted it drained."""
    entry = held_now(config, node).get(node)
    if entry is None:
        return None
    return (f"{node} is in service, but gpugate wanted it drained: {HELD_LABEL} since "
            f"{entry.at}: {entry.why}; wanted: {entry.reason}")  # fmt: skip

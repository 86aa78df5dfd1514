"""The one executor: carry out a plan of steps (gpugate/act/steps.py), each on its own.

Every step is guarded: one that raises is reported (a line in the daemon's log and a "failed"
outcome) and the others still run, except those whose `when` depends on it (an Isolate after a
Drain that raised). The ownership rules stay in the Slurm adapter (SlurmControl.drain/resume),
the budget in gpugate/gate/drain.py: the executor only calls them. A dry run carries nothing
out and reports the plan as "would ..." outcomes: `--dry-run` costs a command nothing more.
"""

from __future__ import annotations

import json
import os
import sys

from gpugate import log
from gpugate.act import steps as S
from gpugate.record import Record
from gpugate.store import healing, metrics
from gpugate.store.state import ensure_job_dir, write_private

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from gpugate.child import Detach
    from gpugate.config.schema import Config
    from gpugate.gate.drain import DrainOutcome
    from gpugate.slurm.control import SlurmControl

DONE = "done"
FAILED = "failed"
SKIPPED = "skipped"
WOULD = "would"


class Outcome(Record):
    """What became of one step: done, failed (`said` is the error), skipped (`said` is why),
    or would (a dry run); `said` is also what a done step had to say (a line, a change)."""

    kind: str
    what: str
    status: str
    said: str = ""

    def describe(self) -> str:
        """One line: `drain n1: ...`, `would ...`, `... failed: ...`, `... (skipped: ...)`."""
        if self.status == WOULD:
            return f"would {self.what}"
        if self.status == FAILED:
            return f"{self.what} failed: {self.said}"
        if self.status == SKIPPED:
            return f"{self.what} (skipped: {self.said})"
        return f"{self.what} ({self.said})" if self.said else self.what


class Report(Record):
    """What a plan's execution did: each step's outcome, the drain as it stands after, and
    the lift's attempt (resumed, or refused and why)."""

    outcomes: tuple[Outcome, ...] = ()
    drain: DrainOutcome | None = None  # None: the plan had no Drain (or a dry run)
    lift: S.Attempt | None = None  # None: the plan had no Lift (or a dry run)

    def lines(self) -> list[str]:
        """Each outcome's line, in the plan's order."""
        return [o.describe() for o in self.outcomes]


class Hands:
    """What the executor acts with: the config, the Slurm adapter (made on first need by
    `make_slurm`, so a plan of bookkeeping alone starts none), the hook's log prefix, what
    starts work that outlives the hook (`detach`, default gpugate.child.detach) and, for a plan
    that lifts, `gpugate resume`'s path (`lift`: admin.resume.lift, which sits above the
    executor; only the health run lifts)."""

    def __init__(
        self,
        config: Config,
        slurm: SlurmControl | None = None,
        make_slurm: Callable[[Config], SlurmControl] | None = None,
        note: Callable[[str], None] | None = None,
        hook: str = "",
        detach: Detach | None = None,
        lift: Callable[[Config, SlurmControl, S.Lift], S.Attempt] | None = None,
    ) -> None:
        self.config = config
        self.made: SlurmControl | None = slurm  # the adapter, once given or made
        self._make = make_slurm or _backend
        self.note = note or _note
        self.hook = hook
        self.detach = detach
        self.lift = lift

    def slurm(self) -> SlurmControl:
        """The adapter: the one given, else made once (the configured backend and timeout)."""
        if self.made is None:
            self.made = self._make(self.config)
        return self.made


def _backend(config: Config) -> SlurmControl:
    from gpugate.slurm.choose import backend_for  # only a plan that talks to Slurm (start-up)

    return backend_for(config)


def execute(
    plan: Iterable[S.Step], hands: Hands, dry_run: bool = False, kept: str | None = ""
) -> Report:
    """Carry out `plan` in order, each step guarded; the report of every step's outcome.

    `kept` ends the line said for a step that raised ("decision", "drain": what stands);
    None says no line (the caller logs the report's lines itself)."""
    outcomes: list[Outcome] = []
    drain: DrainOutcome | None = None
    lift: S.Attempt | None = None
    for step in plan:
        what = _said(step)
        blocked = _not_due(step.when, drain, lift, dry_run)
        if blocked:
            outcomes.append(Outcome(kind=step.KIND, what=what, status=SKIPPED, said=blocked))
            continue
        if dry_run:
            outcomes.append(Outcome(kind=step.KIND, what=what, status=WOULD))
            continue
        try:
            said = _HANDS[type(step)](step, hands, drain)
        except Exception as exc:  # MemoryError and RecursionError included: one step only
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(step, S.Drain):  # not drained: what depends on the drain waits
                from gpugate.gate.drain import DrainOutcome  # only a plan that drains

                drain = DrainOutcome(
                    reason=step.reason, drained=False, blocked_by="error", why=error
                )
            if isinstance(step, S.Lift):  # not resumed: what follows a refusal follows
                lift = S.Attempt(resumed=False, why=error)
            if kept is not None:
                _failed(hands, what, error, kept)
            outcomes.append(Outcome(kind=step.KIND, what=what, status=FAILED, said=str(exc)))
            continue
        if isinstance(step, (S.Drain, S.Undo)):  # the drain as it stands now
            drain = said  # type: ignore[assignment]  # their hands return a DrainOutcome
            said = _drain_said(drain)
        elif isinstance(step, S.Lift):
            lift = said  # type: ignore[assignment]  # its hand returns the Attempt
            said = _lift_said(said)  # type: ignore[arg-type]
        text = said if isinstance(said, str) else ""
        outcomes.append(Outcome(kind=step.KIND, what=what, status=DONE, said=text))
    return Report(outcomes=tuple(outcomes), drain=drain, lift=lift)


def _said(step: S.Step) -> str:
    try:
        return step.describe()
    except Exception:  # a report must not fail on a step's words
        return step.KIND


def _not_due(when: str, drain: DrainOutcome | None, lift: S.Attempt | None, dry_run: bool) -> str:
    """Why a step with this `when` is not due now ("" when it is). A dry run assumes the drain
    it would do takes the node, and the resume it would ask goes through."""
    if when == S.ALWAYS:
        return ""
    if when in (S.LIFTED, S.NOT_LIFTED):
        return _lift_not_due(when, lift, dry_run)
    if dry_run and drain is None:
        return ""
    if when == S.DRAINED and not (drain is not None and drain.drained):
        return "not drained" + (f" ({drain.blocked_by})" if drain and drain.blocked_by else "")
    if when == S.NOT_HELD and drain is not None and drain.blocked_by == "budget":
        return "the drain budget held the drain back"
    if when == S.HELD and not (drain is not None and drain.held):
        return "the drain budget held nothing back"
    return ""


def _lift_not_due(when: str, lift: S.Attempt | None, dry_run: bool) -> str:
    if dry_run and lift is None:
        return "" if when == S.LIFTED else "a dry run assumes the resume goes through"
    resumed = lift is not None and lift.resumed
    if when == S.LIFTED and not resumed:
        return "not resumed"
    if when == S.NOT_LIFTED and lift is None:
        return "no resume tried"
    return "resumed" if when == S.NOT_LIFTED and resumed else ""


def _lift_said(attempt: S.Attempt) -> str:
    return "resumed" if attempt.resumed else f"refused: {attempt.why}"


def _drain_said(outcome: DrainOutcome | None) -> str:
    if outcome is None:
        return ""
    if outcome.drained:
        return "drained"
    return (
        f"not drained ({outcome.blocked_by}): {outcome.why}"
        if outcome.blocked_by
        else "not drained"
    )


def _failed(hands: Hands, what: str, error: str, kept: str) -> None:
    """The failed step's line in the daemon's log; never raises (the log may be what failed)."""
    _say_failed(hands.hook, what, error, kept)


def _say_failed(hook: str, what: str, error: str, kept: str) -> None:
    tail = f"; {kept} kept" if kept else ""
    try:
        sys.stderr.write(f"gpugate: {hook + ': ' if hook else ''}{what} failed ({error}){tail}\n")
    except Exception:
        pass


def planned(hook: str, builders: Iterable[Callable[..., S.Step | None]], *args: object) -> S.Plan:
    """The steps `builders` make of `args` (None: no step), each on its own: a builder that
    raises costs its own step and a line in the daemon's log, never the others."""
    out: list[S.Step] = []
    for build in builders:
        try:
            step = build(*args)
        except Exception as exc:  # MemoryError and RecursionError included: bookkeeping only
            _say_failed(hook, getattr(build, "__name__", "a step"), f"{type(exc).__name__}: {exc}",
                        "decision")  # fmt: skip
            continue
        if step is not None:
            out.append(step)
    return tuple(out)


def _note(message: str) -> None:
    sys.stderr.write(f"gpugate: {message}\n")


# ------------------------------------------------------------------ the hands, one per kind


def _drain(step: S.Drain, hands: Hands, _: DrainOutcome | None) -> DrainOutcome:
    from gpugate.gate.drain import drain_counted  # only a failing hook drains (start-up)

    return drain_counted(hands.slurm(), step.node, step.reason, hands.config, step.check)


def _undo(step: S.Undo, hands: Hands, drain: DrainOutcome | None) -> DrainOutcome:
    if drain is None:  # `when: drained` makes it due only after a drain
        raise ValueError("no drain to undo")
    from gpugate.gate.drain import undo_beyond_budget

    return undo_beyond_budget(hands.slurm(), step.node, drain, hands.config, step.check)


def _isolate(step: S.Isolate, hands: Hands, _: DrainOutcome | None) -> str:
    from gpugate.gate.drain import isolate_after_drain

    line = isolate_after_drain(hands.config, hands.slurm(), step.node, list(step.failing),
                               step.gpus, step.boot_id)  # fmt: skip
    if line:
        hands.note(line)
    return line


def _lift(step: S.Lift, hands: Hands, _: DrainOutcome | None) -> S.Attempt:
    """Resume through `gpugate resume`'s own path (checks, qualification, audit): the Attempt."""
    if hands.lift is None:  # a plan that lifts comes with the path (Hands.lift)
        raise LookupError("no resume path to lift with (Hands.lift)")
    return hands.lift(hands.config, hands.slurm(), step)


def _refuse(step: S.Refuse, hands: Hands, _: DrainOutcome | None) -> str:
    """Leave a note for this job's epilog: the job never ran here, there is nothing to collect.

    Slurm runs the Epilog after a failed Prolog too; without the note it would collect
    "evidence" of the fault the prolog already reported, for a job that never started.
    """
    directory = ensure_job_dir(hands.config.state_dir, step.job_id)
    write_private(os.path.join(directory, "refused.json"), json.dumps({"reason": step.reason}))
    return ""


def _requeue(step: S.Requeue, hands: Hands, _: DrainOutcome | None) -> str:
    hands.slurm().requeue(step.job_id)
    return ""


def _exclude(step: S.Exclude, hands: Hands, _: DrainOutcome | None) -> str:
    excluded, pinned = hands.slurm().exclude_nodes(step.job_id, step.nodes)
    kept = f"; kept the -w pin on {','.join(pinned)}" if pinned else ""
    return f"ExcNodeList now {','.join(excluded) or '(none)'}{kept}"


def _start_now(step: S.StartNow, hands: Hands, _: DrainOutcome | None) -> str:
    from gpugate.gate.requeue import start_when_pending  # only the controller's requeue

    start_when_pending(hands.config, step.job_id, detach=hands.detach)
    return ""


def _note_beside(step: S.NoteBeside, hands: Hands, _: DrainOutcome | None) -> str:
    from gpugate.gate.requeue import tell_user

    return tell_user(step.job, step.decision)


def _comment(step: S.Note, hands: Hands, _: DrainOutcome | None) -> str:
    slurm = hands.slurm()
    if step.target == "node":
        slurm.set_node_comment(step.name, step.text)
    elif step.target == "job+":
        if not slurm.add_admin_comment(step.name, step.text):
            return "unchanged: already there, or no room"
    else:
        slurm.set_admin_comment(step.name, step.text)
    return ""


def _record_drain(step: S.RecordDrain, hands: Hands, _: DrainOutcome | None) -> str:
    from gpugate.store import history  # only after a drain (start-up: a healthy run skips it)

    history.note_drain(hands.config, step.node, step.reason, check=step.check, hook=step.hook,
                       boot_id=step.boot_id, job=step.job, category=step.category,
                       xid=step.xid, bundle=step.bundle, gpu=step.gpu)  # fmt: skip
    return ""


def _tell_held(step: S.TellHeld, hands: Hands, drain: DrainOutcome | None) -> str:
    if drain is None:  # `when: held` makes it due only after a held drain
        raise ValueError("no held drain to tell")
    from gpugate.gate.drain import tell_held

    tell_held(hands.slurm(), step.node, drain.reason, drain.why, hands.config)
    return ""


def _record_held(step: S.RecordHeld, hands: Hands, drain: DrainOutcome | None) -> str:
    if drain is None:  # `when: held` makes it due only after a held drain
        raise ValueError("no held drain to record")
    from gpugate.store.held import note_held  # only a drain the budget held back

    note_held(hands.config, step.node, drain.reason, drain.why, hands.hook or None)
    return ""


def _record_healing(step: S.RecordHealing, hands: Hands, _: DrainOutcome | None) -> str:
    healing.put(hands.config.state_dir, step.entry)
    return ""


def _forget_healing(step: S.ForgetHealing, hands: Hands, _: DrainOutcome | None) -> str:
    healing.forget(hands.config.state_dir, step.node)
    return ""


def _record_xids(step: S.RecordUnknownXids, hands: Hands, _: DrainOutcome | None) -> str:
    from gpugate.store import history

    history.note_unknown_xids(hands.config, step.node, step.xids, job=step.job, hook=step.hook)
    return ""


def _record_metrics(step: S.RecordMetrics, hands: Hands, _: DrainOutcome | None) -> str:
    metrics.note_run(hands.config, step.node, step.hook, **step.run)
    return ""


def _record_event(step: S.RecordEvent, hands: Hands, _: DrainOutcome | None) -> str:
    log.event(step.directory, step.hook, **step.fields)
    return ""


def _say(step: S.Say, hands: Hands, _: DrainOutcome | None) -> str:
    log.say(step.text)
    return ""


_HANDS: dict[type[S.Step], Callable[[Any, Hands, DrainOutcome | None], object]] = {
    S.Drain: _drain,
    S.Undo: _undo,
    S.Isolate: _isolate,
    S.Lift: _lift,
    S.Refuse: _refuse,
    S.Requeue: _requeue,
    S.Exclude: _exclude,
    S.StartNow: _start_now,
    S.NoteBeside: _note_beside,
    S.Note: _comment,
    S.RecordDrain: _record_drain,
    S.TellHeld: _tell_held,
    S.RecordHeld: _record_held,
    S.RecordHealing: _record_healing,
    S.ForgetHealing: _forget_healing,
    S.RecordUnknownXids: _record_xids,
    S.RecordMetrics: _record_metrics,
    S.RecordEvent: _record_event,
    S.Say: _say,
}

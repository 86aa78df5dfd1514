"""The repair ladder: the next step for a node gpugate drained, climbed by `gpugate health`.

One ladder per fault class, NVIDIA's catalog actions by default (the drain's check and Xid,
gpugate/gate/repair.py `repair_kind`; an Xid's action from gpugate/checks/xid_catalog.py, a
site's override in checks.kernel.xid_actions):
- transient (a hot GPU, a slow mount): no repair; the drain heals after
  `health.heal_after_passes` passing runs (gpugate/health/heal.py);
- reset (the catalog's "reset the GPU"): `nvidia-smi -r` on the failing GPUs
  (`health.gpu_reset`), once per drain, then the checklist again; still failing, the next rung;
- reboot (the catalog's "reboot the node", a GPU lost or off the bus): `scontrol reboot ASAP
  nextstate=DOWN` (`health.reboot`), once per drain; after the reboot the checklist runs again,
  then the qualification `admin.resume_qualify` asks for the fault class, then the resume;
- replace the part: the same GPU (its serial) or the same hardware check drained
  `admin.rma_after_drains` times in the window, or a reboot that did not repair the fault. The
  node stays drained, on the RMA list (`gpugate nodes --rma`), and nothing more is tried:
  never an endless loop.
Job-safe: a reset or a reboot only on an idle drained node (no job running or completing);
otherwise the ladder waits, says so once, and `health.repair_wait_h` after the drain it stops
waiting and leaves the node to a person. Every step is a line in the ledger
(gpugate/store/ledger.py). The ladder never raises into the health run (`climb`'s caller).
"""

from __future__ import annotations

import os
import time

from gpugate.checks.registry import HARDWARE, fault_class
from gpugate.child import detach
from gpugate.gate import repair as R
from gpugate.gate.ladder_result import Climb
from gpugate.store import history, ledger

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpugate.checks.findings import Finding
    from gpugate.child import Detach
    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.records import NodeInfo
    from gpugate.store.entries import DrainEntry, LedgerEntry
    from gpugate.store.healing import Healing

WHO = "gpugate health"
# What belongs to this drain: written at or after its start, Slurm's reason time, which is
# whole seconds (the hooks record the drain, and the ladder its steps, after Slurm set it). A
# wider margin would take the previous drain's reboot, qualification or RMA line for this one's
# when a node fails again soon after it was repaired.
_SLACK_S = 1.0


def climb(
    config: Config,
    slurm: SlurmControl,
    info: NodeInfo,
    entry: Healing,
    findings: list[Finding],
    boot: str | None,
) -> Climb:
    """The ladder's step for `info`, gpugate's drain (its healing `entry`): done, and said."""
    hardware = entry.fault == HARDWARE
    drain = drain_of(read_drains(config, entry, info.name), info.name, entry)
    found = read_drains(config, entry, info.name, drain.gpu if drain else None)
    window = history.window_start(config.admin.history_window_days)
    gpu = drain.gpu if drain else None
    repeats = same_part_drains(found, window, info.name, entry.check, gpu) if hardware else 0
    failing = [f for f in findings if f.status == "fail"]
    if hardware and history.reaches_rma(True, repeats, config.admin.rma_after_drains):
        what = f"GPU {drain.gpu}" if drain is not None and drain.gpu else entry.check
        why = (f"{what} drained {repeats} times in {config.admin.history_window_days:g} days "
               f"(admin.rma_after_drains {config.admin.rma_after_drains})")  # fmt: skip
        _once(config, info, entry, ledger.RMA, why, "replace the part", drain)
        return Climb(
            said=f"RMA candidate: {why}; stays drained, a person decides", rma=True, repeats=repeats
        )
    asked = R.reboot_asked(config, info.name)
    asked_boot = asked.get("boot_id") if asked and _since(asked, entry) else None
    if asked_boot and boot and asked_boot != boot:
        after = _after_reboot(config, info, entry, failing, boot, drain, repeats)
        return after.replace(boot_before=str(asked_boot))
    steps, by = ladder_steps(config, info, entry, failing)
    if not steps or not hardware:
        return Climb(repeats=repeats)
    return _repair(config, slurm, info, entry, failing, steps, by, boot, asked, repeats)


def ladder_steps(
    config: Config, info: NodeInfo, entry: Healing, failing: list[Finding]
) -> tuple[tuple[str, ...], str]:
    """The steps this drain may take, in order, and whose word they are: the site's
    (`health.ladder` for the drain's check), else NVIDIA's catalog action for the fault (a
    reset, then a reboot if the reset does not repair it; or a reboot)."""
    site = config.health.ladder.get(entry.check)
    if site is not None:
        return tuple(site), f"health.ladder {entry.check}"
    kind = R.repair_kind(info.reason, config) or _findings_kind(failing, config)
    if kind == R.RESET:
        return (R.RESET, R.REBOOT), ""
    return ((R.REBOOT,), "") if kind == R.REBOOT else ((), "")


def _after_reboot(
    config: Config,
    info: NodeInfo,
    entry: Healing,
    failing: list[Finding],
    boot: str,
    drain: DrainEntry | None,
    repeats: int,
) -> Climb:
    """The check after the reboot gpugate asked for: once per boot in the ledger; a fault
    the reboot did not repair is the last rung's failure: replace the part."""
    names = ", ".join(sorted({f.check for f in failing}))
    outcome = f"failed: {names}" if failing else "passed"
    _once(config, info, entry, ledger.RECHECK, "the checklist after the reboot", outcome, drain,
          evidence=f"boot {boot}")  # fmt: skip
    hard = [f for f in failing if fault_class(f.check) == HARDWARE]
    if hard:
        why = f"the reboot did not repair it ({names})"
        _once(config, info, entry, ledger.RMA, why, "replace the part", drain)
        return Climb(said=f"RMA candidate: {why}; stays drained, a person decides", rma=True, rebooted=True,
                     repeats=repeats)  # fmt: skip
    return Climb(said="rebooted: " + outcome, rebooted=True, repeats=repeats)


def _repair(
    config: Config,
    slurm: SlurmControl,
    info: NodeInfo,
    entry: Healing,
    failing: list[Finding],
    steps: tuple[str, ...],
    by: str,
    boot: str | None,
    asked: dict[str, object] | None,
    repeats: int,
) -> Climb:
    """The reset or the reboot rung, job-safe; a Climb that says what was done or awaited.
    Each rung is the site's to turn on (health.gpu_reset, health.reboot)."""
    hc = config.health
    reset_at = R.reset_recorded(info.name, config)
    reset_done = reset_at is not None and reset_at > entry.since
    if R.RESET in steps and not reset_done:
        if not hc.gpu_reset:
            return Climb(repeats=repeats)
        kind, escalated = R.RESET, ""
    elif R.RESET in steps and not failing:  # the reset repaired it: heal.py lifts on it
        return Climb(repeats=repeats)
    elif R.REBOOT in steps and hc.reboot:
        kind = R.REBOOT
        escalated = "the GPU reset did not repair it" if R.RESET in steps else by
    else:
        return Climb(repeats=repeats)
    if kind == R.REBOOT and asked is not None and _since(asked, entry):
        return Climb(said=f"reboot requested at {history.iso(_at(asked))}; waits for it",
                     repeats=repeats)  # fmt: skip
    if info.busy:
        return _wait(config, info, entry, "reset" if kind == R.RESET else "reboot", repeats)
    if kind == R.RESET:
        targets = R.reset_targets(failing, config) or (_gpus_of(failing) if by else [])
        if not targets:  # the drain's GPU fault is not seen now: nothing to reset
            return Climb(repeats=repeats)
        lines = R.reset_gpus(targets, config, node=info.name)
        return Climb(said="; ".join(lines), rejudge=True, repeats=repeats)
    done = R.request_reboot(slurm, info.name, info.reason, config, escalated=escalated, boot=boot)
    return Climb(said=done or "", repeats=repeats)


def _wait(config: Config, info: NodeInfo, entry: Healing, what: str, repeats: int) -> Climb:
    """Jobs run or complete on the drained node: the rung waits (bounded), said once."""
    limit_s = config.health.repair_wait_h * 3600
    waited = time.time() - entry.since
    if waited > limit_s:
        why = (f"the {what} waited {config.health.repair_wait_h:g} h (health.repair_wait_h) for "
               f"the node's jobs ({info.state}); a person decides")  # fmt: skip
        _once(config, info, entry, ledger.WAIT, why, "gave up")
        return Climb(said=why, repeats=repeats)
    why = f"the {what} waits for the node's jobs to end ({info.state}; job-safe)"
    _once(config, info, entry, ledger.WAIT, why, "waiting")
    return Climb(said=why, repeats=repeats)


def qualify_after_repair(
    config: Config,
    info: NodeInfo,
    entry: Healing,
    level: int,
    dry_run: bool = False,
    start: Detach | None = None,
) -> str:
    """Start the qualification the lift waits for (admin.resume_qualify), once per drain, in a
    detached child that resumes the node when it passes (gpugate/qualify/launch.py); what was
    done or is awaited. "" without a qualify: section (`gpugate resume NODE --qualify` then).
    `start`: what starts the child (default gpugate.child.detach)."""
    if config.qualify is None:
        return ""
    mine = this_drain(ledger.recent(config, info.name, entry.since - _SLACK_S))
    earlier = ledger.last(mine, ledger.QUALIFY)
    if earlier is not None:  # once per drain: a failed one drains anew, and the ladder restarts
        return f"level-{level} qualification {earlier.outcome} at {earlier.at}"
    if dry_run:
        return f"would start a level-{level} qualification"
    pid = start_qualification(config, info.name, level, start or detach)
    ledger.note(config, info.name, ledger.QUALIFY, who=WHO, outcome="started",
                why=f"level {level} (admin.resume_qualify {entry.fault}) before the resume",
                evidence=f"pid {pid}", check=entry.check, reason=info.reason)  # fmt: skip
    return f"level-{level} qualification started (pid {pid})"


def start_qualification(config: Config, node: str, level: int, start: Detach) -> object:
    """Start the repaired node's qualification in a detached child (it outlives the health
    run, which slurmd kills at its timeout; gpugate/qualify/launch.py qualify_repaired); its pid."""
    qc = config.qualify
    assert qc is not None  # qualify_after_repair asks for one only with a qualify: section
    # One phase for one node (its own job; pairs need two), then the settling.
    kwargs = {"node": node, "level": level, "config": os.environ.get("GPUGATE_CONFIG")}
    return start("gpugate.qualify.launch:qualify_repaired", kwargs, timeout=qc.wait_s + 600)


def recheck(config: Config, info: NodeInfo, findings: list[Finding], why: str) -> None:
    """The checklist's outcome after a repair (a GPU reset), as a ledger line."""
    names = ", ".join(sorted({f.check for f in findings if f.status == "fail"}))
    ledger.note(config, info.name, ledger.RECHECK, who=WHO, why=why,
                outcome=f"failed: {names}" if names else "passed", reason=info.reason)  # fmt: skip


# --------------------------------------------------------------------------------- reading


def read_drains(
    config: Config, entry: Healing, node: str, gpu: str | None = None
) -> list[DrainEntry]:
    """The drains of `node`, and of the GPU `gpu` on any node, since the window began (or since
    `entry`'s drain if earlier); only those lines are checked and read (a full history is
    20,000 lines: bench/bench_ladder.py)."""
    since = min(history.window_start(config.admin.history_window_days),
                entry.since - _SLACK_S)  # fmt: skip
    wanted = (lambda e: e.get("node") == node or e.get("gpu") == gpu) if gpu else (
        lambda e: e.get("node") == node)  # fmt: skip
    return history.drains(history.history_dir(config), None, since, where=wanted)


def drain_of(found: list[DrainEntry], node: str, entry: Healing) -> DrainEntry | None:
    """The history's entry of the drain `entry` follows (its GPU, its bundle), or None."""
    since = entry.since - _SLACK_S
    mine = (d for d in reversed(found) if d.node == node and d.when >= since)
    return next((d for d in mine if d.check == entry.check), None)


def same_part_drains(
    found: Iterable[DrainEntry],
    window: float | None,
    node: str,
    check: str | None,
    gpu: str | None,
) -> int:
    """How often the same part failed since `window` (None: in all of `found`): the drains of
    the GPU `gpu` (by its serial, on any node: a part moved keeps its count) or of `check` on
    `node`, whichever is more; a drill's drains never count. The one RMA count (the ladder's
    verdict, `gpugate nodes --rma`)."""
    real = [d for d in found if (window is None or d.when >= window) and not history.drill_of(d)]
    by_check = sum(1 for d in real if d.node == node and d.check == check)
    return max(by_check, sum(1 for d in real if d.gpu == gpu)) if gpu else by_check


def this_drain(found: list[LedgerEntry]) -> list[LedgerEntry]:
    """The lines after the newest resume among `found`: a resume ends a drain, and a node may
    be drained again within the second a qualification resumed it (its pass is not this one's)."""
    ends = [i for i, e in enumerate(found) if e.step in (ledger.RESUME, ledger.ADMIN)]
    return found[ends[-1] + 1 :] if ends else found


def _gpus_of(failing: list[Finding]) -> list[int]:
    """The GPUs of the failing findings, when every one names a GPU (a site's reset step)."""
    gpus = [f.gpu for f in failing]
    return sorted({g for g in gpus if g is not None}) if None not in gpus else []


def _findings_kind(failing: list[Finding], config: Config) -> str | None:
    """The repair the failing findings call for, where the drain reason names none."""
    if R.reboot_fault(failing, config) is not None:
        return R.REBOOT
    return R.RESET if R.reset_targets(failing, config) else None


def _at(asked: dict[str, object]) -> float | None:
    at = asked.get("at")
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None


def _since(asked: dict[str, object], entry: Healing) -> bool:
    """Whether the reboot was asked for this drain (not an earlier one)."""
    at = _at(asked)
    return at is not None and at >= entry.since - _SLACK_S


def _once(
    config: Config,
    info: NodeInfo,
    entry: Healing,
    step: str,
    why: str,
    outcome: str,
    drain: DrainEntry | None = None,
    evidence: str | None = None,
) -> None:
    """A ledger line for this drain, unless the node's newest line of `step` since the drain
    says the same (each health run would repeat it)."""
    evidence = evidence or (drain.bundle if drain else None)
    mine = this_drain(ledger.recent(config, info.name, entry.since - _SLACK_S))
    last = ledger.last(mine, step)
    if last is not None and last.outcome == outcome and last.evidence == evidence:
        return
    ledger.note(config, info.name, step, who=WHO, why=why, outcome=outcome, evidence=evidence,
                check=entry.check, gpu=drain.gpu if drain else None, reason=info.reason)  # fmt: skip

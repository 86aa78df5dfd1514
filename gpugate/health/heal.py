"""When a drain gpugate set may be lifted by itself (pure: no I/O, no Slurm, no clock).

A transient fault (a hot GPU, a slow mount) heals by itself: the drain goes after
`health.heal_after_passes` passing health runs in a row. A hardware fault (ECC, a lost GPU,
NVLink) stays until a person resumes the node, or until repair evidence shows (the boot id
changed since the drain: the node rebooted) and the whole checklist passes. A node drained
`admin.rma_after_drains` times in the window for the same hardware check is never lifted here:
it is an RMA candidate. Drains gpugate did not set never reach these rules (gpugate/hooks/health.py).
Where `admin.resume_qualify` asks a qualification of the drain's fault class, a lift also waits
for a pass recorded since the drain began (proof_gate), as `gpugate resume` does.
"""

from __future__ import annotations

from gpugate.record import Record
from gpugate.store.healing import Healing
from gpugate.store.history import reaches_rma

TRANSIENT, HARDWARE = "transient", "hardware"  # as gpugate/checks/registry.py names them
LIFT, KEEP = "lift", "keep"


class HealVerdict(Record):
    """Lift or keep the drain, the entry to store, and why (the audit's `why` on a lift)."""

    action: str  # lift / keep
    entry: Healing
    why: str


def heal_verdict(
    entry: Healing,
    failing: tuple[tuple[str, str], ...],
    boot_id: str | None,
    heal_after: int,
    same_check_drains: int = 0,
    rma_after: int = 0,
    reset_at: float | None = None,
) -> HealVerdict:
    """One health run's verdict on a node gpugate drained; `failing`: (check, fault) pairs."""
    if failing:
        # A hardware failure seen while drained for a transient one: the drain now waits for
        # a repair, as if that check had drained it.
        hardware = [c for c, fault in failing if fault == HARDWARE]
        if entry.fault == TRANSIENT and hardware:
            entry = entry.replace(check=hardware[0], fault=HARDWARE)
        names = ", ".join(c for c, _ in failing)
        return HealVerdict(
            action=KEEP, entry=entry.replace(passes=0), why=f"still failing: {names}"
        )
    entry = entry.replace(passes=entry.passes + 1)
    runs = f"{entry.passes} run{'s' if entry.passes != 1 else ''} in a row"
    if entry.fault == TRANSIENT:
        if entry.passes >= heal_after:
            return HealVerdict(action=LIFT, entry=entry, why=f"healed: {entry.check} passed {runs}")
        return HealVerdict(action=KEEP, entry=entry,
                           why=f"{entry.check} passed {runs}, {heal_after} needed")  # fmt: skip
    if reaches_rma(True, same_check_drains, rma_after):  # the one RMA rule (gpugate nodes too)
        return HealVerdict(action=KEEP, entry=entry, why=f"RMA candidate: drained {same_check_drains} "
                           f"times for {entry.check} in the window; a person decides")  # fmt: skip
    if entry.boot_id and boot_id and boot_id != entry.boot_id:
        return HealVerdict(action=LIFT, entry=entry, why="repaired: rebooted")
    # A GPU reset gpugate's own repair step recorded (gpugate/gate/repair.py) after the drain.
    if reset_at is not None and reset_at > entry.since:
        return HealVerdict(action=LIFT, entry=entry, why="repaired: GPU reset")
    return HealVerdict(action=KEEP, entry=entry, why=f"hardware fault ({entry.check}): "
                       "waits for a person or a repair (a reboot, then a passing checklist)")  # fmt: skip


def proof_gate(verdict: HealVerdict, qualify_level: int, qualified: bool) -> HealVerdict:
    """A lift the site makes wait for a qualification (admin.resume_qualify) waits for a pass."""
    if verdict.action != LIFT or not qualify_level or qualified:
        return verdict
    # health never runs a qualification itself (minutes of exclusive jobs): the admin's
    # `gpugate resume NODE --qualify` does, or a sweep's pass recorded since the drain.
    return verdict.replace(
        action=KEEP,
        why=f"{verdict.why}, but a level-{qualify_level} qualification must pass first "
        "(gpugate resume NODE --qualify)",
    )

"""A drain of gpugate's that someone lifted outside gpugate (`scontrol update state=resume`).

gpugate's healing entry (gpugate/store/healing.py) says it drained the node; gpugate's own
lifts leave an audit entry (`gpugate resume`, health's lift, a qualification) or a new boot (a
repair's `scontrol reboot ... nextstate=RESUME`), an isolation resumes its own drain, and a
qualification resumes gpugate's drains inside its reservation, audited when it settles. A node
back in service with none of these was resumed by a person: the audit records that as an
admin's act, once (the entry is forgotten then), and the next drain is gpugate's own again.
"""

from __future__ import annotations

from gpugate import log
from gpugate.store import healing
from gpugate.store.history import history_dir, record_resume, resumes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config
    from gpugate.slurm.records import NodeInfo

OUTSIDE_WHO = "admin (outside gpugate)"
_HELD = frozenset({"MAINT", "RESERVED"})  # node flags while a reservation holds it
ISOLATE_CHECK = "isolate"  # gpugate/isolate/apply.py resumes its own drain, unaudited


def resumed_outside(config: Config, info: NodeInfo, boot: str | None) -> str:
    """Record an in-service node's gpugate drain lifted outside gpugate; the line said, or ""."""
    if info.drained or _HELD & set(info.flags):
        # In a reservation (a qualification resumes gpugate's drains inside its MAINT one and
        # settles them after, audited): not yet anyone's resume; the entry waits.
        return ""
    entry = healing.load(config.state_dir).get(info.name)
    if entry is None or entry.check == ISOLATE_CHECK:
        return ""
    if entry.boot_id and boot and boot != entry.boot_id:
        return ""  # rebooted: a repair's nextstate=RESUME (or a reboot), not a bare resume
    audit = history_dir(config)
    if any(r.resumed for r in resumes(audit, info.name, since=entry.since)):
        return ""  # gpugate's own lift (or `gpugate resume`) is on record
    why = (
        f"back in service ({info.state}) without gpugate: gpugate's drain ({entry.check}) was "
        "lifted outside it (scontrol update state=resume); recorded as the admin's act"
    )
    from gpugate.store.ledger import ADMIN  # late: only a resume seen outside gpugate

    # The repair ledger's line is the admin's act (ADMIN), not a resume of gpugate's.
    record_resume(
        audit, info.name, who=OUTSIDE_WHO, why=why, reason=f"gpugate: {entry.check}",
        result="resumed outside gpugate (seen by gpugate health)", step=ADMIN,
    )  # fmt: skip
    healing.forget(config.state_dir, info.name)  # recorded once; a new drain, a new entry
    log.event(config.state_dir, "health", node=info.name, outcome="resumed_outside", why=why)
    return f"{info.name}: {why}"

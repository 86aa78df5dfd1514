"""Failing messages readable at a glance: each says what to do and names the GPU's serial.

A drain reason is often all an admin reads (`sinfo -R`), and an RMA ticket needs the board's
serial, so `run_checks` passes every failing finding through `readable`: `GPU3` becomes
`GPU3 (serial 1654922004170)` where the snapshot has the serial, and a message that names no
action gets the registry's one for its check, e.g. `(reset GPU)`.
"""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.registry import suggested_action
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.facts import Facts

# Words that make a message's own advice (checks write "(reset it)", ": reboot the node ...").
# A failing message with none of them gets the registry's action for its check appended.
ACTION_WORDS = lazy(
    r"(?i)\b(reboot|reset|reseat|replace|reload|remount|mount|check|fix|upgrade|install|load|"
    r"raise|lower|set|enable|kill|stop|free|drain|rma|ulimit|see)\b",
)


def has_action(message: str) -> bool:
    """Whether a message already says what to do."""
    return ACTION_WORDS.search(message.partition(": ")[2] or message) is not None


def with_serial(message: str, gpu: int, serial: str) -> str:
    """`GPU3 ...` -> `GPU3 (serial S) ...`; `GPU5 (0000:ab:00) ...` -> `GPU5 (serial S, 0000:ab:00) ...`."""
    if f"serial {serial}" in message:
        return message
    import re  # late: a failing message with a serial to add only (gpugate/startup.py)

    pattern = re.compile(rf"\bGPU{gpu}(?!\d)( \()?")

    def add(match: re.Match[str]) -> str:
        if match.group(1):  # the GPU already has a parenthesis: share it
            return f"GPU{gpu} (serial {serial}, "
        return f"GPU{gpu} (serial {serial})"

    return pattern.sub(add, message, count=1)


def serials(facts: Facts) -> dict[int, str]:
    """GPU index -> serial, for the GPUs whose snapshot names one."""
    out = {}
    for g in facts.gpus or ():
        serial = getattr(g, "serial", None)
        if isinstance(serial, str) and serial.strip():
            out[g.index] = serial.strip()
    return out


def readable(findings: list[F.Finding], facts: Facts) -> list[F.Finding]:
    """Failing findings with the GPU's serial and an action; the others unchanged."""
    by_index = serials(facts)
    out = []
    for f in findings:
        if f.status == F.FAIL:
            message = f.message
            if f.gpu is not None and f.gpu in by_index:
                message = with_serial(message, f.gpu, by_index[f.gpu])
            if not has_action(message):
                message = f"{message} ({suggested_action(f.check)})"
            if message != f.message:
                f = f.replace(message=message)
        out.append(f)
    return out

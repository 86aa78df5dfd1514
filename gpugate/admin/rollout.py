"""Each check's roll-out stage beside its false-drain rate: which checks to promote (issue 45).

A check is acting, report-only or canary-only (gate/policy.py: rollout). Its record over the
history window (store/outcomes.py: check_record) gives its drains and how they ended; its
false-drain rate is the share of its drains lifted through gpugate (`gpugate resume`,
healing) with no repair since (history.lifted_without_repair): of the drains that have ended,
how many found nothing to repair. A drain still in place, or lifted outside gpugate, has no
verdict yet and is left out of the rate (it is in `drains`). A drill's drain is never counted
(check_record leaves it out). A canary check's rate is its record on the canary's nodes, where
it drains: a low rate over enough drains is the proof to promote it to acting.
"""

from __future__ import annotations

from gpugate.checks.registry import registered
from gpugate.gate.policy import ACTING, rollout
from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpugate.config.schema import Policy

OTHER = "other"  # a history entry's check that no registered check has (an old or odd entry)


class CheckRate(Record):
    """One check: its stage, its drains in the window, the false ones and their share."""

    check: str
    rollout: str  # acting / report-only / canary-only
    drains: int = 0
    false_drains: int = 0
    lifted: int = 0  # drains lifted through gpugate (with or without repair): the rate's base
    rate: float | None = None  # false_drains / lifted; None: none lifted yet

    def to_json(self) -> dict[str, object]:
        """The row as `gpugate report --json` prints it."""
        return {"rollout": self.rollout, "drains": self.drains, "false_drains": self.false_drains,
                "lifted": self.lifted, "rate": self.rate}  # fmt: skip


def check_rates(record: Mapping[str, Mapping[str, int]], policy: Policy) -> list[CheckRate]:
    """A row for each check that drained in the window or does not act everywhere, by check
    id; drains of a check no longer registered are summed under OTHER (labels stay bounded)."""
    known = registered()
    counts: dict[str, list[int]] = {}
    for check, v in record.items():
        name = check if check in known else OTHER
        acc = counts.setdefault(name, [0, 0, 0])
        acc[0] += v.get("drains", 0)
        acc[1] += v.get("lifted_unrepaired", 0)
        acc[2] += v.get("lifted_unrepaired", 0) + v.get("lifted_repaired", 0)
    for check in known:
        if rollout(check, policy) != ACTING:
            counts.setdefault(check, [0, 0, 0])
    rows = []
    for check, (drains, false, lifted) in sorted(counts.items()):
        stage = ACTING if check == OTHER else rollout(check, policy)
        rows.append(CheckRate(check=check, rollout=stage, drains=drains, false_drains=false,
                              lifted=lifted, rate=false / lifted if lifted else None))  # fmt: skip
    return rows


def rate_text(rate: float | None) -> str:
    """`25%`, or `-` when no drain of the check has been lifted yet."""
    return "-" if rate is None else f"{rate * 100:.0f}%"

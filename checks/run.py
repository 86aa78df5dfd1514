"""Run the checklist over one snapshot. A check that raises is reported, never propagated."""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.expect import make_context
from gpugate.checks.registry import registered

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checks.facts import Facts
    from gpugate.config.schema import Config


def run_checks(
    facts: Facts, config: Config, only: list[str] | None = None, app_xids: tuple = ()
) -> list[F.Finding]:
    """Every enabled check over `facts`, findings sorted problems first."""
    ctx = make_context(facts, config, app_xids)
    disabled = set(config.checks.disabled)
    out: list[F.Finding] = []
    for check_id, fn in registered().items():
        if check_id in disabled or (only is not None and check_id not in only):
            continue
        try:
            out.extend(fn(facts, ctx))
        except Exception as exc:  # a bug in one check must not hide the others
            out.append(F.unknown(check_id, f"check crashed: {type(exc).__name__}: {exc}"))
    return F.sort_findings(out)

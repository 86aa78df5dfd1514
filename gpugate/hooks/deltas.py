"""What changed on the node while the job ran: counters now against the prolog's baseline."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.store.state import Baseline

# IB counters whose growth means a flapping link or a bad cable (docs/gpu-facts.md section 5).
IB_ERROR_COUNTERS = (
    "link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
    "local_link_integrity_errors", "excessive_buffer_overrun_errors",
    "port_rcv_remote_physical_errors", "port_xmit_discards",
)  # fmt: skip
GPU_COUNTERS = (
    "ecc_volatile_uncorrected", "ecc_volatile_corrected", "ecc_aggregate_uncorrected",
    "ecc_aggregate_corrected", "remapped_uncorrected", "remapped_corrected", "pcie_replay_errors",
)  # fmt: skip


def _grew(before: object, after: object) -> int | None:
    if isinstance(before, int) and isinstance(after, int) and after > before:
        return after - before
    return None


def counter_deltas(baseline: Baseline | None, now: dict[str, Any]) -> dict[str, Any]:
    """Per GPU and IB port: counters that grew, states that changed. Empty when nothing did."""
    if not baseline:
        return {}
    out: dict[str, Any] = {}
    for index, after in now.get("gpus", {}).items():
        before = baseline.gpus.get(index, {})
        change: dict[str, object] = {
            k: d for k in GPU_COUNTERS if (d := _grew(before.get(k), after.get(k)))
        }
        nvl_before, nvl_after = before.get("nvlink_errors") or {}, after.get("nvlink_errors") or {}
        for k, v in nvl_after.items():
            if d := _grew(nvl_before.get(k), v):
                change[f"nvlink_{k}"] = d
        if after.get("remap_pending") and not before.get("remap_pending"):
            change["remap_pending"] = True
        if (after.get("nvlink_active") or 0) < (before.get("nvlink_active") or 0):
            change["nvlink_active"] = (
                f"{before.get('nvlink_active')} -> {after.get('nvlink_active')}"
            )
        if after.get("error") and after.get("error") != before.get("error"):
            change["error"] = after["error"]
        new_throttle = sorted(
            set(after.get("throttle_reasons") or ()) - set(before.get("throttle_reasons") or ())
        )
        if new_throttle:
            change["throttle_reasons"] = new_throttle
        if change:
            out.setdefault("gpus", {})[index] = change
    for port, after in now.get("infiniband", {}).items():
        before = baseline.infiniband.get(port, {})
        change = {k: d for k in IB_ERROR_COUNTERS if (d := _grew(before.get(k), after.get(k)))}
        # (a port's change: counters that grew, then its state)
        if after.get("state") != before.get("state") and before:
            change["state"] = f"{before.get('state')} -> {after.get('state')}"
        if change:
            out.setdefault("infiniband", {})[port] = change
    return out


def describe(deltas: dict[str, Any]) -> list[str]:
    """One line per changed GPU or port, for people."""
    lines = []
    for index, change in sorted(deltas.get("gpus", {}).items(), key=lambda kv: int(kv[0])):
        lines.append(
            f"GPU{index}: "
            + ", ".join(
                f"{k} {'+' if isinstance(v, int) and not isinstance(v, bool) else ''}{v}"
                for k, v in change.items()
            )
        )
    for port, change in sorted(deltas.get("infiniband", {}).items()):
        lines.append(
            f"{port}: "
            + ", ".join(f"{k} {'+' if isinstance(v, int) else ''}{v}" for k, v in change.items())
        )
    return lines  # fmt: skip


def new_kernel_lines(baseline: Baseline | None, lines: tuple[str, ...] | list[str]) -> list[str]:
    """Kernel-log lines that appeared since the prolog.

    With a kmsg position the source already read only newer records; a replayed or re-read log
    is compared with the tail the prolog saw.
    """
    if not baseline:
        return list(lines)
    seen = set(baseline.kernel_log_tail)
    return [line for line in lines if line not in seen]

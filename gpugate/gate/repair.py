"""Repair through Slurm, opt in: reboot-class faults to `scontrol reboot ASAP`, GPU resets.

The rungs the repair ladder (gpugate/gate/ladder.py) climbs. `request_reboot` hands a node
gpugate drained for a reboot-class fault (an Xid whose action is `reboot` in
gpugate/checks/xid_catalog.py, e.g. 79 "fallen off the bus"; a GPU whose recovery action is
node_reboot; gpu.lost, kernel.gpu_bus), or one a reset did not repair, to Slurm: `scontrol
reboot ASAP nextstate=DOWN reason="gpugate: ..." NODE` (`health.reboot_nextstate`).
scontrol(1), `reboot`: ASAP drains the node, the site's RebootProgram (slurm.conf) runs once
the node is idle, the HealthCheckProgram runs once when slurmd starts again; nextstate=DOWN
keeps the node out of service with the reason until gpugate's post-reboot check lifts it
(nextstate=RESUME would clear the drain and the reason as slurmd registers); a node that does
not come back within ResumeTimeout is marked DOWN. Only on an idle node (no job running or
completing: issue 45, "job-safe"), never for a drain gpugate did not set, once per drain
(recorded with the boot it was asked in, `state_dir/repairs.json`), within the drain budget.
`reset_gpus` runs `nvidia-smi -r -i N` on an idle node (nvidia-smi(1): root only, refused
while any process uses the GPU) and records when, as repair evidence for the healing step
(`reset_recorded`).
"""

from __future__ import annotations

import json
import os
import time

from gpugate import log, runner
from gpugate.checks.registry import REBOOT as REBOOT_ACTION
from gpugate.checks.registry import suggested_action
from gpugate.checks.xid import SITE_ACTIONS, lookup
from gpugate.fsutil import FileLock, atomic_write, lock_file, read_regular
from gpugate.gate.budget import check_budget
from gpugate.node import node_name
from gpugate.regex import lazy
from gpugate.slurm.control import NotOurDrain, SlurmError, valid_node_name
from gpugate.slurm.reasons import drain_reason, is_ours, reason_check
from gpugate.store import history, ledger, locks
from gpugate.store.state import StateError, ensure_state_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.records import NodeInfo

REBOOT, RESET = "reboot", "reset"
REPAIRS_FILE = "repairs.json"
REPAIRS_MODE = 0o600  # root's only: what gpugate did to this node's hardware
_MAX_NODES = 4096  # entries kept per kind (a node-local file holds one node; a few at most)
# Slurm shows a pending reboot as these state flags (`@` and `^` in sinfo).
_PENDING_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
_XID = lazy(r"\bXid (\d{1,9})\b")


def reboot_asked(config: Config, node: str) -> dict[str, Any] | None:
    """The reboot gpugate last asked for `node` (`at`, `reason`, `boot_id`), or None."""
    asked = _load(config).get(REBOOT, {}).get(node)
    return asked if isinstance(asked, dict) else None


# --------------------------------------------------------------------------- classifying


def repair_kind(fault: str, config: Config | None = None) -> str | None:
    """`reboot`, `reset` or None for a fault: a drain reason or a finding's message.

    Reads gpugate's own words (`gpugate: <check>: <detail>` or `<check>: <detail>`): the check
    id, the Xid code and the action the Xid check wrote ("reboot the node" / "reset the GPU").
    """

    text = fault.strip()
    check = reason_check(text if is_ours(text) else f"gpugate: {text}")
    # A reboot request's own reason (reboot_reason) is judged by the fault it names.
    detail = text.split(f"{check}:", 1)[-1].strip().removeprefix("reboot:") if check else ""
    if check is None:
        return None
    if check == "kernel.xid":
        return _xid_kind(detail, config)
    if check == "gpu.recovery_action":
        if "reboot" in detail:
            return REBOOT
        return RESET if "reset" in detail else None
    return REBOOT if suggested_action(check) == REBOOT_ACTION else None


def _xid_kind(detail: str, config: Config | None) -> str | None:
    if "reboot the node" in detail:
        return REBOOT
    m = _XID.search(detail)
    if m is None:
        return RESET if "reset the GPU" in detail else None
    site = config.checks.kernel.xid_actions.get(m.group(1)) if config is not None else None
    action = (
        SITE_ACTIONS.get(site, "report") if site is not None else lookup(int(m.group(1))).action
    )
    if action == "reboot":
        return REBOOT
    return RESET if action == "reset_gpu" or "reset the GPU" in detail else None


def reboot_fault(findings: Iterable[Finding], config: Config | None = None) -> str | None:
    """The message of the first failing finding a reboot repairs, or None (for request_reboot)."""
    return next(
        (
            f.message
            for f in findings
            if f.status == "fail" and repair_kind(f.message, config) == REBOOT
        ),
        None,
    )


def reset_targets(findings: Iterable[Finding], config: Config | None = None) -> list[int]:
    """The GPUs whose failures a reset repairs (for reset_gpus); [] when any failure needs more.

    A reset cannot mend a fault of another kind (ECC over the limit, a lost GPU, a slow mount):
    with one of those failing too, resetting would only delay the drain, so nothing is reset.
    """
    failing = [f for f in findings if f.status == "fail"]
    kinds = [repair_kind(f.message, config) for f in failing]
    if not failing or any(k != RESET or f.gpu is None for f, k in zip(failing, kinds)):
        return []
    return sorted({f.gpu for f in failing if f.gpu is not None})  # none is None (above)


def reboot_reason(fault: str) -> str:
    """The reason the reboot request writes: the same check id, so healing and `gpugate nodes`
    still know what drained the node (`gpugate: kernel.xid: reboot: GPU0 Xid 79 ...`)."""
    text = fault.strip()
    check = reason_check(text if is_ours(text) else f"gpugate: {text}") or "unknown"
    detail = text.split(f"{check}:", 1)[-1].strip()
    detail = detail.removeprefix("reboot:").strip()
    return drain_reason(check, f"reboot: {detail}" if detail else "reboot")


# --------------------------------------------------------------------------------- reboot


def request_reboot(
    slurm: SlurmControl,
    node: str,
    reason: str,
    config: Config,
    escalated: str = "",
    boot: str | None = None,
) -> str | None:
    """Ask Slurm to reboot `node` for a reboot-class fault; what was done, or None.

    Opt in (`health.reboot`); only an idle node drained by gpugate, once per drain, within the
    drain budget. `escalated`: why a fault of another kind is rebooted all the same (a reset
    that did not repair it). `boot`: this boot's id, recorded (the ladder's proof the node
    rebooted). Every refusal is a line in slurmd's log; nothing is raised for Slurm's errors.
    """
    if not config.health.reboot:
        return None
    if repair_kind(reason, config) != REBOOT and not escalated:
        return None
    try:
        before = slurm.node(valid_node_name(node))
    except (SlurmError, ValueError) as exc:
        log.say(f"not rebooting {node}: cannot read the node ({exc})")
        return None
    refused = _reboot_refusal(slurm, before, config)
    if refused:
        log.say(f"not rebooting {node}: {refused}")
        return None
    wanted = reboot_reason(reason)
    nextstate = config.health.reboot_nextstate.upper()
    try:
        change = slurm.reboot_asap(node, wanted, nextstate=nextstate)
    except (NotOurDrain, SlurmError, ValueError) as exc:
        log.say(f"not rebooting {node}: {exc}")
        return None
    _record(config, REBOOT, node, {"drain": _drain_key(before), "reason": change.reason,
                                   "boot_id": boot})  # fmt: skip
    how = f"scontrol reboot ASAP nextstate={nextstate}"
    done = f"{node}: reboot requested ({how}): {change.reason}"
    log.event(
        config.state_dir, "repair", node=node, outcome="reboot_requested", reason=change.reason
    )
    ledger.note(config, node, ledger.REBOOT, who="gpugate health", outcome="requested",
                why=f"{escalated}; {how}" if escalated else how, check=reason_check(wanted),
                reason=change.reason)  # fmt: skip
    return done


def _reboot_refusal(slurm: SlurmControl, before: NodeInfo, config: Config) -> str | None:
    """Why this node must not be rebooted now, or None."""
    if not before.drained:
        return "not drained (gpugate reboots only a node it drained)"
    if before.busy:  # job-safe: ASAP would wait, but the ask itself waits for an idle node
        return f"a job runs or completes on it ({before.state}); the reboot waits for an idle node"
    if not before.gpugate_owned:
        return (
            f"drained by {before.reason_user or 'someone else'} ({before.reason!r}), not by gpugate"
        )
    if _PENDING_FLAGS & set(before.flags):
        return "a reboot is already pending"
    asked = _load(config).get(REBOOT, {}).get(before.name)
    if isinstance(asked, dict) and (
        asked.get("drain") == _drain_key(before) or asked.get("reason") == before.reason
    ):
        return f"a reboot was already requested for this drain at {asked.get('at')}"
    try:
        # The same limits as the drain it follows (a hardware check's share of the partition).
        nodes, check = slurm.nodes(), reason_check(before.reason)
        verdict = check_budget(nodes, before.name, config.budget, time.time(), check)
    except SlurmError as exc:  # a reboot is not the normal action: no count, no reboot
        return f"drain budget unknown ({exc})"
    return None if verdict.allowed else f"drain budget: {verdict.why}"


def _drain_key(info: NodeInfo) -> list[str | int | None]:
    """What identifies one drain: its reason and when it was set."""
    return [info.reason, info.reason_time]


# ---------------------------------------------------------------------------------- reset


def reset_gpus(
    indices: Iterable[int],
    config: Config,
    runner: Callable[..., runner.CommandResult] = runner.run,
    node: str | None = None,
) -> list[str]:
    """`nvidia-smi -r -i N` for each GPU (the caller says the node is idle); one line each.

    Opt in (`health.gpu_reset`). nvidia-smi missing, refusing (a process uses the GPU, not
    root, not supported) or timing out is reported in the line, never raised. A reset that
    worked is recorded (`reset_recorded`); the caller checks the node again.
    """
    if not config.health.gpu_reset:
        return []
    lines, done = [], []
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            lines.append(f"GPU {index!r}: not a GPU index; not reset")
            continue
        argv = ["nvidia-smi", "-r", "-i", str(index)]
        res = runner(argv, config.health.gpu_reset_timeout_s)
        lines.append(_reset_line(index, res))
        if res.ok:
            done.append(index)
    if done:
        where = node or node_name()
        _record(config, RESET, where, {"gpus": done})
        _audit_reset(config, where, done)
        log.event(config.state_dir, "repair", node=where, outcome="gpu_reset", gpus=done)
    return lines


def _audit_reset(config: Config, node: str, gpus: list[int]) -> None:
    """The reset in the audit log, where the false-drain count looks for repairs."""

    why = f"gpugate: nvidia-smi -r on GPU {', '.join(map(str, gpus))}"
    try:
        history.record_repair(
            history.history_dir(config), node, history.GPU_RESET, why=why, who="gpugate health"
        )  # the ladder's step, not root's by hand
    except (OSError, ValueError) as exc:
        log.error(config.state_dir, f"could not audit the GPU reset of {node}", exc)


def _reset_line(index: int, res: runner.CommandResult) -> str:
    """One line on one reset, in nvidia-smi's own words where it said why."""
    said = " ".join((res.stdout + " " + res.stderr).split())[:300]
    if res.ok:
        return f"GPU {index}: reset (nvidia-smi -r)" + (f": {said}" if said else "")
    if res.status == runner.MISSING:
        return f"GPU {index}: not reset: nvidia-smi is not installed"
    if res.status == runner.TIMEOUT:
        return f"GPU {index}: not reset: nvidia-smi -r timed out after {res.duration_s:.0f} s"
    # nvidia-smi(1), -r: refused while any process (a job, another nvidia-smi, a monitor)
    # uses the GPU; its message names the reason.
    return f"GPU {index}: not reset: {res.describe()}" + (f": {said}" if said else "")


def reset_recorded(node: str, config: Config) -> float | None:
    """When gpugate last reset a GPU of `node` (epoch seconds), or None: repair evidence."""
    entry = _load(config).get(RESET, {}).get(node)
    at = entry.get("at") if isinstance(entry, dict) else None
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None


# ---------------------------------------------------------------------------------- state


def _path(config: Config) -> str:
    return os.path.join(config.state_dir, REPAIRS_FILE)


def _load(config: Config) -> dict[str, Any]:
    """`repairs.json` ({"reboot": {node: entry}, "reset": {node: entry}}), {} when unusable."""
    try:
        data = json.loads(read_regular(_path(config), 16 << 20, follow=False))  # never blocks
    except (OSError, ValueError, RecursionError):  # RecursionError: "[[[[..." 100k deep
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if k in (REBOOT, RESET) and isinstance(v, dict)}


def _record(config: Config, kind: str, node: str, entry: dict[str, Any]) -> None:
    """Add one entry under a lock, atomically, root's only; a failure is logged, not raised.

    Past locks.REPAIRS_WAIT_S the entry is written without the lock (an atomic rewrite: at
    worst the holder's entry is lost), said in the log: a repair not recorded could be asked
    for again.
    """
    try:
        ensure_state_dir(config.state_dir)
        lock = FileLock(lock_file(config.state_dir, locks.REPAIRS), wait_s=locks.REPAIRS_WAIT_S)
        with lock:
            if not lock.held:
                log.say(f"{_path(config)}: lock held over {locks.REPAIRS_WAIT_S:g} s: "
                        "written without it")  # fmt: skip
            data = _load(config)
            nodes = data.setdefault(kind, {})
            nodes.pop(node, None)
            nodes[node] = {**entry, "at": time.time()}
            while len(nodes) > _MAX_NODES:
                nodes.pop(next(iter(nodes)))
            atomic_write(_path(config), json.dumps(data, sort_keys=True), REPAIRS_MODE)
    except (OSError, StateError, ValueError) as exc:
        log.error(config.state_dir, f"could not record the {kind} of {node}", exc)

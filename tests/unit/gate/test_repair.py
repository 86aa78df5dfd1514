"""Repair through Slurm (gpugate/gate/repair.py): reboot requests and GPU resets, opt in."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest
from factories import default_config
from fakes import NODE, FakeSlurm, drained, idle
from slurm_recorded import FakeRunner

from gpugate.gate import repair
from gpugate.runner import CommandResult
from gpugate.slurm.cli import CliBackend
from gpugate.slurm.control import NotOurDrain
from gpugate.store import ledger

XID79 = "gpugate: kernel.xid: GPU0 Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS: GPU has fallen off the bus (reboot the node)"
ECC = "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100"


def config(tmp_path, reboot: bool = True, gpu_reset: bool = True, **budget):
    cfg = default_config()
    return cfg.replace(
        state_dir=str(tmp_path / "state"),
        health=cfg.health.replace(reboot=reboot, gpu_reset=gpu_reset, gpu_reset_timeout_s=7.0),
        budget=cfg.budget.replace(**budget) if budget else cfg.budget,
    )


def slurm_with(*infos) -> FakeSlurm:
    return FakeSlurm(nodes=infos or (drained(NODE, XID79, when=1000),))


# ------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (XID79, "reboot"),
        ("kernel.xid: GPU1 Xid 167 PCIE_FATAL_TIMEOUT: PCIE_FATAL_TIMEOUT", "reboot"),
        (
            "gpugate: kernel.xid: GPU2 Xid 48 GPU_ECC_DBE: Double Bit ECC Error (reset the GPU)",
            "reset",
        ),
        (
            "gpugate: gpu.recovery_action: GPU0 driver requires recovery action node_reboot (reboot the node)",
            "reboot",
        ),
        (
            "gpu.recovery_action: GPU0 driver requires recovery action gpu_reset (reset the GPU)",
            "reset",
        ),
        ("gpugate: gpu.lost: GPU4 is lost (gpu_is_lost)", "reboot"),
        ("gpugate: kernel.gpu_bus: GPU0: fallen off the bus", "reboot"),
        (ECC, None),
        ("gpugate: gpu.temperature: GPU0 91 C > 85 C", None),
        ("admin: fan swap", None),
        ("", None),
    ],
)
def test_repair_kind_follows_the_check_and_the_xid_catalog(fault, kind):
    assert repair.repair_kind(fault) == kind


def test_a_site_xid_action_makes_an_xid_reboot_class(tmp_path):
    cfg = default_config()
    site = cfg.replace(
        checks=cfg.checks.replace(kernel=cfg.checks.kernel.replace(xid_actions={"48": "reboot"}))
    )
    fault = "gpugate: kernel.xid: GPU2 Xid 48 GPU_ECC_DBE: Double Bit ECC Error"
    assert repair.repair_kind(fault) == "reset"
    assert repair.repair_kind(fault, site) == "reboot"


def test_the_findings_name_what_to_repair():
    from gpugate.checks import findings as F

    xid79 = F.fail(
        "kernel.xid", "GPU0 Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS: x (reboot the node)", gpu=0
    )
    xid48 = F.fail(
        "kernel.xid", "GPU2 Xid 48 GPU_ECC_DBE: Double Bit ECC Error (reset the GPU)", gpu=2
    )
    reset5 = F.fail("gpu.recovery_action", "GPU5 driver requires recovery action gpu_reset", gpu=5)
    ecc = F.fail("gpu.ecc", "GPU3 aggregate uncorrected ECC 120 > 100", gpu=3)
    warned = F.warn(
        "kernel.xid", "GPU1 Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS: x (reboot the node)", gpu=1
    )
    assert repair.reboot_fault([ecc, warned, xid79]) == xid79.message
    assert repair.reboot_fault([ecc, xid48, warned]) is None
    assert repair.reset_targets([xid48, reset5, F.ok("gpu.ecc", "fine")]) == [2, 5]
    # A fault a reset does not mend fails too: no reset, the drain stands.
    assert repair.reset_targets([xid48, ecc]) == []
    assert repair.reset_targets([xid48, xid79]) == []
    assert repair.reset_targets([]) == []


def test_the_reboot_reason_keeps_the_check_id():
    reason = repair.reboot_reason(XID79)
    assert reason.startswith("gpugate: kernel.xid: reboot: GPU0 Xid 79")
    assert repair.reboot_reason(reason) == reason  # not "reboot: reboot: ..."
    assert repair.repair_kind(reason) == "reboot"
    reset = "gpu.recovery_action: GPU0 driver requires recovery action gpu_reset (reset the GPU)"
    assert repair.repair_kind(repair.reboot_reason(reset)) == "reset"  # "reboot:" is no fault
    assert len(repair.reboot_reason(XID79 + "x" * 400)) <= 200


# ---------------------------------------------------------------------------------- reboot


def test_opt_in_off_does_nothing(tmp_path):
    slurm = slurm_with()
    assert repair.request_reboot(slurm, NODE, XID79, config(tmp_path, reboot=False)) is None
    assert slurm.reboots == []
    assert not os.path.exists(tmp_path / "state" / "repairs.json")


def test_a_reboot_class_drain_is_handed_to_slurm_and_recorded(tmp_path):
    slurm, cfg = slurm_with(), config(tmp_path)
    done = repair.request_reboot(slurm, NODE, XID79, cfg, boot="boot-a")
    assert done and "reboot requested" in done and "nextstate=DOWN" in done
    [(node, reason, nextstate)] = slurm.reboots
    # DOWN (the default): out of service until gpugate's check after the reboot lifts it.
    assert (node, nextstate) == (NODE, "DOWN")
    assert reason.startswith("gpugate: kernel.xid: reboot: GPU0 Xid 79")
    path = tmp_path / "state" / "repairs.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    entry = json.loads(path.read_text())["reboot"][NODE]
    assert entry["drain"] == [XID79, 1000] and entry["reason"] == reason
    assert entry["boot_id"] == "boot-a"  # the ladder's proof the node rebooted since
    [line] = ledger.entries(str(tmp_path / "state"), NODE)
    assert (line.step, line.outcome, line.check) == ("reboot", "requested", "kernel.xid")
    assert "nextstate=DOWN" in line.why and line.reason == reason
    events = (tmp_path / "state" / "events.jsonl").read_text()
    assert '"outcome":"reboot_requested"' in events


def test_a_fault_that_a_reboot_does_not_clear_is_not_rebooted(tmp_path):
    slurm = slurm_with(drained(NODE, ECC, when=1000))
    assert repair.request_reboot(slurm, NODE, ECC, config(tmp_path)) is None
    assert slurm.reboots == []


def test_an_admins_drain_is_not_rebooted(tmp_path, capsys):
    slurm = slurm_with(drained(NODE, "fan swap ticket 4711", user="alice"))
    assert repair.request_reboot(slurm, NODE, XID79, config(tmp_path)) is None
    assert slurm.reboots == []
    assert "not by gpugate" in capsys.readouterr().err


def test_the_adapter_itself_refuses_an_admins_drain():
    slurm = slurm_with(drained(NODE, "fan swap ticket 4711", user="alice"))
    with pytest.raises(NotOurDrain):
        slurm.reboot_asap(NODE, repair.reboot_reason(XID79))
    with pytest.raises(ValueError):
        slurm.reboot_asap(NODE, "not ours")
    assert slurm.reboots == []


def test_an_undrained_node_is_not_rebooted(tmp_path, capsys):
    """The drain comes first (budget, ownership); a node the budget left in service stays."""
    slurm = slurm_with(idle(NODE))
    assert repair.request_reboot(slurm, NODE, XID79, config(tmp_path)) is None
    assert slurm.reboots == [] and "not drained" in capsys.readouterr().err


def test_one_request_per_drain(tmp_path, capsys):
    slurm, cfg = slurm_with(), config(tmp_path)
    assert repair.request_reboot(slurm, NODE, XID79, cfg)
    # Slurm now shows the reboot pending (REBOOT_REQUESTED): no second request.
    assert repair.request_reboot(slurm, NODE, XID79, cfg) is None
    assert "already pending" in capsys.readouterr().err
    # Even where the flag is gone (24.11 shows it only while pending), the record says so.
    slurm.infos[NODE] = slurm.infos[NODE].replace(flags=("DRAIN",))
    assert repair.request_reboot(slurm, NODE, XID79, cfg) is None
    assert "already requested" in capsys.readouterr().err
    assert len(slurm.reboots) == 1


def test_a_new_drain_after_the_reboot_may_be_rebooted_again(tmp_path):
    slurm, cfg = slurm_with(), config(tmp_path)
    assert repair.request_reboot(slurm, NODE, XID79, cfg)
    slurm.infos[NODE] = drained(NODE, XID79, when=5000)  # back, failed again, drained again
    assert repair.request_reboot(slurm, NODE, XID79, cfg)
    assert len(slurm.reboots) == 2


def budget_cluster(other_drains: int) -> FakeSlurm:
    """7 nodes in one partition: ours (Xid 79), `other_drains` more drained by gpugate."""
    others = [drained(f"gpu-node-0{i}", ECC, when=1000) for i in range(2, 2 + other_drains)]
    spare = [idle(f"gpu-node-1{i}") for i in range(6 - other_drains)]
    return slurm_with(drained(NODE, XID79, when=1000), *others, *spare)


def test_the_budget_refuses(tmp_path, capsys):
    slurm = budget_cluster(other_drains=4)
    # kernel.xid is a hardware check: half the partition (4 of 7) at most; 4 others are out.
    cfg = config(tmp_path, max_drained_share=0.1, min_drains_allowed=1)
    assert repair.request_reboot(slurm, NODE, XID79, cfg) is None
    assert slurm.reboots == [] and "drain budget" in capsys.readouterr().err


def test_the_budget_is_the_drains_own(tmp_path):
    """The reboot is judged with the limits of the check that drained the node."""
    slurm = budget_cluster(other_drains=2)
    # 10 % of 7 would allow one drain in all; a hardware check may hold 4.
    cfg = config(tmp_path, max_drained_share=0.1, min_drains_allowed=1)
    assert repair.request_reboot(slurm, NODE, XID79, cfg)


def test_the_site_may_keep_slurms_resume_as_slurmd_registers(tmp_path):
    cfg = config(tmp_path)
    cfg = cfg.replace(health=cfg.health.replace(reboot_nextstate="resume"))
    slurm = slurm_with()
    assert "nextstate=RESUME" in (repair.request_reboot(slurm, NODE, XID79, cfg) or "")
    assert [s for _, _, s in slurm.reboots] == ["RESUME"]


@pytest.mark.parametrize("state", [("MIXED", ("DRAIN",)), ("IDLE", ("DRAIN", "COMPLETING")),
                                   ("ALLOCATED", ("DRAIN",))])  # fmt: skip
def test_no_reboot_is_asked_while_a_job_runs_or_completes(tmp_path, state, capsys):
    base, flags = state
    node = drained(NODE, XID79, when=1000).replace(state=base, flags=flags)
    slurm = slurm_with(node)
    assert repair.request_reboot(slurm, NODE, XID79, config(tmp_path)) is None
    assert slurm.reboots == []
    assert "waits for an idle node" in capsys.readouterr().err


def test_a_reset_class_fault_is_rebooted_only_when_escalated(tmp_path):
    slurm = slurm_with(drained(NODE, ECC, when=1000))
    assert repair.request_reboot(slurm, NODE, ECC, config(tmp_path)) is None
    done = repair.request_reboot(slurm, NODE, ECC, config(tmp_path),
                                 escalated="the GPU reset did not repair it")  # fmt: skip
    assert done and len(slurm.reboots) == 1
    [line] = ledger.entries(str(tmp_path / "state"), NODE)
    assert line.why.startswith("the GPU reset did not repair it; scontrol reboot ASAP")


def test_slurm_errors_are_reported_not_raised(tmp_path, capsys):
    from gpugate.slurm.control import SlurmError

    slurm = slurm_with()
    slurm.errors["reboot"] = SlurmError("slurmctld not responding")
    assert repair.request_reboot(slurm, NODE, XID79, config(tmp_path)) is None
    slurm.errors = {"node": SlurmError("slurmctld not responding")}
    assert repair.request_reboot(slurm, NODE, XID79, config(tmp_path)) is None
    assert capsys.readouterr().err.count("not rebooting") == 2
    assert repair.request_reboot(slurm, "-x", XID79, config(tmp_path)) is None


def test_the_cli_backend_runs_scontrol_reboot_asap():
    reason = repair.reboot_reason(XID79)
    argv = ("scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", NODE)
    runner = FakeRunner().ok(argv)
    runner.ok(("scontrol", "-o", "show", "node", NODE), show_node(XID79))
    backend = CliBackend(runner=runner, timeout=4.0)
    change = backend.reboot_asap(NODE, reason)
    assert change.action == "reboot_requested" and change.reason == reason
    assert runner.calls[-1][0] == argv and runner.calls[-1][1] == 4.0


def show_node(reason: str) -> str:
    """One `scontrol -o show node` line of a drained node (22.05's shape)."""
    return (
        f"NodeName={NODE} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 "
        "State=IDLE+DRAIN Partitions=gpu "
        f"Reason={reason} [root@2026-12-01T09:00:00]\n"
    )


# ----------------------------------------------------------------------------------- reset


def reply(argv, status="ok", rc=0, stdout="", stderr="", duration_s=0.1) -> CommandResult:
    return CommandResult(argv=tuple(argv), status=status, returncode=rc, stdout=stdout,
                         stderr=stderr, duration_s=duration_s)  # fmt: skip


class ResetRunner:
    """nvidia-smi -r per GPU: index -> (status, rc, stdout); every call kept."""

    def __init__(self, answers: dict[int, tuple]) -> None:
        self.answers, self.calls = answers, []

    def __call__(self, argv, timeout, env=None, stdin=None) -> CommandResult:
        self.calls.append((tuple(argv), timeout))
        status, rc, out = self.answers[int(argv[-1])]
        return reply(
            argv, status, rc, stdout=out, duration_s=timeout if status == "timeout" else 0.1
        )


def test_reset_off_does_nothing(tmp_path):
    runner = ResetRunner({})
    assert repair.reset_gpus([0], config(tmp_path, gpu_reset=False), runner=runner, node=NODE) == []
    assert runner.calls == [] and repair.reset_recorded(NODE, config(tmp_path)) is None


def test_a_reset_is_run_per_gpu_and_recorded(tmp_path):
    cfg = config(tmp_path)
    runner = ResetRunner(
        {2: ("ok", 0, "GPU 00000000:3B:00.0 was successfully reset.\n"), 5: ("ok", 0, "")}
    )
    lines = repair.reset_gpus([2, 5], cfg, runner=runner, node=NODE)
    assert runner.calls == [
        (("nvidia-smi", "-r", "-i", "2"), 7.0),
        (("nvidia-smi", "-r", "-i", "5"), 7.0),
    ]
    assert lines[0] == "GPU 2: reset (nvidia-smi -r): GPU 00000000:3B:00.0 was successfully reset."
    assert lines[1] == "GPU 5: reset (nvidia-smi -r)"
    when = repair.reset_recorded(NODE, cfg)
    assert when is not None and abs(when - time.time()) < 60
    assert repair.reset_recorded("gpu-node-99", cfg) is None
    data = json.loads((tmp_path / "state" / "repairs.json").read_text())
    assert data["reset"][NODE]["gpus"] == [2, 5]
    # Audited as a repair: a later lift of this drain is not counted as a false drain.
    [audit] = [json.loads(x) for x in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert (audit["node"], audit["repair"], audit["resumed"]) == (NODE, "gpu reset", False)
    [line] = ledger.entries(str(tmp_path / "state"), NODE)  # the ladder's step, by the hook
    assert (line.step, line.who) == ("reset", "gpugate health") and audit["who"] == line.who


def test_nvidia_smi_missing_refusing_or_timing_out_is_reported(tmp_path):
    cfg = config(tmp_path)
    busy = "Unable to reset GPU 00000000:18:00.0 because it's being used by some other process"
    runner = ResetRunner(
        {0: ("missing", None, ""), 1: ("nonzero", 255, busy), 2: ("timeout", None, "")}
    )
    lines = repair.reset_gpus([0, 1, 2], cfg, runner=runner, node=NODE)
    assert lines[0] == "GPU 0: not reset: nvidia-smi is not installed"
    assert (
        lines[1].startswith("GPU 1: not reset: nvidia-smi -r -i 1: exit 255") and busy in lines[1]
    )
    assert lines[2] == "GPU 2: not reset: nvidia-smi -r timed out after 7 s"
    assert repair.reset_recorded(NODE, cfg) is None  # nothing was reset: no repair evidence
    assert not (tmp_path / "state" / "audit.jsonl").exists()


def test_a_bad_index_is_reported_and_not_run(tmp_path):
    runner = ResetRunner({})
    lines = repair.reset_gpus(["0; reboot", -1, True], config(tmp_path), runner=runner, node=NODE)
    assert runner.calls == [] and all("not a GPU index" in line for line in lines)


def test_the_real_runner_reports_a_missing_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("gpugate.runner.SAFE_PATH", str(tmp_path))
    [line] = repair.reset_gpus([0], config(tmp_path), node=NODE)
    assert line == "GPU 0: not reset: nvidia-smi is not installed"


def test_an_unreadable_record_is_no_evidence(tmp_path):
    cfg = config(tmp_path)
    os.makedirs(cfg.state_dir)
    bad_time = json.dumps({"reset": {NODE: {"at": "yesterday"}}})
    for text in ("[[[", bad_time, '{"reset": []}', "[]"):
        (tmp_path / "state" / "repairs.json").write_text(text)
        assert repair.reset_recorded(NODE, cfg) is None

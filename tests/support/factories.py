"""Test factories for facts: `make_gpu(ecc_aggregate_uncorrected=120)`, `make_facts(...)`.

Defaults describe one healthy H100 SXM GPU / node, so a test changes only what it is about.
"""

from __future__ import annotations

from gpugate.act.execute import Hands, execute
from gpugate.act.plans import budget_drain
from gpugate.checks.facts import Facts, Gpu, IbPort, Limits, Memory, Mount, Pcie, RemappedRows
from gpugate.checks.run import run_checks
from gpugate.config import load_config
from gpugate.slurm.reasons import drain_reason
from gpugate.store.view_records import ControllerRecord


def make_gpu(index: int = 0, **changes: object) -> Gpu:
    """A healthy idle H100 80GB HBM3 with `changes` applied."""
    values: dict = {
        "index": index,
        "uuid": f"GPU-0000-{index:04d}",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{0x18 + index * 0x10:02X}:00.0",
        "serial": f"1652123{index:06d}",
        "temperature_c": 35.0,
        "power_draw_w": 72.0,
        "power_limit_w": 700.0,
        "throttle_reasons": ("gpu_idle",),
        "ecc_mode_enabled": True,
        "ecc_volatile_uncorrected": 0,
        "ecc_volatile_corrected": 0,
        "ecc_aggregate_uncorrected": 0,
        "ecc_aggregate_corrected": 0,
        "retired_pages_pending": None,
        "remapped_rows": RemappedRows(corrected=0, uncorrected=0, pending=False, failure=False),
        "pcie": Pcie(gen=1, max_gen=5, width=16, max_width=16, replay_errors=0),
        "nvlink_active": (True,) * 18,
        "nvlink_errors": {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0},
        "memory_used_mib": 0,
        "memory_total_mib": 81559,
        "processes": (),
        "persistence_mode": True,
        "fabric_state": "completed",
        "fabric_status": "success",
        "recovery_action": "none",
    }
    values.update(changes)
    return Gpu(**values)


def make_ib(i: int = 0, **changes: object) -> IbPort:
    """A healthy NDR InfiniBand port."""
    values: dict = {
        "device": f"mlx5_{i}",
        "port": 1,
        "state": "ACTIVE",
        "phys_state": "LinkUp",
        "rate_gbps": 400.0,
        "link_layer": "InfiniBand",
        "counters": {"symbol_error": 0, "link_downed": 0, "link_error_recovery": 0},
    }
    values.update(changes)
    return IbPort(**values)


def make_facts(gpus: object = None, **changes: object) -> Facts:
    """A healthy 8-GPU H100 node; `gpus={3: {"temperature_c": 91}}` changes single GPUs."""
    gpu_list = [make_gpu(i) for i in range(8)]
    if isinstance(gpus, dict):
        for index, gpu_changes in gpus.items():
            gpu_list[index] = make_gpu(index, **gpu_changes)
    elif gpus is not None:
        gpu_list = list(gpus)
    values: dict = {
        "node": "gpu-node-01",
        "collected_at": "2026-11-29T10:00:00Z",
        "driver_version": "550.54.15",
        "cuda_driver_version": "12.4",
        "gpus": tuple(gpu_list),
        "pci_gpu_count": 8,
        "infiniband": tuple(make_ib(i) for i in range(8)),
        "kernel_log": (),
        "kernel_modules": ("nvidia", "nvidia_uvm", "nvidia_peermem", "mlx5_core", "mlx5_ib"),
        "limits": Limits(nofile_soft=1048576, nofile_hard=1048576),
        "memory": Memory(
            total_mib=2063500, available_mib=1900000, swap_total_mib=0, swap_used_mib=0
        ),
        "mounts": (Mount(path="/checkpoints", mounted=True, writable=True, fsync_ms=3.0),),
        "source_errors": {},
    }
    values.update(changes)
    return Facts(**values)


def default_config(**overrides: object):
    """The packaged defaults (no site file)."""
    return load_config("/dev/null")


def findings_of(check_id: str, facts: Facts, config: object = None) -> list:
    """Run one check id over `facts` with the packaged defaults (or `config`)."""
    return run_checks(facts, config or default_config(), only=[check_id])


def statuses(findings: list) -> list[str]:
    """The statuses of findings, in order."""
    return [f.status for f in findings]


def site(tmp_path, text: str):
    """The packaged defaults under a site file holding `text`."""
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return load_config(str(path))


def only(check_id: str, facts: Facts, config: object = None):
    """The single finding `check_id` gives for `facts`."""
    found = findings_of(check_id, facts, config)
    assert len(found) == 1, found
    return found[0]


def this_boot(config, root, boot: str):
    """`config` reading a /proc under `root` (a pathlib.Path) whose boot_id is `boot`: the
    kernel-log reader's root, passed in as on a real node."""
    random = root / "proc" / "sys" / "kernel" / "random"
    random.mkdir(parents=True, exist_ok=True)
    (random / "boot_id").write_text(f"{boot}\n")
    return config.replace(sources=config.sources.replace(proc_root=str(root / "proc")))


def run_command(argv: list[str], **fakes: object) -> int:
    """`gpugate ARGV` as the CLI runs it (cli.run_guarded: its exit codes, its one-line errors),
    with `fakes` passed to the command's main (`make_slurm=...`) instead of patched in."""
    from functools import partial

    from gpugate.cli import COMMANDS, run_guarded
    from gpugate.startup import import_module

    module = import_module(f"gpugate.commands.{COMMANDS[argv[0]][0]}")
    return run_guarded(partial(module.main, **fakes), argv[1:], argv[0])


def view(record: dict | ControllerRecord) -> ControllerRecord:
    """A node's decision record as the controller reads it from its JSON (`state` done unless
    the dict says otherwise): tests write the file's shape, the code gets the record."""
    if isinstance(record, ControllerRecord):
        return record
    return ControllerRecord.from_json({"state": "done", **record})


def views(records: list) -> list[ControllerRecord]:
    """view() of each."""
    return [view(r) for r in records]


def make_bundle(job: str = "77", node: str = "n1", restart: int = 0, **changes: object):
    """A bundle of the report's window (admin/losses.Bundle): a job's run, `<job>/<node>-r<n>`."""
    from gpugate.admin.losses import Bundle

    fields: dict = {"path": f"{job}/{node}-r{restart}", "kind": "job", **changes}
    return Bundle(job=job, node=node, restart=restart, **fields)


def make_decision(when: float, **extra: object):
    """EpilogSlurmctld's decision at `when` (admin/losses.Requeue): its line's keys, `job` first."""
    from gpugate.admin.losses import REQUEUE_HOOK, decision
    from gpugate.clock import utc
    from gpugate.log import Event

    found = decision(Event(time=utc(when), hook=REQUEUE_HOOK, extra=extra), when)
    assert found is not None, extra
    return found


def drain_node(slurm, node: str, check: str, detail: str, config):
    """What a hook does to drain `node` for `check` within the budget: the plan
    (act.plans.budget_drain: drain, undo beyond the budget, say and record a held drain)
    carried out by the executor; the drain's outcome."""
    plan = budget_drain(node, check, drain_reason(check, detail))
    return execute(plan, Hands(config, slurm)).drain

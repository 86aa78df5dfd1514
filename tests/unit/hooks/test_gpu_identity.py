"""A job's GPUs told by device, not by index (issue 44): after gpugate takes /dev/nvidia3 out of
gres.conf, Slurm's GPU index 3 (SLURM_JOB_GPUS=3) is /dev/nvidia4, NVML's GPU with minor 4.

The red team's case on 22.05: a job's own uncorrectable ECC on the GPU behind its Slurm index 3
was filed under faults outside the job, and the job was not requeued."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from epilog_setup import env as epilog_env
from epilog_setup import setup as epilog_setup
from epilog_setup import slurm_with_job, snapshot
from factories import default_config, make_facts
from fakes import FakeSlurm, SharedSlurm
from health_setup import OTHERS
from health_setup import setup as health_setup
from isolated_node import NODE, facts_with_minors, gres_conf, isolated
from prolog_setup import env, setup

from gpugate.checks.findings import fail
from gpugate.gate import allocation
from gpugate.gate.allocation import JobGpus, slurm_minors, split_by_job
from gpugate.hooks.epilog import run_epilog
from gpugate.hooks.health import run_health
from gpugate.hooks.prolog import concerns_job, run_prolog
from gpugate.slurm.records import NodeInfo
from gpugate.store import app_xids

ECC = {"ecc_volatile_uncorrected": 2}


def ecc(gpu: int):
    return fail("gpu.ecc", f"GPU{gpu} volatile uncorrectable ECC 2 (limit 0)", gpu=gpu)


@pytest.fixture
def seven(tmp_path):
    """The isolated node: 7 GPUs in gres.conf (nvidia0-2,4-7), GPU3 out, the record applied."""
    return isolated(default_config().replace(state_dir=str(tmp_path / "state")), tmp_path)


def test_slurm_indices_are_places_in_gres_confs_list():
    files = tuple(f"/dev/nvidia{i}" for i in (0, 1, 2, 4, 5, 6, 7))
    assert slurm_minors(files, (3,)) == {4}
    assert slurm_minors(files, (0, 6)) == {0, 7}
    assert slurm_minors(files, (7,)) is None  # no 8th file: unknown, never guessed
    assert slurm_minors(("/dev/gpu-a",), (0,)) is None  # not /dev/nvidia<minor>


def test_on_the_isolated_node_slurm_index_3_is_the_gpu_with_minor_4(seven):
    held = JobGpus(seven, NODE, (3,), facts_with_minors().gpus)
    assert held.holds(4) and not held.holds(3) and not held.holds(5)
    assert held.holds(None)  # node-wide: everyone's
    assert concerns_job(ecc(4), held) and not concerns_job(ecc(3), held)
    mine, elsewhere = split_by_job([ecc(4), ecc(3), ecc(6)], held)
    assert [f.gpu for f in mine] == [4] and [f.gpu for f in elsewhere] == [3, 6]


def test_minors_not_nvml_indices_decide(seven):
    # A board whose NVML order differs from its minors: NVML's GPU 2 is /dev/nvidia4.
    gpus = facts_with_minors().gpus
    swapped = tuple(g.replace(minor_number={2: 4, 4: 2}.get(g.index, g.index)) for g in gpus)
    held = JobGpus(seven, NODE, (3,), swapped)  # Slurm's 3: /dev/nvidia4
    assert held.holds(2) and not held.holds(4)


def test_a_gpu_whose_minor_is_unknown_counts_as_the_jobs(seven):
    gpus = tuple(g.replace(minor_number=None) if g.index == 6 else g
                 for g in facts_with_minors().gpus)  # fmt: skip
    held = JobGpus(seven, NODE, (3,), gpus)
    assert held.holds(6) and not held.holds(5)


def test_an_unreadable_gres_conf_on_an_isolated_node_counts_every_gpu(seven, capsys):
    (Path(seven.isolate.slurm_conf).parent / "gres.conf").unlink()
    held = JobGpus(seven, NODE, (3,), facts_with_minors().gpus)
    assert all(held.holds(i) for i in range(8))
    assert "cannot read Slurm's GPU order from gres.conf" in capsys.readouterr().err


def test_a_gpu_put_back_last_is_slurms_last_index(tmp_path):
    # A gres.conf out of device order with no isolation record left (put back by an earlier
    # gpugate, whose line followed the node's others, or edited so): Slurm's order is
    # nvidia0-2,4-7,3, and a site that isolates reads gres.conf even then.
    text = gres_conf("/dev/nvidia[0-2,4-7]") + f"NodeName={NODE} Name=gpu File=/dev/nvidia3\n"
    config = default_config().replace(state_dir=str(tmp_path / "state"))
    config = isolated(config, tmp_path, unit="gpu", gres=text, count=8, record=False)
    held = JobGpus(config, NODE, (3, 7), facts_with_minors().gpus)
    assert held.nvml() == {3, 4}  # NVML indices of minors 4 and 3
    assert held.holds(3) and held.holds(4) and not held.holds(7)


def test_a_node_never_isolated_reads_slurms_index_as_nvmls_without_a_file(tmp_path, monkeypatch):
    def no_read(*_):
        raise AssertionError("gres.conf read on a node gpugate never changed")

    monkeypatch.setattr(allocation, "gres_gpu_files", no_read)
    config = default_config().replace(state_dir=str(tmp_path / "state"))
    assert config.isolate is None or config.isolate.unit != "gpu"
    held = JobGpus(config, NODE, (3,), make_facts().gpus)  # facts without minors: as before
    assert held.holds(3) and not held.holds(4)
    assert JobGpus(config, NODE, None, make_facts().gpus).holds(4)  # the job's GPUs unknown


# ------------------------------------------------------------------- through the hooks


def test_prolog_refuses_the_job_for_an_ecc_fault_behind_its_slurm_index(tmp_path):
    config = isolated(setup(tmp_path, facts_with_minors({4: ECC})), tmp_path)
    slurm = FakeSlurm()
    result = run_prolog(config, env(gpus=(3,)), slurm)  # SLURM_JOB_GPUS=3: /dev/nvidia4
    assert result.reason.startswith("gpugate: gpu.ecc: GPU4 ")
    assert (result.exit_code, result.refused, result.drained) == (1, True, True)


def test_prolog_lets_the_job_start_beside_a_fault_on_another_device(tmp_path):
    config = isolated(setup(tmp_path, facts_with_minors({5: ECC})), tmp_path)
    result = run_prolog(config, env(gpus=(3,)), FakeSlurm())  # GPU5 is Slurm's index 4
    assert (result.exit_code, result.refused, result.drained) == (0, False, True)


@pytest.mark.parametrize(("broken", "refused"), [(3, True), (4, False)])
def test_prolog_on_a_node_never_isolated_is_unchanged(tmp_path, broken, refused):
    config = setup(tmp_path, facts_with_minors({broken: ECC}))
    assert run_prolog(config, env(gpus=(3,)), FakeSlurm()).refused is refused


def summary(result) -> dict:
    with open(f"{result.bundle}/summary.json") as fh:
        return json.load(fh)


def epilog_on_isolated_node(tmp_path, broken_gpu: int):
    """Job 77 holds Slurm's GPU 3 (/dev/nvidia4); an uncorrectable ECC appears on NVML's GPU
    `broken_gpu` (minor = index) while it runs; it ends with exit code 1."""
    config = isolated(epilog_setup(tmp_path), tmp_path)
    snapshot(tmp_path, facts_with_minors())
    out = tmp_path / "job.out"
    out.write_text("")
    slurm = slurm_with_job(str(out))
    assert run_prolog(config, epilog_env(gpus=(3,)), slurm).exit_code == 0
    out.write_text("RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    snapshot(tmp_path, facts_with_minors({broken_gpu: {"ecc_volatile_uncorrected": 3}}))
    return run_epilog(config, epilog_env(gpus=(3,)), slurm)


def test_epilog_files_the_jobs_own_ecc_fault_as_its_hardware_fault(tmp_path):
    result = epilog_on_isolated_node(tmp_path, broken_gpu=4)
    s = summary(result)
    assert result.hardware_fault and s["hardware_fault"] is True
    assert s["faults_outside_job"] == []
    assert result.drained


def test_epilog_files_an_ecc_fault_on_another_device_outside_the_job(tmp_path):
    result = epilog_on_isolated_node(tmp_path, broken_gpu=5)
    s = summary(result)
    assert not result.hardware_fault and s["hardware_fault"] is False
    assert any("GPU5" in m for m in s["faults_outside_job"])


# A node shared by two jobs after the isolation: job A holds Slurm's GPU 4 (/dev/nvidia5), this
# job Slurm's GPU 3 (/dev/nvidia4); Slurm's GresUsed names both by index (issue 41's judgement).
BOTH = "gpu:h100:2(IDX:3-4)"
A_PROC = {"processes": ({"pid": 4242, "name": "python", "used_memory_mib": 30000},),
          "memory_used_mib": 30000}  # fmt: skip


def test_another_jobs_process_behind_its_slurm_index_does_not_drain(tmp_path):
    config = isolated(setup(tmp_path, facts_with_minors({5: A_PROC})), tmp_path)
    slurm = SharedSlurm(BOTH)
    result = run_prolog(config, env(gpus=(3,)), slurm)
    assert (result.exit_code, result.drained) == (0, False), result


def test_a_leftover_on_the_jobs_own_device_refuses_it_without_asking_slurm(tmp_path):
    config = isolated(setup(tmp_path, facts_with_minors({4: A_PROC})), tmp_path)
    slurm = SharedSlurm(BOTH)
    result = run_prolog(config, env(gpus=(3,)), slurm)
    assert (result.exit_code, result.refused, result.drained) == (1, True, True)
    assert slurm.scontrols == []  # Slurm gave /dev/nvidia4 to this job alone


class OneJob(FakeSlurm):
    """The isolated node running one job on Slurm's GPU 3 (/dev/nvidia4)."""

    def scontrol(self, *args: str) -> str:
        return f"NodeName={NODE} Gres=gpu:7 GresUsed=gpu:h100:1(IDX:3) State=MIXED"


@pytest.mark.parametrize(("hot", "drained"), [(4, False), (3, False), (5, True)])
def test_health_sets_aside_the_load_of_the_gpu_behind_a_jobs_slurm_index(tmp_path, hot, drained):
    config = isolated(health_setup(tmp_path, facts_with_minors({hot: {"temperature_c": 95.0}})),
                      tmp_path)  # fmt: skip
    slurm = OneJob([NodeInfo(name=NODE, state="MIXED", partitions=("gpu",)), *OTHERS])
    result = run_health(config, NODE, slurm)
    assert bool(slurm.drains) is drained, result  # GPU3 is isolated: its heat is only a warning


def test_the_jobs_application_xids_are_those_on_its_device(seven):
    def xid31(pci: str) -> str:
        return (f"[Sun Nov 29 10:00:01 2026] NVRM: Xid (PCI:{pci}): 31, pid=1234, name=python, "
                "channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2")  # fmt: skip

    facts = facts_with_minors()  # GPU4 (/dev/nvidia4) is 0000:58:00, GPU3 0000:48:00
    lines = [xid31("0000:48:00"), xid31("0000:58:00")]
    held = JobGpus(seven, NODE, (3,), facts.gpus)
    events = app_xids.job_events(lines, epilog_env(gpus=(3,)), facts, 1.0, held.holds)
    assert [e.gpu for e in events] == ["0000:58:00"]

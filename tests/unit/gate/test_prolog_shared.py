"""A node shared by two jobs (issue 41, R6): the prolog judges only what is this job's or no one's.

Job A runs on GPUs 0-3 with its CUDA context open; job B's prolog runs for GPUs 4-7. Slurm is
faked at the adapter: `scontrol -d -o show node` answers with the node's GresUsed (B's own GPUs
included, as Slurm allocates them before the prolog runs).
"""

from __future__ import annotations

from factories import make_facts
from fakes import SharedSlurm
from prolog_setup import env, setup

from gpugate.checks import findings as F
from gpugate.checks.facts import Memory
from gpugate.gate.shared import job_gpus, judge_shared
from gpugate.hooks.prolog import run_prolog
from gpugate.slurm.control import SlurmError

A_RUNS = "gpu:h100:8(IDX:0-7)"  # A on 0-3, B (this prolog's job) on 4-7
A_PROC = {"processes": ({"pid": 4242, "name": "python", "used_memory_mib": 30000},),
          "memory_used_mib": 30000}  # fmt: skip
JOB_B = (4, 5, 6, 7)


def test_another_jobs_process_does_not_drain_the_node(tmp_path):
    """The R6 drain: `gpu.processes: GPU0 has 1 leftover process(es)` for job A's own process."""
    slurm = SharedSlurm(A_RUNS)
    facts = make_facts(gpus={0: A_PROC, 1: A_PROC, 2: {"temperature_c": 95.0},
                             3: {"throttle_reasons": ("hw_thermal_slowdown",)}})  # fmt: skip
    result = run_prolog(setup(tmp_path, facts), env(gpus=JOB_B), slurm)
    assert (result.exit_code, result.action, result.drained) == (0, "allow", False), result
    assert slurm.drains == [] and slurm.node_comments == []
    assert slurm.scontrols == [("-d", "-o", "show", "node", "gpu-node-01")]  # one call


def test_a_leftover_on_a_gpu_no_job_holds_still_drains(tmp_path):
    """A on GPUs 0-1 only: a process on GPU 2 is nobody's job, a real leftover."""
    slurm = SharedSlurm("gpu:h100:6(IDX:0-1,4-7)")
    facts = make_facts(gpus={0: A_PROC, 2: A_PROC})
    result = run_prolog(setup(tmp_path, facts), env(gpus=JOB_B), slurm)
    assert result.drained and result.reason.startswith("gpugate: gpu.processes: GPU2 ")
    assert (result.exit_code, result.refused) == (0, False)  # not B's GPU: B starts


def test_a_leftover_on_the_jobs_own_gpu_drains_without_asking_slurm(tmp_path):
    slurm = SharedSlurm(A_RUNS)
    result = run_prolog(setup(tmp_path, make_facts(gpus={5: A_PROC})), env(gpus=JOB_B), slurm)
    assert (result.exit_code, result.refused, result.drained) == (1, True, True)
    assert slurm.scontrols == []  # Slurm gave GPU 5 to this job alone: nothing to ask


def test_a_healthy_prolog_asks_slurm_nothing(tmp_path):
    slurm = SharedSlurm(A_RUNS)
    result = run_prolog(setup(tmp_path, make_facts()), env(gpus=JOB_B), slurm)
    assert result.action == "allow" and slurm.scontrols == []


def test_unknown_allocation_is_reported_not_passed_nor_drained(tmp_path):
    slurm = SharedSlurm(None)  # the controller does not answer
    result = run_prolog(setup(tmp_path, make_facts(gpus={0: A_PROC})), env(gpus=JOB_B), slurm)
    assert (result.exit_code, result.drained, result.status) == (0, False, "warn")
    assert "GPU0: not judged: which GPUs other jobs hold is unknown" in result.message
    assert "leftover process" in result.message  # what was seen stays in the report


def test_host_memory_with_another_job_on_the_node_is_reported_not_drained(tmp_path):
    slurm = SharedSlurm(A_RUNS)
    result = run_prolog(setup(tmp_path, make_facts(memory=LOW)), env(gpus=JOB_B), slurm)
    assert (result.exit_code, result.drained, result.status) == (0, False, "warn")
    assert "host.memory: reported, not drained: another job runs on the node" in result.message


LOW = Memory(total_mib=2063500, available_mib=4000, swap_total_mib=0, swap_used_mib=0)


def test_host_memory_with_no_other_job_is_judged(tmp_path):
    slurm = SharedSlurm("gpu:h100:4(IDX:4-7)")  # only this job's GPUs, only this job
    result = run_prolog(setup(tmp_path, make_facts(memory=LOW)), env(gpus=JOB_B), slurm)
    assert result.drained and result.reason.startswith("gpugate: host.memory: ")
    assert slurm.calls[0][:4] == ("squeue", "-h", "-w", "gpu-node-01")


def test_host_memory_beside_a_cpu_only_job_is_reported_not_drained(tmp_path):
    """Job 41 holds no GPU but uses the host's memory: the low figure may be its load."""
    slurm = SharedSlurm("gpu:h100:4(IDX:4-7)", jobs=("41", "42"))
    result = run_prolog(setup(tmp_path, make_facts(memory=LOW)), env(gpus=JOB_B), slurm)
    assert (result.exit_code, result.drained, result.status) == (0, False, "warn")
    assert "host.memory: reported, not drained: another job runs on the node" in result.message


def test_host_memory_when_the_jobs_cannot_be_listed_is_reported(tmp_path):
    slurm = SharedSlurm("gpu:h100:4(IDX:4-7)", jobs=None)
    result = run_prolog(setup(tmp_path, make_facts(memory=LOW)), env(gpus=JOB_B), slurm)
    assert (result.drained, result.status) == (False, "warn")
    assert "host.memory: reported, not drained: other jobs may run on the node" in result.message


def test_judge_shared_keeps_the_jobs_own_gpus_and_free_ones():
    from factories import default_config

    found = [
        F.fail("gpu.processes", "GPU0 has 1 leftover process(es)", gpu=0),
        F.fail("gpu.processes", "GPU2 has 1 leftover process(es)", gpu=2),
        F.fail("gpu.temperature", "GPU5 temperature 95C >= 90C", gpu=5),
        F.fail("gpu.ecc", "GPU1 aggregate uncorrected ECC 120 > 100", gpu=1),
    ]
    out = judge_shared(found, (4, 5), default_config().policy, lambda: frozenset({0, 1, 4, 5}))
    assert [f.status for f in out] == ["ok", "fail", "fail", "fail"]  # ECC is nobody's load


def test_job_gpus_from_scontrol_show_job_detail():
    text = ("JobId=7 JobState=RUNNING NodeList=n[1-2] Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)"
            " Nodes=n2 CPU_IDs=0-1 Mem=0 GRES=gpu:1(IDX:5) TRES=cpu=1")  # fmt: skip
    assert job_gpus(text, "n2") == {5}
    assert job_gpus(text, "n1") == {0, 1}
    assert job_gpus("JobId=8 Nodes=n1 CPU_IDs=0 Mem=0 GRES= TRES=cpu=1", "n1") == frozenset()
    assert job_gpus("JobId=9 JobState=RUNNING", "n1") is None  # no detail: unknown


class UntypedSlurm(SharedSlurm):
    """Slurm 22.05 with untyped GPUs: the node's GresUsed has no indices, each job's detail has."""

    def __init__(self, jobs: dict[str, str | None]) -> None:
        super().__init__("gpu:4")
        self.jobs_gres = jobs

    def call(self, *argv: str) -> str:
        assert argv[:4] == ("squeue", "-h", "-w", "gpu-node-01"), argv
        return "\n".join(self.jobs_gres) + "\n"

    def scontrol(self, *args: str) -> str:
        if args[:4] == ("-d", "-o", "show", "job"):
            gres = self.jobs_gres[args[4]]
            if gres is None:
                raise SlurmError(f"slurm_load_jobs error: Invalid job id specified {args[4]}")
            return f"JobId={args[4]} Nodes=gpu-node-01 CPU_IDs=0 Mem=0 GRES={gres} TRES=cpu=1"
        return super().scontrol(*args)


def test_untyped_gpus_are_learned_job_by_job(tmp_path):
    slurm = UntypedSlurm({"41": "gpu:2(IDX:0-1)", "42": "gpu:2(IDX:4-5)"})
    facts = make_facts(gpus={0: A_PROC, 2: A_PROC})
    result = run_prolog(setup(tmp_path, facts), env(gpus=(4, 5)), slurm)
    assert result.drained and result.reason.startswith("gpugate: gpu.processes: GPU2 ")
    assert "(+" not in result.reason  # GPU 0 is job 41's: set aside


def test_a_job_that_ended_between_the_calls_makes_it_unknown(tmp_path):
    slurm = UntypedSlurm({"41": None, "42": "gpu:2(IDX:4-5)"})
    result = run_prolog(setup(tmp_path, make_facts(gpus={0: A_PROC})), env(gpus=(4, 5)), slurm)
    assert (result.drained, result.status) == (False, "warn")

"""The epilog: bundles after abnormal ends, the cause named, hardware drains, users' files safe."""

from __future__ import annotations

import json
import os
import stat

from factories import default_config, make_facts
from fakes import FakeSlurm

from gpugate.slurm_hooks.epilog import abnormal_end, run_epilog
from gpugate.slurm_hooks.hookenv import HookEnv
from gpugate.slurm_hooks.prolog import run_prolog
from gpugate.slurm_hooks.slurm.records import JobInfo
from gpugate.yamlio import dump_yaml

XID79 = "[Sun Nov 29 11:02:03 2026] NVRM: Xid (PCI:0000:58:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
NCCL_TIMEOUT = (
    "[rank3]:[E1129 11:00:01.1 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600061 milliseconds before timing out.\n"
)
CUDA_OOM = (
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 1 has a total "
    "capacity of 79.10 GiB of which 12.73 GiB is free.\n"
)


def job_77(stdout: str, job_id: str = "77") -> JobInfo:
    """Job 77 (or `job_id`) of alice as Slurm reports it, its output in `stdout`."""
    return JobInfo(job_id=int(job_id), user="alice", uid=os.getuid(), state="FAILED", reason="",
                   nodes=("gpu-node-01",), batch_host="gpu-node-01", stdout=stdout,
                   stderr=stdout, work_dir="/", exit_code=1, exit_signal=0, restarts=0,
                   comment="", admin_comment="", excluded_nodes=(), requeue=True, partition="gpu")  # fmt: skip


def slurm_with_job(stdout: str, job_id: str = "77") -> FakeSlurm:
    """The one node, in service, and job 77 (or `job_id`)."""
    return FakeSlurm(jobs=[job_77(stdout, job_id)])


def setup(tmp_path, **epilog):
    config = default_config()
    return config.replace(
        facts_file=str(tmp_path / "{node}.yaml"),
        state_dir=str(tmp_path / "state"),
        evidence_dir=str(tmp_path / "evidence"),
        epilog=config.epilog.replace(**epilog),
        task_prolog=config.task_prolog.replace(nccl_debug_dir=None),
        budget=config.budget.replace(settle_s=0),
    )


def snapshot(tmp_path, facts) -> None:
    (tmp_path / "gpu-node-01.yaml").write_text(dump_yaml(facts.to_dict()))


def env(**changes) -> HookEnv:
    values = {"node": "gpu-node-01", "job_id": "77", "uid": os.getuid(), "gid": os.getgid(), "user": "alice",
              "exit_code": 256, "exit_code2": "1:0", "derived_ec": 0}  # fmt: skip
    values.update(changes)
    return HookEnv(**values)


def job_run(tmp_path, log_text: str, after=None, **env_changes):
    """Prolog on a healthy node, the job writes its log, the node changes, then the epilog."""
    config = setup(tmp_path)
    snapshot(tmp_path, make_facts())
    assert run_prolog(config, env(), slurm_with_job("")).exit_code == 0
    out = tmp_path / "job.out"
    out.write_text(log_text)
    snapshot(tmp_path, after or make_facts())
    slurm = slurm_with_job(str(out))
    return run_epilog(config, env(**env_changes), slurm), slurm, config


def member(result, name: str) -> str:
    with open(os.path.join(result.bundle, name)) as fh:
        return fh.read()


def summary(result) -> dict:
    return json.loads(member(result, "summary.json"))


def test_normal_end_leaves_no_bundle_and_no_baseline(tmp_path):
    result, slurm, config = job_run(tmp_path, "done\n", exit_code=0, exit_code2="0:0")
    assert not result.abnormal and result.bundle is None and slurm.drains == []
    assert not os.path.exists(os.path.join(config.state_dir, "jobs", "77"))


def test_nccl_timeout_gets_a_bundle_and_no_drain(tmp_path):
    result, slurm, _ = job_run(tmp_path, "step 10\n" + NCCL_TIMEOUT)
    assert result.abnormal and result.category == "nccl_timeout" and slurm.drains == []
    s = summary(result)
    assert (
        s["category"] == "nccl_timeout" and s["action"] == "none" and s["hardware_fault"] is False
    )
    assert {
        "summary.json",
        "kernel.log",
        "counters.json",
        "snapshot.yaml",
        "diagnosis.json",
    } <= set(s["files"])
    assert any(name.startswith("logs/") for name in s["files"])


def test_hardware_xid_after_the_prolog_drains_with_the_bundle_in_the_reason(tmp_path):
    broken = make_facts(kernel_log=(XID79,))
    result, slurm, _ = job_run(tmp_path, NCCL_TIMEOUT, after=broken, exit_code=9, exit_code2="0:9")
    assert result.hardware_fault and result.drained
    node, reason = slurm.drains[0]
    assert node == "gpu-node-01"
    assert reason.startswith(
        "gpugate: kernel.xid: evidence 77/gpu-node-01-r0: GPU4 (serial 1652123000004, 0000:58:00) Xid 79"
    )
    assert result.category == "gpu_xid_hardware" and result.xid == 79
    s = summary(result)
    assert s["suspected_node"] == "gpu-node-01" and s["action"] == "drained"
    assert XID79 in member(result, "kernel.log")


def test_ecc_counters_growing_during_the_job_drain(tmp_path):
    broken = make_facts(gpus={2: {"ecc_volatile_uncorrected": 3}})
    result, slurm, _ = job_run(
        tmp_path, "RuntimeError: CUDA error: uncorrectable ECC error encountered\n", after=broken
    )
    assert result.drained and slurm.drains[0][1].startswith(
        "gpugate: gpu.ecc: evidence 77/gpu-node-01-r0: GPU2"
    )
    changes = summary(result)["counter_changes"]
    assert any(line.startswith("GPU2: ecc_volatile_uncorrected +3") for line in changes)


def test_users_own_oom_leaves_the_node_in_service(tmp_path):
    result, slurm, _ = job_run(tmp_path, CUDA_OOM)
    assert result.category == "cuda_oom" and result.failing_rank == 1
    assert result.confidence == "high" and summary(result)["confidence"] == "high"
    assert slurm.drains == [] and not result.hardware_fault


def test_app_xid_alone_does_not_drain(tmp_path):
    xid13 = "[Sun Nov 29 11:02:03 2026] NVRM: Xid (PCI:0000:18:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 1, SM 1): Out Of Range Address"
    result, slurm, _ = job_run(tmp_path, "CUDA error: an illegal memory access was encountered\n",
                               after=make_facts(kernel_log=(xid13,)))  # fmt: skip
    assert slurm.drains == [] and not result.hardware_fault


def test_a_symlinked_stdout_is_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root's secret\n")
    config = setup(tmp_path)
    snapshot(tmp_path, make_facts())
    run_prolog(config, env(), slurm_with_job(""))
    link = tmp_path / "job.out"
    link.symlink_to(secret)
    result = run_epilog(config, env(), slurm_with_job(str(link)))
    s = summary(result)
    assert any("symlink" in e for e in s["read_errors"])
    assert all(
        "root's secret" not in member(result, f) for f in s["files"] if f.startswith("logs/")
    )


def test_bundle_is_for_admins_only(tmp_path):
    result, _, _ = job_run(tmp_path, NCCL_TIMEOUT)
    assert stat.S_IMODE(os.stat(result.bundle).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(os.path.join(result.bundle, "summary.json")).st_mode) == 0o640


def test_abnormal_end_from_the_epilog_environment():
    assert abnormal_end(env(exit_code=768, exit_code2="3:0")) == "exit code 3"
    assert abnormal_end(env(exit_code=9, exit_code2="0:9")) == "killed by signal 9"
    assert abnormal_end(env(exit_code=0, exit_code2="0:0", derived_ec=1792)) is not None
    assert abnormal_end(env(exit_code=0, exit_code2="0:0")) is None  # scancel looks like this
    assert abnormal_end(env(exit_code=4022, exit_code2="0:54")) is None  # prolog refused it (24.11)


def test_a_requeued_run_that_ended_well_is_not_judged_by_an_earlier_runs_steps():
    # Slurm keeps the derived exit code of run 0's failed steps after a requeue (issue 26).
    rerun = env(exit_code=0, exit_code2="0:0", derived_ec=256, restart_count=1)
    assert abnormal_end(rerun) is None
    # The first run's own failed step still counts; so does a rerun's own non-zero exit.
    assert abnormal_end(rerun.replace(restart_count=0)) == "a job step failed (derived exit code 1)"
    assert abnormal_end(rerun.replace(exit_code=768, exit_code2="3:0")) == "exit code 3"


def test_the_suspect_is_the_node_with_the_first_hardware_error():
    from gpugate.store.evidence import suspect_node

    summaries = [
        {"node": "n1", "hardware_fault": False, "category": "nccl_timeout"},
        {
            "node": "n3",
            "hardware_fault": True,
            "first_hardware_error_at": "2026-11-29T11:02:09.000000Z",
        },
        {
            "node": "n2",
            "hardware_fault": True,
            "first_hardware_error_at": "2026-11-29T11:02:03.500000Z",
        },
    ]
    assert suspect_node(summaries) == "n2"
    assert suspect_node(summaries[:1]) is None


def test_kernel_line_times_become_comparable_utc():
    from gpugate.checks.kerneltime import line_utc as kernel_line_time

    assert (
        kernel_line_time("[  100.250000] NVRM: Xid ...", boot_epoch=1_800_000_000.0)
        == "2027-01-15T08:01:40.250000Z"
    )
    assert kernel_line_time("[Sun Nov 29 11:02:03 2026] NVRM: Xid").startswith("2026-11-29T")
    assert kernel_line_time("no stamp") is None


def test_the_epilog_after_a_refused_prolog_collects_nothing(tmp_path):
    config = setup(tmp_path)
    snapshot(tmp_path, make_facts(gpus={3: {"error": "gpu_is_lost"}}))
    slurm = slurm_with_job("")
    assert run_prolog(config, env(), slurm).exit_code == 1
    result = run_epilog(config, env(exit_code=0, exit_code2="0:0"), slurm)
    assert result.bundle is None and "never ran" in result.why
    assert len(slurm.drains) == 1  # the prolog's; the epilog did not rewrite it
    assert not os.path.exists(os.path.join(config.state_dir, "jobs", "77"))


# --- what counts as evidence: root's kernel lines, never the job's own output ---------------

FAKE_XID79 = "[rank0]: NVRM: Xid (PCI:0000:58:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"


def test_a_fake_xid_79_in_stdout_is_reported_not_trusted(tmp_path):
    result, slurm, _ = job_run(tmp_path, NCCL_TIMEOUT + FAKE_XID79 * 5)
    assert slurm.drains == [] and not result.hardware_fault
    assert (result.category, result.xid) == ("nccl_timeout", None)
    s = summary(result)
    assert (s["category"], s["xid"], s["hardware_fault"]) == ("nccl_timeout", None, False)
    assert (s["category_source"], s["category_trusted"]) == ("job file", False)
    assert (s["job_output_category"], s["job_output_xid"]) == ("gpu_xid_hardware", 79)
    assert s["untrusted_claims"] == ["job output claiming Xid 79 (not trusted)"] * 5
    d = json.loads(member(result, "diagnosis.json"))
    assert {u["source"] for u in d["untrusted"]} == {"job file"}
    assert "Xid" not in member(result, "decisive.txt")


def test_root_s_kernel_line_is_the_trusted_verdict(tmp_path):
    broken = make_facts(kernel_log=(XID79,))
    result, _, _ = job_run(tmp_path, NCCL_TIMEOUT, after=broken, exit_code=9, exit_code2="0:9")
    s = summary(result)
    assert (s["category"], s["xid"], s["category_source"], s["category_trusted"]) == (
        "gpu_xid_hardware", 79, "kernel log", True)  # fmt: skip
    d = json.loads(member(result, "diagnosis.json"))
    assert d["evidence_locations"][0]["source"] == "kernel log"


# --- the bundle first, then the drain naming it ----------------------------------------------


class BundleWatchingSlurm(FakeSlurm):
    """Records, at drain time, which bundles exist."""

    def __init__(self, stdout: str, evidence_dir: str) -> None:
        super().__init__(jobs=[job_77(stdout)])
        self.evidence_dir = evidence_dir
        self.seen: list[bool] = []

    def _write_drain(self, node: str, reason: str) -> None:
        self.seen.append(os.path.isfile(os.path.join(self.evidence_dir, "77", "gpu-node-01-r0",
                                                     "summary.json")))  # fmt: skip
        super()._write_drain(node, reason)


def hardware_run(tmp_path, config):
    snapshot(tmp_path, make_facts())
    assert run_prolog(config, env(), slurm_with_job("")).exit_code == 0
    out = tmp_path / "job.out"
    out.write_text(NCCL_TIMEOUT)
    snapshot(tmp_path, make_facts(kernel_log=(XID79,)))
    slurm = BundleWatchingSlurm(str(out), config.evidence_dir)
    return run_epilog(config, env(exit_code=9, exit_code2="0:9"), slurm), slurm


def test_the_bundle_is_written_before_the_drain_and_records_its_outcome(tmp_path):
    result, slurm = hardware_run(tmp_path, setup(tmp_path))
    assert slurm.seen == [True] and result.drained
    s = summary(result)
    assert (s["action"], s["drain_reason"]) == ("drained", slurm.drains[0][1])
    assert "evidence 77/gpu-node-01-r0:" in s["drain_reason"]
    mode = stat.S_IMODE(os.stat(os.path.join(result.bundle, "summary.json")).st_mode)
    assert mode == 0o640


def test_a_drain_reason_names_no_bundle_that_was_not_written(tmp_path):
    config = setup(tmp_path)
    (tmp_path / "evidence").write_text("not a directory\n")  # the bundle cannot be written
    result, slurm = hardware_run(tmp_path, config)
    assert result.bundle is None and result.drained
    _, reason = slurm.drains[0]
    assert "evidence" not in reason and reason.startswith("gpugate: kernel.xid: GPU4")


def test_the_policy_keeps_a_hardware_fault_from_draining_where_the_site_says_so(tmp_path):
    no_drain = setup(tmp_path / "a", drain_on_hardware=False)
    report = setup(tmp_path / "b")
    report = report.replace(policy=report.policy.replace(report_only=True))
    for where, config in (("a", no_drain), ("b", report)):
        (tmp_path / where).mkdir()
        result, slurm = hardware_run(tmp_path / where, config)
        assert result.hardware_fault and result.hardware_checks == ("kernel.xid",)
        assert slurm.drains == [] and not result.drained


# --- each of the job's files within its own budget --------------------------------------------


def test_a_50_gb_sparse_nccl_file_does_not_cost_the_jobs_stdout(tmp_path):
    import time

    config = setup(tmp_path, read_timeout_s=5)
    config = config.replace(task_prolog=config.task_prolog.replace(
        nccl_debug_dir=str(tmp_path / "nccl")))  # fmt: skip
    snapshot(tmp_path, make_facts())
    assert run_prolog(config, env(), slurm_with_job("")).exit_code == 0
    nccl = tmp_path / "nccl" / "77"
    nccl.mkdir(parents=True, exist_ok=True)
    with open(nccl / "gpu-node-01.1234.nccl", "wb") as fh:
        fh.truncate(50 * 10**9)
    out = tmp_path / "job.out"
    out.write_text("step 1\n" + CUDA_OOM)
    started = time.monotonic()
    result = run_epilog(config, env(), slurm_with_job(str(out)))
    assert time.monotonic() - started < 5
    assert result.category == "cuda_oom"
    s = summary(result)
    tails = [f for f in s["files"] if f.startswith("logs/")]
    assert any("job.out" in f for f in tails)
    assert any(CUDA_OOM.strip() in member(result, f) for f in tails)
    d = json.loads(member(result, "diagnosis.json"))
    sparse = next(f for f in d["files"] if f["path"].endswith(".nccl"))
    assert sparse["bytes"] <= config.epilog.diagnose_max_mib * 1024 * 1024
    # Read from the tail: the capped window before the end (a slow disk may cut the read short
    # within the file's share of read_timeout_s, so the bytes can end before the file does).
    cap = config.epilog.diagnose_max_mib * 1024 * 1024
    assert sparse["offset"] >= 50 * 10**9 - cap
    assert sparse["offset"] + sparse["bytes"] <= 50 * 10**9

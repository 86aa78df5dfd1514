"""The epilog: bundles after abnormal ends, the cause named, hardware drains, users' files safe."""

from __future__ import annotations

import json
import os
import stat

import pytest
from epilog_setup import (
    NCCL_TIMEOUT,
    XID79,
    env,
    job_77,
    job_run,
    member,
    setup,
    slurm_with_job,
    snapshot,
)
from factories import default_config, make_facts, views
from fakes import FakeSlurm

from gpugate.hooks.epilog import abnormal_end, run_epilog
from gpugate.hooks.prolog import run_prolog
from gpugate.slurm.records import JobInfo
from gpugate.store.state import Baseline
from gpugate.store.summary import SummaryJob

CUDA_OOM = (
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 1 has a total "
    "capacity of 79.10 GiB of which 12.73 GiB is free.\n"
)


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
    assert result.gpu == "1652123000004"  # the part, for its RMA count (the history's `gpu`)
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
    # A one-node job: the failing rank ran here (issue 30: the bundle names the rank's node).
    assert result.failing_node == "gpu-node-01" and summary(result)["failing_node"] == "gpu-node-01"
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
    from gpugate.store.view_records import suspect_node

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
    assert suspect_node(views(summaries)) == "n2"
    assert suspect_node(views(summaries[:1])) is None


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


def test_a_refused_job_counts_no_job_end(tmp_path):
    """The prolog refused it: no run ended here, so gpugate_job_ends_total counts nothing
    (it counted an `ok` end: tests/e2e/test_e2e_prometheus.py saw 2 for one job run)."""
    from gpugate.store.metrics import parse_samples

    (tmp_path / "textfile").mkdir()
    prom = tmp_path / "textfile" / "gpugate.prom"
    config = setup(tmp_path)
    config = config.replace(admin=config.admin.replace(metrics_file=str(prom)))
    snapshot(tmp_path, make_facts(gpus={3: {"error": "gpu_is_lost"}}))
    slurm = slurm_with_job("")
    assert run_prolog(config, env(), slurm).exit_code == 1
    run_epilog(config, env(exit_code=0, exit_code2="0:0"), slurm)
    samples = parse_samples(prom.read_text())
    assert not [k for k in samples if k[0] == "gpugate_job_ends_total"], samples
    assert samples[("gpugate_node_healthy", (("node", "gpu-node-01"),))] == 0
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


# A run is judged by its own run (issue 26, deliver 5).


def rerun(tmp_path, before: str, this_run: str, prolog_facts=None, after=None, **env_changes):
    """Run 1 of a requeued job whose log (--open-mode=append) holds run 0's lines `before`."""
    config = setup(tmp_path)
    out = tmp_path / "job.out"
    out.write_text(before)
    snapshot(tmp_path, prolog_facts or make_facts())
    slurm = slurm_with_job(str(out))
    changes = {"restart_count": 1, **env_changes}
    assert run_prolog(config, env(**changes), slurm).exit_code == 0
    with open(out, "a") as fh:
        fh.write(this_run)
    snapshot(tmp_path, after or prolog_facts or make_facts())
    return run_epilog(config, env(**changes), slurm), slurm, config


def test_the_prolog_records_where_this_run_starts_in_the_jobs_log(tmp_path):
    from gpugate.store.state import load_baseline

    config = setup(tmp_path)
    out = tmp_path / "job.out"
    out.write_text("run 0 said this\n")
    snapshot(tmp_path, make_facts())
    run_prolog(config, env(restart_count=1), slurm_with_job(str(out)))
    baseline = load_baseline(config.state_dir, "77")
    assert baseline.log_offsets == {str(out): len("run 0 said this\n")}


def test_a_first_run_asks_slurm_nothing_for_its_logs(tmp_path):
    from gpugate.store.state import load_baseline

    config = setup(tmp_path)
    out = tmp_path / "job.out"
    out.write_text("another job's lines\n")
    snapshot(tmp_path, make_facts())
    run_prolog(config, env(), slurm_with_job(str(out)))  # restart 0: its file comes after
    assert load_baseline(config.state_dir, "77").log_offsets is None


def test_an_appended_log_never_replays_an_earlier_runs_failure(tmp_path):
    result, _, _ = rerun(tmp_path, "step 10\n" + NCCL_TIMEOUT, "step 11\n" + CUDA_OOM)
    assert result.category == "cuda_oom", result
    tails = "".join(member(result, f) for f in summary(result)["files"] if f.startswith("logs/"))
    assert "Watchdog caught collective" not in tails and "CUDA out of memory" in tails


def test_a_requeued_run_that_completes_is_a_success_whatever_its_log_held(tmp_path):
    result, slurm, config = rerun(tmp_path, NCCL_TIMEOUT, "step 12\ndone\n",
                                  exit_code=0, exit_code2="0:0", derived_ec=256)  # fmt: skip
    assert (result.abnormal, result.bundle, slurm.drains) == (False, None, [])
    assert not os.path.exists(os.path.join(config.evidence_dir, "77"))


def test_a_log_truncated_by_the_rerun_is_read_from_its_start(tmp_path):
    config = setup(tmp_path)
    out = tmp_path / "job.out"
    out.write_text("x" * 4096)
    snapshot(tmp_path, make_facts())
    slurm = slurm_with_job(str(out))
    run_prolog(config, env(restart_count=1), slurm)
    out.write_text(CUDA_OOM)  # --open-mode=truncate: the rerun starts the file again
    result = run_epilog(config, env(restart_count=1), slurm)
    assert result.category == "cuda_oom"


LOST_OUTSIDE = make_facts(gpus={5: {"error": "gpu_is_lost"}})


def test_a_gpu_the_prolog_found_lost_outside_the_job_is_not_the_jobs_fault(tmp_path):
    # The prolog drains the node but lets the job run on its two healthy GPUs.
    result, slurm, _ = rerun(tmp_path, "", "done\n", prolog_facts=LOST_OUTSIDE, gpus=(0, 1),
                             restart_count=0, exit_code=0, exit_code2="0:0")  # fmt: skip
    assert (result.abnormal, result.hardware_fault, result.bundle) == (False, False, None)
    assert len(slurm.drains) == 1  # the prolog's own drain; the epilog adds none


def test_a_known_fault_does_not_make_a_failed_job_an_infrastructure_failure(tmp_path):
    result, _, _ = rerun(tmp_path, "", CUDA_OOM, prolog_facts=LOST_OUTSIDE, gpus=(0, 1),
                         restart_count=0)  # fmt: skip
    s = summary(result)
    assert result.abnormal and s["hardware_fault"] is False and s["hardware_findings"] == []
    assert s["category"] == "cuda_oom" and s["suspected_node"] is None


def test_the_epilog_takes_the_jobs_gpus_from_the_prolog_when_its_env_lacks_them(tmp_path):
    config = setup(tmp_path)
    snapshot(tmp_path, LOST_OUTSIDE)
    run_prolog(config, env(gpus=(0, 1)), slurm_with_job(""))  # runs beside the lost GPU5
    result = run_epilog(config, env(exit_code=0, exit_code2="0:0"), slurm_with_job(""))
    assert (result.hardware_fault, result.bundle, result.drained) == (False, None, False)


def test_a_fault_the_prolog_reported_is_not_new_since_the_prolog():
    from gpugate.hooks.epilog import hardware_decision

    config = default_config()
    known = Baseline.from_json({"job_id": "77", "known_faults": [
        {"check": "gpu.lost", "gpu": 5}, {"check": "gpu.count", "gpu": None}]})  # fmt: skip
    assert hardware_decision(LOST_OUTSIDE, [], config).failing  # without the prolog's record
    assert not hardware_decision(LOST_OUTSIDE, [], config, baseline=known).failing
    # Another GPU lost since then is new.
    both = make_facts(gpus={5: {"error": "gpu_is_lost"}, 6: {"error": "gpu_is_lost"}})
    failing = hardware_decision(both, [], config, baseline=known).failing
    assert [(f.check, f.gpu) for f in failing] == [("gpu.lost", 6)]


def test_a_new_fault_on_another_jobs_gpu_drains_but_is_not_this_jobs_verdict(tmp_path):
    broken = make_facts(kernel_log=(XID79,))  # GPU4 (0000:58:00) falls off the bus
    result, slurm, _ = rerun(tmp_path, "", "step 1\n" + NCCL_TIMEOUT, after=broken,
                             gpus=(0, 1), restart_count=0)  # fmt: skip
    s = summary(result)
    assert result.drained and slurm.drains[-1][1].startswith("gpugate: kernel.xid")
    assert s["hardware_fault"] is False and any("Xid 79" in m for m in s["faults_outside_job"])
    # Root's kernel line about GPU4 is no cause of this job's end: its own log decides.
    assert s["category"] == "nccl_timeout" and s["category_trusted"] is False


def test_a_new_fault_on_the_jobs_own_gpu_is_its_hardware_fault(tmp_path):
    broken = make_facts(kernel_log=(XID79,))
    result, _, _ = rerun(tmp_path, "", NCCL_TIMEOUT, after=broken, gpus=(4, 5), restart_count=0)
    assert result.hardware_fault and summary(result)["category"] == "gpu_xid_hardware"


def test_a_completed_job_beside_a_new_fault_elsewhere_gets_no_bundle_but_the_node_drains(tmp_path):
    broken = make_facts(kernel_log=(XID79,))
    result, slurm, _ = rerun(tmp_path, "", "done\n", after=broken, gpus=(0, 1), restart_count=0,
                             exit_code=0, exit_code2="0:0")  # fmt: skip
    assert (result.abnormal, result.bundle, result.hardware_fault) == (False, None, False)
    assert result.drained and slurm.drains[-1][1].startswith("gpugate: kernel.xid")


def test_the_bundle_carries_the_real_collection_time_and_the_runs_times(tmp_path):
    import time

    from gpugate.clock import parse_utc

    before = time.time()
    result, _, _ = job_run(tmp_path, NCCL_TIMEOUT, start_time=1795945822, end_time=1795945844)
    s = summary(result)
    assert parse_utc(s["collected_at"]) >= int(before)  # not the snapshot's 2026-11-29T10:00
    assert s["facts_time"] == "2026-11-29T10:00:00Z"
    assert (s["job_start"], s["job_end"]) == ("2026-11-29T09:50:22Z", "2026-11-29T09:50:44Z")


def test_without_slurms_times_the_bundle_takes_scontrols_else_the_prologs(tmp_path):
    import time

    from gpugate.clock import parse_utc

    config = setup(tmp_path)
    snapshot(tmp_path, make_facts())
    out = tmp_path / "job.out"
    before = time.time()
    run_prolog(config, env(), slurm_with_job(str(out)))
    out.write_text(NCCL_TIMEOUT)
    # 22.05: no SLURM_JOB_START_TIME; scontrol's StartTime/EndTime are taken first.
    told = FakeSlurm(jobs=[job_77(str(out)).replace(start_time=1795945000, end_time=1795945100)])
    s = summary(run_epilog(config, env(), told))
    assert (s["job_start"], s["job_end"]) == ("2026-11-29T09:36:40Z", "2026-11-29T09:38:20Z")
    # Slurm says nothing: the prolog's own record of the start.
    run_prolog(config, env(), slurm_with_job(str(out)))
    s = summary(run_epilog(config, env(), slurm_with_job(str(out))))
    assert int(before) <= parse_utc(s["job_start"]) <= parse_utc(s["job_end"])


@pytest.mark.parametrize(
    ("diagnosis", "nodelist", "job_nodes", "node"),
    [
        ({"failing_rank": 9, "failing_node": "from-log"}, "n[1-4]", None, "from-log"),
        # Several nodes and no word from the log: Slurm's tasks per node would mislead under
        # torchrun (one task per node), so no node.
        ({"failing_rank": 9}, "n[1-4]", None, None),
        ({"failing_rank": 3}, "n7", None, "n7"),  # one node
        ({"failing_rank": 3}, "n[1-4]", ["m1"], "m1"),  # Slurm's job record: one node
        ({"failing_rank": None}, "n7", None, None),
        ({}, None, None, None),
    ],
)
def test_the_failing_node_from_the_log_or_a_one_node_job(diagnosis, nodelist, job_nodes, node):
    from gpugate.hooks.child_answer import JobDiagnosis
    from gpugate.hooks.collect import failing_node

    e = env().replace(nodelist=nodelist)
    read = JobDiagnosis.from_json(diagnosis)
    assert failing_node(read, e, SummaryJob(nodes=job_nodes)) == node


def test_a_reader_childs_answer_of_the_wrong_shape_is_refused_not_used():
    """The child runs as the job's user: root checks every key of its JSON before using it."""
    from gpugate.hooks.child_answer import ChildDiagnosis

    ok = ChildDiagnosis.from_json({"tails": {"/o": "x"}, "errors": [], "diagnosis": {"xid": 79}})
    assert ok.diagnosis.xid == 79 and ok.tails == {"/o": "x"}
    for bad in ({"tails": {"/o": 5}}, {"diagnosis": {"xid": "79"}}, {"errors": "x"}, []):
        with pytest.raises(ValueError, match="the reader child's answer"):
            ChildDiagnosis.from_json(bad, "the reader child's answer")


def test_the_summarys_job_is_slurms_word_without_the_users_comment_or_the_environments():
    """Slurm answered: its fields are written (nulls included), the user's comment never;
    Slurm failed: only the environment's fields, stdout and why. Both read back the same."""
    from gpugate.hooks.collect import job_info

    class Answers:
        def job(self, job_id):
            return JobInfo(job_id=int(job_id), stdout="/o", comment="gpugate:ckpt=/c secret")

    class Fails:
        def job(self, job_id):
            raise TimeoutError("scontrol took too long")

    e = env().replace(stdout="out.%j", work_dir="/w")
    said = job_info(default_config(), e, Answers())
    assert said.comment == "gpugate:ckpt=/c secret"  # read: the checkpoint dir may be there
    written = said.to_json()
    assert "comment" not in written and "slurm_error" not in written
    assert written["stdout"] == "/o" and written["stderr"] is None and written["nodes"] == []
    failed = job_info(default_config(), e, Fails()).to_json()
    assert set(failed) == {"job_id", "user", "uid", "gid", "slurm_error", "stdout"}
    assert failed["slurm_error"] == "TimeoutError: scontrol took too long"
    assert failed["stdout"] == f"/w/out.{e.job_id}"
    for json_ in (written, failed):
        assert SummaryJob.from_json(json_).to_json() == json_


# --- issue 43: Slurm's exit code over a log that names no cause -------------------------------


@pytest.mark.parametrize("log", [
    "step 10\nstep 11\n",  # a fragment: the log shows neither a failure nor an end
    "step 10\n{'train_runtime': 81.2, 'epoch': 3.0}\n",  # the log looks finished
])  # fmt: skip
def test_a_failed_job_is_never_filed_as_no_failure(tmp_path, log):
    result, _, _ = job_run(tmp_path, log, exit_code=768, exit_code2="3:0")
    s = summary(result)
    assert (result.category, s["category"], s["confidence"]) == ("other", "other", "low")
    assert s["summary_text"].startswith("The job failed (exit code 3) and its logs name no cause.")


def test_a_failed_jobs_named_cause_is_kept(tmp_path):
    result, _, _ = job_run(tmp_path, "step 10\n" + CUDA_OOM, exit_code=256, exit_code2="1:0")
    assert summary(result)["category"] == "cuda_oom"


def test_a_clean_exit_makes_a_quiet_log_no_failure(tmp_path):
    config = setup(tmp_path, always_bundle=True)
    snapshot(tmp_path, make_facts())
    out = tmp_path / "job.out"
    out.write_text("step 10\nstep 11\n")
    result = run_epilog(config, env(exit_code=0, exit_code2="0:0"), slurm_with_job(str(out)))
    s = summary(result)
    assert (s["category"], s["summary_text"].split(";")[0]) == (
        "no_failure",
        "Slurm's exit code 0:0 says the job ended well",
    )

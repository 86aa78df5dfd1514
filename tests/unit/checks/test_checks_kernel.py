"""Kernel-log checks (gpugate/checks/kernel.py): Xids, GPUs lost without an Xid, the OOM killer.

The lines are written from the formats in docs/gpu-facts.md (section 2).
"""

from __future__ import annotations

import pytest
from factories import findings_of, make_facts, only, site, statuses

from gpugate.store.app_xids import AppXidEntry

KERNEL_CHECKS = ["kernel.xid", "kernel.gpu_bus", "kernel.oom"]
# make_gpu(i) sits at bus 0x18 + 0x10 * i: GPU2 at 0000:38:00, GPU5 at 0000:68:00.
GPU2, GPU5 = "0000:38:00", "0000:68:00"


def log(*lines: str):
    """A healthy node whose kernel log holds `lines`."""
    return make_facts(kernel_log=lines)


def xid(code: int, text: str, pci: str = GPU5, when: str = "[Sun Nov 29 09:59:01 2026]") -> str:
    return f"{when} NVRM: Xid (PCI:{pci}): {code}, pid='<unknown>', name=<unknown>, {text}"


@pytest.mark.parametrize("check_id", KERNEL_CHECKS)
def test_a_quiet_kernel_log_gets_one_ok_per_check(check_id):
    facts = log(
        "[Sun Nov 29 08:12:44 2026] nvidia-peermem nv_mem_init:2025 nvidia-peermem: module loaded"
    )
    assert only(check_id, facts).status == "ok"


@pytest.mark.parametrize("check_id", KERNEL_CHECKS)
def test_without_the_kernel_log_the_checks_are_unknown_and_say_why(check_id):
    facts = make_facts(
        kernel_log=None, source_errors={"kernel_log": "dmesg: read kernel buffer failed"}
    )
    f = only(check_id, facts)
    assert f.status == "unknown" and "read kernel buffer failed" in f.message


# kernel.xid


def test_xid79_fails_naming_gpu_code_mnemonic_and_action():
    f = only("kernel.xid", log(xid(79, "GPU has fallen off the bus.")))
    assert (f.status, f.gpu, f.value) == ("fail", 5, 79)
    assert f.message == (
        "kernel.xid: GPU5 (serial 1652123000005, 0000:68:00) Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS: GPU has fallen off the bus"
        " (reboot the node)"
    )


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer"),
        (74, "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
        (95, "Uncontained: FBHUB. RST: Yes, D-RST: No"),
        (119, "Timeout after 6s of waiting for RPC response from GPU5 GSP!"),
        (150, "MSE_ERROR Fatal XC0 i0 Link -1 (0x0 0x0 0x0 0x0 0x0 0x0)"),
        (154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"),
    ],
)
def test_xids_that_need_a_reset_or_reboot_fail(code, text):
    f = only("kernel.xid", log(xid(code, text)))
    assert (f.status, f.gpu) == ("fail", 5)
    assert f"Xid {code} " in f.message
    assert "(reset the GPU)" in f.message or "(reboot the node)" in f.message


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (
            63,
            "Row Remapper: New row (0x00000012bac1c3e0) marked for remapping, reset gpu to activate.",
        ),
        (92, "High single-bit ECC error rate"),
        (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x1 0x0 0x00100000 0x4)"),
        (154, "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)"),
        (45, "Ch 00000001"),
    ],
)
def test_informational_xids_pass_and_are_named(code, text):
    f = only("kernel.xid", log(xid(code, text)))
    assert f.status == "ok"
    assert f"informational: Xid {code} on GPU5 (0000:68:00)" in f.message


def test_job_level_xid_warns_and_keeps_the_node():
    f = only("kernel.xid", log(xid(94, "Contained: SM (0x1). RST: No, D-RST: No")))
    assert (f.status, f.gpu) == ("warn", 5) and "job-level, node kept" in f.message


def test_xid45_is_judged_by_the_xid_that_caused_it():
    assert (
        only("kernel.xid", log(xid(45, "Ch 00000001 caused by previous Xid 79"))).status == "fail"
    )
    assert (
        only("kernel.xid", log(xid(45, "Ch 00000001 caused by previous Xid 13"))).status == "warn"
    )
    assert only("kernel.xid", log(xid(45, "Ch 00000001 caused by previous Xid 63"))).status == "ok"


def test_repeated_lines_of_one_xid_make_one_finding_with_a_count():
    facts = log(*[xid(79, "GPU has fallen off the bus.")] * 3)
    f = only("kernel.xid", facts)
    assert "Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS x3:" in f.message


def _xid13_bursts(n: int) -> list[str]:
    """`n` faults an hour apart, each logging 15 Xid 13 lines within a millisecond."""
    text = "Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0): Out Of Range Address"
    return [
        xid(13, text, GPU2, f"kern  :warn  : 2025-01-21T{2 + hour:02d}:21:33,{498559 + i}+00:00")
        for hour in range(n)
        for i in range(15)
    ]


def test_app_xid_warns_for_one_fault_however_many_lines_it_logs():
    # One out-of-range access logs ~15 Xid 13 lines in the same millisecond: still one fault.
    f = only("kernel.xid", log(*_xid13_bursts(1)))
    assert (f.status, f.gpu, f.value, f.limit) == ("warn", 2, 1, 3)
    assert "GPU2 (0000:38:00) Xid 13 GR_EXCEPTION x15" in f.message and "1 burst(s)" in f.message
    assert "application's own fault" in f.message


def test_one_jobs_app_xid_bursts_never_fail_however_many(tmp_path):
    # Five faults an hour apart from one job's own process: the job's fault, not the node's.
    facts = log(*_xid13_bursts(5))
    f = only("kernel.xid", facts)
    assert (f.status, f.gpu, f.value) == ("warn", 2, 5)
    same_job = tuple(AppXidEntry(t=0.0, gpu=GPU2, xid=13, job="77", uid=1000) for _ in range(5))
    assert app_finding(facts, same_job).status == "warn"
    config = site(tmp_path, "checks:\n  kernel:\n    app_xid_repeat_max: 1\n")
    assert only("kernel.xid", facts, config).status == "warn"  # the old key drains no more


def app_finding(facts, app_xids, config=None):
    from factories import default_config

    from gpugate.checks.run import run_checks

    found = run_checks(facts, config or default_config(), only=["kernel.xid"], app_xids=app_xids)
    assert len(found) == 1, found
    return found[0]


def jobs_on(pci: str, *pairs) -> tuple:
    return tuple(AppXidEntry(t=0.0, gpu=pci, xid=31, job=job, uid=uid) for job, uid in pairs)


def suspected(f) -> bool:
    return f.status == "warn" and "flagged for qualification" in f.message


def test_app_xids_repeated_by_jobs_of_different_users_make_the_gpu_a_suspect_not_a_failure(
    tmp_path,
):
    facts = log(*_xid13_bursts(1))
    f = app_finding(facts, jobs_on(GPU2, ("1", 1000), ("2", 1001), ("3", 1000), ("4", 1001)))
    assert (f.status, f.gpu, f.value, f.limit) == ("warn", 2, 4, 3) and suspected(f)
    assert "application Xids in 4 jobs of 2 users within 168 h" in f.message
    # Three users, one job each: as many users as jobs.
    assert suspected(app_finding(facts, jobs_on(GPU2, ("1", 1000), ("2", 1001), ("3", 1002))))
    # One user primes (many jobs), a second tips with one: not fair, the application's fault.
    primed = jobs_on(GPU2, ("1", 1000), ("2", 1000), ("3", 1000), ("4", 1000), ("5", 1001))
    assert not suspected(app_finding(facts, primed))
    # One user's three jobs, two jobs, or other GPUs' history: still the application's fault.
    assert not suspected(app_finding(facts, jobs_on(GPU2, ("1", 1000), ("2", 1000), ("3", 1000))))
    assert not suspected(app_finding(facts, jobs_on(GPU2, ("1", 1000), ("2", 1001))))
    assert not suspected(app_finding(facts, jobs_on(GPU5, ("1", 1000), ("2", 1001), ("3", 1002))))
    config = site(tmp_path, "checks:\n  kernel:\n    app_xid_users_min: 1\n")
    same_user = jobs_on(GPU2, ("1", 1000), ("2", 1000), ("3", 1000))
    assert suspected(app_finding(facts, same_user, config))
    # Whatever the record says, kernel.xid never fails on application Xids.
    assert app_finding(facts, same_user, config).status != "fail"


def test_xid_lines_name_the_process_that_raised_them():
    from gpugate.checks.xid import parse_xid

    e = parse_xid(f"NVRM: Xid (PCI:{GPU2}): 31, pid=1234, name=python, channel 0x0000000c")
    assert (e.code, e.pid, e.process) == (31, 1234, "python")
    e = parse_xid(xid(79, "GPU has fallen off the bus."))
    assert (e.pid, e.process) == (None, None)


@pytest.mark.parametrize(
    "stamps",
    [
        ["[ 100.000001]", "[ 400.000001]", "[ 700.000001]", "[ 1000.000001]"],
        [
            "[Sun Nov 29 09:00:01 2026]",
            "[Sun Nov 29 09:10:01 2026]",
            "[Sun Nov 29 09:20:01 2026]",
            "[Sun Nov 29 23:59:59 2026]",
        ],
        [
            "2026-11-29T09:00:01,1+00:00",
            "2026-11-29T09:10:01,1+00:00",
            "2026-11-29 09:20:01",
            "2026-11-30T00:00:00",
        ],
        [
            "May 19 07:08:57 gpu-node-01 kernel: [680111.646286]",
            "May 19 07:18:57 gpu-node-01 kernel: [680711.646286]",
            "May 19 07:28:57 gpu-node-01 kernel: [681311.646286]",
            "May 19 07:38:57 gpu-node-01 kernel: [681911.646286]",
        ],
        [
            "Nov 29 09:00:01 gpu-node-01 kernel:",
            "Nov 29 09:10:01 gpu-node-01 kernel:",
            "Nov 29 09:20:01 gpu-node-01 kernel:",
            "Nov 30 09:20:01 gpu-node-01 kernel:",
        ],
    ],
)
def test_app_xid_bursts_are_told_apart_in_every_time_format(stamps):
    facts = log(*[xid(31, "MMU Fault: ENGINE GRAPHICS GPC2", GPU2, s) for s in stamps])
    assert only("kernel.xid", facts).value == 4


def test_app_xid_lines_without_time_stamps_count_as_one_burst():
    facts = log(*[f"NVRM: Xid (PCI:{GPU2}): 43, pid=2815167, name=pt_main_thread, Ch 00000008"] * 6)
    assert only("kernel.xid", facts).status == "warn"


def test_xid_on_an_address_no_gpu_has_or_a_redacted_one_is_still_reported():
    f = only("kernel.xid", log(xid(79, "GPU has fallen off the bus.", "0000:ff:00")))
    assert f.gpu is None and "PCI 0000:ff:00 (no GPU listed there)" in f.message
    f = only("kernel.xid", log("NVRM: Xid (PCI:...): 79, GPU has fallen off the bus."))
    assert (f.status, f.gpu) == ("fail", None) and "GPU ?" in f.message


def test_xids_on_several_gpus_give_a_finding_each():
    facts = log(xid(79, "GPU has fallen off the bus."), xid(48, "DBE", GPU2))
    assert sorted((f.gpu, f.status) for f in findings_of("kernel.xid", facts)) == [
        (2, "fail"),
        (5, "fail"),
    ]


# kernel.gpu_bus


@pytest.mark.parametrize(
    "lines",
    [
        ["[ 1843.308145] NVRM: GPU 0000:68:00.0: GPU has fallen off the bus."],
        [
            "[ 12.1] NVRM: The NVIDIA GPU 0000:68:00.0",
            "[ 12.1]       NVRM: (PCI ID: 10de:2330) installed in this system has",
            "[ 12.1]       NVRM: fallen off the bus and is not responding to commands.",
            "[ 12.1] NVRM: The NVIDIA probe routine failed for 1 device(s).",
        ],
        ["[ 12.1] NVRM: GPU at 0000:68:00.0 has fallen off the bus."],
        ["[ 30.2] NVRM: GPU 0000:68:00.0: RmInitAdapter failed! (0x24:0x72:1568)"],
    ],
)
def test_gpu_bus_lost_or_failed_gpu_fails_naming_the_gpu(lines):
    f = only("kernel.gpu_bus", log(*lines))
    assert (f.status, f.gpu) == ("fail", 5)
    assert f.message.startswith("kernel.gpu_bus: GPU5 (serial 1652123000005, 0000:68:00): ")


@pytest.mark.parametrize(
    ("line", "text"),
    [
        ("[ 30.2] NVRM: rm_init_adapter failed, device minor number 5", "RmInitAdapter failed"),
        (
            "[ 99.9] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] (0x00000062) returned from status @ kernel_channel.c:2827",
            "NV_ERR_RESET_REQUIRED",
        ),
    ],
)
def test_gpu_bus_lines_without_an_address_still_fail(line, text):
    f = only("kernel.gpu_bus", log(line))
    assert (f.status, f.gpu) == ("fail", None) and text in f.message


def test_gpu_bus_leaves_xid_lines_to_kernel_xid():
    assert only("kernel.gpu_bus", log(xid(79, "GPU has fallen off the bus."))).status == "ok"


def test_gpu_bus_repeated_lines_make_one_finding():
    line = "[ 1843.3] NVRM: GPU 0000:68:00.0: GPU has fallen off the bus."
    assert statuses(findings_of("kernel.gpu_bus", log(line, line))) == ["fail"]


# kernel.oom


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (
            "[ 812.4] Out of memory: Killed process 4242 (python) total-vm:98765432kB, anon-rss:91234567kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:190000kB oom_score_adj:0",
            "pid 4242 python",
        ),
        (
            "[ 812.4] Memory cgroup out of memory: Killed process 4243 (pt_main_thread) total-vm:1kB",
            "pid 4243 pt_main_thread in a cgroup",
        ),
        (
            "[ 812.4] Out of memory: Kill process 4244 (python3) score 912 or sacrifice child",
            "pid 4244 python3",
        ),
        (
            "[ 812.4] OOM[3]: Out of memory: Killed process 4245 (python) total-vm:1kB",
            "pid 4245 python",
        ),
        (
            "[ 812.3] python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
            "invoked 1 time(s), by python",
        ),
    ],
)
def test_oom_killer_warns_naming_the_process(line, text):
    f = only("kernel.oom", log(line))
    assert f.status == "warn" and text in f.message


def test_oom_killer_counts_victims_not_the_lines_around_them():
    lines = [
        "[ 812.3] python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE), order=0",
        "[ 812.4] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task=python,pid=4242,uid=1000",
        "[ 812.4] Out of memory: Killed process 4242 (python) total-vm:98765432kB",
        "[ 812.5] oom_reaper: reaped process 4242 (python), now anon-rss:0kB",
    ]
    f = only("kernel.oom", log(*lines))
    assert (f.status, f.value) == ("warn", 1)
    assert f.message == "kernel.oom: OOM killer killed 1 process(es): pid 4242 python"

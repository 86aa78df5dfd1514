"""GPU checks (gpugate/checks/gpu.py): one healthy case, each broken case, missing facts, overrides."""

from __future__ import annotations

import pytest
from factories import findings_of, make_facts, make_gpu, only, site, statuses

from gpugate.checks.facts import Gpu, GpuProcess, RemappedRows

GPU_CHECKS = [
    "gpu.count",
    "gpu.lost",
    "gpu.driver",
    "gpu.temperature",
    "gpu.throttle",
    "gpu.ecc",
    "gpu.memory_errors",
    "gpu.recovery_action",
    "gpu.processes",
    "gpu.persistence",
    "gpu.power_limit",
]
PER_GPU = [
    c for c in GPU_CHECKS if c not in ("gpu.count", "gpu.lost", "gpu.driver", "gpu.power_limit")
]


@pytest.mark.parametrize("check_id", GPU_CHECKS)
def test_a_healthy_node_gets_one_ok_per_check(check_id):
    f = only(check_id, make_facts())
    assert f.status == "ok" and f.gpu is None
    assert f.message.startswith(f"{check_id}: ")


@pytest.mark.parametrize("check_id", PER_GPU)
def test_without_nvml_every_gpu_check_is_unknown_and_says_why(check_id):
    facts = make_facts(source_errors={"nvml": "NVMLError_DriverNotLoaded"}).replace(gpus=None)
    f = only(check_id, facts)
    assert f.status == "unknown"
    assert "NVMLError_DriverNotLoaded" in f.message


@pytest.mark.parametrize("check_id", PER_GPU)
def test_a_lost_gpu_is_left_to_gpu_lost_and_named_in_the_ok(check_id):
    facts = make_facts(gpus=[make_gpu(i) for i in range(7)] + [Gpu(index=7, error="gpu_is_lost")])
    f = only(check_id, facts)
    assert f.status == "ok"
    assert "all 7 readable GPUs" in f.message and "GPU7 not read (see gpu.lost)" in f.message


@pytest.mark.parametrize(
    ("check_id", "field"),
    [
        ("gpu.temperature", "temperature_c"),
        ("gpu.throttle", "throttle_reasons"),
        ("gpu.ecc", "ecc_aggregate_uncorrected"),
        ("gpu.recovery_action", "recovery_action"),
        ("gpu.persistence", "persistence_mode"),
    ],
)
def test_a_value_one_gpu_did_not_report_is_unknown_for_that_gpu(check_id, field):
    f = only(check_id, make_facts(gpus={4: {field: None}}))
    assert (f.status, f.gpu) == ("unknown", 4)
    assert "GPU4 did not report" in f.message


def test_all_gpus_lost_is_unknown_not_ok():
    facts = make_facts(gpus=[Gpu(index=0, error="gpu_is_lost")])
    assert statuses(findings_of("gpu.temperature", facts)) == ["unknown"]


# gpu.driver


def test_driver_cuda_version_below_the_minimum_fails():
    f = only("gpu.driver", make_facts(cuda_driver_version="11.8"))
    assert f.status == "fail"
    assert f.message == "gpu.driver: CUDA driver version 11.8 < 12.0 minimum (upgrade the driver)"


@pytest.mark.parametrize(
    ("cuda", "minimum", "status"),
    [
        ("12.10", "12.4", "ok"),
        ("12.3", "12.10", "fail"),
        ("12.4", "12.4", "ok"),
        ("13", "12.8", "ok"),
    ],
)
def test_driver_cuda_versions_compare_numerically(tmp_path, cuda, minimum, status):
    config = site(tmp_path, f"checks:\n  gpu:\n    cuda_driver_min: '{minimum}'\n")
    assert only("gpu.driver", make_facts(cuda_driver_version=cuda), config).status == status


def test_driver_pinned_by_the_site_must_match(tmp_path):
    config = site(tmp_path, "checks:\n  gpu:\n    driver_version: '550.90.07'\n")
    f = only("gpu.driver", make_facts(), config)
    assert f.status == "fail"
    assert f.message == "gpu.driver: driver 550.54.15, site requires 550.90.07 (fix host setup)"
    config = site(tmp_path, "checks:\n  gpu:\n    driver_version: '550.54.15'\n")
    assert only("gpu.driver", make_facts(), config).status == "ok"


def test_driver_unknown_when_versions_are_missing_or_unreadable():
    f = only(
        "gpu.driver", make_facts(driver_version=None, source_errors={"nvml": "timed out after 8 s"})
    )
    assert f.status == "unknown" and "timed out after 8 s" in f.message
    assert only("gpu.driver", make_facts(cuda_driver_version=None)).status == "unknown"
    f = only("gpu.driver", make_facts(cuda_driver_version="12.x"))
    assert f.status == "unknown" and "'12.x'" in f.message


def test_driver_without_a_cuda_minimum_accepts_any_cuda(tmp_path):
    config = site(tmp_path, "checks:\n  gpu:\n    cuda_driver_min: null\n")
    assert only("gpu.driver", make_facts(cuda_driver_version="10.2"), config).status == "ok"


# gpu.temperature


@pytest.mark.parametrize(
    ("temp", "status"),
    [(79.0, "ok"), (80.0, "warn"), (84.9, "warn"), (85.0, "fail"), (91.0, "fail")],
)
def test_temperature_warns_then_fails_at_the_limits(temp, status):
    assert statuses(
        findings_of("gpu.temperature", make_facts(gpus={6: {"temperature_c": temp}}))
    ) == [status]


def test_temperature_message_names_gpu_value_and_limit():
    f = only("gpu.temperature", make_facts(gpus={6: {"temperature_c": 91.0}}))
    assert (f.gpu, f.value, f.limit) == (6, 91.0, 85.0)
    assert (
        f.message
        == "gpu.temperature: GPU6 (serial 1652123000006) temperature 91C >= 85C (check cooling/power)"
    )


def test_temperature_limits_come_from_the_config(tmp_path):
    config = site(
        tmp_path, "checks:\n  gpu:\n    temperature_max_c: 95\n    temperature_warn_c: 92\n"
    )
    assert (
        only("gpu.temperature", make_facts(gpus={6: {"temperature_c": 91.0}}), config).status
        == "ok"
    )


def test_temperature_reports_every_hot_gpu():
    found = findings_of(
        "gpu.temperature", make_facts(gpus={1: {"temperature_c": 88.0}, 6: {"temperature_c": 82.0}})
    )
    assert [(f.status, f.gpu) for f in found] == [("fail", 1), ("warn", 6)]


# gpu.throttle


@pytest.mark.parametrize(
    ("reasons", "status"),
    [
        (("gpu_idle",), "ok"),
        (("sw_power_cap",), "ok"),
        ((), "ok"),
        (("sw_thermal_slowdown",), "warn"),
        (("gpu_idle", "hw_slowdown"), "fail"),
        (("hw_thermal_slowdown", "sw_thermal_slowdown"), "fail"),
        (("hw_power_brake_slowdown",), "fail"),
    ],
)
def test_throttle_hardware_slowdown_fails_software_thermal_warns(reasons, status):
    assert statuses(
        findings_of("gpu.throttle", make_facts(gpus={6: {"throttle_reasons": reasons}}))
    ) == [status]


def test_throttle_message_names_gpu_and_reason():
    f = only("gpu.throttle", make_facts(gpus={6: {"throttle_reasons": ("hw_thermal_slowdown",)}}))
    assert f.gpu == 6
    assert (
        f.message
        == "gpu.throttle: GPU6 (serial 1652123000006) clocks slowed by hw_thermal_slowdown (check cooling/power)"
    )


def test_throttle_reasons_that_fail_come_from_the_config(tmp_path):
    config = site(
        tmp_path, "checks:\n  gpu:\n    throttle_fail: []\n    throttle_warn: [hw_slowdown]\n"
    )
    facts = make_facts(gpus={0: {"throttle_reasons": ("hw_slowdown",)}})
    assert only("gpu.throttle", facts, config).status == "warn"


# gpu.ecc


def test_ecc_aggregate_over_100_fails_with_the_documented_message():
    f = only("gpu.ecc", make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}}))
    assert f.message == (
        "gpu.ecc: GPU3 (serial 1652123000003) aggregate uncorrected ECC 120 > 100"
        " (RMA candidate: open a ticket with its serial)"
    )
    assert (f.status, f.gpu, f.value, f.limit) == ("fail", 3, 120, 100)


def test_ecc_aggregate_at_the_limit_passes():
    assert only("gpu.ecc", make_facts(gpus={3: {"ecc_aggregate_uncorrected": 100}})).status == "ok"


def test_ecc_any_volatile_uncorrected_error_fails():
    f = only("gpu.ecc", make_facts(gpus={2: {"ecc_volatile_uncorrected": 1}}))
    assert (f.status, f.gpu) == ("fail", 2)
    assert "GPU2 (serial 1652123000002) volatile uncorrected ECC 1 > 0 (reset it)" in f.message


def test_ecc_both_counters_over_give_two_failures():
    facts = make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120, "ecc_volatile_uncorrected": 2}})
    assert statuses(findings_of("gpu.ecc", facts)) == ["fail", "fail"]


def test_ecc_mode_disabled_fails_unless_the_site_allows_it(tmp_path):
    facts = make_facts(gpus={5: {"ecc_mode_enabled": False, "ecc_volatile_uncorrected": None}})
    f = only("gpu.ecc", facts)
    assert (f.status, f.gpu) == (
        "fail",
        5,
    ) and "GPU5 (serial 1652123000005) ECC mode disabled" in f.message
    config = site(tmp_path, "checks:\n  gpu:\n    require_ecc_mode: false\n")
    assert only("gpu.ecc", facts, config).status == "ok"


def test_ecc_limits_come_from_the_config(tmp_path):
    config = site(tmp_path, "checks:\n  gpu:\n    ecc_aggregate_uncorrected_max: 200\n")
    assert (
        only("gpu.ecc", make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}}), config).status
        == "ok"
    )


# gpu.memory_errors


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        (
            {
                "remapped_rows": RemappedRows(
                    corrected=0, uncorrected=1, pending=True, failure=False
                )
            },
            "GPU2 (serial 1652123000002) row remap pending: reset the GPU",
        ),
        (
            {
                "remapped_rows": RemappedRows(
                    corrected=0, uncorrected=9, pending=False, failure=True
                )
            },
            "GPU2 (serial 1652123000002) row remapping failed: RMA candidate",
        ),
        (
            {"remapped_rows": None, "retired_pages_pending": True},
            "GPU2 (serial 1652123000002) page retirement pending: reset the GPU",
        ),
    ],
)
def test_memory_errors_pending_repair_or_remap_failure_fails(changes, text):
    f = only("gpu.memory_errors", make_facts(gpus={2: changes}))
    assert (f.status, f.gpu) == ("fail", 2)
    assert text in f.message


def test_memory_errors_pre_ampere_gpu_with_no_pending_retirement_passes():
    facts = make_facts(gpus={2: {"remapped_rows": None, "retired_pages_pending": False}})
    assert only("gpu.memory_errors", facts).status == "ok"


def test_memory_errors_unknown_when_neither_mechanism_is_reported():
    facts = make_facts(gpus={2: {"remapped_rows": None, "retired_pages_pending": None}})
    assert (only("gpu.memory_errors", facts).status, only("gpu.memory_errors", facts).gpu) == (
        "unknown",
        2,
    )


# gpu.recovery_action


@pytest.mark.parametrize(
    "action", ["gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset", "bus_reset"]
)
def test_recovery_action_other_than_none_fails_naming_it(action):
    f = only("gpu.recovery_action", make_facts(gpus={4: {"recovery_action": action}}))
    assert (f.status, f.gpu, f.value) == ("fail", 4, action)
    assert f"GPU4 (serial 1652123000004) driver requires recovery action {action}" in f.message


# gpu.processes


def test_processes_leftover_process_fails_naming_the_pid():
    procs = (GpuProcess(pid=48213, name="python", used_memory_mib=30000),)
    f = only("gpu.processes", make_facts(gpus={0: {"processes": procs, "memory_used_mib": 30512}}))
    assert (f.status, f.gpu, f.value) == ("fail", 0, [48213])
    assert (
        f.message
        == "gpu.processes: GPU0 (serial 1652123000000) has 1 leftover process(es): pid 48213 python"
        " (30000 MiB) (kill them)"
    )


def test_processes_memory_in_use_without_a_process_fails_over_the_limit(tmp_path):
    facts = make_facts(gpus={1: {"memory_used_mib": 2048}})
    f = only("gpu.processes", facts)
    assert (f.status, f.gpu) == ("fail", 1) and "2048 MiB" in f.message and "1024 MiB" in f.message
    assert only("gpu.processes", make_facts(gpus={1: {"memory_used_mib": 1024}})).status == "ok"
    config = site(tmp_path, "checks:\n  gpu:\n    leftover_memory_max_mib: 4096\n")
    assert only("gpu.processes", facts, config).status == "ok"


def test_processes_unknown_when_nothing_is_reported():
    facts = make_facts(gpus={1: {"memory_used_mib": None, "processes": None}})
    assert only("gpu.processes", facts).status == "unknown"


# gpu.persistence


def test_persistence_off_warns_unless_the_site_requires_it(tmp_path):
    facts = make_facts(gpus={7: {"persistence_mode": False}})
    f = only("gpu.persistence", facts)
    assert (f.status, f.gpu) == ("warn", 7) and "GPU7 persistence mode off" in f.message
    config = site(tmp_path, "checks:\n  gpu:\n    require_persistence_mode: true\n")
    assert only("gpu.persistence", facts, config).status == "fail"


# gpu.power_limit


def test_power_limit_not_configured_is_one_ok_even_without_nvml():
    f = only("gpu.power_limit", make_facts().replace(gpus=None))
    assert f.status == "ok" and "not configured" in f.message


def test_power_limit_outside_the_tolerance_fails(tmp_path):
    config = site(tmp_path, "checks:\n  gpu:\n    power_limit_w: 700\n")
    f = only("gpu.power_limit", make_facts(gpus={2: {"power_limit_w": 500.0}}), config)
    assert (f.status, f.gpu, f.value, f.limit) == ("fail", 2, 500.0, 700.0)
    assert f.message == (
        "gpu.power_limit: GPU2 (serial 1652123000002) power limit 500 W, configured 700 W +-10 W (fix host setup)"
    )
    assert (
        only("gpu.power_limit", make_facts(gpus={2: {"power_limit_w": 695.0}}), config).status
        == "ok"
    )
    assert (
        only("gpu.power_limit", make_facts(gpus={2: {"power_limit_w": None}}), config).status
        == "unknown"
    )

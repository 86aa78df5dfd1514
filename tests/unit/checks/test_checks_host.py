"""Host checks (gpugate/checks/host.py): open-files limit, host memory, required filesystems."""

from __future__ import annotations

import pytest
from factories import findings_of, make_facts, only, site, statuses

from gpugate.checks.facts import Limits, Memory, Mount

HOST_CHECKS = ["host.nofile", "host.memory", "host.mounts"]


def mounts(*changed: dict):
    """A node whose mount facts are /checkpoints (healthy) changed by each dict in turn."""
    base = {"path": "/checkpoints", "mounted": True, "writable": True, "fsync_ms": 3.0}
    return make_facts(mounts=tuple(Mount(**{**base, **c}) for c in changed))


@pytest.mark.parametrize("check_id", HOST_CHECKS)
def test_a_healthy_node_gets_one_ok_per_check(check_id):
    assert only(check_id, make_facts()).status == "ok"


@pytest.mark.parametrize(
    ("check_id", "field", "source"),
    [
        ("host.nofile", "limits", "host"),
        ("host.memory", "memory", "host"),
        ("host.mounts", "mounts", "mounts"),
    ],
)
def test_without_their_facts_the_checks_are_unknown_and_say_why(check_id, field, source):
    facts = make_facts(**{field: None}, source_errors={source: "timed out after 2 s"})
    f = only(check_id, facts)
    assert f.status == "unknown" and "timed out after 2 s" in f.message


# host.nofile


def test_nofile_low_soft_limit_fails_naming_value_and_limit():
    f = only("host.nofile", make_facts(limits=Limits(nofile_soft=1024, nofile_hard=1048576)))
    assert (f.status, f.value, f.limit) == ("fail", 1024, 1048576)
    assert f.message == "host.nofile: open-files soft limit 1024 < 1048576 (ulimit -n)"


def test_nofile_minimum_comes_from_the_config(tmp_path):
    config = site(tmp_path, "checks:\n  host:\n    nofile_min: 65536\n")
    assert only("host.nofile", make_facts(limits=Limits(nofile_soft=65536)), config).status == "ok"


def test_nofile_soft_limit_not_reported_is_unknown():
    assert only("host.nofile", make_facts(limits=Limits(nofile_hard=1048576))).status == "unknown"


# host.memory


def test_memory_too_little_available_fails():
    f = only("host.memory", make_facts(memory=Memory(available_mib=4096, swap_used_mib=0)))
    assert (f.status, f.value, f.limit) == ("fail", 4096, 8192)
    assert f.message == "host.memory: available memory 4096 MiB < 8192 MiB (fix host setup)"


def test_memory_swap_in_use_only_warns(tmp_path):
    facts = make_facts(memory=Memory(available_mib=1900000, swap_used_mib=2048))
    f = only("host.memory", facts)
    assert (f.status, f.value, f.limit) == ("warn", 2048, 1024)
    assert "swap in use 2048 MiB > 1024 MiB" in f.message
    config = site(tmp_path, "checks:\n  host:\n    swap_used_max_mib: 4096\n")
    assert only("host.memory", facts, config).status == "ok"


def test_memory_both_problems_are_reported():
    facts = make_facts(memory=Memory(available_mib=100, swap_used_mib=9000))
    assert statuses(findings_of("host.memory", facts)) == ["fail", "warn"]


def test_memory_values_not_reported_are_unknown():
    facts = make_facts(memory=Memory(available_mib=None, swap_used_mib=None))
    assert statuses(findings_of("host.memory", facts)) == ["unknown", "unknown"]


# host.mounts


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"mounted": False, "writable": None, "fsync_ms": None, "error": "not a mount point"},
            "host.mounts: /checkpoints not mounted (not a mount point)",
        ),
        (
            {
                "writable": False,
                "fsync_ms": None,
                "error": "OSError: [Errno 30] Read-only file system",
            },
            "host.mounts: /checkpoints not writable (OSError: [Errno 30] Read-only file system)"
            " (fix host setup)",
        ),
        (
            {"fsync_ms": 2500.0},
            "host.mounts: /checkpoints write+fsync took 2500 ms > 1000 ms (check the filesystem)",
        ),
    ],
)
def test_mounts_unmounted_readonly_or_slow_fail(changes, message):
    f = only("host.mounts", mounts(changes))
    assert f.status == "fail"
    assert f.message == message


def test_mounts_fsync_limit_per_path_from_required_mounts(tmp_path):
    config = site(
        tmp_path, "sources:\n  required_mounts: [{path: /checkpoints, fsync_ms_max: 5000}]\n"
    )
    assert only("host.mounts", mounts({"fsync_ms": 2500.0}), config).status == "ok"
    config = site(
        tmp_path, "sources:\n  required_mounts: [{path: /checkpoints, fsync_ms_max: 2}]\n"
    )
    assert only("host.mounts", mounts({}), config).status == "fail"


def test_mounts_default_fsync_limit_comes_from_the_config(tmp_path):
    config = site(tmp_path, "checks:\n  host:\n    fsync_ms_max: 3000\n")
    assert only("host.mounts", mounts({"fsync_ms": 2500.0}), config).status == "ok"


def test_mounts_required_path_missing_from_the_facts_is_unknown(tmp_path):
    config = site(tmp_path, "sources:\n  required_mounts: [{path: /datasets, fsync_ms_max: 500}]\n")
    f = only("host.mounts", mounts({}), config)
    assert f.status == "unknown" and "/datasets" in f.message


@pytest.mark.parametrize("field", ["mounted", "writable", "fsync_ms"])
def test_mounts_unknown_state_is_unknown(field):
    assert only("host.mounts", mounts({field: None})).status == "unknown"


def test_mounts_every_mount_is_judged():
    facts = mounts({}, {"path": "/datasets", "mounted": False})
    f = only("host.mounts", facts)
    assert f.status == "fail" and "/datasets not mounted" in f.message


def test_mounts_none_required_and_none_listed_is_ok():
    assert only("host.mounts", make_facts(mounts=())).status == "ok"

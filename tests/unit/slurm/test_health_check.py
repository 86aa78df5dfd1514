"""HealthCheckTimeout and SLURM_NODE_IS_HEALTHY as each Slurm shows them (gpugate/slurm/
health_check.py; docs/slurm-facts.md, "HealthCheckTimeout and SLURM_NODE_IS_HEALTHY")."""

from __future__ import annotations

import pytest
from fakes import FakeSlurm
from slurm_recorded import FakeRunner

from gpugate.slurm.cli import CliBackend
from gpugate.slurm.control import SlurmError
from gpugate.slurm.health_check import (
    FIXED,
    FROM_SLURM_CONF,
    health_limit,
    node_is_healthy,
    parse_health_check_timeout,
    read_health_check_timeout,
)

# `scontrol show config`'s HealthCheck lines as each release prints them (slurm_print_key_pairs:
# "%-23s = %s"; src/api/config_info.c). HealthCheckTimeout is printed from 26.05 on, always
# (its default 60 where slurm.conf does not set it).
BEFORE_26_05 = (
    "HashPlugin              = hash/k12\n"
    "HealthCheckInterval     = 2 sec\n"
    "HealthCheckNodeState    = ANY\n"
    "HealthCheckProgram      = /usr/libexec/gpugate/gpugate-health\n"
    "InactiveLimit           = 0 sec\n"
)
SLURM_26_05 = (
    "HealthCheckInterval     = 2 sec\n"
    "HealthCheckNodeState    = ANY\n"
    "HealthCheckProgram      = /usr/libexec/gpugate/gpugate-health\n"
    "HealthCheckTimeout      = 17 sec\n"
    "HttpParserType          = http_parser/libhttp_parser\n"
)
SLURM_26_05_DEFAULT = SLURM_26_05.replace("17 sec", "60 sec")


@pytest.mark.parametrize(
    "shown, expected",
    [
        (BEFORE_26_05, None),  # 22.05, 24.11, 25.11: no such option
        (SLURM_26_05, 17),
        (SLURM_26_05_DEFAULT, 60),
        ("HealthCheckTimeout      = 65535 sec\n", 65535),
        ("HealthCheckTimeout      = 0 sec\n", None),  # slurmd resets 0 to 60: not a value to trust
        ("HealthCheckTimeout      = (null)\n", None),
        ("HealthCheckTimeoutX     = 30 sec\n", None),
        ("", None),
    ],
)
def test_health_check_timeout_from_each_releases_show_config(shown, expected):
    assert parse_health_check_timeout(shown) == expected


def test_the_timeout_is_read_through_the_adapter():
    slurm = FakeSlurm()
    slurm.shown_config = SLURM_26_05
    assert read_health_check_timeout(slurm) == (17, "")
    slurm.shown_config = BEFORE_26_05
    assert read_health_check_timeout(slurm) == (None, "")


SHOW_CONFIG = ("scontrol", "show", "config")


@pytest.mark.parametrize("shown, expected", [(SLURM_26_05, 17), (BEFORE_26_05, None)])
def test_the_cli_backend_asks_scontrol_show_config_once(shown, expected):
    runner = FakeRunner().ok(SHOW_CONFIG, shown)
    assert read_health_check_timeout(CliBackend(runner=runner)) == (expected, "")
    assert runner.argvs == [SHOW_CONFIG]


@pytest.mark.parametrize("status, rc", [("timeout", None), ("missing", None), ("nonzero", 1)])
def test_a_failed_scontrol_is_the_older_path_with_its_why(status, rc):
    runner = FakeRunner().fail(SHOW_CONFIG, status=status, rc=rc)
    timeout, why = read_health_check_timeout(CliBackend(runner=runner))
    assert timeout is None and why.startswith("cannot read HealthCheckTimeout (")


def test_an_unreadable_config_says_why_and_keeps_the_fixed_limit():
    slurm = FakeSlurm()
    slurm.errors["config"] = SlurmError("scontrol: timed out after 10 s")
    timeout, why = read_health_check_timeout(slurm)
    assert timeout is None and "timed out" in why
    assert health_limit(20.0, timeout).timeout_s == 60


@pytest.mark.parametrize(
    "deadline, timeout, budget, limit, source",
    [
        (20.0, None, 20.0, 60, FIXED),  # the older path: today's budget, unchanged
        (55.0, None, 55.0, 60, FIXED),
        (90.0, None, 55.0, 60, FIXED),  # a long deadline on older Slurm: 5 s below the fixed 60
        (20.0, 60, 20.0, 60, FROM_SLURM_CONF),
        (20.0, 17, 12.0, 17, FROM_SLURM_CONF),  # sized below a short HealthCheckTimeout
        (300.0, 600, 300.0, 600, FROM_SLURM_CONF),  # a long one lets a long deadline run
        (20.0, 4, 2.0, 4, FROM_SLURM_CONF),  # the margin is at most half the limit
    ],
)
def test_the_budget_stays_below_slurmds_limit(deadline, timeout, budget, limit, source):
    got = health_limit(deadline, timeout)
    assert (got.budget_s, got.timeout_s, got.source) == (budget, limit, source)
    assert got.budget_s < got.timeout_s


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"SLURM_NODE_IS_HEALTHY": "yes"}, True),
        ({"SLURM_NODE_IS_HEALTHY": "no"}, False),
        ({}, None),  # before 26.05.2, without health_check_report, or slurmd's start-up run
        ({"SLURM_NODE_IS_HEALTHY": "YES"}, None),  # slurmd writes lower case only
        ({"SLURM_NODE_IS_HEALTHY": ""}, None),
    ],
)
def test_node_is_healthy_where_slurmd_sets_it(environ, expected):
    assert node_is_healthy(environ) is expected

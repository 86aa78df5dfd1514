"""The health run under slurmd's limit (HealthCheckTimeout on Slurm 26.05, a fixed 60 s before)
and with slurmctld's SLURM_NODE_IS_HEALTHY (26.05.2+): FakeSlurm and a replayed snapshot."""

from __future__ import annotations

import json

import pytest
from factories import make_facts
from fakes import NODE
from health_setup import ECC, cluster, setup

from gpugate.hooks import health
from gpugate.hooks.health import run_health
from gpugate.slurm.control import SlurmError
from gpugate.slurm.records import NodeInfo

TIMEOUT_17 = "HealthCheckProgram      = /x/gpugate-health\nHealthCheckTimeout      = 17 sec\n"
BEFORE_26_05 = "HealthCheckInterval     = 2 sec\nHealthCheckProgram      = /x/gpugate-health\n"


ADMINS = NodeInfo(name=NODE, state="IDLE", flags=("DRAIN",), reason="admin: bios",
                  partitions=("gpu",))  # fmt: skip


def events(config) -> list[dict]:
    """The health runs' lines of events.jsonl, oldest first."""
    with open(f"{config.state_dir}/events.jsonl") as fh:
        return [e for e in map(json.loads, fh) if e["hook"] == "health"]


@pytest.fixture
def deadlines(monkeypatch) -> list[float]:
    """The deadline each gather of the health run was given."""
    seen: list[float] = []
    real = health.gather

    def gather(*args, **kwargs):
        seen.append(kwargs["deadline_s"])
        return real(*args, **kwargs)

    monkeypatch.setattr(health, "gather", gather)
    return seen


@pytest.mark.parametrize(
    "shown, budget, limit, source",
    [
        (BEFORE_26_05, 20.0, 60, "fixed"),  # 22.05/24.11: today's budget (health.deadline_s)
        (TIMEOUT_17, 12.0, 17, "HealthCheckTimeout"),  # 26.05: 5 s below HealthCheckTimeout
    ],
)
def test_the_run_sizes_its_budget_below_slurmds_limit(tmp_path, deadlines, shown, budget, limit,
                                                      source):  # fmt: skip
    config = setup(tmp_path, make_facts())
    slurm = cluster()
    slurm.shown_config = shown
    result = run_health(config, NODE, slurm, environ={})
    assert deadlines == [budget]
    assert (result.budget_s, result.slurm_timeout_s, result.timeout_from) == (budget, limit,
                                                                              source)  # fmt: skip
    line = events(config)[-1]
    assert (line["budget_s"], line["slurm_timeout_s"], line["timeout_from"]) == (budget, limit,
                                                                                 source)  # fmt: skip


def test_an_unreadable_config_keeps_the_older_path_and_the_run_goes_on(tmp_path, deadlines,
                                                                      capsys):  # fmt: skip
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    slurm.errors["config"] = SlurmError("scontrol: timed out after 10 s")
    result = run_health(config, NODE, slurm, environ={})
    assert deadlines == [20.0] and result.timeout_from == "fixed"
    assert result.drained  # the check still runs and acts
    assert "cannot read HealthCheckTimeout" in capsys.readouterr().err


def test_a_long_deadline_is_cut_to_the_fixed_limit_on_older_slurm(tmp_path, deadlines):
    config = setup(tmp_path, make_facts())
    config = config.replace(health=config.health.replace(deadline_s=90.0))
    result = run_health(config, NODE, cluster(), environ={})
    assert deadlines == [55.0] and result.budget_s == 55.0


@pytest.mark.parametrize(
    "environ, recorded", [({"SLURM_NODE_IS_HEALTHY": "yes"}, True), ({}, None)]
)
def test_slurmctlds_word_is_recorded_with_the_run(tmp_path, environ, recorded, capsys):
    config = setup(tmp_path, make_facts())
    result = run_health(config, NODE, cluster(), environ=environ)
    assert result.node_is_healthy is recorded and result.action == "allow"
    assert events(config)[-1]["node_is_healthy"] is recorded
    assert "SLURM_NODE_IS_HEALTHY" not in capsys.readouterr().err  # it agrees with the read


@pytest.mark.parametrize(
    "info, word",
    [
        (NodeInfo(name=NODE, state="IDLE", partitions=("gpu",)), "no"),  # resumed since
        (NodeInfo(name=NODE, state="IDLE", flags=("MAINT",), partitions=("gpu",)), "yes"),
        (ADMINS, "yes"),
    ],
)
def test_a_word_the_read_contradicts_is_noted_and_the_read_counts(tmp_path, info, word, capsys):
    config = setup(tmp_path, make_facts())
    slurm = cluster(info)
    result = run_health(config, NODE, slurm, environ={"SLURM_NODE_IS_HEALTHY": word})
    err = capsys.readouterr().err
    assert "(SLURM_NODE_IS_HEALTHY), Slurm now says" in err
    # The read decides: the admin's drain is left alone whatever the word said.
    assert result.blocked_by == ("admin" if info.reason else None)
    assert slurm.drains == [] and slurm.resumed == []


def test_a_word_the_read_agrees_with_is_not_noted(tmp_path, capsys):
    config = setup(tmp_path, make_facts())
    run_health(config, NODE, cluster(ADMINS), environ={"SLURM_NODE_IS_HEALTHY": "no"})
    assert "SLURM_NODE_IS_HEALTHY" not in capsys.readouterr().err


def test_without_slurms_read_the_word_is_said_and_nothing_is_done(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    slurm.errors["node"] = RuntimeError("slurmctld down")
    result = run_health(config, NODE, slurm, environ={"SLURM_NODE_IS_HEALTHY": "yes"})
    assert (result.status, result.drained) == ("error", False)
    assert result.message.endswith("(slurmctld said in service when it asked for this run)")

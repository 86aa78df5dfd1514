"""The budget fits small partitions: a node useless for any job is drained past the share
(up to half the partition, never its last node in service); a budget that cannot act warns."""

from __future__ import annotations

import os

import pytest
from budget_cluster import NOW, cluster, node
from factories import default_config, drain_node
from fakes import FakeSlurm

from gpugate.config import ConfigError, load_config
from gpugate.gate.budget import budget_warnings, check_budget, keeps_drain, warn_daily
from gpugate.slurm.records import NodeInfo
from gpugate.store.held import held_entries, held_now


def cfg(**changes):
    return default_config().budget.replace(**changes)


def test_a_second_gpu_off_the_bus_on_three_nodes_is_drained():
    nodes = cluster(3, ours=1)  # 10 % of 3 is nothing; "at least 1" is spent
    assert not check_budget(nodes, "n01", cfg(), NOW, "gpu.driver").allowed
    for check in ("gpu.lost", "kernel.gpu_bus", "kernel.xid", "gpu.ecc"):
        assert check_budget(nodes, "n01", cfg(), NOW, check).allowed, check


def test_never_the_last_node_in_service():
    verdict = check_budget(cluster(3, ours=2), "n02", cfg(), NOW, "gpu.lost")
    assert not verdict.allowed and "one node left in service" in verdict.why
    # An admin's drain leaves fewer nodes up: gpugate may take one fewer.
    nodes = cluster(3, ours=1, admin=1)
    assert not check_budget(nodes, "n02", cfg(), NOW, "gpu.lost").allowed
    # The share itself stands: a 1-node partition may still lose its node, as before.
    assert check_budget(cluster(1), "n00", cfg(), NOW, "gpu.lost").allowed


def test_half_of_a_large_partition_then_the_window():
    nodes = cluster(100, ours=49, age_s=7200)  # drained long ago: the window is free
    assert check_budget(nodes, "n99", cfg(), NOW, "gpu.ecc").allowed
    nodes = cluster(100, ours=50, age_s=7200)
    assert not check_budget(nodes, "n99", cfg(), NOW, "gpu.ecc").allowed
    # A fleet-wide false positive still drains at most max_drains_per_window an hour.
    recent = cluster(100, ours=10, age_s=60)
    verdict = check_budget(recent, "n99", cfg(), NOW, "gpu.ecc")
    assert not verdict.allowed and "10 gpugate drains in the last 3600 s" in verdict.why


def test_the_hardware_list_and_share_are_the_sites():
    nodes = cluster(3, ours=1)
    assert not check_budget(nodes, "n01", cfg(hardware_checks=[]), NOW, "gpu.lost").allowed
    assert check_budget(
        nodes, "n01", cfg(hardware_checks=["gpu.driver"]), NOW, "gpu.driver"
    ).allowed
    assert not check_budget(
        cluster(4, ours=1), "n01", cfg(hardware_share=0.25), NOW, "gpu.lost"
    ).allowed


def test_simultaneous_hardware_drains_keep_one_node_up():
    nodes = cluster(3)
    for name in ("n00", "n01", "n02"):
        nodes[name] = node(name, ours=True, age_s=1)
    kept = [n for n in nodes if keeps_drain(nodes, n, cfg(), NOW, "gpu.lost").allowed]
    assert kept == ["n00", "n01"]
    assert not keeps_drain(nodes, "n01", cfg(), NOW, "gpu.driver").allowed


def test_a_drain_passes_its_check_to_the_budget(tmp_path):
    config = default_config().replace(state_dir=str(tmp_path), budget=cfg(settle_s=0, jitter_s=0))
    slurm = FakeSlurm(nodes=[*cluster(2, ours=1).values(), node("n02")])
    outcome = drain_node(slurm, "n02", "kernel.gpu_bus", "GPU1 fell off the bus", config)
    assert outcome.drained
    outcome = drain_node(slurm, "n01", "kernel.gpu_bus", "GPU0 fell off the bus", config)
    assert (outcome.drained, outcome.blocked_by) == (False, "budget")


def test_a_held_drain_is_recorded_once_for_every_view(tmp_path):
    config = default_config().replace(state_dir=str(tmp_path), budget=cfg(settle_s=0, jitter_s=0))
    slurm = FakeSlurm(nodes=[*cluster(20, ours=2).values()])
    for _ in range(2):  # the prologs of two jobs: one entry
        outcome = drain_node(slurm, "n10", "gpu.temperature", "GPU2 95 C", config)
        assert outcome.blocked_by == "budget"
    [entry] = held_entries(str(tmp_path))
    assert entry.node == "n10" and entry.check == "gpu.temperature"
    assert entry.reason == "gpugate: gpu.temperature: GPU2 95 C"
    assert "already drained 2 of 20" in entry.why
    assert held_now(config)["n10"] == entry
    assert "would drain (budget exceeded" in slurm.node_comments[0][1]


def test_budget_warnings_name_what_cannot_act():
    assert budget_warnings(cfg()) == []
    [w] = budget_warnings(cfg(min_drains_allowed=0))
    assert "partitions under 10 nodes" in w
    nodes = {
        **cluster(3, parts=("small",)),
        "b": NodeInfo(name="b", state="IDLE", partitions=("big",)),
    }
    nodes.update(
        {f"b{i}": NodeInfo(name=f"b{i}", state="IDLE", partitions=("big",)) for i in range(12)}
    )
    [w] = budget_warnings(cfg(min_drains_allowed=0), nodes)
    assert w.startswith("partition small (3 nodes): the drain budget allows 0 drains")
    assert "never drain" in budget_warnings(cfg(max_drains_per_window=0))[0]


def test_warned_once_a_day(tmp_path):
    config = default_config().replace(state_dir=str(tmp_path), budget=cfg(min_drains_allowed=0))
    assert warn_daily(config)
    assert warn_daily(config) == []  # the stamp: one stat on later runs
    os.utime(tmp_path / ".budget-warned", (NOW - 2 * 86400, 1))
    assert warn_daily(config)
    assert "DRAIN BUDGET TOO SMALL TO ACT" in (tmp_path / "gpugate.log").read_text()
    assert warn_daily(default_config().replace(state_dir=str(tmp_path / "ok"))) == []


def test_gpugate_check_prints_the_warning(tmp_path, capsys):
    from factories import make_facts
    from prolog_setup import setup

    from gpugate import cli

    config = setup(tmp_path, make_facts())
    site = tmp_path / "site.yaml"
    site.write_text(f"facts_file: {config.facts_file}\nstate_dir: {tmp_path / 'state'}\n"
                    "budget:\n  min_drains_allowed: 0\n")  # fmt: skip
    assert cli.main(["check", "--config", str(site)]) == 0
    assert "WARN    drain budget: budget.min_drains_allowed is 0" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["hardware_share: 1.5", "hardware_checks: [gpu.nonesuch]"])
def test_bad_budget_settings_are_refused(tmp_path, bad):
    site = tmp_path / "site.yaml"
    site.write_text(f"budget:\n  {bad}\n")
    with pytest.raises(ConfigError, match=r"budget\.hardware_"):
        load_config(str(site))

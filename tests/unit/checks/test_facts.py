"""The snapshot contract: YAML round trip, absent means unknown, wrong shapes refused."""

from __future__ import annotations

import os

import paths
import pytest
from factories import make_facts, make_gpu

from gpugate.checks.facts import SnapshotError, facts_from_dict, load_snapshot
from gpugate.record import Record
from gpugate.yamlio import dump_yaml, parse_yaml

SNAPSHOTS = str(paths.SNAPSHOTS)


def test_snapshot_round_trips_through_yaml():
    facts = make_facts(gpus={2: {"error": "gpu_is_lost", "temperature_c": None}})
    again = facts_from_dict(parse_yaml(dump_yaml(facts.to_dict())))
    assert again == facts


def test_bundled_healthy_snapshot_has_the_contract_keys():
    facts = load_snapshot(os.path.join(SNAPSHOTS, "h100-healthy.yaml"))
    assert facts.node == "gpu-node-01"
    assert len(facts.gpus) == 8
    gpu = facts.gpus[0]
    assert gpu.pcie.max_width == 16 and len(gpu.nvlink_active) == 18
    assert gpu.remapped_rows.pending is False
    assert facts.infiniband[0].state == "ACTIVE" and facts.limits.nofile_soft == 1048576


def test_absent_keys_are_unknown_not_zero():
    facts = facts_from_dict({"gpus": [{"index": 0}]})
    assert facts.gpus[0].ecc_aggregate_uncorrected is None
    assert facts.limits is None and facts.kernel_log is None


def test_unquoted_version_numbers_become_strings():
    assert facts_from_dict({"driver_version": 550.54}).driver_version == "550.54"


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"gpus": {"index": 0}}, "snapshot.gpus: expected a list"),
        ({"gpus": [{"index": "zero"}]}, "snapshot.gpus[0].index: expected an integer"),
        ({"gpus": [{"index": 0, "persistence_mode": "yes"}]}, "persistence_mode: expected true"),
        ({"gpus": [{"uuid": "x"}]}, "snapshot.gpus[0]: Gpu: missing field 'index'"),
        ({"limits": [1]}, "snapshot.limits: expected a mapping"),
        ("just text", "snapshot: expected a mapping"),
    ],
)
def test_wrong_shapes_name_the_key(data, where):
    with pytest.raises(SnapshotError) as err:
        facts_from_dict(data)
    assert where in str(err.value)


def test_records_are_immutable_and_compare_by_value():
    gpu = make_gpu(1)
    with pytest.raises(AttributeError):
        gpu.index = 2
    assert gpu == make_gpu(1) and gpu != make_gpu(2)
    assert gpu.replace(temperature_c=90.0).temperature_c == 90.0
    assert hash(gpu) == hash(make_gpu(1))


def test_record_rejects_unknown_fields():
    class Point(Record):
        x: int
        y: int = 0

    assert Point(x=1).y == 0
    with pytest.raises(TypeError, match="unknown field"):
        Point(x=1, z=2)

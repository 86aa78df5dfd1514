"""The isolation's parts without Slurm: which faults narrow to a GPU, the device rule, the records."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpugate.checks.facts import Gpu
from gpugate.checks.findings import fail, ok, warn
from gpugate.config import load_config
from gpugate.isolate import cgroup, state
from gpugate.isolate.comment import IsolatedGpu, format_comment, parse_comment
from gpugate.isolate.plan import targets


@pytest.fixture
def config(tmp_path: Path):
    base = load_config()
    iso = base.isolate.replace(unit="gpu", cgroup_devices=str(tmp_path / "devices"))
    admin = base.admin.replace(history_dir=str(tmp_path / "history"))
    (tmp_path / "state").mkdir()
    return base.replace(isolate=iso, admin=admin, state_dir=str(tmp_path / "state"))


def gpus(minors: dict[int, int | None]) -> tuple[Gpu, ...]:
    return tuple(Gpu(index=i, serial=f"S{i}", minor_number=m) for i, m in sorted(minors.items()))


ECC3 = fail("gpu.ecc", "GPU3 volatile uncorrectable ECC 2 (limit 0)", gpu=3)


def test_one_gpu_fault_narrows_to_that_gpu_and_its_minor(config) -> None:
    chosen = targets(config, [ECC3], gpus({i: i + 10 for i in range(8)}))
    assert isinstance(chosen, list) and len(chosen) == 1
    assert (chosen[0].index, chosen[0].minor, chosen[0].serial) == (3, 13, "S3")
    assert chosen[0].why.startswith("gpu.ecc: GPU3")


@pytest.mark.parametrize(
    ("failing", "why"),
    [
        ([fail("nvlink.fabric", "fabric not ready", gpu=3)], "concerns the whole node"),
        ([fail("gpu.ecc", "ECC off somewhere")], "names no single GPU"),
        ([ECC3, fail("gpu.ecc", "GPU5 ECC", gpu=5)], "2 GPUs at fault"),
        ([ECC3, fail("host.memory", "low")], "concerns the whole node"),
    ],
)
def test_node_wide_or_too_many_faults_keep_the_drain(config, failing, why) -> None:
    chosen = targets(config, failing, gpus({i: i for i in range(8)}))
    assert isinstance(chosen, str) and why in chosen


def test_unknown_minor_is_never_guessed_from_the_index(config) -> None:
    chosen = targets(config, [ECC3], gpus({3: None}))
    assert isinstance(chosen, str) and "minor number is unknown" in chosen


def test_isolate_off_or_absent_keeps_the_drain(config) -> None:
    off = config.replace(isolate=config.isolate.replace(unit="node"))
    assert targets(off, [ECC3], gpus({3: 3})) == "isolate.unit is node"
    assert targets(config.replace(isolate=None), [ECC3], gpus({3: 3})) == "isolate.unit is node"


def test_the_comment_round_trips_after_gpugates_prefix() -> None:
    gpu = IsolatedGpu(index=3, minor=3, serial="165", since=1764782400, why="gpu.ecc: a; b=1")
    text = "gpugate: " + format_comment([gpu])
    (back,) = parse_comment(text)
    assert back.replace(why="") == gpu.replace(why="") and back.why == "gpu.ecc: a, b=1"
    assert parse_comment("an admin's own comment") == []
    assert format_comment([]) == ""


def fake_devices(root: Path, group: str = "slurm") -> Path:
    """A devices hierarchy as cgroupfs shows it: control files exist, writes go to them."""
    (root / group).mkdir(parents=True)
    for name in ("devices.deny", "devices.allow"):
        (root / name).write_text("")
        (root / group / name).write_text("")
    return root / group


def test_the_rule_goes_to_slurmds_group_per_node_or_shared(tmp_path: Path) -> None:
    shared = fake_devices(tmp_path / "a")
    assert cgroup.deny(str(tmp_path / "a"), "n1", 3) == str(shared)
    assert (shared / "devices.deny").read_text() == "c 195:3 rwm"
    per_node = fake_devices(tmp_path / "b", "slurm_n1")
    cgroup.allow(str(tmp_path / "b"), "n1", 3)
    assert (per_node / "devices.allow").read_text() == "c 195:3 rwm"


def test_neither_hierarchy_is_a_problem(tmp_path: Path) -> None:
    said = cgroup.problem(str(tmp_path)) or ""
    assert "neither a cgroup v1 devices controller nor a cgroup v2 mount" in said
    fake_devices(tmp_path)
    assert cgroup.problem(str(tmp_path)) is None  # root runs the tests
    with pytest.raises(ValueError):
        cgroup.rule(-1)


def record(node: str = "n1", status: str = state.APPLIED) -> state.Isolation:
    gpu = IsolatedGpu(index=3, minor=3, serial="S3", since=1, why="gpu.ecc: GPU3 bad")
    line = "NodeName=n1 Name=gpu File=/dev/nvidia3"
    return state.Isolation(node=node, state=status, gpus=(state.Isolated(gpu=gpu, line=line),))


def test_records_round_trip_in_both_places(config) -> None:
    state.save(config, record())
    assert state.load_local(config) == record()
    assert state.load(state.shared_path(config, "n1")) == record()
    state.forget(config, "n1", here=True)
    assert state.load_local(config) is None
    assert state.load(state.shared_path(config, "n1")) is None


def test_a_broken_record_is_an_error_not_a_crash(config) -> None:
    Path(state.local_path(config)).write_text('{"node": "n1"}')
    with pytest.raises(ValueError, match="not an isolation record"):
        state.load_local(config)
    assert state.isolated_indices(config, None) == frozenset()
    target = Path(config.state_dir) / "elsewhere.json"
    target.write_text(record().to_json().__repr__())
    link = Path(config.state_dir) / "link.json"
    os.symlink(target, link)
    with pytest.raises(ValueError):
        state.load(str(link))  # a symlink is never followed


def test_only_applied_isolations_turn_failures_into_warnings(config) -> None:
    found = [ECC3, fail("gpu.ecc", "GPU5 ECC", gpu=5), ok("gpu.count", "8 GPUs")]
    now = gpus({i: i for i in range(8)})
    assert state.without_isolated(config, found, now) == found  # nothing isolated
    state.save(config, record(status=state.REQUESTED))
    assert state.without_isolated(config, found, now) == found
    state.save(config, record())
    out = state.without_isolated(config, found, now)
    assert out[0].status == "warn" and "GPU3 is isolated" in out[0].message
    assert out[1:] == found[1:]
    assert warn("x", "y").status == "warn"


def shifted() -> tuple[Gpu, ...]:
    """After a reboot that lost GPU 1 from the bus: the isolated GPU (minor 3, serial S3) is
    NVML index 2 now, and index 3 is the healthy minor 4."""
    return (
        Gpu(index=0, serial="S0", minor_number=0),
        Gpu(index=1, serial="S2", minor_number=2),
        Gpu(index=2, serial="S3", minor_number=3),
        Gpu(index=3, serial="S4", minor_number=4),
    )


def test_the_isolated_gpu_is_found_by_device_when_indices_shift(config) -> None:
    state.save(config, record())  # isolated as index 3, minor 3, serial S3
    assert state.isolated_indices(config, shifted()) == frozenset({2})
    found = [fail("gpu.ecc", "GPU2 ECC", gpu=2), fail("gpu.ecc", "GPU3 ECC", gpu=3)]
    out = state.without_isolated(config, found, shifted())
    # The isolated GPU's fault is a warning; the healthy GPU now at its old index still fails.
    assert out[0].status == "warn" and "GPU2 is isolated" in out[0].message
    assert out[1] == found[1]


@pytest.mark.parametrize(
    ("gpu", "isolated"),
    [
        (Gpu(index=5, serial="S3", minor_number=3), True),  # same device, another index
        (Gpu(index=3, serial="S9", minor_number=3), False),  # another board in its slot
        (Gpu(index=3, serial="S3", minor_number=4), False),  # its serial, another device?
        (Gpu(index=5, serial=None, minor_number=3), True),  # no serial: the minor decides
        (Gpu(index=5, serial="S3", minor_number=None), True),  # no minor: the serial decides
        (Gpu(index=3, serial="S4", minor_number=None), False),
    ],
)
def test_a_gpu_matches_by_minor_and_serial(gpu, isolated) -> None:
    assert state.matches(record().gpus[0].gpu, gpu) is isolated


def test_a_gpu_that_tells_no_device_falls_back_to_the_recorded_index(config) -> None:
    state.save(config, record())
    lost = (Gpu(index=2, serial="S2", minor_number=2), Gpu(index=3, error="gpu_is_lost"))
    assert state.isolated_indices(config, lost) == frozenset({3})
    # Not when the isolated GPU is seen elsewhere, nor when the GPU there tells its device.
    assert state.isolated_indices(config, (*lost, Gpu(index=4, serial="S3", minor_number=3))) == frozenset({4})  # fmt: skip
    assert state.isolated_indices(config, (Gpu(index=3, serial="S4", minor_number=4),)) == frozenset()  # fmt: skip
    assert state.isolated_indices(config, None) == frozenset({3})


def test_the_prolog_writes_the_rule_again_after_a_reboot(config, tmp_path: Path) -> None:
    group = fake_devices(tmp_path / "devices")
    state.sync(config, "n1")
    assert (group / "devices.deny").read_text() == ""  # nothing isolated: nothing written
    state.save(config, record())
    state.sync(config, "n1")
    assert (group / "devices.deny").read_text() == "c 195:3 rwm"

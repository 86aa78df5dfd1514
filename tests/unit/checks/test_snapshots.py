"""The packaged example snapshots through `gpugate check`: the healthy one passes, and each
broken one fails exactly the check(s) its header names."""

from __future__ import annotations

import json
import os

import paths
import pytest

from gpugate.checks.facts import facts_from_dict
from gpugate.cli import main
from gpugate.yamlio import parse_yaml

SNAPSHOTS = str(paths.SNAPSHOTS)

# snapshot -> the check ids it must fail, no more and no fewer.
BROKEN = {
    "h100-ecc.yaml": {"gpu.ecc"},
    "h100-gpu-lost.yaml": {"gpu.lost"},
    "h100-xid79.yaml": {"kernel.xid"},
    "h100-nvlink-down.yaml": {"nvlink.links"},
    "h100-ib-down.yaml": {"ib.ports"},
    "h100-hot.yaml": {"gpu.temperature", "gpu.throttle"},
    "h100-pcie-x8.yaml": {"pcie.link"},
    "h100-nofile.yaml": {"host.nofile"},
    "h100-leftover-procs.yaml": {"gpu.processes"},
    "h100-mount-slow.yaml": {"host.mounts"},
    "h100-driver-mismatch.yaml": {"gpu.driver"},
    "b200-fabric-in-progress.yaml": {"nvlink.fabric"},
    "b200-nvlink-down.yaml": {"nvlink.links"},
    "gb200-nvlink-down.yaml": {"nvlink.links"},
    "gh200-remap-pending.yaml": {"gpu.memory_errors"},
}


def check(name: str, capsys) -> tuple[int, dict]:
    """`gpugate check --json` over one packaged snapshot with the packaged defaults."""
    path = os.path.join(SNAPSHOTS, name)
    code = main(["check", "--facts", path, "--config", "/dev/null", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_healthy_snapshot_passes_with_nothing_but_ok(capsys):
    code, out = check("h100-healthy.yaml", capsys)
    assert (code, out["status"]) == (0, "ok")
    assert {f["status"] for f in out["findings"]} == {"ok"}


@pytest.mark.parametrize(("name", "failing"), sorted(BROKEN.items()))
def test_each_broken_snapshot_fails_exactly_its_check(capsys, name, failing):
    code, out = check(name, capsys)
    assert (code, out["status"]) == (1, "fail")
    assert {f["check"] for f in out["findings"] if f["status"] == "fail"} == failing
    assert not [f for f in out["findings"] if f["status"] == "unknown"]


def test_every_broken_snapshot_is_in_the_table_and_names_its_checks():
    headers = {}
    for name in os.listdir(SNAPSHOTS):
        with open(os.path.join(SNAPSHOTS, name), encoding="utf-8") as fh:
            headers[name] = fh.read(400)
    assert {n for n, head in headers.items() if head.startswith("# Broken: ")} == set(BROKEN)
    for name, failing in BROKEN.items():
        assert all(check_id in headers[name] for check_id in failing), name


@pytest.mark.parametrize("name", sorted(os.listdir(SNAPSHOTS)))
def test_every_packaged_gpu_names_its_own_device_file(name):
    """Each GPU NVML answered for carries its minor (/dev/nvidia<minor>), no two alike, so
    `isolate.unit: gpu` can be tried on every snapshot; a GPU without a handle has none."""
    with open(os.path.join(SNAPSHOTS, name), encoding="utf-8") as fh:
        facts = facts_from_dict(parse_yaml(fh.read(), name))
    gpus = facts.gpus or ()
    answered = [g for g in gpus if g.pci_bus_id is not None]
    assert all(g.minor_number is not None for g in answered), name
    minors = [g.minor_number for g in gpus if g.minor_number is not None]
    assert len(set(minors)) == len(minors), f"{name}: minors {minors}"
    assert all(0 <= m < 255 for m in minors)  # /dev/nvidia255 is nvidiactl, no GPU

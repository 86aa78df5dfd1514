"""A site set for `isolate.unit: gpu` in a temporary directory: the config, a devices tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpugate.config import load_config
from gpugate.config.schema import Config


def fake_devices(tmp_path: Path) -> Path:
    """A cgroup v1 devices tree of plain files (`cgroup/`, `cgroup/slurm/`, each with empty
    devices.deny and devices.allow): what gpugate writes is read back from them."""
    devices = tmp_path / "cgroup"
    (devices / "slurm").mkdir(parents=True)
    for name in ("devices.deny", "devices.allow"):
        (devices / name).write_text("")
        (devices / "slurm" / name).write_text("")
    return devices


def gpu_config(tmp_path: Path, slurm_conf: Path, devices: Path, **isolate: Any) -> Config:
    """The packaged config with `isolate.unit: gpu` on these files, its state and history
    under `tmp_path` (state/ made); `isolate`: further isolate settings."""
    (tmp_path / "state").mkdir()
    base = load_config()
    assert base.isolate is not None
    return base.replace(
        state_dir=str(tmp_path / "state"),
        admin=base.admin.replace(history_dir=str(tmp_path / "history")),
        isolate=base.isolate.replace(
            unit="gpu", slurm_conf=str(slurm_conf), cgroup_devices=str(devices), **isolate
        ),
    )


def probe_scratch(tmp_path: Path) -> str:
    """A private (0700) directory for the probe's device node, on a filesystem that allows
    devices (the test's tmp_path)."""
    where = tmp_path / "scratch"
    where.mkdir(mode=0o700)
    return str(where)

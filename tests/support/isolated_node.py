"""A node with one GPU isolated by gpugate, as its hooks find it: the Slurm files without the GPU's
device, the device rule's cgroup, and the node's isolation record (gpugate/isolate/)."""

from __future__ import annotations

from pathlib import Path

from factories import make_facts, make_gpu

from gpugate.isolate import state
from gpugate.isolate.comment import IsolatedGpu

NODE = "gpu-node-01"


def gres_conf(files: str) -> str:
    """gres.conf with the node's GPU files `files` (a hostlist such as `/dev/nvidia[0-2,4-7]`)."""
    return f"AutoDetect=off\nNodeName={NODE} Name=gpu File={files}\n"


def slurm_conf(count: int) -> str:
    return f"ClusterName=c\nGresTypes=gpu\nNodeName={NODE} CPUs=2 Gres=gpu:{count} State=UNKNOWN\n"


def isolated(config, tmp_path: Path, gpu: int = 3, gpus: int = 8, unit: str = "node",
             gres: str | None = None, count: int | None = None, record: bool = True):  # fmt: skip
    """`config` for a node whose GPU `gpu` (NVML index and minor alike) gpugate took out of
    Slurm's service: gres.conf lists the other `gpus - 1` devices (or is `gres`), slurm.conf
    counts them (or `count`), the node's record says APPLIED (none without `record`, as after
    `gpugate resume`); `isolate.unit` is `unit`."""
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    others = ",".join(str(i) for i in range(gpus) if i != gpu)
    (etc / "gres.conf").write_text(gres or gres_conf(f"/dev/nvidia[{others}]"))
    (etc / "slurm.conf").write_text(slurm_conf(gpus - 1 if count is None else count))
    devices = tmp_path / "cgroup"
    (devices / "slurm").mkdir(parents=True, exist_ok=True)
    for name in ("devices.deny", "devices.allow"):
        (devices / name).write_text("")
        (devices / "slurm" / name).write_text("")
    config = config.replace(
        admin=config.admin.replace(history_dir=str(tmp_path / "history")),
        isolate=config.isolate.replace(
            unit=unit, slurm_conf=str(etc / "slurm.conf"), cgroup_devices=str(devices)
        ),
    )
    Path(config.state_dir).mkdir(parents=True, exist_ok=True)
    if record:
        taken = IsolatedGpu(index=gpu, minor=gpu, serial=f"1652123{gpu:06d}", since=1,
                            why=f"gpu.ecc: GPU{gpu} uncorrectable ECC")  # fmt: skip
        line = f"NodeName={NODE} Name=gpu File=/dev/nvidia{gpu}"
        state.save(config, state.Isolation(node=NODE, state=state.APPLIED,
                                           gpus=(state.Isolated(gpu=taken, line=line),)))  # fmt: skip
    return config


def facts_with_minors(changes: dict[int, dict] | None = None, gpus: int = 8):
    """A healthy node whose GPUs carry their device minors (= their NVML indices, as on the
    reference boards), with per-GPU `changes`."""
    changes = changes or {}
    return make_facts(gpus=[make_gpu(i, minor_number=i, **changes.get(i, {})) for i in range(gpus)])

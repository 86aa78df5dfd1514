"""`gpugate health`'s site: config and snapshot, the cluster it sees, boots and swapped GPUs, the audit."""

from __future__ import annotations

import json

from factories import default_config
from fakes import NODE, FakeSlurm

from gpugate.yamlio import dump_yaml

ECC = {3: {"ecc_aggregate_uncorrected": 120}}


def write_boot(tmp_path, boot: str) -> None:
    """This boot's id under tmp_path's proc/sys/kernel/random (the replayed /proc)."""
    path = tmp_path / "proc/sys/kernel/random"
    path.mkdir(parents=True, exist_ok=True)
    (path / "boot_id").write_text(boot + "\n")


def setup(tmp_path, facts, passes: int = 2, boot: str = "boot-1"):
    """Config replaying `facts` (the same `facts_file` replay the prolog uses)."""
    swap(tmp_path, facts)
    write_boot(tmp_path, boot)
    config = default_config()
    return config.replace(
        facts_file=str(tmp_path / "node.yaml"),
        state_dir=str(tmp_path / "state"),
        budget=config.budget.replace(settle_s=0, jitter_s=0),
        sources=config.sources.replace(proc_root=str(tmp_path / "proc")),
        health=config.health.replace(heal_after_passes=passes),
    )


def swap(tmp_path, facts) -> None:
    """Replace the replayed snapshot (what a changed GPU looks like to the next run)."""
    data = facts.to_dict()
    data.pop("boot_id", None)  # the boot id comes from the proc root the test points at
    (tmp_path / "node.yaml").write_text(dump_yaml(data))


def audit(config) -> list[dict]:
    """The resume audit log's entries, oldest first."""
    path = f"{config.state_dir}/audit.jsonl"
    with open(path) as fh:
        return [json.loads(line) for line in fh]


OTHERS = ("gpu-node-02", "gpu-node-03", "gpu-node-04")


def cluster(*infos) -> FakeSlurm:
    """NODE (idle unless given) in a 4-node partition: the drain budget has room for it."""
    given = {i.name for i in infos}
    return FakeSlurm([*infos, *(n for n in (NODE, *OTHERS) if n not in given)])

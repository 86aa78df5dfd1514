"""`gpugate nodes` on a faked Slurm: a node as sinfo lists it, the site, an evidence bundle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_recorded import fixture

from gpugate.slurm.records import NodeInfo
from gpugate.store.evidence import write_bundle


def node(name: str, state: str = "IDLE", flags: tuple = ("DRAIN",), reason: str = "",
         user: str = "root", when: int | None = 1_789_000_000) -> NodeInfo:  # fmt: skip
    """A node as sinfo lists it: drained by root at a fixed time unless told otherwise."""
    return NodeInfo(name=name, state=state, flags=flags, reason=reason, reason_user=user,
                    reason_time=when)  # fmt: skip


def gpugate_sinfo(reason: str, name: str = "vm") -> str:
    """The recorded 22.05 drained node, with a gpugate reason in place of the test's."""
    doc = json.loads(fixture("22.05/sinfo.drained.json"))
    doc["nodes"][0].update(reason=reason, name=name)
    return json.dumps(doc)


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site in tmp_path (state and evidence below it), its config named by GPUGATE_CONFIG."""
    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nevidence_dir: {tmp_path / 'ev'}\n")
    monkeypatch.setenv("GPUGATE_CONFIG", str(cfg))
    return tmp_path


def bundle(site: Path, job: str, node: str, restart: int = 0, **summary) -> str:
    """An evidence bundle of JOB on NODE written into the site's store; its path."""
    summary = {"job_id": job, "node": node, "restart": restart, **summary}
    return write_bundle(str(site / "ev"), job, node, restart, {"kernel.log": "x\n"}, summary)

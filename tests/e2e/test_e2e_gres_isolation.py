"""Taking one GPU out of a node through Slurm's own configuration: what Slurm does (issue 31).

Facts, not gpugate: each test runs a real local Slurm (22.05 on the host, 24.11 in CI's
Debian 13 root) with device cgroups (TaskPlugin=task/cgroup, ConstrainDevices=yes, cgroup v1)
and 8 fake GPUs with NVIDIA's device numbers, changes the node's GPUs the way an isolation
would, and checks from inside jobs which devices they can open: ENXIO means the cgroup let
the job open the device (no driver answers here), EPERM means it did not. The results are
the table in docs/slurm-facts.md ("One GPU out of a node"), which gpugate's isolation builds on.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paths
import pytest

ROOT = paths.ROOT
sys.path.insert(0, str(ROOT))

from tests.slurm.device_probe import opened, probe, refused  # noqa: E402
from tests.slurm.localslurm import (  # noqa: E402
    LocalSlurm,
    LocalSlurmError,
    SlurmUnavailable,
    device_cgroups_usable,
    ensure_available,
    slurm_version,
    state_flags,
)

pytestmark = pytest.mark.slurm

GPUS = 8
BAD = 3  # the GPU taken out
KEPT = [index for index in range(GPUS) if index != BAD]
# NVIDIA's character-device major (Documentation/admin-guide/devices.txt: 195 char, NVIDIA).
NVIDIA_MAJOR = 195
OUR_REASON = "gpugate: isolate: isolating GPU 3"  # the drain reason grammar (docs/interfaces.md)


@pytest.fixture(scope="module", autouse=True)
def _needs_slurm_and_cgroups() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (a local Slurm, device cgroup rules)")
    why = device_cgroups_usable()
    if why:
        pytest.skip(f"no device cgroups here: {why}")
    try:
        ensure_available()
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalSlurm]:
    """Two nodes of 8 fake GPUs each, with device cgroups."""
    with LocalSlurm(
        tmp_path / "slurm", nodes=["n1", "n2"], gpus_per_node=GPUS, device_cgroups=True
    ) as running:
        yield running


def reload_gres(cluster: LocalSlurm, node: str) -> None:
    """Make Slurm read a changed GPU count the way this version needs (measured here):
    24.11's `scontrol reconfigure` restarts slurmctld and the slurmds; 22.05's does not take
    a count change, so slurmctld and the node's slurmd are restarted."""
    if slurm_version() >= (24, 0):
        cluster.run(["scontrol", "reconfigure"])
    else:
        cluster.restart_slurmctld()
        cluster.restart_slurmd(node)


def wait_gres(cluster: LocalSlurm, node: str, gpus: int, timeout: float = 30) -> dict[str, str]:
    """Poll until ``node`` reports ``gpu:<gpus>`` or Slurm marks it INVALID_REG."""
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            fields = cluster.node(node)
        except (LocalSlurmError, OSError):
            time.sleep(0.2)  # slurmctld restarting
            continue
        reported = fields.get("Gres", "").split("(")[0] == f"gpu:{gpus}"
        invalid = "INVALID_REG" in state_flags(fields.get("State", ""))
        if (reported or invalid) and fields.get("SlurmdStartTime") not in (None, "None"):
            return fields
        time.sleep(0.2)
    raise TimeoutError(f"{node} never reported gpu:{gpus}: {fields}")


class NodeWatch:
    """Poll a node's state in the background; remember every state and reason seen."""

    def __init__(self, cluster: LocalSlurm, node: str) -> None:
        self.cluster, self.node = cluster, node
        self.seen: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fields = self.cluster.node(self.node)
                self.seen.append((fields.get("State", ""), fields.get("Reason", "")))
            except (LocalSlurmError, OSError, IndexError):
                pass  # slurmctld restarting
            self._stop.wait(0.1)

    def __enter__(self) -> NodeWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def slurm_own_drains(self) -> list[tuple[str, str]]:
        """States in which Slurm itself invalidated or drained the node."""
        return [
            (state, reason)
            for state, reason in self.seen
            if "INVALID_REG" in state_flags(state)
            or "INVAL" in state_flags(state)
            or "reported lower than configured" in reason
        ]


def deny_gpu(cluster: LocalSlurm, node: str, index: int, allow: bool = False) -> Path:
    """Deny (or allow again) GPU ``index``'s device below slurmd's cgroup of ``node``.

    Jobs' cgroups are children of it: a deny there reaches every job and step, running or
    new (cgroup v1 propagates a parent's exceptions down).
    """
    group = cluster.device_cgroup(node)
    group.mkdir(exist_ok=True)  # slurmd makes it at its first job; it takes an existing one
    rule = f"c {NVIDIA_MAJOR}:{index} rwm"
    (group / ("devices.allow" if allow else "devices.deny")).write_text(rule)
    return group


def test_a_count_change_is_refused_while_gres_conf_names_files(cluster: LocalSlurm) -> None:
    proc = cluster.run(["scontrol", "update", "NodeName=n1", "Gres=gpu:7"], check=False)
    assert proc.returncode != 0
    assert "Invalid generic resource" in proc.stderr
    assert cluster.node("n1")["Gres"].startswith("gpu:8")


def test_gres_conf_alone_makes_slurm_drain_the_node(cluster: LocalSlurm) -> None:
    cluster.set_gpus("n1", KEPT, count=GPUS)  # gres.conf leaves nvidia3 out, slurm.conf says 8
    cluster.run(["scontrol", "reconfigure"])
    fields = cluster.wait_node("n1", lambda f: "INVALID_REG" in state_flags(f["State"]), 30)
    assert "DRAIN" in state_flags(fields["State"])
    assert "gres/gpu count reported lower than configured (7 < 8)" in fields["Reason"]


def test_reconfigure_takes_a_count_change_only_on_24(cluster: LocalSlurm) -> None:
    cluster.drain("n1", OUR_REASON)
    cluster.set_gpus("n1", KEPT)  # both files: 7 GPUs, nvidia3 left out
    cluster.run(["scontrol", "reconfigure"])
    fields = wait_gres(cluster, "n1", 7)
    if slurm_version() >= (24, 0):
        assert fields["Gres"].startswith("gpu:7")
        assert "INVALID_REG" not in state_flags(fields["State"])
        assert OUR_REASON in fields["Reason"]
    else:
        # 22.05's slurmctld keeps its count of 8 and takes the slurmd's 7 as a bad
        # registration; the node can no longer be resumed.
        assert fields["Gres"].startswith("gpu:8")
        assert "INVALID_REG" in state_flags(fields["State"])
        proc = cluster.run(["scontrol", "update", "NodeName=n1", "State=RESUME"], check=False)
        assert "Invalid node state specified" in proc.stderr


def test_a_gpu_left_out_of_gres_conf_is_open_to_every_job(cluster: LocalSlurm) -> None:
    cluster.drain("n1", OUR_REASON)
    cluster.set_gpus("n1", KEPT)
    reload_gres(cluster, "n1")
    wait_gres(cluster, "n1", 7)
    cluster.resume("n1")
    # Slurm constrains only the devices gres.conf names: the one left out is open to all.
    seven = probe(cluster, "n1", 7)
    assert opened(seven) == set(range(GPUS))
    no_gpu = probe(cluster, "n1", None)
    assert opened(no_gpu) == {BAD}
    assert refused(no_gpu) == set(KEPT)


def test_the_safe_sequence_out_and_back(cluster: LocalSlurm) -> None:
    """Drain, deny the device, change both files, reload, check, resume; and back."""
    busy = cluster.submit(wrap="sleep 300", nodelist="n2", gres=f"gpu:{GPUS}")
    cluster.wait_job(busy, "RUNNING")
    with NodeWatch(cluster, "n1") as watch:
        cluster.drain("n1", OUR_REASON)
        deny_gpu(cluster, "n1", BAD)
        cluster.set_gpus("n1", KEPT)
        reload_gres(cluster, "n1")
        fields = wait_gres(cluster, "n1", 7)
        assert fields["Gres"].startswith("gpu:7")
        assert OUR_REASON in fields["Reason"]
        assert "DRAIN" in state_flags(fields["State"])
        cluster.resume("n1")

        seven = probe(cluster, "n1", 7)
        assert refused(seven) == {BAD}
        assert opened(seven) == set(KEPT)
        assert seven["gpus"] == "0,1,2,3,4,5,6"  # GRES indices over the 7 files, not devices
        assert refused(probe(cluster, "n1", None)) == set(range(GPUS))
        # No node has 8 free GPUs: the job waits (n2 is busy, n1 has 7), never runs on n1.
        eight = cluster.submit(wrap="true", gres=f"gpu:{GPUS}")
        time.sleep(3)
        assert cluster.job_state(eight)["JobState"] == "PENDING"
        cluster.run(["scancel", str(eight)])
        # The job on the other node lived through the reload.
        assert cluster.job_state(busy)["JobState"] == "RUNNING"

        cluster.drain("n1", "gpugate: isolate: restoring GPU 3")
        cluster.set_gpus("n1", list(range(GPUS)))
        reload_gres(cluster, "n1")
        assert wait_gres(cluster, "n1", GPUS)["Gres"].startswith(f"gpu:{GPUS}")
        deny_gpu(cluster, "n1", BAD, allow=True)
        cluster.resume("n1")
        assert opened(probe(cluster, "n1", GPUS)) == set(range(GPUS))
    assert watch.seen, "the watch never read the node"
    assert watch.slurm_own_drains() == []
    assert cluster.job_state(busy)["JobState"] == "RUNNING"

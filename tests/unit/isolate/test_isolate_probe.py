"""The proof after applying: a process in a job-like group opens the GPU's device (issue 44).

On this machine's real cgroup v1 devices hierarchy (root, /sys/fs/cgroup/devices): a group of
the test's own stands in for slurmd's; with `c 195:N rwm` denied there the probe must get
EPERM, without it the open reaches the (absent) driver and the probe must say not denied.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from isolate_site import probe_scratch

from gpugate.isolate import probe

DEVICES = "/sys/fs/cgroup/devices"


def _why_not_real() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a device node, a cgroup of its own)"
    if not os.path.exists(os.path.join(DEVICES, "devices.deny")):
        return f"no cgroup v1 devices controller at {DEVICES}"
    return None


real = pytest.mark.skipif(_why_not_real() is not None, reason=_why_not_real() or "")


@pytest.fixture
def group():
    """A devices group of the test's own (removed after), standing in for slurmd's."""
    path = os.path.join(DEVICES, f"gpugate_test_probe_{os.getpid()}")
    os.mkdir(path)
    try:
        yield path
    finally:
        for child in os.listdir(path):  # the probe's own group, if a failure left it
            if child.startswith("gpugate_probe_"):
                os.rmdir(os.path.join(path, child))
        os.rmdir(path)


@pytest.fixture
def scratch(tmp_path: Path) -> str:
    return probe_scratch(tmp_path)


def _deny(group: str, minor: int) -> None:
    with open(os.path.join(group, "devices.deny"), "w", encoding="ascii") as fh:
        fh.write(f"c 195:{minor} rwm")


@real
def test_a_denied_gpu_is_refused_with_eperm(group: str, scratch: str) -> None:
    _deny(group, 3)
    assert probe.not_denied(group, 3, scratch) is None
    assert os.listdir(scratch) == []  # the device node and its directory gone
    assert [c for c in os.listdir(group) if c.startswith("gpugate_probe_")] == []


@real
def test_a_hooks_umask_does_not_turn_the_answer_into_eacces(group: str, scratch: str) -> None:
    # Hooks run with umask 077; the node must still be open to the unprivileged child's
    # permission check, or every answer is EACCES ("not denied") and no isolation holds.
    old = os.umask(0o077)
    try:
        _deny(group, 3)
        assert probe.not_denied(group, 3, scratch) is None
        assert probe.open_errno(group, os.makedev(195, 4), scratch) in (errno.ENXIO, errno.ENODEV)
    finally:
        os.umask(old)


@real
def test_without_the_deny_the_probe_says_not_denied(group: str, scratch: str) -> None:
    _deny(group, 3)  # another GPU's rule: GPU 4 stays open
    why = probe.not_denied(group, 4, scratch)
    assert why is not None and "was not refused c 195:4" in why
    # No NVIDIA driver here: the allowed open reaches the kernel's missing driver.
    assert "ENXIO" in why or "ENODEV" in why or "it opened" in why, why
    assert probe.open_errno(group, os.makedev(195, 3), scratch) == errno.EPERM


@real
def test_an_allow_after_the_deny_is_seen(group: str, scratch: str) -> None:
    _deny(group, 5)
    with open(os.path.join(group, "devices.allow"), "w", encoding="ascii") as fh:
        fh.write("c 195:5 rwm")
    assert probe.not_denied(group, 5, scratch) is not None


@real
def test_a_group_that_is_not_there_cannot_prove_anything(scratch: str) -> None:
    with pytest.raises(probe.ProbeError, match="cannot place the probe"):
        probe.not_denied(os.path.join(DEVICES, "gpugate_no_such_group"), 3, scratch)
    assert os.listdir(scratch) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a device node)")
def test_a_directory_that_is_no_cgroup_cannot_prove_anything(tmp_path: Path, scratch: str) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(probe.ProbeError, match="cannot place the probe"):
        probe.not_denied(str(plain), 3, scratch)
    assert list(plain.iterdir()) == [] and os.listdir(scratch) == []  # nothing left behind


def test_a_scratch_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(probe.ProbeError, match="only root can write"):
        probe.not_denied(str(tmp_path), 3, str(shared))
    link = tmp_path / "link"
    link.symlink_to(shared)
    with pytest.raises(probe.ProbeError, match="only root can write"):
        probe.not_denied(str(tmp_path), 3, str(link))  # a link is not followed

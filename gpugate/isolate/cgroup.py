"""Deny (or allow again) one GPU's device to every job of this node's slurmd.

Slurm's ConstrainDevices denies only the devices that gres.conf names, so a GPU left out of
gres.conf is open to every job (docs/slurm-facts.md, "One GPU out of a node"). A deny rule
in the cgroup v1 devices group that holds slurmd's jobs closes it: jobs' and steps' groups
are its children, and v1 propagates a parent's exceptions down to children, running or new.
Measured on Slurm 22.05 and 24.11: the rule survives restarts of slurmctld and slurmd; a
reboot clears it, so the prolog writes it again from the node's record (`sync`).

cgroup v2 has no such file (device rules are eBPF programs Slurm attaches): `problem` says so
and the isolation is not attempted there.
"""

from __future__ import annotations

import os

# NVIDIA's character-device major for /dev/nvidiaN (the kernel's devices.txt: 195 char,
# "NVIDIA graphics devices"); the minor is NVML's nvmlDeviceGetMinorNumber.
NVIDIA_MAJOR = 195


def slurm_group(devices: str, node: str) -> str:
    """The devices group of slurmd's jobs: `slurm_<node>` for a slurmd built to run several
    per host (`slurmd -N`, as the tests run), else `slurm` (Slurm's cgroup/v1 layout)."""
    per_node = os.path.join(devices, f"slurm_{node}")
    return per_node if os.path.isdir(per_node) else os.path.join(devices, "slurm")


def problem(devices: str) -> str | None:
    """Why device rules cannot be written under `devices`, or None."""
    if not os.path.exists(os.path.join(devices, "devices.deny")):
        return (
            f"no cgroup v1 devices controller at {devices} (cgroup v2 device rules are eBPF "
            "programs that only Slurm attaches)"
        )
    if os.geteuid() != 0:
        return "device cgroup rules need root"
    return None


def rule(minor: int) -> str:
    """The devices.deny/allow rule for /dev/nvidia<minor>."""
    if minor < 0:
        raise ValueError(f"not a device minor: {minor}")
    return f"c {NVIDIA_MAJOR}:{int(minor)} rwm"


def deny(devices: str, node: str, minor: int) -> str:
    """Deny /dev/nvidia<minor> to every job of slurmd (made now if slurmd has not yet: it
    takes an existing group); returns the group's path."""
    group = slurm_group(devices, node)
    os.makedirs(group, exist_ok=True)
    _write(os.path.join(group, "devices.deny"), rule(minor))
    return group


def allow(devices: str, node: str, minor: int) -> None:
    """Allow /dev/nvidia<minor> again below slurmd's group (nothing to do without one)."""
    group = slurm_group(devices, node)
    if os.path.isdir(group):
        _write(os.path.join(group, "devices.allow"), rule(minor))


def _write(path: str, text: str) -> None:
    # A cgroup control file: root's, in cgroupfs (no user can plant a link there); O_NOFOLLOW
    # all the same, and one write() per rule as the kernel expects.
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)

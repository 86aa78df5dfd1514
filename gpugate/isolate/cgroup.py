"""Deny (or allow again) one GPU's device to every job of this node's slurmd, on cgroup v1 or v2.

Slurm's ConstrainDevices denies only the devices that gres.conf names, so a GPU left out of
gres.conf is open to every job (docs/slurm-facts.md, "One GPU out of a node"). gpugate closes
it above every job's group:
- cgroup v1: a deny rule in the devices group that holds slurmd's jobs; jobs' and steps' groups
  are its children, and v1 propagates a parent's exceptions down to children, running or new.
  Measured on Slurm 22.05 and 24.11: the rule survives restarts of slurmctld and slurmd;
- cgroup v2: an eBPF device program attached with BPF_F_ALLOW_MULTI at the scope that holds
  slurmstepd's jobs (`system.slice/slurmstepd.scope`, `<node>_slurmstepd.scope` for a slurmd
  built to run several per host), run in addition to Slurm's own programs below (bpf.py).
A reboot clears either, so the prolog attaches it again from the node's record (`sync`).

Which one: `isolate.cgroup_devices` (default /sys/fs/cgroup/devices) holding `devices.deny` is
v1; a cgroup2 mount there, or above it where that path does not exist (a v2-only host), is v2.
"""

from __future__ import annotations

import os

from gpugate.isolate import bpf
from gpugate.isolate.bpf import NVIDIA_MAJOR

V1, V2 = "cgroup v1", "cgroup v2"


def version(devices: str) -> str | None:
    """V1 or V2 by what `devices` holds (see the module), None for neither."""
    if os.path.exists(os.path.join(devices, "devices.deny")):
        return V1
    return V2 if _v2_root(devices) else None


def _v2_root(devices: str) -> str | None:
    """The cgroup2 mount `devices` names, or its parent on a host without that path."""
    for place in (devices, os.path.dirname(devices.rstrip("/"))):
        if os.path.exists(os.path.join(place, "cgroup.controllers")):
            return place
        if os.path.exists(devices):
            return None  # a path that is there and is no cgroup2 mount: not the parent's
    return None


def slurm_group(devices: str, node: str) -> str:
    """The group above every job of slurmd: v1's devices group `slurm_<node>` (a slurmd built to
    run several per host, `slurmd -N`, as the tests run) or `slurm` (Slurm's cgroup/v1
    layout); v2's `system.slice/<node>_slurmstepd.scope` or `system.slice/slurmstepd.scope`
    (cgroup/v2 with or without systemd)."""
    root = _v2_root(devices) if version(devices) == V2 else None
    if root is not None:
        base = os.path.join(root, "system.slice")
        per_node = os.path.join(base, f"{node}_slurmstepd.scope")
        return per_node if os.path.isdir(per_node) else os.path.join(base, "slurmstepd.scope")
    per_node = os.path.join(devices, f"slurm_{node}")
    return per_node if os.path.isdir(per_node) else os.path.join(devices, "slurm")


def problem(devices: str) -> str | None:
    """Why device rules cannot be set under `devices`, or None."""
    if version(devices) is None:
        return (
            f"neither a cgroup v1 devices controller nor a cgroup v2 mount at {devices} "
            "(isolate.cgroup_devices: Slurm's CgroupMountpoint/devices on v1, the cgroup2 mount "
            "on v2)"
        )
    if os.geteuid() != 0:
        return "device cgroup rules need root"
    return None


def route(devices: str, node: str) -> str:
    """How a GPU would be denied here and why, in words (isolate check, selftest)."""
    group = slurm_group(devices, node)
    if version(devices) == V2:
        return (f"cgroup v2 ({_v2_root(devices)} is a cgroup2 mount): an eBPF device program "
                f"attached with BPF_F_ALLOW_MULTI at {group}, run beside Slurm's own")  # fmt: skip
    return f"cgroup v1 ({devices} holds devices.deny): a deny rule in {group}/devices.deny"


def describe(devices: str, node: str, minor: int) -> str:
    """What `deny` would do for `minor`, in words (the dry run's line)."""
    group = slurm_group(devices, node)
    if version(devices) == V2:
        return (f"attach the eBPF device program {bpf.PREFIX}{minor} (deny c {NVIDIA_MAJOR}:"
                f"{minor}, BPF_F_ALLOW_MULTI) to {group}")  # fmt: skip
    return f"write {rule(minor)!r} into {os.path.join(group, 'devices.deny')}"


def rule(minor: int) -> str:
    """The devices.deny/allow rule for /dev/nvidia<minor>."""
    if minor < 0:
        raise ValueError(f"not a device minor: {minor}")
    return f"c {NVIDIA_MAJOR}:{int(minor)} rwm"


def deny(devices: str, node: str, minor: int) -> str:
    """Deny /dev/nvidia<minor> to every job of slurmd (the group made now if slurmd has not
    yet: it takes an existing one); returns the group's path."""
    group = slurm_group(devices, node)
    os.makedirs(group, exist_ok=True)
    if version(devices) == V2:
        bpf.deny(group, minor)
    else:
        _write(os.path.join(group, "devices.deny"), rule(minor))
    return group


def allow(devices: str, node: str, minor: int) -> None:
    """Allow /dev/nvidia<minor> again below slurmd's group (nothing to do without one)."""
    group = slurm_group(devices, node)
    if not os.path.isdir(group):
        return
    if version(devices) == V2:
        bpf.allow(group, minor)
    else:
        _write(os.path.join(group, "devices.allow"), rule(minor))


def denied(devices: str, node: str) -> frozenset[int] | None:
    """The minors gpugate denies there now on cgroup v2; None on v1 (its rules cannot be
    read back as gpugate's: devices.list holds every rule of the group)."""
    group = slurm_group(devices, node)
    if version(devices) != V2 or not os.path.isdir(group):
        return None
    return bpf.denied(group)


def _write(path: str, text: str) -> None:
    # A cgroup control file: root's, in cgroupfs (no user can plant a link there); O_NOFOLLOW
    # all the same, and one write() per rule as the kernel expects.
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)

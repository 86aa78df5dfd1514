"""Isolation on cgroup v2: gpugate's eBPF device program beside Slurm's (issue 44, Deliver 2).

On this machine's real cgroup2 hierarchy (root; a group of the test's own, removed after): the
program attached with BPF_F_ALLOW_MULTI at a scope must deny `c 195:N` to a process two levels
down, below programs attached with Slurm's own flags (job: BPF_F_ALLOW_OVERRIDE, task: none)
that allow everything, and nothing else; detached, the device opens again. The process and the
open are the isolation's own proof (probe.py): EPERM denied, ENXIO (no driver here) allowed.
"""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from isolate_site import probe_scratch

from gpugate.isolate import bpf, cgroup, probe


def _cgroup2() -> str | None:
    """A cgroup2 mount of this machine, or None."""
    try:
        with open("/proc/self/mounts", encoding="ascii", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    return fields[1]
    except OSError:
        return None
    return None


def _why_not_real() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a cgroup and a device node of its own, bpf(2))"
    if _cgroup2() is None:
        return "no cgroup2 mount here"
    return None


real = pytest.mark.skipif(_why_not_real() is not None, reason=_why_not_real() or "")


def _remove_tree(path: str) -> None:
    for sub, dirs, _ in os.walk(path, topdown=False):
        for name in dirs:
            os.rmdir(os.path.join(sub, name))
    os.rmdir(path)


@pytest.fixture
def scope():
    """A cgroup2 group of the test's own standing in for `slurmstepd.scope`, with a job and a
    task group below it as Slurm makes them."""
    path = os.path.join(_cgroup2() or "", f"gpugate_test_bpf_{os.getpid()}")
    os.makedirs(os.path.join(path, "job_1", "step_0"))
    try:
        yield path
    finally:
        _remove_tree(path)


@pytest.fixture
def scratch(tmp_path: Path) -> str:
    return probe_scratch(tmp_path)


def _allow_all(group: str, flags: int) -> None:
    """A program allowing every device attached to `group` with `flags`, as Slurm attaches its
    own (src/plugins/cgroup/v2/ebpf.c: job and step BPF_F_ALLOW_OVERRIDE, task none)."""
    prog = bpf._load(bpf._insn(0xB7, 0, 0, 0, 1) + bpf._insn(0x95), "slurm_like")
    fd = bpf._open_dir(group)
    try:
        bpf._call(bpf.PROG_ATTACH, struct.pack("<IIII", fd, prog, bpf.CGROUP_DEVICE, flags), "x")
    finally:
        os.close(fd)
        os.close(prog)


def _opens(group: str, minor: int, scratch: str) -> int:
    return probe.open_errno(group, os.makedev(195, minor), scratch)


@real
def test_the_scope_program_denies_one_gpu_below_slurms_own_programs(scope, scratch) -> None:
    task = os.path.join(scope, "job_1", "step_0")
    bpf.deny(scope, 3)
    _allow_all(os.path.join(scope, "job_1"), 1)  # BPF_F_ALLOW_OVERRIDE
    _allow_all(task, 0)
    assert _opens(task, 3, scratch) == errno.EPERM
    assert _opens(task, 4, scratch) in (errno.ENXIO, errno.ENODEV, 0)  # another GPU: allowed
    assert probe.not_denied(task, 3, scratch) is None


# Moves itself into argv[1] (as slurmd's hooks are below the scope), then runs the proof.
_FROM_BELOW = """import os, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as fh:
    fh.write(str(os.getpid()))
from gpugate.isolate import probe
print(probe.not_denied(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
"""


@real
def test_the_proof_runs_below_the_deny_as_slurmds_hooks_do(scope, scratch) -> None:
    """cgroup/v2 moves slurmd to `<scope>/slurmd`: its hooks, the isolation and its proof run
    below gpugate's program, so making the probe's node (mknod) must pass there, and opening
    it must not (test_e2e_isolate_v2.py found the mknod refused)."""
    hooks = os.path.join(scope, "slurmd")
    os.mkdir(hooks)
    task = os.path.join(scope, "job_1", "step_0")
    bpf.deny(scope, 3)

    def proof(minor: int) -> str:
        argv = [sys.executable, "-c", _FROM_BELOW, hooks, task, str(minor), scratch]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert proof(3) == "None"  # denied: the proof holds
    assert "not refused c 195:4" in proof(4)


def _root_opens(group: str, minor: int, scratch: str) -> int:
    """The errno (0: opened) of an open of `c 195:<minor>` by a root process in a new child
    group of `group` (as slurmd and gpugate's hooks are below slurmstepd's scope on v2)."""
    node = os.path.join(scratch, f"root-{minor}")
    os.mknod(node, 0o600 | 0o020000, os.makedev(195, minor))
    where = os.path.join(group, "root_child")
    os.mkdir(where)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: into the group, open, report, leave at once
        code = 255
        try:
            with open(os.path.join(where, "cgroup.procs"), "w", encoding="ascii") as fh:
                fh.write(str(os.getpid()))
            os.close(os.open(node, os.O_RDONLY | os.O_NONBLOCK))
            code = 0
        except OSError as exc:
            code = exc.errno or 255
        os.write(write, bytes([code]))
        os._exit(0)
    os.close(write)
    try:
        got = os.read(read, 1)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
        os.rmdir(where)
        os.unlink(node)
    return got[0]


@real
def test_roots_own_processes_keep_the_device(scope, scratch) -> None:
    # slurmd, gpugate's hooks and their NVML live below the scope on v2: as root they must
    # still open the isolated GPU; the probe, as an unprivileged job would, must not.
    bpf.deny(scope, 3)
    assert _root_opens(scope, 3, scratch) in (errno.ENXIO, errno.ENODEV, 0)
    assert _opens(scope, 3, scratch) == errno.EPERM


@real
def test_deny_is_once_per_gpu_and_allow_lifts_it(scope, scratch) -> None:
    bpf.deny(scope, 3)
    bpf.deny(scope, 3)
    bpf.deny(scope, 5)
    assert bpf.denied(scope) == {3, 5}
    assert bpf.allow(scope, 3) is True
    assert bpf.allow(scope, 3) is False  # nothing left for it
    assert bpf.denied(scope) == {5}
    assert _opens(scope, 3, scratch) in (errno.ENXIO, errno.ENODEV, 0)
    assert _opens(scope, 5, scratch) == errno.EPERM
    bpf.allow(scope, 5)


@real
def test_another_programs_name_is_never_taken_for_gpugates(scope) -> None:
    _allow_all(scope, 2)  # BPF_F_ALLOW_MULTI, like gpugate's, but not gpugate's
    bpf.deny(scope, 7)
    assert bpf.denied(scope) == {7}
    assert bpf.allow(scope, 6) is False
    assert bpf.allow(scope, 7) is True and bpf.denied(scope) == frozenset()


@real
def test_cgroup_uses_the_v2_program_at_slurmstepds_scope(tmp_path, scratch) -> None:
    root = os.path.join(_cgroup2() or "", f"gpugate_test_v2root_{os.getpid()}")
    os.makedirs(os.path.join(root, "system.slice", "n1_slurmstepd.scope", "job_9"))
    try:
        assert cgroup.version(root) == cgroup.V2 and cgroup.problem(root) is None
        group = cgroup.deny(root, "n1", 3)
        assert group == os.path.join(root, "system.slice", "n1_slurmstepd.scope")
        assert cgroup.denied(root, "n1") == {3}
        assert _opens(os.path.join(group, "job_9"), 3, scratch) == errno.EPERM
        assert "gpugate_nv3" in cgroup.describe(root, "n1", 3)
        cgroup.allow(root, "n1", 3)
        assert cgroup.denied(root, "n1") == frozenset()
        assert _opens(os.path.join(group, "job_9"), 3, scratch) != errno.EPERM
    finally:
        _remove_tree(root)


def _fake_v2(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    return path


def test_which_hierarchy_and_which_group(tmp_path) -> None:
    v2 = _fake_v2(tmp_path / "v2")
    # A v2-only host: the default path (…/devices) is not there, its parent is the mount.
    assert cgroup.version(str(v2 / "devices")) == cgroup.V2
    assert cgroup.slurm_group(str(v2 / "devices"), "n1") == str(
        v2 / "system.slice" / "slurmstepd.scope"
    )
    (v2 / "system.slice" / "n1_slurmstepd.scope").mkdir(parents=True)
    assert cgroup.slurm_group(str(v2), "n1").endswith("system.slice/n1_slurmstepd.scope")
    # A v1 devices controller wins; a path that is there but neither is refused.
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "devices.deny").write_text("")
    assert cgroup.version(str(v1)) == cgroup.V1
    assert cgroup.slurm_group(str(v1), "n1") == str(v1 / "slurm")
    assert cgroup.version(str(tmp_path)) is None
    assert cgroup.denied(str(v1), "n1") is None  # v1's rules are not read back
    # isolate check and selftest name the route and why
    assert cgroup.route(str(v1), "n1").startswith(f"cgroup v1 ({v1} holds devices.deny)")
    said = cgroup.route(str(v2), "n1")
    assert said.startswith(f"cgroup v2 ({v2} is a cgroup2 mount)") and "ALLOW_MULTI" in said


def test_the_program_refuses_a_minor_no_device_has() -> None:
    with pytest.raises(ValueError, match="not a device minor"):
        bpf._deny_program(-1)

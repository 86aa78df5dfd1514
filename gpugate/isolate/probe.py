"""Prove on the node itself that a GPU's device is denied to a job: open it from a job-like group.

A child process is moved into a new group below slurmd's devices group (where Slurm makes each
job's group: v1 copies the parent's rules into it) and opens a character device with the
GPU's numbers, made in a private directory. The kernel's device cgroup check runs before the
driver's open (fs/namei.c may_open -> inode_permission -> devcgroup_inode_permission), so a
denied device gives EPERM with or without NVIDIA's driver; an allowed one opens, or fails in
the driver (ENXIO/ENODEV where there is none). Anything but EPERM: not denied.

A mount with `nodev` fails every device open EACCES before that check (may_open), so the
private directory's filesystem must allow devices; the probe refuses one that does not.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile

from gpugate.isolate.bpf import NVIDIA_MAJOR

TIMEOUT_S = 10.0
# Waits for the go (after its move into the group), opens argv[1], prints the errno (0: opened).
# As an unprivileged user (nobody's ids), as a job's process would: on cgroup v2 gpugate's
# program leaves root's processes the device (bpf.py). The node is reached through an O_PATH
# descriptor of the parent's (/proc/self/fd/N), so the private directory stays root's alone.
NOBODY = 65534
_CHILD = (
    "import os,sys\n"
    "sys.stdin.buffer.read(1)\n"
    "try:\n"
    f" os.setgroups([]);os.setresgid({NOBODY},{NOBODY},{NOBODY});os.setresuid({NOBODY},{NOBODY},{NOBODY})\n"
    "except OSError as e:\n"
    " print('drop',e.errno);sys.exit(0)\n"
    "try:\n"
    " os.close(os.open(sys.argv[1],os.O_RDONLY|os.O_NONBLOCK|os.O_NOCTTY))\n"
    " print(0)\n"
    "except OSError as e:\n"
    " print(e.errno)\n"
)


class ProbeError(RuntimeError):
    """The probe could not be run (no answer about the device either way)."""


def not_denied(group: str, minor: int, scratch: str, timeout_s: float = TIMEOUT_S) -> str | None:
    """Why /dev/nvidia<minor> is not denied to a job below `group` (what its open got), or None
    when it is (EPERM). `scratch`: a root-owned directory, writable by root only, on a
    filesystem that allows devices, for the private device node. ProbeError when it cannot run."""
    code = open_errno(group, os.makedev(NVIDIA_MAJOR, minor), scratch, timeout_s)
    if code == errno.EPERM:
        return None
    got = "it opened" if code == 0 else f"its open got {errno.errorcode.get(code, code)}"
    device = f"c {NVIDIA_MAJOR}:{minor}"
    return f"a process in a job-like group below {group} was not refused {device}: {got}, not EPERM"


def open_errno(group: str, device: int, scratch: str, timeout_s: float = TIMEOUT_S) -> int:
    """The errno (0: opened) of an open of character device `device` by a process in a new
    child group of `group`; the group and the device node removed after."""
    where = _private_dir(scratch)
    try:
        node = os.path.join(where, "gpu")
        # 0666: the unprivileged child's permission check must reach the device cgroup's; no
        # one else reaches the node (its directory is root's, 0700).
        os.mknod(node, stat.S_IFCHR | 0o666, device)
        os.chmod(node, 0o666)  # noqa: S103 - past the umask (a hook's is 077: EACCES)
        path_fd = os.open(node, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return _open_in_group(group, path_fd, timeout_s)
        finally:
            os.close(path_fd)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _private_dir(scratch: str) -> str:
    """A fresh 0700 directory in `scratch`, after checking that no one but root could swap
    what is in it, and that its filesystem allows device nodes."""
    info = os.lstat(scratch)  # lstat: a link in its place is refused, not followed
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise ProbeError(f"{scratch}: not a directory that only root can write")
    if os.statvfs(scratch).f_flag & os.ST_NODEV:
        raise ProbeError(f"{scratch}: mounted nodev (every device open fails EACCES there)")
    return tempfile.mkdtemp(prefix="gpugate-probe-", dir=scratch)  # 0700, the caller's


def _open_in_group(group: str, node_fd: int, timeout_s: float) -> int:
    """Start the child, move it into `group`/gpugate_probe_<pid>, let it open the node."""
    child = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _CHILD, f"/proc/self/fd/{node_fd}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        pass_fds=(node_fd,),
    )
    probe_group = os.path.join(group, f"gpugate_probe_{child.pid}")
    try:
        os.mkdir(probe_group, 0o700)
        # No O_CREAT: a directory that is no cgroup has no such file, and gets none.
        fd = os.open(os.path.join(probe_group, "cgroup.procs"), os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.write(fd, str(child.pid).encode())  # one write of the pid, as the kernel expects
        finally:
            os.close(fd)
        out, _ = child.communicate(b"g", timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(f"the probe's open did not return within {timeout_s:g} s") from exc
    except OSError as exc:
        raise ProbeError(f"cannot place the probe in {probe_group}: {exc}") from exc
    finally:
        _end(child)
        _remove_group(probe_group)
    answer = out.decode(errors="replace").strip()
    if answer.startswith("drop"):
        raise ProbeError(f"the probe could not become an unprivileged user ({answer})")
    try:
        return int(answer)
    except ValueError as exc:
        raise ProbeError(f"the probe answered {out!r} (exit {child.returncode})") from exc


def _end(child: subprocess.Popen[bytes]) -> None:
    """The child gone and reaped (its group can be removed only then)."""
    if child.poll() is None:
        child.kill()
        try:
            child.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel: its group stays, reported by _remove_group's caller
    for pipe in (child.stdin, child.stdout):
        if pipe:
            pipe.close()


def _remove_group(path: str) -> None:
    """rmdir the probe's group (a cgroup directory holds only the kernel's files)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ProbeError(f"cannot remove the probe's group {path}: {exc}") from exc

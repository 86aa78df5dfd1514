"""Deny one GPU's device on cgroup v2: an eBPF device program gpugate attaches beside Slurm's.

On cgroup v2 a device rule is a BPF_PROG_TYPE_CGROUP_DEVICE program; Slurm's cgroup/v2 plugin
attaches one per job and step (BPF_F_ALLOW_OVERRIDE) and task (no flag), and nothing at the
`slurmstepd.scope` above them (src/plugins/cgroup/v2/ebpf.c, cgroup_v2.c). Its programs allow
what gres.conf does not name, so a GPU taken out of gres.conf is open to every job. A program
attached at the scope with BPF_F_ALLOW_MULTI runs in addition to the ones below, and the
kernel allows a device only when every program in the effective list allows it
(kernel/bpf/cgroup.c: compute_effective_progs, __cgroup_bpf_check_dev_permission; the flags'
meaning in include/uapi/linux/bpf.h). Measured on this project's VM (kernel 6.18, cgroup2):
with such a program at a parent, a process two levels down, below Slurm's own flags, gets
EPERM opening `c 195:N` (tests/unit/isolate/test_isolate_bpf.py).

One program per GPU, named `gpugate_nv<minor>`: an attachment outlives the process that made
it (the cgroup holds the program), so later runs find gpugate's programs by name
(BPF_PROG_QUERY, then each one's info) to tell what is denied or to detach one. Every call is
a raw bpf(2) syscall through ctypes: no library, no compiler, no bpffs mount needed.
"""

from __future__ import annotations

import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes

# NVIDIA's character-device major for /dev/nvidiaN (the kernel's devices.txt: 195 char,
# "NVIDIA graphics devices"); the minor is NVML's nvmlDeviceGetMinorNumber.
NVIDIA_MAJOR = 195
PREFIX = "gpugate_nv"  # + the minor: at most 15 characters (BPF_OBJ_NAME_LEN 16)

# bpf(2) commands and constants (include/uapi/linux/bpf.h)
PROG_LOAD, PROG_ATTACH, PROG_DETACH, PROG_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD, PROG_QUERY = (
    5, 8, 9, 13, 15, 16,
)  # fmt: skip
PROG_TYPE_CGROUP_DEVICE = 15
CGROUP_DEVICE = 6  # the attach type
F_ALLOW_MULTI = 2
GET_CURRENT_UID_GID = 15  # the helper's number (enum bpf_func_id)
DEVCG_DEV_CHAR = 2  # bpf_cgroup_dev_ctx.access_type's low 16 bits
DEVCG_ACC_MKNOD = 1  # its high 16 bits: the access asked for
ATTR_SIZE = 128  # zeroed past the fields a command reads, as the kernel requires
SYSCALL = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}


class BpfError(OSError):
    """A bpf(2) call failed (its errno kept, what was asked named)."""


def deny(group: str, minor: int) -> None:
    """Attach a program denying `c 195:<minor>` to `group` and everything below it (once: a
    program already there for this minor is kept)."""
    if minor in denied(group):
        return
    prog = _load(_deny_program(minor), f"{PREFIX}{minor}")
    try:
        fd = _open_dir(group)
        try:
            _call(PROG_ATTACH, struct.pack("<IIII", fd, prog, CGROUP_DEVICE, F_ALLOW_MULTI),
                  f"attach the deny of minor {minor} to {group}")  # fmt: skip
        finally:
            os.close(fd)
    finally:
        os.close(prog)


def allow(group: str, minor: int) -> bool:
    """Detach gpugate's program for `minor` from `group`; whether there was one."""
    fd = _open_dir(group)
    try:
        for prog, name in _attached(fd, group):
            try:
                if name == f"{PREFIX}{minor}":
                    _call(PROG_DETACH, struct.pack("<IIII", fd, prog, CGROUP_DEVICE, 0),
                          f"detach the deny of minor {minor} from {group}")  # fmt: skip
                    return True
            finally:
                os.close(prog)
        return False
    finally:
        os.close(fd)


def denied(group: str) -> frozenset[int]:
    """The minors gpugate's programs attached to `group` itself deny."""
    fd = _open_dir(group)
    try:
        found = set()
        for prog, name in _attached(fd, group):
            os.close(prog)
            if name.startswith(PREFIX) and name[len(PREFIX) :].isdigit():
                found.add(int(name[len(PREFIX) :]))
        return frozenset(found)
    finally:
        os.close(fd)


def _deny_program(minor: int) -> bytes:
    """The program: 0 (deny) for opening a character device 195:<minor>, 1 (allow) for anything
    else. Its context is struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor}:
    the device type in access_type's low 16 bits, the access (BPF_DEVCG_ACC_MKNOD 1, READ 2,
    WRITE 4) in its high 16 (include/uapi/linux/bpf.h).

    Root's processes (uid 0 by bpf_get_current_uid_gid, in the initial user namespace) keep the
    device: cgroup/v2 moves slurmd to `<scope>/slurmd`, so slurmd, gpugate's hooks and their
    NVML live below the scope too, and NVML there must still see the isolated GPU (a device it
    cannot open is one it does not list: the count would drop, and the GPU's repair could not
    be judged). A job's processes run as its user (a setuid program keeps the user's real uid)
    and are refused; a job run as root is not, as root is above every device rule anyway. The
    isolation's proof (probe.py) opens as an unprivileged user for that reason. A mknod alone
    is allowed too (measured in tests/e2e/test_e2e_isolate_v2.py: with mknod denied, the proof,
    which makes a node with the GPU's numbers after the deny, failed EPERM on Slurm 24.11)."""
    if not 0 <= minor < 1 << 20:
        raise ValueError(f"not a device minor: {minor}")
    return b"".join((
        _insn(0xBF, 6, 1),  # r6 = ctx (the call below clobbers r1-r5)
        _insn(0x85, 0, 0, 0, GET_CURRENT_UID_GID),  # r0 = gid << 32 | uid
        _insn(0xBC, 0, 0),  # w0 = w0: the uid
        _insn(0x15, 0, 0, 12, 0),  # root: allow
        _insn(0x61, 2, 6, 0, 0),  # r2 = ctx->access_type
        _insn(0xBF, 3, 2),  # r3 = r2
        _insn(0x77, 3, 0, 0, 16),  # r3 >>= 16: the access
        _insn(0x54, 2, 0, 0, 0xFFFF),  # w2 &= 0xffff: the device type
        _insn(0x55, 2, 0, 7, DEVCG_DEV_CHAR),  # not a character device: allow
        _insn(0x15, 3, 0, 6, DEVCG_ACC_MKNOD),  # a mknod alone: allow
        _insn(0x61, 3, 6, 4, 0),  # r3 = ctx->major
        _insn(0x55, 3, 0, 4, NVIDIA_MAJOR),  # another major: allow
        _insn(0x61, 4, 6, 8, 0),  # r4 = ctx->minor
        _insn(0x55, 4, 0, 2, minor),  # another GPU: allow
        _insn(0xB7, 0, 0, 0, 0),  # r0 = 0: deny
        _insn(0x95),  # exit
        _insn(0xB7, 0, 0, 0, 1),  # r0 = 1: allow
        _insn(0x95),  # exit
    ))  # fmt: skip


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One eBPF instruction (struct bpf_insn: code, dst|src<<4, off, imm)."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _load(program: bytes, name: str) -> int:
    """BPF_PROG_LOAD; the program's fd."""
    import ctypes

    insns = ctypes.create_string_buffer(program, len(program))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack(
        "<IIQQIIQII16s",
        PROG_TYPE_CGROUP_DEVICE, len(program) // 8, ctypes.addressof(insns),
        ctypes.addressof(license_), 0, 0, 0, 0, 0, name.encode(),
    )  # fmt: skip
    return _call(PROG_LOAD, attr, f"load the device program {name}")


def _attached(cgroup_fd: int, group: str) -> list[tuple[int, str]]:
    """(an open fd, the name) of each device program attached to the cgroup itself."""
    import ctypes

    ids = (ctypes.c_uint32 * 64)()
    query = struct.pack("<IIIIQI", cgroup_fd, CGROUP_DEVICE, 0, 0, ctypes.addressof(ids), 64)
    buf = _buffer(query)
    _call(PROG_QUERY, buf, f"list the device programs of {group}")
    count = struct.unpack_from("<I", buf, 24)[0]
    out = []
    for prog_id in ids[: min(count, 64)]:
        try:
            fd = _call(PROG_GET_FD_BY_ID, struct.pack("<I", prog_id), f"open program {prog_id}")
        except BpfError:
            continue  # detached meanwhile
        out.append((fd, _name(fd)))
    return out


def _name(prog_fd: int) -> str:
    """A loaded program's name (struct bpf_prog_info's `name`, at offset 64)."""
    import ctypes

    info = ctypes.create_string_buffer(96)
    _call(OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", prog_fd, 96, ctypes.addressof(info)),
          "read a program's name")  # fmt: skip
    return info.raw[64:80].split(b"\0", 1)[0].decode("ascii", "replace")


def _open_dir(group: str) -> int:
    """The cgroup directory, opened without following a link at its last component."""
    return os.open(group, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _buffer(attr: bytes) -> ctypes.Array[ctypes.c_char]:
    import ctypes

    return ctypes.create_string_buffer(attr.ljust(ATTR_SIZE, b"\0"), ATTR_SIZE)


def _call(cmd: int, attr: bytes | ctypes.Array[ctypes.c_char], what: str) -> int:
    """bpf(cmd, attr); its result, or BpfError naming `what`."""
    import ctypes
    import platform

    number = SYSCALL.get(platform.machine())
    if number is None:
        raise BpfError(0, f"cannot {what}: bpf(2) on {platform.machine()} is not known here")
    buf = attr if not isinstance(attr, bytes) else _buffer(attr)
    libc = ctypes.CDLL(None, use_errno=True)
    result = int(libc.syscall(number, cmd, buf, ATTR_SIZE))
    if result < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"cannot {what}: {os.strerror(err)}")
    return result

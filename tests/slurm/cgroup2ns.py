"""Slurm's cgroup/v2 plugin for a local cluster: each slurmd in a mount namespace of its own.

docs/slurm-facts.md, "cgroup v2 on this machine (measured, issue 44)": CI's machines mount the
cgroup v1 controllers at /sys/fs/cgroup and cgroup2 at /sys/fs/cgroup/unified (hybrid). For
`LocalSlurm(cgroup_v2=True)` every slurmd starts in `unshare --mount --propagation private`
with cgroup2 mounted over /sys/fs/cgroup there only, as a v2-only host has it; its hooks and
what they start (a detached `gpugate isolate apply`) inherit that namespace. On a hybrid host
slurmd also gets tools/cgroup_v1hide.c preloaded, built here with gcc: without it every release
stops at "Hybrid mode is not supported" (its v1 lines in /proc/<pid>/cgroup). Everything else
Slurm does is real: its scope, its cgroups, the eBPF device programs the kernel enforces.

The cgroup2 hierarchy is the kernel's, one for the machine: what slurmd makes below the
namespace's /sys/fs/cgroup (`system.slice/<node>_slurmstepd.scope`) stays after it, so a
cluster removes it when its daemons are gone (`remove_scopes`), in a namespace of its own
again: the host's mounts are never touched. Stdlib only, as localslurm.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

# tests/slurm/ -> the checkout's tools/ (the shim's one source, also tools/measure_cgroup_v2.py's)
SHIM_SOURCE = Path(__file__).resolve().parents[2] / "tools" / "cgroup_v1hide.c"
# Devices only: no memory or cpuset controller reaches cgroup2 here (ConstrainRAMSpace would
# stop every job, docs/slurm-facts.md); IgnoreSystemd: no systemd to ask for the scope.
CGROUP_CONF = "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nConstrainDevices=yes\n"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Run "$@" with cgroup2 over /sys/fs/cgroup, in the namespace `in_view` makes. That namespace
# keeps its mounts' propagation (`unshare --propagation private` makes / private, which fails in
# a chroot such as .ci/second-slurm's, whose / is no mount point): /sys/fs/cgroup is made
# private first, so the mount over it reaches no other namespace; where it is no mount point
# that fails, and nothing is mounted.
_MOUNT_THEN_EXEC = (
    'mount --make-rprivate /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && exec "$@"'
)
# rmdir each named scope below system.slice, deepest first; print those still there.
_REMOVE = """cd /sys/fs/cgroup/system.slice 2>/dev/null || exit 0
for scope; do
    [ -d "$scope" ] && find "$scope" -depth -type d -exec rmdir {} \\; 2>/dev/null
done
for scope; do [ -d "$scope" ] && echo "$scope"; done
# a cgroup with children or processes cannot go: rmdir fails then (ours only if we made it)
[ -n "$GPUGATE_SLICE_TOO" ] && cd / && rmdir /sys/fs/cgroup/system.slice 2>/dev/null
exit 0
"""


def problem() -> str | None:
    """Why `LocalSlurm(cgroup_v2=True)` cannot run here, or None."""
    if os.geteuid() != 0:
        return "a mount namespace and cgroup2 need root"
    if "cgroup2" not in Path("/proc/filesystems").read_text():
        return "the kernel has no cgroup2"
    for program in ("unshare", "mount", "find"):
        if shutil.which(program, path=SYSTEM_PATH) is None:
            return f"{program} is not installed (util-linux, findutils)"
    if hybrid():
        if not SHIM_SOURCE.is_file():
            return f"{SHIM_SOURCE} is missing (the hybrid host's LD_PRELOAD shim)"
        if shutil.which("gcc", path=SYSTEM_PATH) is None:
            return "gcc is not installed: it builds the hybrid host's shim (tools/cgroup_v1hide.c)"
    return None


def hybrid() -> bool:
    """Whether this host lists cgroup v1 hierarchies (Slurm's cgroup/v2 refuses that)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    return any(not line.startswith("0::") for line in lines if line)


def build_shim(dest: Path) -> Path:
    """tools/cgroup_v1hide.c compiled to `dest` (a shared object slurmd preloads)."""
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", str(dest), str(SHIM_SOURCE),
                    "-ldl"], check=True, timeout=120, capture_output=True,
                   env={"PATH": SYSTEM_PATH})  # fmt: skip
    dest.chmod(0o755)
    return dest


def in_view(argv: Sequence[str]) -> list[str]:
    """`argv` in a private mount namespace with cgroup2 at /sys/fs/cgroup (slurmd's view)."""
    unshare = shutil.which("unshare", path=SYSTEM_PATH) or "unshare"
    return [unshare, "--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c",
            _MOUNT_THEN_EXEC, "sh", *argv]  # fmt: skip


def scope(node: str) -> str:
    """The scope slurmd of `node` makes below /sys/fs/cgroup/system.slice: Debian builds Slurm
    for several slurmd per host, so the node's name leads (docs/slurm-facts.md)."""
    return f"{node}_slurmstepd.scope"


def slice_exists() -> bool:
    """Whether /sys/fs/cgroup/system.slice exists in cgroup2 (24.11+ make it when absent)."""
    out = _run_in_view(
        ["/bin/sh", "-c", "if [ -d /sys/fs/cgroup/system.slice ]; then echo yes; fi"]
    )
    return out.strip() == "yes"


def remove_scopes(nodes: Sequence[str], slice_too: bool = False, wait_s: float = 10.0) -> list[str]:
    """rmdir the nodes' scopes, deepest first (a cgroup goes once its processes have); with
    `slice_too` also system.slice if nothing else is left in it. The scopes still there."""
    scopes = [scope(node) for node in nodes]
    env = {"GPUGATE_SLICE_TOO": "1"} if slice_too else {}
    deadline = time.monotonic() + wait_s
    while True:
        left = _run_in_view(["/bin/sh", "-c", _REMOVE, "sh", *scopes], env).split()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)  # killed processes leave their cgroups a moment later


def _run_in_view(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Run `argv` in a namespace of its own with cgroup2 at /sys/fs/cgroup; its stdout."""
    proc = subprocess.run(in_view(argv), capture_output=True, text=True, timeout=60,
                          env={"PATH": SYSTEM_PATH, **(env or {})}, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} with cgroup2 mounted failed: {proc.stderr}")
    return proc.stdout

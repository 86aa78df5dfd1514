"""Measures what Slurm's cgroup plugins do with fake GPUs here (docs/slurm-facts.md, issue 44).

One local node (tests/slurm/localslurm.py, `slurmd -N cgv2m44`), two fake GPUs in gres.conf
(`c 195 0|1`) and one device in no gres.conf line (`nvidia5`, `c 195 5`); each job, run as the
tests' ordinary user, opens the three and prints the errno (ENXIO: the cgroup let it through,
there is no driver; EPERM: denied). With cgroup v2 it also lists the cgroups that hold a
BPF_CGROUP_DEVICE program while the job runs (the bpf(2) syscall; no bpftool needed).

Root only. It runs in a private mount namespace (`unshare --mount --propagation private`) where
cgroup2 is mounted over /sys/fs/cgroup (v2) or the host's v1 tree is kept (`--v1`); `--root R`
runs the Slurm of a Debian root (.ci/second-slurm's, e.g. /var/tmp/gpugate-second-slurm/sid/root)
with /proc, /sys, /dev, /run and /tmp mounted into it, in that namespace only. `--shim` starts
slurmd with tools/cgroup_v1hide.c preloaded: on a hybrid machine every release otherwise stops
at "Hybrid mode is not supported". Prints one JSON report; leaves no cgroup of its own behind.

    python3 tools/measure_cgroup_v2.py --shim [--root R] [--quarantine] [--jobs gpu,none,quar]
        [--cgroup-conf 'CgroupPlugin=cgroup/v2\\nIgnoreSystemd=yes\\nConstrainDevices=yes']
        [--select CR_Core_Memory] [--v1]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOCALSLURM = HERE.parent / "tests" / "slurm" / "localslurm.py"
SHIM_SOURCE = HERE / "cgroup_v1hide.c"
NODE = "cgv2m44"  # a name no test cluster uses: its cgroups are ours to remove
V2_CONF = "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nConstrainDevices=yes\n"
V1_CONF = "CgroupPlugin=cgroup/v1\nConstrainDevices=yes\n"
# The host's view of the kernel's one cgroup2 hierarchy, and its v1 trees (hybrid machines).
HOST_V2 = Path("/sys/fs/cgroup/unified")
HOST_V1 = Path("/sys/fs/cgroup")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GRES_OF = {"gpu": "gpu:1", "none": None, "quar": "gpuquarantine:1", "gpu2": "gpu:2"}
# bpf(2) BPF_PROG_QUERY for attach type BPF_CGROUP_DEVICE (include/uapi/linux/bpf.h), x86_64.
SYS_BPF = 321
BPF_PROG_QUERY = 16
BPF_CGROUP_DEVICE = 6
OPEN_DEVICES = """
import errno, os
for path in DEVICES:
    try:
        os.close(os.open(path, os.O_RDONLY))
        print("OPEN", path, "OPENED")
    except OSError as exc:
        print("OPEN", path, errno.errorcode.get(exc.errno, exc.errno))
print("CGROUP", open("/proc/self/cgroup").read().replace(chr(10), " | "))
"""


class _QueryAttr(ctypes.Structure):
    """The query part of union bpf_attr, padded to the kernel's size."""

    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64),
        ("prog_cnt", ctypes.c_uint32),
        ("pad", ctypes.c_uint8 * 100),
    ]


def device_programs(cgroup: Path) -> list[int] | str:
    """Ids of the BPF_CGROUP_DEVICE programs attached to one cgroup, or the errno text."""
    libc = ctypes.CDLL(None, use_errno=True)
    ids = (ctypes.c_uint32 * 64)()
    attr = _QueryAttr(attach_type=BPF_CGROUP_DEVICE, prog_cnt=64)
    attr.prog_ids = ctypes.addressof(ids)
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        attr.target_fd = fd
        if libc.syscall(SYS_BPF, BPF_PROG_QUERY, ctypes.byref(attr), ctypes.sizeof(attr)):
            return os.strerror(ctypes.get_errno())
        return [ids[i] for i in range(attr.prog_cnt)]
    finally:
        os.close(fd)


def programs_below(root: Path) -> dict[str, list[int] | str]:
    """Every cgroup below ``root`` holding a device program (path relative to root)."""
    found: dict[str, list[int] | str] = {}
    for dirpath, _dirs, files in os.walk(root):
        if "cgroup.procs" in files:
            programs = device_programs(Path(dirpath))
            if programs:
                found[str(Path(dirpath).relative_to(root))] = programs
    return found


def _localslurm() -> Any:
    """tests/slurm/localslurm.py, imported from beside this script (copied there)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import localslurm  # type: ignore[import-not-found]  # copied beside this file at run time

    return localslurm


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start the cluster, run the jobs, stop it; the report (runs inside the namespace)."""
    ls = _localslurm()
    base: Any = ls.LocalSlurm

    class Cluster(base):  # type: ignore[misc]  # localslurm is loaded at run time, untyped
        """A LocalSlurm with our cgroup.conf, debug logs and an optional quarantine GRES."""

        def _write_configs(self) -> None:
            super()._write_configs()
            (self.base / "etc" / "cgroup.conf").write_text(args.cgroup_conf)

        def _write_fake_gpus(self) -> None:
            super()._write_fake_gpus()
            extra = self.base / "dev" / NODE / "nvidia5"
            extra.unlink(missing_ok=True)
            ls._run_quiet(["mknod", "-m", "666", str(extra), "c", "195", "5"])

        def slurm_conf_text(self) -> str:
            text: str = super().slurm_conf_text()
            text = text.replace("SlurmdDebug=info", "SlurmdDebug=debug2\nDebugFlags=cgroup")
            text = text.replace("=CR_Core\n", f"={args.select}\n")
            if args.quarantine:
                text = text.replace("GresTypes=gpu", "GresTypes=gpu,gpuquarantine")
                text = text.replace("Gres=gpu:2", "Gres=gpu:1,gpuquarantine:1")
            return text

        def gres_conf_text(self) -> str:
            if not args.quarantine:
                return str(super().gres_conf_text())
            dev = self.base / "dev" / NODE
            return (
                f"AutoDetect=off\nNodeName={NODE} Name=gpu File={dev}/nvidia0\n"
                f"NodeName={NODE} Name=gpuquarantine File={dev}/nvidia1\n"
            )

        def slurmd_argv(self, node: str) -> list[str]:
            argv: list[str] = super().slurmd_argv(node)
            return ["/usr/bin/env", f"LD_PRELOAD={args.shim}", *argv] if args.shim else argv

        # The v1 lock and reset serve the tests' v1 clusters; a v2 run touches neither.
        def _take_cgroup_lock(self) -> None:
            if args.v1:
                super()._take_cgroup_lock()

        def _reset_device_cgroups(self) -> None:
            if args.v1:
                super()._reset_device_cgroups()

    cluster = Cluster(Path(args.base), nodes=[NODE], gpus_per_node=2, device_cgroups=True)
    report: dict[str, Any] = {"slurm": ls.slurm_version(), "cgroup_conf": args.cgroup_conf}
    try:
        cluster.start()
    except (ls.LocalSlurmError, ls.SlurmUnavailable) as exc:
        report["start"] = f"failed: {exc}"
        return report
    report["start"] = "ok"
    try:
        report["node_gres"] = cluster.node(NODE).get("Gres")
        report["jobs"] = [run_job(ls, cluster, name, args.v1) for name in args.jobs.split(",")]
    finally:
        cluster.stop()
    return report


def run_job(ls: Any, cluster: Any, name: str, v1: bool) -> dict[str, Any]:
    """One job as the ordinary user: what it could open, and (v2) where programs sat."""
    devices = [str(cluster.base / "dev" / NODE / f"nvidia{i}") for i in (0, 1, 5)]
    out = cluster.base / "work" / f"{name}.out"
    out.unlink(missing_ok=True)
    code = f"DEVICES = {devices!r}\n{OPEN_DEVICES}"
    script = f"#!/bin/sh\npython3 - <<'EOF'\n{code}EOF\nsleep 5\n"
    result: dict[str, Any] = {"job": name, "gres": GRES_OF[name]}
    try:
        jobid = cluster.submit(script, output=str(out), gres=GRES_OF[name])
    except ls.LocalSlurmError as exc:
        result["submit"] = f"refused: {exc}"
        return result
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and "CGROUP" not in _read(out):
        if cluster.job_state(jobid).get("JobState") in ls.TERMINAL_JOB_STATES:
            break
        time.sleep(0.3)
    opens = [line.split()[1:] for line in _read(out).splitlines() if line.startswith("OPEN ")]
    result["opens"] = {Path(path).name: errno for path, errno in opens}
    if not v1:
        result["device_programs"] = programs_below(Path("/sys/fs/cgroup"))
    try:
        job = cluster.wait_job(jobid, ls.TERMINAL_JOB_STATES, timeout=40)
        result["state"] = job.get("JobState")
    except (TimeoutError, ls.LocalSlurmError) as exc:
        result["state"] = f"not ended: {str(exc)[:300]}"
    return result


def _read(path: Path) -> str:
    """A file's text, empty when it is not there yet."""
    try:
        return path.read_text()
    except OSError:
        return ""


def namespace_stage(args: argparse.Namespace, argv: list[str]) -> int:
    """Inside the private mount namespace: the mounts, then the measurement (chrooted)."""
    root = args.root or ""
    if root:
        _mount("-t", "proc", "proc", f"{root}/proc")
        _mount("--rbind", "/sys", f"{root}/sys")
        _mount("--rbind", "/dev", f"{root}/dev")
        _mount("-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "tmpfs", f"{root}/run")
        # Not nodev: the fake GPUs live below the work dir.
        _mount("-t", "tmpfs", "-o", "mode=1777,nosuid", "tmpfs", f"{root}/tmp")
        Path(f"{root}{args.work}").mkdir(parents=True)
        _mount("--bind", args.work, f"{root}{args.work}")
    if not args.v1:
        _mount("-t", "cgroup2", "none", f"{root}/sys/fs/cgroup")
        if _slurm_major(root) < 23:
            # 22.05 makes only the scope (_init_new_scope: mkdir), not system.slice.
            Path(f"{root}/sys/fs/cgroup/system.slice").mkdir(exist_ok=True)
    python = [f"{args.work}/measure_cgroup_v2.py", "--stage", "measure", *argv]
    if root:
        command = ["chroot", root, "/usr/bin/env", "-i", f"PATH={SYSTEM_PATH}", "HOME=/root",
                   "LANG=C.UTF-8", "python3", *python]  # fmt: skip
    else:
        command = [sys.executable, *python]
    return subprocess.run(command, check=False, timeout=900).returncode


def _mount(*argv: str) -> None:
    """mount(8), failing loudly."""
    subprocess.run(["mount", *argv], check=True, timeout=30)


def _slurm_major(root: str) -> int:
    """The major version of the slurmd in ``root`` (or here)."""
    prefix = ["chroot", root] if root else []
    out = subprocess.run([*prefix, "slurmd", "-V"], capture_output=True, text=True,
                         check=True, timeout=30, env={"PATH": SYSTEM_PATH}).stdout  # fmt: skip
    return int(out.split()[-1].split(".")[0])


def remove_our_cgroups() -> list[str]:
    """rmdir, deepest first, the empty cgroups our slurmd made; what could not go."""
    left = []
    tops = [HOST_V2 / "system.slice" / f"{NODE}_slurmstepd.scope"]
    tops += [tree / f"slurm_{NODE}" for tree in HOST_V1.iterdir() if tree.is_dir()]
    for top in tops:
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda e: -len(e[0])):
            try:
                os.rmdir(dirpath)
            except OSError as exc:
                left.append(f"{dirpath}: {exc.strerror}")
    slice_dir = HOST_V2 / "system.slice"
    if slice_dir.is_dir() and not any(p.is_dir() for p in slice_dir.iterdir()):
        try:
            slice_dir.rmdir()  # ours if empty: this machine has no systemd to own it
        except OSError as exc:
            left.append(f"{slice_dir}: {exc.strerror}")
    return left


def host_stage(args: argparse.Namespace, argv: list[str]) -> int:
    """Copy what runs inside, build the shim, enter the namespace, clean up after."""
    work = Path(tempfile.mkdtemp(prefix="gpugate-cgv2-", dir="/tmp"))
    work.chmod(0o755)  # the job user traverses it to the fake GPUs
    try:
        shutil.copy(__file__, work / "measure_cgroup_v2.py")
        shutil.copy(LOCALSLURM, work / "localslurm.py")
        shutil.copy(LOCALSLURM.with_name("cgroup2ns.py"), work / "cgroup2ns.py")  # it imports it
        extra = ["--work", str(work), "--base", str(work / "cluster")]
        if args.shim:
            so = work / "cgroup_v1hide.so"
            subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", str(so),
                            str(SHIM_SOURCE), "-ldl"], check=True, timeout=120)  # fmt: skip
            extra += ["--shim-path", str(so)]
        command = ["unshare", "--mount", "--propagation", "private", "--", sys.executable,
                   str(Path(__file__).resolve()), "--stage", "namespace", *argv, *extra]  # fmt: skip
        status = subprocess.run(command, check=False, timeout=1200).returncode
    finally:
        left = remove_our_cgroups()
        if left:
            print(f"measure_cgroup_v2: left behind: {left}", file=sys.stderr)
        if args.keep:
            print(f"measure_cgroup_v2: logs kept in {work}/cluster/log", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return status


def _parser() -> argparse.ArgumentParser:
    """The command line (the stages pass theirs on)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="a Debian root whose Slurm to run (chroot)")
    parser.add_argument("--v1", action="store_true", help="keep the v1 tree (no cgroup2 mount)")
    parser.add_argument("--shim", action="store_true", help="preload tools/cgroup_v1hide.c")
    parser.add_argument("--quarantine", action="store_true",
                        help="nvidia1 as GRES gpuquarantine, not gpu")  # fmt: skip
    parser.add_argument("--jobs", default="gpu,none", help=f"from {sorted(GRES_OF)}")
    parser.add_argument("--cgroup-conf", help="cgroup.conf text, \\n between lines")
    parser.add_argument("--select", default="CR_Core", help="SelectTypeParameters")
    parser.add_argument("--keep", action="store_true", help="keep the work dir and logs")
    parser.add_argument("--stage", choices=("host", "namespace", "measure"), default="host",
                        help=argparse.SUPPRESS)  # fmt: skip
    for hidden in ("--work", "--base", "--shim-path"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    return parser


def main() -> int:
    """Entry point: the stage named by --stage (the host's by default)."""
    argv = sys.argv[1:]
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("measure_cgroup_v2: needs root (namespaces, mounts, mknod)", file=sys.stderr)
        return 2
    if args.stage == "host":
        return host_stage(args, argv)
    # The stages below get the host's argv again, with --stage and the hidden paths after it.
    passed = [a for a in argv if a not in ("--stage", "namespace", "measure")]
    if args.stage == "namespace":
        return namespace_stage(args, passed)
    conf = args.cgroup_conf or (V1_CONF if args.v1 else V2_CONF)
    args.cgroup_conf = conf.replace("\\n", "\n").rstrip("\n") + "\n"
    args.shim = args.shim_path
    print(json.dumps(measure(args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A real, private Slurm cluster on this host, for tests and the demo (stdlib only).

Usage from Python::

    with LocalSlurm(base_dir, nodes=["n1", "n2"], prolog="/abs/prolog.sh") as cluster:
        job = cluster.submit(wrap="echo hi", output=str(base_dir / "out.%j"))
        cluster.wait_job(job, "COMPLETED")

Usage from a shell (what ``make demo`` does)::

    python3 tests/slurm/localslurm.py install
    export SLURM_CONF=$(python3 tests/slurm/localslurm.py start --dir /tmp/demo --nodes a,b)
    python3 tests/slurm/localslurm.py stop --dir /tmp/demo

The recipe follows `docs/slurm-facts.md` (Debian 12 / Slurm 22.05 and
Debian 13 / Slurm 24.11, root, no systemd, no GPU). Everything the cluster writes lives under
the base directory; it runs its own munged on a private socket and picks free TCP ports, so
several clusters (and a site's real Slurm) can coexist on one host.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

try:  # tests/slurm on sys.path, as the e2e modules put it (e2e.slurm_or_skip)
    import cgroup2ns
except ModuleNotFoundError:  # imported as tests.slurm.localslurm (test_e2e_slurm_backends alone)
    from tests.slurm import cgroup2ns

APT_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMON_BINARIES = ("slurmctld", "slurmd", "scontrol", "munged")
CLIENT_BINARIES = ("scontrol", "sinfo", "squeue", "sbatch", "scancel", "srun")
# Hooks and daemons get this PATH; sbin is where Debian puts slurmd and munged.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Every process we start carries this variable; stop() only kills processes that carry it with
# our base dir as the value, so it never touches another cluster on the host.
MARKER_VAR = "LOCALSLURM_BASE"
STATE_FILE = "localslurm.json"
TERMINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
# Job fields holding arbitrary text (gpugate writes its verdicts into comments).
JOB_FREE_TEXT = ("AdminComment", "Comment", "SystemComment")
NODE_FREE_TEXT = ("Reason", "Comment")  # gpugate writes node comments too
# What scontrol prints right after those (info_job.c: the comments, then StdErr=; node_info.c:
# Comment, then Extra, InstanceId/InstanceType, ReservationName): where 26.05's one-space
# `-o` join leaves no two spaces, they end a free-text value.
FREE_TEXT_FOLLOWERS = ("StdErr", "Extra", "InstanceId", "InstanceType", "ReservationName")
# Unix socket paths (munged's, slurmstepd's in the spool dir) must fit in sun_path (108 bytes).
MAX_SOCKET_PATH = 107
# Where the sockets go instead when the base dir is too long for them.
SHORT_DIR_ROOT = Path("/run/localslurm")
# The ordinary user that submits the tests' jobs: hooks must be tried on a real user's job, not
# only on root's (root's jobs hide every permission bug: reading as the user, file modes).
JOB_USER = "gpugate-e2e"
# SlurmUser as Debian and RHEL ship it: slurmctld starts as root and drops to this account, so
# EpilogSlurmctld runs as it (slurmd stays root). Debian's package creates it with this uid.
SLURM_USER = "slurm"
DEBIAN_SLURM_UID = 64030
# A RebootProgram for tests: restarts the node's slurmd with -b (see fake_reboot.py).
FAKE_REBOOT = Path(__file__).resolve().with_name("fake_reboot.py")

NodePredicate = Callable[[dict], bool]


# The cgroup v1 devices controller; Slurm's default CgroupMountpoint is /sys/fs/cgroup.
CGROUP_V1_DEVICES = "/sys/fs/cgroup/devices"
# The devices hierarchy is the kernel's, one for the host and every root .ci/second-slurm makes,
# and its groups are named by node (slurm_n1): two clusters with device cgroups at once, in two
# pytest workers or two roots side by side, would deny and reset each other's devices. They
# take turns on a lock in /dev/shm, which those roots share with the host (they bind /dev).
# cgroup2's scopes are named by node too (system.slice/n1_slurmstepd.scope): v2 clusters take it.
CGROUP_LOCK = "/dev/shm/gpugate-tests-device-cgroups.lock"
CGROUP_LOCK_WAIT_S = 1200.0


class SlurmUnavailable(RuntimeError):
    """Slurm cannot run here (not root, or apt cannot provide it): tests should skip."""


class LocalSlurmError(RuntimeError):
    """The local cluster failed to start or misbehaved; the message carries the log tails."""


# --------------------------------------------------------------------------- installation


def find_binary(name: str) -> str | None:
    """Return the absolute path of a Slurm/munge program, also looking in sbin."""
    path = os.environ.get("PATH", "") + ":" + SYSTEM_PATH
    return shutil.which(name, path=path)


def missing_binaries(names: Iterable[str] = DAEMON_BINARIES + CLIENT_BINARIES) -> list[str]:
    """Return the programs among ``names`` that are not installed."""
    return [name for name in names if find_binary(name) is None]


def install(timeout: float = 900) -> None:
    """Install Slurm and munge with apt-get unless they are already there (idempotent)."""
    if not missing_binaries():
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable("Slurm is not installed and installing it needs root")
    apt = find_binary("apt-get")
    if apt is None:
        raise SlurmUnavailable("Slurm is not installed and there is no apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", PATH=SYSTEM_PATH)
    steps = (
        [apt, "update", "-q"],
        [apt, "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES],
    )
    for argv in steps:
        try:
            proc = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnavailable(f"{' '.join(argv)} timed out after {timeout} s") from exc
        if proc.returncode != 0:
            raise SlurmUnavailable(f"{' '.join(argv)} failed:\n{_tail_text(proc.stderr)}")
    still_missing = missing_binaries()
    if still_missing:
        raise SlurmUnavailable(f"apt installed Slurm but these are missing: {still_missing}")


def ensure_available() -> None:
    """Raise SlurmUnavailable unless a local cluster can run (root, Slurm installed)."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("a local Slurm cluster needs root (SlurmUser=root, mknod)")
    install()


def ensure_user(name: str = JOB_USER) -> tuple[int, int]:
    """(uid, gid) of an ordinary local user for test jobs, created (no home, no login) if absent."""
    argv = [_need("useradd"), "--system", "--user-group", "--no-create-home",
            "--home-dir", "/nonexistent", "--shell", "/bin/sh"]  # fmt: skip
    entry = _account(name, argv)
    return entry.pw_uid, entry.pw_gid


def _account(name: str, useradd: list[str]) -> pwd.struct_passwd:
    """NAME's passwd entry, added with USERADD if absent. Parallel test workers (pytest -n)
    ask at once on a fresh machine: one adds it under a lock, the others then find it."""
    import fcntl

    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    with open(os.path.join(tempfile.gettempdir(), ".gpugate-tests-useradd.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(name)
        except KeyError:
            _run_quiet([*useradd, name])
        return pwd.getpwnam(name)


def ensure_slurm_user() -> tuple[int, int]:
    """(uid, gid) of the `slurm` account, created as Debian's package does if absent.

    Debian: a system user and group `slurm`, uid 64030, home /nonexistent, no login shell.
    """
    argv = [_need("useradd"), "--system", "--user-group", "--no-create-home",
            "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"]  # fmt: skip
    try:
        pwd.getpwuid(DEBIAN_SLURM_UID)
    except KeyError:  # Debian's uid when it is free, so files look as on a real site
        argv += ["--uid", str(DEBIAN_SLURM_UID)]
    entry = _account(SLURM_USER, argv)
    return entry.pw_uid, entry.pw_gid


def open_path(path: str | os.PathLike) -> None:
    """Let other users traverse every directory down to ``path`` (pytest's tmp dirs are 0700)."""
    current = Path(path).resolve()
    for directory in (current, *current.parents):
        mode = directory.stat().st_mode
        if not mode & 0o001:
            directory.chmod((mode & 0o7777) | 0o001)


def slurm_version() -> tuple[int, int]:
    """Return (major, minor) from ``slurmd -V``, e.g. (22, 5) or (24, 11)."""
    out = _run_quiet([_need("slurmd"), "-V"]).stdout
    match = re.search(r"(\d+)\.(\d+)", out)
    if match is None:
        raise LocalSlurmError(f"cannot read the Slurm version from {out!r}")
    return int(match.group(1)), int(match.group(2))


@functools.cache
def cpu_layout() -> dict[str, int]:
    """Return this host's CPU layout as ``slurmd -C`` reports it (fallback: cpu_count)."""
    try:
        first = _run_quiet([_need("slurmd"), "-C"]).stdout.splitlines()[0]
        fields = parse_kv(first)
        return {
            "CPUs": int(fields["CPUs"]),
            "Sockets": int(fields.get("SocketsPerBoard", 1)),
            "CoresPerSocket": int(fields["CoresPerSocket"]),
            "ThreadsPerCore": int(fields.get("ThreadsPerCore", 1)),
        }
    except (IndexError, KeyError, ValueError, LocalSlurmError):
        cpus = os.cpu_count() or 1
        return {"CPUs": cpus, "Sockets": 1, "CoresPerSocket": cpus, "ThreadsPerCore": 1}


# --------------------------------------------------------------------------- parsing


_KEY_RE = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/().+-]*)=")


def parse_kv(line: str, free_text: Sequence[str] = ()) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` line into a dict of Key=Value strings.

    Values may contain spaces (OS=Linux 6.1 #1 SMP), so a field starts only at `` Key=``
    with an upper-case key. Free-text values (node Reason, job Comment) may even contain
    ``Key=``: 22.05 and 24.11 end each of them with two spaces, so a key in ``free_text`` runs
    to the next key preceded by two spaces, or to the next free-text key (24.11 prints a
    node's `Comment=` one space after its `Reason=`), or to a key of FREE_TEXT_FOLLOWERS
    (26.05 joins `-o` lines with one space: a job's comments end at `StdErr=`), or to the end
    of the line.
    """
    matches = list(_KEY_RE.finditer(line))
    fields: dict[str, str] = {}
    index = 0
    while index < len(matches):
        match = matches[index]
        key = match.group(1)
        following = matches[index + 1 :]
        if key in free_text:
            following = [
                m
                for m in following
                if line[m.start() - 1 : m.start() + 1] == "  "
                or m.group(1) in free_text
                or m.group(1) in FREE_TEXT_FOLLOWERS
            ]
        end = following[0].start() if following else len(line)
        fields[key] = line[match.end() : end].strip()
        index = matches.index(following[0]) if following else len(matches)
    return fields


def state_flags(state: str) -> set[str]:
    """Split a node State such as ``IDLE+DRAIN`` or ``IDLE*`` into upper-case parts."""
    parts = set(state.upper().replace("*", "+NOT_RESPONDING").split("+"))
    parts.discard("")
    return parts


# --------------------------------------------------------------------------- the cluster


class LocalSlurm:
    """One private Slurm cluster: a munged, a slurmctld and one slurmd per node, all local."""

    def __init__(
        self,
        base_dir: str | os.PathLike,
        nodes: Sequence[str] = ("gpu-node-01",),
        gpus_per_node: int = 8,
        prolog: str | os.PathLike | None = None,
        epilog: str | os.PathLike | None = None,
        task_prolog: str | os.PathLike | None = None,
        epilog_slurmctld: str | os.PathLike | None = None,
        prolog_epilog_timeout: int | None = None,
        prolog_flags: str | None = "Alloc",
        scheduler_parameters: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        wrap_hooks: bool = True,
        extra_conf: str = "",
        cluster_name: str = "localslurm",
        start_timeout: float = 20.0,
        job_user: str | None = JOB_USER,
        reboot_program: str | os.PathLike | None = None,
        health_check_program: str | os.PathLike | None = None,
        health_check_interval: int | None = None,
        health_check_node_state: str | None = None,
        job_submit_lua: str | os.PathLike | None = None,
        slurm_user: str = "root",
        device_cgroups: bool = False,
        cgroup_v2: bool = False,
        simulated_nodes: str = "",
    ) -> None:
        self.base = Path(base_dir).resolve()
        self.nodes = list(nodes)
        # A hostlist (`sim[0001-1000]`) of nodes slurm.conf and the partition list with no
        # slurmd behind them: a real slurmctld's node table at a size one machine cannot run
        # slurmds for (the budget's storm benchmark, bench/bench_scale.py). SlurmdTimeout=0
        # keeps them out of DOWN ("not responding"): slurmctld never pings them.
        self.simulated_nodes = simulated_nodes
        if not self.nodes:
            raise ValueError("a cluster needs at least one node")
        self.gpus_per_node = gpus_per_node
        self.hooks = {
            "Prolog": _abs_or_none(prolog),
            "Epilog": _abs_or_none(epilog),
            "TaskProlog": _abs_or_none(task_prolog),
            "EpilogSlurmctld": _abs_or_none(epilog_slurmctld),
            # Off by default; slurmd runs it every HealthCheckInterval s and at its start.
            "HealthCheckProgram": _abs_or_none(health_check_program),
        }
        self.health_check_interval = health_check_interval
        self.health_check_node_state = health_check_node_state
        self.prolog_epilog_timeout = prolog_epilog_timeout
        self.prolog_flags = prolog_flags
        self.scheduler_parameters = scheduler_parameters
        self.extra_env = dict(extra_env or {})
        self.wrap_hooks = wrap_hooks
        self.extra_conf = extra_conf
        self.cluster_name = cluster_name
        self.start_timeout = start_timeout
        # submit() runs sbatch as this ordinary user (None: as the caller, root).
        self.job_user = job_user
        # RebootProgram= (off by default); FAKE_REBOOT restarts the node's slurmd with -b.
        self.reboot_program = _abs_or_none(reboot_program)
        # JobSubmitPlugins=lua with this script copied beside slurm.conf as job_submit.lua.
        self.job_submit_lua = _abs_or_none(job_submit_lua)
        self.job_uid: int | None = None
        self.job_gid: int | None = None
        # SlurmUser: "root", or "slurm" (created as Debian's package does when missing), which
        # owns what slurmctld writes (state, its log and pid file) and runs EpilogSlurmctld.
        if slurm_user not in ("root", SLURM_USER):
            raise ValueError(f"slurm_user is 'root' or {SLURM_USER!r}, not {slurm_user!r}")
        self.slurm_user = slurm_user
        # TaskPlugin=task/cgroup with ConstrainDevices=yes (cgroup v1), fake GPUs with
        # NVIDIA's major number: a job can open only the GPUs Slurm gave it (errno tells).
        self.device_cgroups = device_cgroups or cgroup_v2
        # The same on Slurm's cgroup/v2 plugin: each slurmd in a mount namespace with cgroup2
        # at /sys/fs/cgroup, preloaded with the hybrid host's shim (cgroup2ns.py).
        self.cgroup_v2 = cgroup_v2
        self.shim: Path | None = None  # the built shim, on a hybrid host
        self.made_slice = False  # whether slurmd made cgroup2's system.slice (ours to remove)
        # The nodes' scopes stop() could not remove (a process still in one), for the tests.
        self.cgroup_leftovers: list[str] = []
        self._cgroup_lock: int | None = None  # the fd holding CGROUP_LOCK while running
        # The GPU indices each node's gres.conf lists (set_gpus() leaves some out).
        self.gpu_indices = {node: list(range(gpus_per_node)) for node in self.nodes}
        self.gpu_counts = {node: gpus_per_node for node in self.nodes}
        self.ctld_port = 0
        self.node_ports: dict[str, int] = {}

    # ----------------------------------------------------------------- paths

    @property
    def conf_path(self) -> Path:
        """The private slurm.conf; clients find it through SLURM_CONF."""
        return self.base / "etc" / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        """Where slurmctld.log, slurmd-<node>.log and munged.log go."""
        return self.base / "log"

    @property
    def work_dir(self) -> Path:
        """Default working directory of submitted jobs (their slurm-%j.out land here)."""
        return self.base / "work"

    @property
    def socket_dir(self) -> Path:
        """Parent of the munged socket and slurmd spool dirs: the base dir if short enough."""
        # slurmstepd listens on SlurmdSpoolDir/<node>_<jobid>.<stepid>; a long base dir (deep
        # pytest tmp paths) would overflow sun_path, so those go to a short private dir.
        node = max(self.nodes, key=len)
        longest = self.base / "spool" / node / f"{node}_1234567.4294967294"
        if len(str(longest)) <= MAX_SOCKET_PATH:
            return self.base
        return SHORT_DIR_ROOT / _short_hash(str(self.base))

    @property
    def munge_socket(self) -> Path:
        """The private munged socket (AuthInfo=socket=...)."""
        return self.socket_dir / "munge" / "munge.socket"

    @property
    def spool_dir(self) -> Path:
        """Parent of the per-node SlurmdSpoolDir (``spool/<node>``)."""
        return self.socket_dir / "spool"

    def slurmd_log(self, node: str) -> Path:
        """The SlurmdLogFile of ``node`` (hook output lands here too)."""
        return self.log_dir / f"slurmd-{node}.log"

    def _pid_files(self) -> dict[str, Path]:
        """Daemon name -> pid file, for every daemon of this cluster."""
        run = self.base / "run"
        files = {"slurmctld": run / "slurmctld.pid", "munged": run / "munged.pid"}
        files.update({f"slurmd-{n}": run / f"slurmd-{n}.pid" for n in self.nodes})
        return files

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> LocalSlurm:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> LocalSlurm:
        """Write the configs and start munged, slurmctld and every slurmd; wait for idle."""
        ensure_available()
        self._kill_leftovers()  # a crashed earlier run of this base dir
        self._prepare_dirs()
        self._prepare_job_user()
        self._prepare_slurm_user()
        self._pick_ports()
        self._write_munge_key()
        self._write_fake_gpus()
        self._write_configs()
        self._save_state()
        if self.device_cgroups:
            self._take_cgroup_lock()
            try:
                if self.cgroup_v2:
                    self._prepare_cgroup_v2()
                else:
                    self._reset_device_cgroups()
            except BaseException:
                self._release_cgroup_lock()
                raise
        try:
            self._start_munged()
            self._start_daemon([_need("slurmctld"), "-f", str(self.conf_path)], "slurmctld")
            for node in self.nodes:
                self._start_daemon(self.slurmd_argv(node), f"slurmd-{node}")
            self.wait_idle(timeout=self.start_timeout)
        except (LocalSlurmError, TimeoutError, subprocess.SubprocessError, OSError) as exc:
            report = self.log_tails()
            self.stop()
            raise LocalSlurmError(f"local Slurm did not come up: {exc}\n{report}") from exc
        return self

    def slurmd_argv(self, node: str) -> list[str]:
        """How the slurmd of ``node`` is started (with ``cgroup_v2``: in its namespace)."""
        argv = [_need("slurmd"), "-f", str(self.conf_path), "-N", node]
        if not self.cgroup_v2:
            return argv
        if self.shim is not None:  # slurmstepd inherits it; hooks get no daemon variable
            argv = ["/usr/bin/env", f"LD_PRELOAD={self.shim}", *argv]
        return cgroup2ns.in_view(argv)

    def on_node(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run as a command on a node of this cluster sees the host: with
        ``cgroup_v2``, cgroup2 at /sys/fs/cgroup as its slurmd has it (gpugate's route)."""
        return cgroup2ns.in_view(argv) if self.cgroup_v2 else list(argv)

    def restart_slurmd(self, node: str, booted: bool = False, timeout: float = 20.0) -> None:
        """Stop the slurmd of ``node`` and start it again; ``booted`` adds ``-b`` (slurmd(8):
        "Report node rebooted when daemon restarted. Used for testing purposes")."""
        pid = self._daemon_pid(f"slurmd-{node}")
        if pid is not None:
            _terminate([pid], grace=timeout / 2)
        argv = self.slurmd_argv(node) + (["-b"] if booted else [])
        self._start_daemon(argv, f"slurmd-{node}")

    def stop(self, timeout: float = 20.0) -> None:
        """Cancel every job, shut the daemons down, kill leftovers. Safe to call twice."""
        if self._alive("slurmctld"):
            try:
                self._cancel_all_jobs(timeout=timeout / 2)
                self.run(["scontrol", "shutdown"], timeout=10, check=False)
            except (LocalSlurmError, subprocess.SubprocessError, OSError):
                pass  # a dead or broken controller: the kills below still clean up
            self._wait_gone(["slurmctld", *[f"slurmd-{n}" for n in self.nodes]], timeout=5)
        self._kill_leftovers()
        if self.device_cgroups:
            try:
                if self.cgroup_v2:  # a program attached there goes with its scope
                    self.cgroup_leftovers = cgroup2ns.remove_scopes(self.nodes, self.made_slice)
                else:  # a denied device must not reach the next cluster
                    self._reset_device_cgroups()
            finally:
                self._release_cgroup_lock()

    def _prepare_cgroup_v2(self) -> None:
        """No scope of an earlier run (with a device program on it) for these nodes; the shim
        built on a hybrid host."""
        why = cgroup2ns.problem()
        if why:
            raise SlurmUnavailable(f"cgroup v2: {why}")
        left = cgroup2ns.remove_scopes(self.nodes)
        if left:
            raise LocalSlurmError(f"cgroup2 system.slice/{left}: an earlier cluster's processes "
                                  "are still there")  # fmt: skip
        self.made_slice = not cgroup2ns.slice_exists()
        if cgroup2ns.hybrid():
            self.shim = cgroup2ns.build_shim(self.base / "cgroup_v1hide.so")

    def _take_cgroup_lock(self) -> None:
        """Wait for CGROUP_LOCK (another cluster with device cgroups may hold it), bounded."""
        import fcntl

        if self._cgroup_lock is not None:
            return
        path = CGROUP_LOCK if os.path.isdir(os.path.dirname(CGROUP_LOCK)) else os.path.join(
            tempfile.gettempdir(), os.path.basename(CGROUP_LOCK))  # fmt: skip
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + CGROUP_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise LocalSlurmError(
                        f"{path}: another cluster with device cgroups held it for "
                        f"{CGROUP_LOCK_WAIT_S:.0f} s"
                    ) from None
                time.sleep(0.5)
        self._cgroup_lock = fd

    def _release_cgroup_lock(self) -> None:
        """Let the next cluster with device cgroups start."""
        if self._cgroup_lock is not None:
            os.close(self._cgroup_lock)  # closing the only fd drops the flock
            self._cgroup_lock = None

    def _prepare_dirs(self) -> None:
        """Create the directory tree; wipe state and spool so no saved DRAIN survives."""
        for old in (self.base / "state", self.spool_dir):
            shutil.rmtree(old, ignore_errors=True)
        for sub in ("etc", "state", "run", "log", "dev", "munge", "work", "hooks"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self.munge_socket.parent.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.spool_dir / node).mkdir(parents=True, exist_ok=True)
        # Keep the previous run's logs for post-mortems, start each run with fresh ones.
        for log in self.log_dir.glob("*.log"):
            log.replace(log.with_suffix(".log.prev"))

    def _prepare_job_user(self) -> None:
        """Create the job user; let it reach the config, munged's socket and its work dir."""
        if not self.job_user:
            return
        self.job_uid, self.job_gid = ensure_user(self.job_user)
        for path in (self.base / "etc", self.munge_socket.parent):
            open_path(path)
        os.chown(self.work_dir, self.job_uid, self.job_gid)

    def _prepare_slurm_user(self) -> None:
        """For SlurmUser=slurm: what slurmctld writes is slurm's, what it reads it can reach."""
        if self.slurm_user == "root":
            return
        uid, gid = ensure_slurm_user()
        # slurmctld drops to SlurmUser after reading slurm.conf and creating its pid file: the
        # state dir, its log and pid file must be the account's, as Debian's package sets up.
        state = self.base / "state"
        os.chown(state, uid, gid)
        state.chmod(0o700)
        for path in (self.log_dir / "slurmctld.log", self.base / "run" / "slurmctld.pid"):
            path.touch()
            os.chown(path, uid, gid)
        # It reads slurm.conf, reaches munged's socket and runs EpilogSlurmctld (extra_env's
        # wrappers live in hooks/): traversal down to them, nothing listed.
        for path in (self.base / "etc", self.munge_socket.parent, self.base / "hooks"):
            open_path(path)

    def _pick_ports(self) -> None:
        """Choose free TCP ports for slurmctld and each slurmd."""
        ports = _free_ports(1 + len(self.nodes))
        self.ctld_port = ports[0]
        self.node_ports = dict(zip(self.nodes, ports[1:]))

    def _write_munge_key(self) -> None:
        """Create a private munge key (munged wants it 0400, owned by the user it runs as)."""
        key = self.base / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)

    def _write_fake_gpus(self) -> None:
        """Make the char devices that gres.conf lists as GPUs (File= is required).

        /dev/null's numbers (1,3) by default; with ``device_cgroups`` NVIDIA's (195,N), which
        no driver serves here: opening one fails ENXIO where the cgroup allows it and EPERM
        where it does not, so a job can tell which GPUs Slurm let it open.
        """
        for node in self.nodes:
            node_dir = self.base / "dev" / node
            node_dir.mkdir(parents=True, exist_ok=True)
            if self.device_cgroups and os.statvfs(node_dir).f_flag & os.ST_NODEV:
                raise LocalSlurmError(
                    f"{node_dir} is on a filesystem mounted nodev: jobs could open none of its "
                    "fake GPUs (EACCES), whatever their device cgroup says; use another base dir"
                )
            for index in range(self.gpus_per_node):
                dev = node_dir / f"nvidia{index}"
                major, minor = ("195", str(index)) if self.device_cgroups else ("1", "3")
                if dev.exists():
                    dev.unlink()  # a previous run of this base dir may have had the other kind
                _run_quiet(["mknod", "-m", "666", str(dev), "c", major, minor])
            if self.device_cgroups:
                # The jobs open these as the job user: every directory above must let them by
                # (pytest's tmp dirs are 0700), or every open fails EACCES, cgroup or not.
                open_path(node_dir)

    def gpu_device(self, node: str, index: int) -> Path:
        """The fake device file of GPU ``index`` on ``node``."""
        return self.base / "dev" / node / f"nvidia{index}"

    def set_gpus(self, node: str, indices: Sequence[int], count: int | None = None) -> None:
        """Rewrite gres.conf so ``node`` lists only these GPUs' files, and slurm.conf's
        ``Gres=gpu:N`` to their number (or to ``count``, to make the two disagree).

        Nothing is reloaded: the caller picks ``scontrol reconfigure`` or restarts.
        """
        self.gpu_indices[node] = sorted(indices)
        self.gpu_counts[node] = len(indices) if count is None else count
        self._write_configs()

    def restart_slurmctld(self, timeout: float = 20.0) -> None:
        """Stop slurmctld and start it again on the same state (running jobs survive)."""
        pid = self._daemon_pid("slurmctld")
        if pid is not None:
            _terminate([pid], grace=timeout / 2)
        self._start_daemon([_need("slurmctld"), "-f", str(self.conf_path)], "slurmctld")

    def device_cgroup(self, node: str) -> Path:
        """Where slurmd of ``node`` puts its jobs in the cgroup v1 devices hierarchy.

        These clusters run several slurmd per host (`slurmd -N`), which use ``slurm_<node>``
        (seen on 22.05 and 24.11); never ``slurm``, which a real slurmd on this host would own.
        """
        return Path(CGROUP_V1_DEVICES) / f"slurm_{node}"

    def _reset_device_cgroups(self) -> None:
        """Allow every device again below each node's cgroup (a test may have denied some)."""
        for node in self.nodes:
            allow = self.device_cgroup(node) / "devices.allow"
            if allow.exists():
                allow.write_text("a")

    def _write_configs(self) -> None:
        """Write slurm.conf, gres.conf and (only for 24.x+) cgroup.conf."""
        etc = self.base / "etc"
        self.conf_path.write_text(self.slurm_conf_text())
        (etc / "gres.conf").write_text(self.gres_conf_text())
        if self.job_submit_lua is not None:
            (etc / "job_submit.lua").write_text(Path(self.job_submit_lua).read_text())
        cgroup_conf = etc / "cgroup.conf"
        if self.cgroup_v2:
            cgroup_conf.write_text(cgroup2ns.CGROUP_CONF)
        elif self.device_cgroups:
            # Both versions take cgroup/v1 by name (22.05 refuses only "disabled").
            cgroup_conf.write_text("CgroupPlugin=cgroup/v1\nConstrainDevices=yes\n")
        elif slurm_version() >= (24, 0):
            # 24.x always loads a cgroup plugin and fails where cgroups are unusable;
            # 22.05 refuses this line (no plugin named "disabled"), so write it only here.
            cgroup_conf.write_text("CgroupPlugin=disabled\n")
        elif cgroup_conf.exists():
            cgroup_conf.unlink()

    def slurm_conf_text(self) -> str:
        """Return the slurm.conf this cluster runs with."""
        base = self.base
        lines = [
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={_hostname()}(127.0.0.1)",
            f"SlurmUser={self.slurm_user}",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.node_ports[self.nodes[0]]}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={base}/state",
            f"SlurmdSpoolDir={self.spool_dir}/%n",
            f"SlurmctldPidFile={base}/run/slurmctld.pid",
            f"SlurmdPidFile={base}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={base}/log/slurmctld.log",
            f"SlurmdLogFile={base}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroups unless asked for (device_cgroups): cgroup v1 device rules need root.
            "ProctrackType=proctrack/cgroup"
            if self.device_cgroups
            else "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/cgroup" if self.device_cgroups else "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "MailProg=/bin/true",
            # A node that was DOWN (not DRAIN) comes back by itself when its slurmd registers.
            "ReturnToService=2",
            # Finished jobs stay visible to `scontrol show job` for an hour.
            "MinJobAge=3600",
            # Fast tests: SIGKILL 2 s after SIGTERM when a job is cancelled.
            "KillWait=2",
            "SlurmdTimeout=0" if self.simulated_nodes else "SlurmdTimeout=30",
            "MessageTimeout=10",
            "GresTypes=gpu",
        ]
        lines += self._hook_lines()
        if self.prolog_flags:
            lines.append(f"PrologFlags={self.prolog_flags}")
        if self.prolog_epilog_timeout is not None:
            lines.append(f"PrologEpilogTimeout={int(self.prolog_epilog_timeout)}")
        if self.reboot_program is not None:
            lines.append(f"RebootProgram={self.reboot_program}")
        if self.job_submit_lua is not None:
            lines.append("JobSubmitPlugins=lua")  # reads job_submit.lua beside slurm.conf
        if self.health_check_interval is not None:
            lines.append(f"HealthCheckInterval={int(self.health_check_interval)}")
        if self.health_check_node_state:
            lines.append(f"HealthCheckNodeState={self.health_check_node_state}")
        lines.append(f"SchedulerParameters={self.scheduler_parameters_text()}")
        if self.extra_conf:
            lines.append(self.extra_conf.strip())
        lines += [self._node_line(node) for node in self.nodes]
        members = ",".join(self.nodes)
        if self.simulated_nodes:
            lines.append(
                f"NodeName={self.simulated_nodes} NodeHostname={_hostname()} "
                "NodeAddr=127.0.0.1 CPUs=1 RealMemory=1000 State=UNKNOWN"
            )
            members += f",{self.simulated_nodes}"
        lines.append(f"PartitionName=debug Nodes={members} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def scheduler_parameters_text(self) -> str:
        """SchedulerParameters: ours for fast job starts, then the caller's."""
        # slurmctld starts batch jobs from a 1 s background tick, and by default only once
        # batch_sched_delay (3 s) has passed since the last pass: submit->RUNNING took 2-3 s.
        # With 0 it is the next tick (about 0.5 s). sched_interval, sched_min_interval and
        # defer made no difference.
        params = ["batch_sched_delay=0"]
        if self.scheduler_parameters:
            params.append(self.scheduler_parameters)
        return ",".join(params)

    def _node_line(self, node: str) -> str:
        """One NodeName= line; every node is this host, on its own slurmd port."""
        layout = " ".join(f"{key}={value}" for key, value in cpu_layout().items())
        gres = f" Gres=gpu:{self.gpu_counts[node]}" if self.gpus_per_node else ""
        return (
            f"NodeName={node} NodeHostname={_hostname()} NodeAddr=127.0.0.1 "
            f"Port={self.node_ports[node]} {layout} RealMemory=1000{gres} State=UNKNOWN"
        )

    def gres_conf_text(self) -> str:
        """Return gres.conf: fake GPU files per node, no NVML autodetection."""
        lines = ["AutoDetect=off"]
        for node in self.nodes if self.gpus_per_node else ():
            indices = self.gpu_indices[node]
            if not indices:
                continue
            names = f"nvidia{indices[0]}" if len(indices) == 1 else f"nvidia[{_ranges(indices)}]"
            lines.append(f"NodeName={node} Name=gpu File={self.base}/dev/{node}/{names}")
        return "\n".join(lines) + "\n"

    def _hook_lines(self) -> list[str]:
        """Prolog=/Epilog=/... lines, pointing at env-setting wrappers when extra_env is set."""
        lines = []
        for key, path in self.hooks.items():
            if path is None:
                continue
            if self.extra_env and self.wrap_hooks:
                path = self._write_hook_wrapper(key, path)
            lines.append(f"{key}={path}")
        return lines

    def _write_hook_wrapper(self, key: str, target: str) -> str:
        """Write a wrapper that exports extra_env, then execs the real hook.

        slurmd and slurmctld build hook environments from scratch: variables in the daemons'
        own environment (and PATH) never reach Prolog/Epilog/EpilogSlurmctld.
        """
        exports = "".join(
            f"export {name}={_sh_quote(value)}\n" for name, value in sorted(self.extra_env.items())
        )
        wrapper = self.base / "hooks" / f"{key}.wrapper.sh"
        wrapper.write_text(f'#!/bin/sh\n{exports}exec {_sh_quote(target)} "$@"\n')
        wrapper.chmod(0o755)
        return str(wrapper)

    def _save_state(self) -> None:
        """Record what the CLI's stop/status need to find this cluster again."""
        state = {
            "nodes": self.nodes,
            "ctld_port": self.ctld_port,
            "node_ports": self.node_ports,
            "conf": str(self.conf_path),
        }
        (self.base / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def from_dir(cls, base_dir: str | os.PathLike) -> LocalSlurm:
        """Rebuild a handle on a cluster started earlier (e.g. by the CLI) in ``base_dir``."""
        base = Path(base_dir).resolve()
        try:
            state = json.loads((base / STATE_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise LocalSlurmError(f"no local Slurm was started in {base}: {exc}") from exc
        cluster = cls(base, nodes=state["nodes"])
        cluster.ctld_port = state["ctld_port"]
        cluster.node_ports = state["node_ports"]
        return cluster

    # ----------------------------------------------------------------- daemons

    def daemon_env(self) -> dict[str, str]:
        """The environment the daemons start with (a clean one, plus extra_env)."""
        env = {
            "PATH": SYSTEM_PATH,
            "LANG": "C.UTF-8",
            "HOME": "/root",
            "SLURM_CONF": str(self.conf_path),
            MARKER_VAR: str(self.base),
        }
        env.update(self.extra_env)
        return env

    def _start_munged(self) -> None:
        """Start a private munged on its own socket, key, pid, log and seed files."""
        socket_path = self.munge_socket
        argv = [
            _need("munged"),
            # As root and below a 0700 dir (pytest's tmp) munged refuses to start; --force
            # turns those checks into warnings. Nothing but root uses this socket.
            "--force",
            f"--socket={socket_path}",
            f"--key-file={self.base}/munge/munge.key",
            f"--pid-file={self.base}/run/munged.pid",
            f"--log-file={self.log_dir}/munged.log",
            f"--seed-file={self.base}/munge/munged.seed",
        ]
        self._start_daemon(argv, "munged")
        _poll(socket_path.exists, timeout=5, what=f"munged socket {socket_path}")

    def _start_daemon(self, argv: list[str], name: str) -> None:
        """Run a self-daemonizing program; its exit status is only a hint (24.11 exits 0
        on a failed init), so start() still waits for the nodes to be idle."""
        proc = subprocess.run(
            argv,
            env=self.daemon_env(),
            cwd=str(self.log_dir),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode != 0:
            raise LocalSlurmError(
                f"{name} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}"
            )

    def _alive(self, name: str) -> bool:
        """Whether the daemon ``name`` of this cluster is running."""
        return self._daemon_pid(name) is not None

    def _daemon_pid(self, name: str) -> int | None:
        """The pid in ``name``'s pid file if that process is ours (carries the marker)."""
        try:
            pid = int(self._pid_files()[name].read_text().split()[0])
        except (OSError, ValueError, IndexError, KeyError):
            return None
        return pid if self._is_ours(pid) else None

    def _is_ours(self, pid: int) -> bool:
        """Whether process ``pid`` was started by this cluster (or one of its jobs)."""
        marker = f"{MARKER_VAR}={self.base}".encode()
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return marker in environ.split(b"\0")

    def processes(self) -> list[int]:
        """Every process carrying our marker: daemons, slurmstepd, job processes."""
        spared = _self_and_ancestors()
        pids = []
        for entry in Path("/proc").iterdir():
            pid = int(entry.name) if entry.name.isdigit() else 0
            if pid and pid not in spared and self._is_ours(pid):
                pids.append(pid)
        return pids

    def _wait_gone(self, names: Iterable[str], timeout: float) -> None:
        """Wait (bounded) until none of the named daemons is running."""
        names = list(names)
        with contextlib.suppress(TimeoutError):  # _kill_leftovers() deals with the rest
            _poll(lambda: not any(self._alive(n) for n in names), timeout, "daemons to exit")

    def _kill_leftovers(self) -> None:
        """SIGTERM then SIGKILL every process of this cluster; munged last (Slurm uses it)."""
        for group in (lambda pid: not self._is_munged(pid), lambda pid: True):
            pids = [pid for pid in self.processes() if group(pid)]
            _terminate(pids, grace=3.0)
        for pid_file in self._pid_files().values():
            pid_file.unlink(missing_ok=True)
        if self.socket_dir != self.base:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def _is_munged(self, pid: int) -> bool:
        """Whether ``pid`` is our munged."""
        return pid == self._daemon_pid("munged")

    # ----------------------------------------------------------------- clients

    def env(self) -> dict[str, str]:
        """Environment for client commands (sbatch, scontrol...) aimed at this cluster."""
        env = {
            key: value
            for key, value in os.environ.items()
            # A caller inside another job, or with SBATCH_* defaults, would skew our commands.
            if not key.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_"))
        }
        env["PATH"] = env.get("PATH", "") + ":" + SYSTEM_PATH
        env["SLURM_CONF"] = str(self.conf_path)
        # Jobs inherit the submitter's environment: the marker lets stop() find stray ones.
        env[MARKER_VAR] = str(self.base)
        return env

    def run(
        self,
        argv: Sequence[str],
        timeout: float = 30.0,
        check: bool = True,
        input: str | None = None,
        as_job_user: bool = False,
        extra_env: Mapping[str, str] | None = None,
        as_user: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a Slurm client command (argv list) against this cluster; text output.

        ``as_job_user`` runs it as the cluster's ordinary job user instead of the caller;
        ``as_user`` as another ordinary user of that name (created if absent).
        """
        argv = list(argv)
        argv[0] = find_binary(argv[0]) or argv[0]
        user: dict[str, Any] = {}
        if as_job_user and self.job_user and self.job_uid is None:
            self.job_uid, self.job_gid = ensure_user(self.job_user)  # from_dir(): look it up
        if as_job_user and self.job_uid is not None:
            user = {"user": self.job_uid, "group": self.job_gid, "extra_groups": []}
        if as_user is not None:
            uid, gid = ensure_user(as_user)
            user = {"user": uid, "group": gid, "extra_groups": []}
        proc = subprocess.run(
            argv,
            env={**self.env(), **(extra_env or {})},
            **user,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise LocalSlurmError(
                f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}"
            )
        return proc

    def submit(
        self,
        script: str | None = None,
        *,
        wrap: str | None = None,
        as_root: bool = False,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        **options: Any,
    ) -> int:
        """Submit a batch job (script text via stdin, or ``wrap``); return its job id.

        Options become sbatch flags: ``output="o.%j"`` -> ``--output=o.%j``,
        ``no_requeue=True`` -> ``--no-requeue``; False/None are left out. Jobs run in
        ``work_dir`` unless ``chdir`` is given, as the ordinary ``job_user`` unless ``as_root``
        (or the cluster has no job user). ``env`` adds variables to the submitter's environment
        (sbatch passes it on to the job). ``user`` submits as another ordinary user.
        """
        if (script is None) == (wrap is None):
            raise ValueError("give exactly one of script and wrap")
        options.setdefault("chdir", str(self.work_dir))
        argv = ["sbatch", "--parsable", *_sbatch_flags(options)]
        if wrap is not None:
            argv.append(f"--wrap={wrap}")
        proc = self.run(argv, input=script, as_job_user=not as_root, extra_env=env, as_user=user)
        # --parsable prints "ID" or "ID;cluster".
        return int(proc.stdout.strip().split(";")[0])

    def job_state(self, jobid: int) -> dict[str, str]:
        """Return ``scontrol show job -o`` of ``jobid`` as a dict (JobState, Reason, ...)."""
        proc = self.run(["scontrol", "show", "job", "-o", str(jobid)])
        line = proc.stdout.strip().splitlines()[0]
        return parse_kv(line, free_text=JOB_FREE_TEXT)

    def wait_job(
        self,
        jobid: int,
        states: str | Iterable[str],
        timeout: float = 30.0,
        reason: str | None = None,
    ) -> dict[str, str]:
        """Poll until the job's JobState is one of ``states`` (and, if given, its Reason
        contains ``reason``, underscores read as spaces); return its fields.

        Raises LocalSlurmError at once if the job ends in an unwanted terminal state, and
        TimeoutError (with the last fields) when ``timeout`` passes.
        """
        wanted = {states} if isinstance(states, str) else set(states)
        wanted = {state.upper() for state in wanted}
        deadline = time.monotonic() + timeout
        while True:
            job = self.job_state(jobid)
            state = job.get("JobState", "")
            # scontrol text says launch_failed_requeued_held, JSON and squeue use spaces.
            job_reason = job.get("Reason", "").replace("_", " ")
            if state in wanted and (reason is None or reason.replace("_", " ") in job_reason):
                return job
            if state in TERMINAL_JOB_STATES and state not in wanted and not self.completing(jobid):
                raise LocalSlurmError(f"job {jobid} ended {state}, wanted {sorted(wanted)}: {job}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {jobid} not {sorted(wanted)} after {timeout} s: {job}")
            time.sleep(0.05)

    def completing(self, jobid: int) -> bool:
        """Whether the job's epilogs (the nodes' or EpilogSlurmctld) still run.

        scontrol's JobState can read FAILED while the COMPLETING flag is still set (seen on
        24.11 with EpilogSlurmctld running; 22.05 said COMPLETING there); squeue reports the
        flag instead of the base state (slurm.schedmd.com/job_state_codes.html). A FAILED job
        may still be requeued by EpilogSlurmctld until the flag clears.
        """
        proc = self.run(["squeue", "-h", "-j", str(jobid), "-o", "%T"], check=False)
        return proc.stdout.strip() == "COMPLETING"

    def node(self, name: str) -> dict[str, str]:
        """Return ``scontrol show node -o NAME`` as a dict (State, Reason, Gres, ...)."""
        proc = self.run(["scontrol", "show", "node", "-o", name])
        return parse_kv(proc.stdout.strip().splitlines()[0], free_text=NODE_FREE_TEXT)

    def is_drained(self, name: str) -> bool:
        """Whether the node carries the DRAIN flag (24.11 keeps Reason after a resume)."""
        return "DRAIN" in state_flags(self.node(name).get("State", ""))

    def wait_node(
        self, name: str, want: str | NodePredicate, timeout: float = 30.0
    ) -> dict[str, str]:
        """Poll until the node's State equals ``want`` (e.g. ``IDLE+DRAIN``) or
        ``want(fields)`` is true; return the fields, or raise TimeoutError."""
        if isinstance(want, str):
            wanted = want.upper()

            def check(fields: dict) -> bool:
                return fields.get("State", "").upper() == wanted

        else:
            check = want
        last: dict[str, str] = {}

        def ready() -> bool:
            nonlocal last
            last = self.node(name)
            return check(last)

        _poll(ready, timeout, what=f"node {name} to be {want}", detail=lambda: str(last))
        return last

    def sinfo_states(self) -> dict[str, str]:
        """Node name -> sinfo's compact state (``idle``, ``idle*``, ``drained``, ``mixed``)."""
        proc = self.run(["sinfo", "-h", "-N", "-o", "%N %T"])
        states = {}
        for line in proc.stdout.splitlines():
            name, _, state = line.partition(" ")
            states[name] = state.strip()
        return states

    def wait_idle(self, nodes: Iterable[str] | None = None, timeout: float = 20.0) -> None:
        """Wait until every node is exactly ``idle`` (``idle*`` = not responding yet)."""
        names = list(nodes) if nodes is not None else self.nodes
        last: dict[str, str] = {}
        began = time.monotonic()

        def all_idle() -> bool:
            nonlocal last
            try:
                last = self.sinfo_states()
            except (LocalSlurmError, subprocess.TimeoutExpired):
                # Still starting, unless slurmctld has died (it writes its pid file early).
                if time.monotonic() - began > 2 and not self._alive("slurmctld"):
                    raise LocalSlurmError("slurmctld is not running") from None
                return False
            return all(last.get(name) == "idle" for name in names)

        _poll(all_idle, timeout, what=f"nodes {names} to be idle", detail=lambda: str(last))

    def drain(self, name: str, reason: str) -> None:
        """Drain a node with a reason, as an admin (or gpugate) would."""
        self.run(["scontrol", "update", f"nodename={name}", "state=drain", f"reason={reason}"])

    def resume(self, name: str, wait: bool = True, timeout: float = 20.0) -> None:
        """Resume a drained node; with ``wait``, until it is exactly ``idle`` again."""
        self.run(["scontrol", "update", f"nodename={name}", "state=resume"])
        if wait:
            self.wait_idle([name], timeout=timeout)

    def release(self, jobid: int, timeout: float = 30.0) -> None:
        """Release a held job and clear the +120 s start time that a requeue set."""
        # `scontrol release` only works once the job is PENDING, not while COMPLETING.
        self.wait_job(jobid, "PENDING", timeout=timeout)
        self.run(["scontrol", "release", str(jobid)])
        self.run(["scontrol", "update", f"jobid={jobid}", "StartTime=now"])

    def queue(self) -> list[int]:
        """Ids of the jobs that are not finished (pending, running, completing)."""
        proc = self.run(["squeue", "-h", "-o", "%A"])
        return [int(word) for word in proc.stdout.split()]

    def _cancel_all_jobs(self, timeout: float) -> None:
        """scancel everything and wait for an empty queue: running jobs survive a shutdown."""
        jobs = self.queue()
        if not jobs:
            return
        self.run(["scancel", *map(str, jobs)], check=False)
        with contextlib.suppress(TimeoutError):  # stop() kills what is left
            _poll(lambda: not self.queue(), timeout, what="an empty queue")

    def log_tails(self, lines: int = 30) -> str:
        """The last lines of every daemon log, for error messages."""
        parts = []
        for log in sorted(self.log_dir.glob("*.log")):
            parts.append(f"--- {log} (last {lines} lines)\n{_tail_file(log, lines)}")
        return "\n".join(parts) or f"(no logs in {self.log_dir})"

    def status(self) -> str:
        """A short human-readable status: daemons alive and sinfo's node states."""
        alive = {name: self._alive(name) for name in self._pid_files()}
        text = " ".join(f"{name}={'up' if up else 'down'}" for name, up in alive.items())
        if alive["slurmctld"]:
            try:
                text += "\n" + self.run(["sinfo", "-N", "-o", "%N %T %E"], timeout=10).stdout
            except (LocalSlurmError, subprocess.TimeoutExpired) as exc:
                text += f"\nsinfo failed: {exc}"
        return text


# --------------------------------------------------------------------------- small helpers


def _ranges(indices: Sequence[int]) -> str:
    """Slurm's bracket list of sorted indices: [0, 1, 2, 4, 5] -> "0-2,4-5"."""
    parts: list[str] = []
    start = prev = indices[0]
    for index in [*indices[1:], None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    return ",".join(parts)


def device_cgroups_usable() -> str | None:
    """Why this host cannot run ``device_cgroups`` clusters, or None when it can.

    Slurm's ConstrainDevices needs the cgroup v1 devices controller (v2 hosts use eBPF,
    which these tests do not cover) and root to write its rules.
    """
    devices = Path(CGROUP_V1_DEVICES)
    if not (devices / "devices.deny").exists():
        return f"no cgroup v1 devices controller at {devices}"
    if os.geteuid() != 0:
        return "device cgroup rules need root"
    return None


def _need(name: str) -> str:
    """Absolute path of a required program, or SlurmUnavailable."""
    path = find_binary(name)
    if path is None:
        raise SlurmUnavailable(f"{name} is not installed (run localslurm.py install)")
    return path


def _run_quiet(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a helper program, raising LocalSlurmError with its stderr when it fails."""
    env = dict(os.environ, PATH=SYSTEM_PATH)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise LocalSlurmError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr}")
    return proc


def _abs_or_none(path: str | os.PathLike | None) -> str | None:
    """Return an absolute hook path (Slurm wants absolute paths) or None."""
    return None if path is None else str(Path(path).resolve())


def _hostname() -> str:
    """The short host name: slurmctld checks SlurmctldHost against it."""
    return socket.gethostname().split(".")[0]


def _short_hash(text: str) -> str:
    """A short stable hash, for per-base-dir names."""
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports that are free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _sbatch_flags(options: Mapping[str, Any]) -> list[str]:
    """Turn keyword options into sbatch flags (underscores become dashes)."""
    flags = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not None and value is not False:
            flags.append(f"{flag}={value}")
    return flags


def _sh_quote(value: str) -> str:
    """Quote a string for /bin/sh."""
    return shlex.quote(str(value))


def _poll(
    ready: Callable[[], bool],
    timeout: float,
    what: str,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> None:
    """Call ``ready`` until it returns true; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            extra = f" (last: {detail()})" if detail else ""
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}{extra}")
        time.sleep(interval)


def _terminate(pids: list[int], grace: float) -> None:
    """SIGTERM the processes, then SIGKILL those still there after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        try:
            _poll(lambda: not any(_exists(pid) for pid in pids), grace, "processes to exit")
            return
        except TimeoutError:
            continue  # slurmstepd ignores SIGTERM: SIGKILL it


def _exists(pid: int) -> bool:
    """Whether a (non-zombie) process ``pid`` exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _self_and_ancestors() -> set[int]:
    """Our own pid and those of our ancestors, which stop() must never kill."""
    pids = set()
    pid = os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _tail_file(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file."""
    try:
        return _tail_text(path.read_text(errors="replace"), lines)
    except OSError as exc:
        return f"(cannot read: {exc})"


def _tail_text(text: str, lines: int = 30) -> str:
    """The last ``lines`` lines of a string."""
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------- CLI


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """Turn NAME=VALUE strings into a dict."""
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--env wants NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def _arg_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="apt-get install Slurm and munge if missing")
    start = sub.add_parser("start", help="start a cluster, print its SLURM_CONF path")
    start.add_argument("--dir", required=True, help="private base directory")
    start.add_argument("--nodes", default="gpu-node-01", help="comma-separated node names")
    start.add_argument("--gpus", type=int, default=8, help="fake GPUs per node")
    for hook in ("prolog", "epilog", "task-prolog", "epilog-slurmctld"):
        start.add_argument(f"--{hook}", help=f"absolute path of the {hook} script")
    start.add_argument("--prolog-epilog-timeout", type=int)
    start.add_argument("--prolog-flags", default="Alloc")
    start.add_argument("--scheduler-parameters")
    start.add_argument("--slurm-user", default="root", choices=("root", SLURM_USER),
                       help="SlurmUser: slurmctld drops to it, EpilogSlurmctld runs as it")  # fmt: skip
    start.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for the daemons and hooks"
    )
    for name, text in (("stop", "stop a cluster"), ("status", "show a cluster's state")):
        sub.add_parser(name, help=text).add_argument("--dir", required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: install | start | stop | status."""
    args = _arg_parser().parse_args(argv)
    try:
        if args.command == "install":
            install()
            major, minor = slurm_version()
            print(f"Slurm {major}.{minor:02d} is installed")
        elif args.command == "start":
            cluster = LocalSlurm(
                args.dir,
                nodes=[n for n in args.nodes.split(",") if n],
                gpus_per_node=args.gpus,
                prolog=args.prolog,
                epilog=args.epilog,
                task_prolog=args.task_prolog,
                epilog_slurmctld=args.epilog_slurmctld,
                prolog_epilog_timeout=args.prolog_epilog_timeout,
                prolog_flags=args.prolog_flags or None,
                scheduler_parameters=args.scheduler_parameters,
                extra_env=_parse_env(args.env),
                slurm_user=args.slurm_user,
            )
            cluster.start()
            print(cluster.conf_path)
        elif args.command == "stop":
            if not (Path(args.dir) / STATE_FILE).exists():
                print(f"localslurm: no cluster in {args.dir}, nothing to stop", file=sys.stderr)
                return 0
            LocalSlurm.from_dir(args.dir).stop()
        else:
            print(LocalSlurm.from_dir(args.dir).status())
    except (SlurmUnavailable, LocalSlurmError, TimeoutError) as exc:
        print(f"localslurm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

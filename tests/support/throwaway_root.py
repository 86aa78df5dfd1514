"""A throwaway root: run a command as root with `/` behind an overlay, so the host is unchanged.

The install tests (`dpkg -i`, `dpkg --purge`, a hook.env in /usr/libexec/gpugate) must never
touch the host's own gpugate (issue 26). `run()` starts the command in a private mount
namespace (`unshare --mount`) where a tmpfs holds the upper layer of an overlayfs whose lower
layer is `/` (one more overlay per other real mount: /home, /var, ... when they are separate),
binds the host's /proc, /sys, /dev, /run and /tmp and the checkout into it, and chroots there.
Everything the command writes to /etc, /usr, /var or /opt lands in the tmpfs and is gone when
the namespace ends; writes to /tmp and the checkout are real (results come back that way).

A throwaway root works inside another one (overlay on overlay), so a test that checks the host
is left alone can run the install tests inside a root it prepared.

Run as a program, this file is the part that runs inside the new namespace:
`throwaway_root.py --enter BASE [--bind DIR]... -- ARGV...` (stdlib only).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

# Run as a program it has only the standard library (python -s -E): no tests/paths.py, so the
# checkout is found from this file's own place, tests/support/.
REPO = Path(__file__).resolve().parents[2]
# The host's own, bound in: kernel interfaces, sockets, and the scratch space results go to.
RECURSIVE_BINDS = ("/proc", "/sys", "/dev", "/run")
PLAIN_BINDS = ("/tmp",)  # not recursive: the throwaway root's own tmpfs is mounted under /tmp
# File systems that hold no files of the host's to protect (or are bound in whole above).
PSEUDO_FS = frozenset(
    {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "mqueue", "binfmt_misc",
     "securityfs", "debugfs", "tracefs", "configfs", "fusectl", "pstore", "bpf", "autofs",
     "hugetlbfs", "efivarfs", "nsfs", "rpc_pipefs"}
)  # fmt: skip
# Set in the command's environment: it runs in a throwaway root.
INSIDE_VAR = "GPUGATE_THROWAWAY_ROOT"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _tool(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":" + SYSTEM_PATH)


@functools.cache
def problem() -> str | None:
    """Why a throwaway root cannot be made here (None: it can), found by making one."""
    if os.geteuid() != 0:
        return "a throwaway root needs root (unshare --mount, overlayfs)"
    if _tool("unshare") is None or _tool("mount") is None:
        return "a throwaway root needs unshare and mount (util-linux)"
    try:
        done = run(["/bin/sh", "-c", "touch /etc/.gpugate-throwaway-probe"], timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a throwaway root could not be made: {exc}"
    if done.returncode != 0:
        return f"a throwaway root could not be made here: {(done.stderr or done.stdout)[-500:]}"
    if os.path.lexists("/etc/.gpugate-throwaway-probe"):  # the overlay leaked: never go on
        os.unlink("/etc/.gpugate-throwaway-probe")
        return "a write inside the throwaway root reached the host's /etc"
    return None


def skip_unless_available() -> None:
    """Skip the calling test (touching nothing) when no throwaway root can be made here."""
    import pytest

    why = problem()
    if why is not None:
        pytest.skip(f"{why}: the install tests run only in a throwaway root")


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    binds: Sequence[str | os.PathLike] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ARGV as root in a throwaway root; its output as text (the whole group is killed on
    timeout). The checkout, /tmp and BINDS are the host's own, writable; the rest is overlaid."""
    base = tempfile.mkdtemp(prefix="gpugate-throwaway-", dir="/tmp")
    enter = [_tool("unshare") or "unshare", "--mount", "--propagation", "private", "--",
             sys.executable, "-s", "-E", os.path.abspath(__file__), "--enter", base,
             "--cwd", os.path.abspath(cwd or os.getcwd())]  # fmt: skip
    for path in (REPO, *binds):
        enter += ["--bind", os.path.abspath(path)]
    environ = dict(os.environ if env is None else env)
    environ[INSIDE_VAR] = "1"
    proc = subprocess.Popen([*enter, "--", *argv], env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    finally:
        # The tmpfs was mounted in the namespace only: here BASE is still the empty directory.
        try:
            os.rmdir(base)
        except OSError:
            pass
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


# --------------------------------------------------------------------------- inside


def _mount(*args: str) -> None:
    subprocess.run([_tool("mount") or "mount", *args], check=True, timeout=60,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def _unescape(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) of this namespace's mounts, in mount order."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            found.append((_unescape(left.split()[4]), right.split()[0]))
    return found


def _under(path: str, tops: Sequence[str]) -> bool:
    return any(path == top or path.startswith(top.rstrip("/") + "/") for top in tops)


def _overlay(lower: str, layers: Path, target: str) -> None:
    """An overlay of LOWER at TARGET, its writes into a fresh directory under LAYERS."""
    n = len(os.listdir(layers))
    upper, work = layers / str(n) / "upper", layers / str(n) / "work"
    upper.mkdir(parents=True)
    work.mkdir()
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    _mount("-t", "overlay", "overlay", "-o", options, target)


def _other_mounts(root: str, base: str, layers: Path, binds: Sequence[str]) -> None:
    """Overlay every other real mount (a separate /home or /var); read-only where overlay fails."""
    skip = (*RECURSIVE_BINDS, *PLAIN_BINDS, base, *binds)
    for point, fstype in _mounts():
        if point == "/" or fstype in PSEUDO_FS or _under(point, skip):
            continue
        target = root + point
        if not os.path.isdir(point) or not os.path.isdir(target):
            continue  # a file bind mount, or under a directory that is gone
        try:
            _overlay(point, layers, target)
        except subprocess.CalledProcessError:
            # Writes there fail (EROFS) instead of reaching the host.
            _mount("--bind", point, target)
            _mount("-o", "remount,bind,ro", target)


def enter(base: str, binds: Sequence[str], cwd: str, argv: Sequence[str]) -> None:
    """Inside the new namespace: build the root under BASE, chroot into it, exec ARGV."""
    # `unshare --propagation private` made every mount private: nothing propagates back.
    _mount("-t", "tmpfs", "-o", "mode=0700", "gpugate-throwaway", base)
    root, layers = os.path.join(base, "root"), Path(base) / "layers"
    os.mkdir(root)
    layers.mkdir()
    _overlay("/", layers, root)
    _other_mounts(root, base, layers, binds)
    for path in RECURSIVE_BINDS:
        if os.path.isdir(path):
            _mount("--rbind", path, root + path)
    for path in (*PLAIN_BINDS, *binds):
        os.makedirs(root + path, exist_ok=True)
        _mount("--bind", path, root + path)
    os.chroot(root)
    os.chdir(cwd if os.path.isdir(cwd) else "/")
    os.execvp(argv[0], list(argv))


def main(args: Sequence[str] | None = None) -> None:
    """`--enter BASE [--bind DIR]... [--cwd DIR] -- ARGV...`: the part run by unshare."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--enter", required=True, metavar="BASE")
    parser.add_argument("--bind", action="append", default=[])
    parser.add_argument("--cwd", default="/")
    parser.add_argument("argv", nargs="+")
    ns = parser.parse_args(args)
    enter(ns.enter, ns.bind, ns.cwd, ns.argv)


if __name__ == "__main__":
    main()

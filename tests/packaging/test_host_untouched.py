"""The suite's install tests leave an installed, configured gpugate exactly as it was (issue 26).

In a throwaway root (tests/support/throwaway_root.py) standing for an admin's node: the .deb installed
with dpkg -i and configured (a line in hook.env and in gpugate.yaml, an evidence bundle and an
event in /var/lib/gpugate); every file of the package, its conffiles, /etc/gpugate,
/var/lib/gpugate and /var/cache/gpugate recorded (type, mode, owner, content); then the suite's
install tests (test_deb.py, test_e2e_deb.py) run there as `make test` runs them; then the record
is taken again. Both must be identical and the package still installed.

Run as a program, this file is the part inside the throwaway root: `test_host_untouched.py DEB
BASETEMP` prints the differences and exits 1 if there are any.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys

import pytest

# Run as a program (inside the throwaway root) pytest's pythonpath is not set: tests/ and
# tests/support/ are found from this file's own place, tests/packaging/.
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
sys.path[:0] = [TESTS, os.path.join(TESTS, "support")]

from debs import (  # noqa: E402
    INSTALL_HERE,
    PACKAGE_PATHS,
    PREBUILT_DEB,
    deb_file,
    run,
)

__all__ = ["deb_file"]  # the fixture, from tests/support/debs.py

pytestmark = pytest.mark.slurm

# What the admin's install is: the package's paths and the other places gpugate keeps things.
WATCHED = (*PACKAGE_PATHS, "/var/tmp/gpugate-nccl")
INSTALL_TESTS = ("tests/packaging/test_deb.py", "tests/e2e/test_e2e_deb.py")


def test_the_install_tests_leave_an_installed_gpugate_as_it_was(deb_file, tmp_path):
    from throwaway_root import run as run_throwaway
    from throwaway_root import skip_unless_available

    skip_unless_available()
    env = {k: v for k, v in os.environ.items() if k not in (INSTALL_HERE, PREBUILT_DEB)}
    argv = [sys.executable, os.path.abspath(__file__), deb_file, str(tmp_path / "inside")]
    done = run_throwaway(argv, timeout=1800, env=env, cwd=REPO)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-3000:]
    assert "the installed gpugate is unchanged" in done.stdout, done.stdout[-3000:]


# --------------------------------------------------------------------------- inside


def record() -> dict[str, tuple]:
    """{path: (kind, mode, uid, gid, content digest or link target)} of everything watched,
    with dpkg's own record of the package (status, version, conffiles and their sums)."""
    found: dict[str, tuple] = {}
    for top in WATCHED:
        for path in walk(top):
            found[path] = describe(path)
    # Each path the package lists, itself only (it lists /usr, /etc...: not walked).
    for path in run(["dpkg", "-L", "gpugate"]).stdout.splitlines():
        if path not in ("/.", "") and os.path.lexists(path):
            found[path] = describe(path)
    query = ["dpkg-query", "-W", "-f", "${Status}|${Version}|${Conffiles}", "gpugate"]
    found["dpkg-query"] = (run(query).stdout,)
    return found


def walk(top: str) -> list[str]:
    """TOP and, for a real directory, everything below it (symlinks never followed)."""
    if not os.path.lexists(top):
        return []
    paths = [top]
    if os.path.isdir(top) and not os.path.islink(top):
        for dirpath, dirnames, filenames in os.walk(top):
            paths += [os.path.join(dirpath, name) for name in dirnames + filenames]
    return paths


def describe(path: str) -> tuple:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        content = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        with open(path, "rb") as fh:
            content = hashlib.sha256(fh.read()).hexdigest()
    else:
        content = ""
    return (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, content)


def install_and_configure(deb: str) -> None:
    """The admin's node: the package installed and configured, with some state."""
    if run(["dpkg-query", "-W", "gpugate"]).returncode == 0:
        run(["dpkg", "--purge", "gpugate"], timeout=300)
    done = run(["dpkg", "-i", deb], timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"dpkg -i failed: {done.stdout}{done.stderr}")
    with open("/etc/gpugate/hook.env", "a") as fh:
        fh.write("SLURM_CONF=/etc/slurm-site/slurm.conf\n")
    with open("/etc/gpugate/gpugate.yaml", "a") as fh:
        fh.write("state_dir: /var/lib/gpugate\n")
    bundle = "/var/lib/gpugate/evidence/977/node7-r0"
    os.makedirs(bundle, mode=0o750)
    with open(f"{bundle}/summary.json", "w") as fh:
        fh.write('{"node": "node7", "category": "gpu_xid_hardware"}\n')
    with open("/var/lib/gpugate/events.jsonl", "a") as fh:
        fh.write('{"hook": "prolog", "job": "977", "action": "allow"}\n')


def inside(deb: str, basetemp: str) -> int:
    """Install, record, run the install tests, record again; 0 if nothing changed."""
    install_and_configure(deb)
    before = record()
    env = dict(os.environ, **{PREBUILT_DEB: deb})  # the same .deb: not built again
    argv = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
            "--basetemp", basetemp, *INSTALL_TESTS]  # fmt: skip
    tests = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    print(tests.stdout[-4000:], tests.stderr[-2000:])
    after = record()
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    for path in changed:
        print(f"changed: {path}: {before.get(path)} -> {after.get(path)}")
    if tests.returncode != 0:
        print(f"the install tests failed (exit {tests.returncode})")
        return 1
    if "install ok installed" not in after["dpkg-query"][0]:
        print(f"the package is no longer installed: {after['dpkg-query']}")
        return 1
    if changed:
        return 1
    print(f"the installed gpugate is unchanged ({len(before)} paths compared)")
    return 0


if __name__ == "__main__":
    sys.exit(inside(sys.argv[1], sys.argv[2]))

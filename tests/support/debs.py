"""The .deb for the install tests: built once or taken prebuilt, installed, purged, run in a throwaway root."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import paths
import pytest
from versions import build_version

REPO = str(paths.ROOT)


BUILD_SH = os.path.join(REPO, "packaging", "deb", "build.sh")


# Every path the package installs at the top of its tree: none may be left after a purge.
PACKAGE_PATHS = (
    "/opt/gpugate",
    "/usr/bin/gpugate",
    "/usr/libexec/gpugate",
    "/etc/gpugate",
    "/var/lib/gpugate",
    "/var/cache/gpugate",
    "/usr/share/doc/gpugate",
    "/usr/share/gpugate",
)


# What the hooks or an admin put outside those at run time, which a purge takes too: the
# packaged metrics textfile, and an older release's NCCL directory (root's).
RUN_TIME_PATHS = ("/var/lib/node_exporter/textfile_collector/gpugate.prom", "/var/tmp/gpugate-nccl")


# The install tests never run on the host itself (issue 26): `dpkg -i` there would replace an
# admin's package and `dpkg --purge` would take its conffiles with it. The host's run of this
# module runs them again in a throwaway root (tests/support/throwaway_root.py: an overlay over `/` in a
# private mount namespace), with INSTALL_HERE set; there they install, run and purge freely.
INSTALL_HERE = "GPUGATE_INSTALL_HERE"


# A .deb an outer run built already (not built again inside).
PREBUILT_DEB = "GPUGATE_TEST_DEB"


def run(argv: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Run a command (argument list, timeout), capturing its output as text."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)


def build_deb(base: str) -> str:
    """Build the .deb with build.sh into BASE/dist; skip without dpkg-deb. Returns its path."""
    if not shutil.which("dpkg-deb"):
        pytest.skip("dpkg-deb not installed (it is in Debian's dpkg package)")
    env = dict(
        os.environ,
        PYTHON=sys.executable,  # has pip: the running test environment
        BUILD_DIR=os.path.join(base, "build"),
        DIST_DIR=os.path.join(base, "dist"),
    )
    version = build_version()
    result = run([BUILD_SH], timeout=600, env=env, cwd=REPO)
    if result.returncode != 0:
        pytest.fail(f"build.sh failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    path = result.stdout.strip().splitlines()[-1]  # build.sh prints the package last
    assert path == os.path.join(base, "dist", f"gpugate_{version}_all.deb"), result.stdout
    return path


@pytest.fixture(scope="module")
def deb_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The .deb, built once for this module in a private build and dist directory."""
    if os.environ.get(PREBUILT_DEB):
        return os.environ[PREBUILT_DEB]  # an outer run's, for the run in its throwaway root
    return build_deb(str(tmp_path_factory.mktemp("deb")))


def installing_here() -> bool:
    """True in the run a throwaway root was made for (never on the host)."""
    from throwaway_root import INSIDE_VAR

    return os.environ.get(INSTALL_HERE) == "1" and os.environ.get(INSIDE_VAR) == "1"


def install_or_skip(deb_file: str) -> None:
    """`dpkg -i` the package in this throwaway root, over whatever the host had installed."""
    if not installing_here():
        pytest.skip(
            "installs only in a throwaway root (its module's test ..._in_a_throwaway_root runs it there)"
        )
    if os.geteuid() != 0 or not shutil.which("dpkg"):
        pytest.skip("installing the .deb needs root and dpkg")
    # The host's own gpugate (package, state, cache), as this root sees it: gone from here only.
    if run(["dpkg-query", "-W", "gpugate"]).returncode == 0:
        purge()
    for path in PACKAGE_PATHS:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
    result = run(["dpkg", "-i", deb_file], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def purge() -> subprocess.CompletedProcess:
    """`dpkg --purge gpugate`, asserting it succeeds."""
    result = run(["dpkg", "--purge", "gpugate"], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def installed(deb_file: str):
    """The package installed with dpkg -i for this module, in the throwaway root it runs in."""
    install_or_skip(deb_file)
    return deb_file


def run_in_throwaway_root(module: str, deb_file: str, basetemp: str, timeout: float) -> str:
    """Run a test MODULE's install tests in a throwaway root; fail unless all ran and passed."""
    from throwaway_root import run as run_throwaway
    from throwaway_root import skip_unless_available

    skip_unless_available()
    env = dict(os.environ, **{INSTALL_HERE: "1", PREBUILT_DEB: deb_file})
    argv = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
            "--basetemp", basetemp, "-k", "not throwaway_root", module]  # fmt: skip
    done = run_throwaway(argv, timeout=timeout, env=env, cwd=REPO)
    told = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, told
    summary = done.stdout.strip().splitlines()[-1]
    assert "passed" in summary and not re.search(r"skipped|failed|error", summary), told
    return done.stdout


def host_package_state() -> tuple[str, list[str]]:
    """dpkg's record of gpugate and which of the package's paths exist: the inner run's traces."""
    status = run(["dpkg-query", "-W", "-f", "${Status} ${Version}", "gpugate"]).stdout
    return status, [path for path in PACKAGE_PATHS if os.path.lexists(path)]

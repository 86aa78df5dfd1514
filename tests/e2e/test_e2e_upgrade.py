"""An upgrade from the previous release's .deb keeps every hook gating (issue 40, acceptance).

The previous release is built from git history (PREVIOUS_RELEASE: the last commit that
accepted `requeue.wait_for_bundles_s: 30`, before 2dfe4c2 refused it) with its own
packaging/deb/build.sh, in a `git archive` export. Its site file (tests/fixtures/upgrade/
site-previous-release.yaml) goes into /etc/gpugate/gpugate.yaml as an admin edits it; then
`dpkg -i --force-confold` of this checkout's .deb upgrades it, keeping that file. The
postinst must say what to fix, and on a 2-node local Slurm whose hooks are the installed
wrappers the job on the node with an uncorrectable ECC error must be refused and the node
drained, with the migration warning in the hooks' output.

As test_e2e_deb.py: the host's run builds both packages (git is needed for the old one) and
runs this module again in a throwaway root (tests/support/throwaway_root.py), never installing on the
host. Inside .ci/second-slurm's root there is no git history: the module skips there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import paths
import pytest
from e2e import Site, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from deb_e2e import ecc_node_refuses_the_job  # noqa: E402
from debs import (  # noqa: E402
    REPO,
    deb_file,
    host_package_state,
    install_or_skip,
    installing_here,
    purge,
    run,
    run_in_throwaway_root,
)
from localslurm import LocalSlurm  # noqa: E402 - on the path once slurm_or_skip() ran

__all__ = ["deb_file"]  # the fixture, from tests/support/debs.py

# The last commit whose config accepted wait_for_bundles_s: 30 (`git log -S _check_together`
# names 2dfe4c2 as the one that started refusing it).
PREVIOUS_RELEASE = "2dfe4c2^"
PREVIOUS_DEB = "GPUGATE_TEST_PREVIOUS_DEB"
FIXTURE = paths.FIXTURES / "upgrade" / "site-previous-release.yaml"
LIBEXEC = Path("/usr/libexec/gpugate")
HOOK_ENV = LIBEXEC / "hook.env"
SITE_FILE = Path("/etc/gpugate/gpugate.yaml")


@pytest.fixture(scope="module")
def previous_deb(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The previous release's .deb, built from git history with its own build.sh."""
    if os.environ.get(PREVIOUS_DEB):
        return os.environ[PREVIOUS_DEB]
    git = shutil.which("git")
    if git is None or run([git, "-C", REPO, "rev-parse", PREVIOUS_RELEASE]).returncode != 0:
        pytest.skip(f"no git history here to build the previous release ({PREVIOUS_RELEASE}) from")
    base = tmp_path_factory.mktemp("previous")
    src = base / "src"
    src.mkdir()
    archive = subprocess.run([git, "-C", REPO, "archive", PREVIOUS_RELEASE], capture_output=True,
                             timeout=120, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, timeout=120, check=True)
    env = dict(os.environ, PYTHON=sys.executable, BUILD_DIR=str(base / "build"),
               DIST_DIR=str(base / "dist"))  # fmt: skip
    done = run([str(src / "packaging" / "deb" / "build.sh")], timeout=600, env=env, cwd=src)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_the_module_passes_in_a_throwaway_root(deb_file: str, previous_deb: str, tmp_path: Path):
    """The whole module (old install, upgrade, Slurm, purge) in a throwaway root."""
    if installing_here():
        pytest.skip("the run inside the throwaway root")
    before = host_package_state()
    os.environ[PREVIOUS_DEB] = previous_deb  # read by the inner run (run_in_throwaway_root)
    try:
        run_in_throwaway_root(__file__, deb_file, str(tmp_path / "inside"), timeout=900)
    finally:
        del os.environ[PREVIOUS_DEB]
    assert host_package_state() == before


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    site = Site(tmp_path_factory.mktemp("e2e-upgrade"))
    site.use_snapshot("n1", "h100-healthy")
    site.use_snapshot("n2", "h100-ecc")
    return site


@pytest.fixture(scope="module")
def upgraded(previous_deb: str, deb_file: str, site: Site) -> str:
    """The previous release installed and configured with its site file, then upgraded."""
    install_or_skip(previous_deb)
    old = run(["gpugate", "--version"]).stdout.strip()
    assert old == "gpugate 0.1.0", old
    # The admin's edit of the conffile: the old release's values, this test's GPUs and state.
    SITE_FILE.write_text(site.config.read_text() + FIXTURE.read_text())
    assert (
        run(["gpugate", "config", "check"]).returncode == 2
    )  # the old release has no such command
    done = run(["dpkg", "-i", "--force-confold", deb_file], timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_upgrade_says_what_to_fix_and_keeps_the_site_file(upgraded: str, deb_file: str):
    assert f"{SITE_FILE}: requeue.wait_for_bundles_s: 30 s is shorter than" in upgraded, upgraded
    assert "raised to 45 s" in upgraded
    assert f"gpugate config: {SITE_FILE}: ok (with the warnings above)" in upgraded
    assert "wait_for_bundles_s: 30" in SITE_FILE.read_text()  # dpkg kept the admin's file
    version = run(["dpkg-deb", "-f", deb_file, "Version"]).stdout.strip()
    assert re.fullmatch(r"0\.1\.0\+git\d+\.\d{8}\.[0-9a-f]{7,}(\.dirty)?", version), version
    assert run(["gpugate", "--version"]).stdout.strip() == f"gpugate {version}"
    installed = run(["dpkg-query", "-W", "-f", "${Version}", "gpugate"]).stdout
    assert installed == version


@pytest.fixture(scope="module")
def cluster(upgraded: str, site: Site):
    """The local Slurm on the installed wrappers, reading /etc/gpugate/gpugate.yaml."""
    slurm = LocalSlurm(site.base / "slurm", nodes=["n1", "n2"], prolog_epilog_timeout=60,
                       wrap_hooks=False, prolog=str(LIBEXEC / "gpugate-prolog"),
                       epilog=str(LIBEXEC / "gpugate-epilog"),
                       task_prolog=str(LIBEXEC / "gpugate-task-prolog"),
                       epilog_slurmctld=str(LIBEXEC / "gpugate-epilog-slurmctld"))  # fmt: skip
    # No GPUGATE_CONFIG: the hooks read the upgraded site file where the package has it.
    HOOK_ENV.write_text(
        "".join(
            line + "\n"
            for line in site.hook_env_text(slurm_conf=slurm.conf_path).splitlines()
            if not line.startswith("GPUGATE_CONFIG=")
        )
    )
    HOOK_ENV.chmod(0o644)
    try:
        with slurm:
            yield slurm
    finally:
        with contextlib.suppress(FileNotFoundError):
            HOOK_ENV.unlink()


def test_the_faulty_node_refuses_the_job_after_the_upgrade(cluster: LocalSlurm, site: Site):
    ecc_node_refuses_the_job(cluster, site)
    log = cluster.slurmd_log("n2").read_text(errors="replace")
    assert "requeue.wait_for_bundles_s: 30 s is shorter" in log, log[-3000:]


def test_the_hooks_say_the_migrated_value(upgraded: str, site: Site):
    """The prolog as slurmd runs it (no arguments, the installed wrapper): the line on stderr."""
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n1"}
    done = run([str(LIBEXEC / "gpugate-prolog")], env=env)
    assert done.returncode == 0, done.stderr
    said = f"gpugate: prolog: config: {SITE_FILE}: requeue.wait_for_bundles_s: 30 s is shorter"
    assert said in done.stderr, done.stderr


def test_after_slurm_stops_the_purge_leaves_no_package(cluster: LocalSlurm):
    """Runs last: the cluster's teardown, then the purge."""
    cluster.stop()
    HOOK_ENV.unlink()
    purge()
    assert run(["dpkg-query", "-W", "gpugate"]).returncode != 0

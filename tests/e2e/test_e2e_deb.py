"""End to end through the installed .deb: the package's own hook wrappers as a real Slurm's hooks.

CI's way (issue 16): `dpkg -i` the package built by packaging/deb/build.sh, point the installed
wrappers at a test site with a hook.env beside them, run a 2-node local Slurm whose Prolog,
Epilog, TaskProlog and EpilogSlurmctld are /usr/libexec/gpugate/gpugate-* (no extra wrapping),
submit as the ordinary user, then stop Slurm and `dpkg --purge`. Only the GPUs are simulated:
n1 replays a healthy snapshot, n2 one with an uncorrectable ECC error.

All of it runs in a throwaway root (tests/support/throwaway_root.py), never on the host: the host's run
of this module builds the .deb and runs the module again inside one (see test_deb.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from e2e import Site, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from deb_e2e import ecc_node_refuses_the_job  # noqa: E402
from debs import (  # noqa: E402
    PACKAGE_PATHS,
    RUN_TIME_PATHS,
    deb_file,
    host_package_state,
    installed,
    installing_here,
    purge,
    run,
    run_in_throwaway_root,
)
from localslurm import JOB_USER, LocalSlurm  # noqa: E402 - on the path once slurm_or_skip() ran

__all__ = ["deb_file", "installed"]  # fixtures, from tests/support/debs.py

LIBEXEC = Path("/usr/libexec/gpugate")
# Read by every installed wrapper after /etc/gpugate/hook.env (slurm_hooks/gpugate-hook).
HOOK_ENV = LIBEXEC / "hook.env"
HOOKS = {
    "prolog": "prolog",
    "epilog": "epilog",
    "task_prolog": "task-prolog",
    "epilog_slurmctld": "epilog-slurmctld",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    site = Site(tmp_path_factory.mktemp("e2e-deb"))
    site.use_snapshot("n1", "h100-healthy")
    site.use_snapshot("n2", "h100-ecc")
    return site


@pytest.fixture(scope="module")
def cluster(installed: str, site: Site):
    """The local Slurm on the installed wrappers; stopped and hook.env removed whatever happens."""
    slurm = LocalSlurm(
        site.base / "slurm",
        nodes=["n1", "n2"],
        prolog_epilog_timeout=60,
        wrap_hooks=False,
        **{key: str(LIBEXEC / f"gpugate-{hook}") for key, hook in HOOKS.items()},
    )
    # Root's own, 0644: the wrappers source it as root and, for the TaskProlog, as the user.
    HOOK_ENV.write_text(site.hook_env_text(slurm_conf=slurm.conf_path))
    HOOK_ENV.chmod(0o644)
    try:
        with slurm:
            yield slurm
    finally:
        with contextlib.suppress(FileNotFoundError):
            HOOK_ENV.unlink()


def test_the_module_passes_in_a_throwaway_root(deb_file: str, tmp_path: Path):
    """The whole module (install, Slurm, purge) in a throwaway root; the host is not touched."""
    if installing_here():
        pytest.skip("the run inside the throwaway root")
    before = host_package_state()
    run_in_throwaway_root(__file__, deb_file, str(tmp_path / "inside"), timeout=900)
    assert host_package_state() == before


def hooks_of(site: Site, job: int) -> set[str]:
    """The hooks that recorded a run for JOB in the site's state."""
    return {e["hook"] for e in site.events() if e.get("job") == str(job)}


def test_the_hooks_are_the_installed_wrappers(cluster: LocalSlurm):
    conf = cluster.conf_path.read_text().splitlines()
    keys = {"prolog": "Prolog", "epilog": "Epilog", "task_prolog": "TaskProlog"}
    keys["epilog_slurmctld"] = "EpilogSlurmctld"
    for option, hook in HOOKS.items():
        assert f"{keys[option]}={LIBEXEC}/gpugate-{hook}" in conf, conf
    assert "GPUGATE_BIN" not in HOOK_ENV.read_text()  # the packaged launcher, not the venv's


def test_healthy_node_runs_the_users_job_with_the_task_prologs_settings(
    cluster: LocalSlurm, site: Site
):
    out = site.base / "n1.out"
    job = cluster.submit(
        wrap='echo "user=$(id -un)"; echo "NCCL_DEBUG=$NCCL_DEBUG"', output=str(out), nodelist="n1"
    )
    state = cluster.wait_job(job, "COMPLETED", timeout=45)
    assert state["NodeList"] == "n1"
    lines = out.read_text().splitlines()
    # The TaskProlog ran as the job's user through the system python3: its export reached the job.
    assert f"user={JOB_USER}" in lines and "NCCL_DEBUG=WARN" in lines, lines
    assert not cluster.is_drained("n1")
    prolog = [e for e in site.events() if e["hook"] == "prolog" and e.get("job") == str(job)]
    assert prolog and prolog[-1]["action"] in ("allow", "warn"), site.events()
    # The epilogs run after the job is COMPLETED; EpilogSlurmctld found Slurm by hook.env's
    # SLURM_CONF (slurmctld gives it none).
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not {"epilog", "epilog-slurmctld"} <= hooks_of(site, job):
        time.sleep(0.5)
    assert {"prolog", "epilog", "epilog-slurmctld"} <= hooks_of(site, job), site.events()


def test_ecc_node_refuses_the_job_and_is_drained(cluster: LocalSlurm, site: Site):
    ecc_node_refuses_the_job(cluster, site)


def test_after_slurm_stops_the_purge_leaves_no_package(cluster: LocalSlurm):
    """Runs last: the cluster's teardown, done here so that the purge can be checked."""
    cluster.stop()
    # What the run left: hook.env beside the wrappers (an admin's, not the package's), the
    # state, events and evidence of real jobs, the metrics textfile: the purge takes them all.
    assert HOOK_ENV.exists() and any(Path("/var/lib/gpugate").iterdir())
    purge()
    assert run(["dpkg-query", "-W", "gpugate"]).returncode != 0
    left = [path for path in (*PACKAGE_PATHS, *RUN_TIME_PATHS) if os.path.lexists(path)]
    assert left == []

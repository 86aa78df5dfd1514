"""End to end: `gpugate qualify` as a new admin runs it, on a site that lacks the tools.

A 3-node local Slurm whose nodes have this host's CPUs (two on the CI machines) and 8 GPUs in
Gres; gpugate as the site installed it (the .deb's launcher in the second root); no dcgmi on
the nodes and no torch in qualify.python (the system python3). What an admin must see:
- `gpugate qualify n1` finishes in a bounded time, prints its job id, names the steps that
  were not run and why (no dcgmi, no torch), and drains nothing: a missing tool is not a fault;
- a geometry Slurm can never start (more ranks per node than the node has CPUs) is refused at
  once, before any reservation or job, with the reason and the fix;
- bad arguments are usage errors before anything runs, with --no-wait too.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402

NODES = ["n1", "n2", "n3"]
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    probe = subprocess.run([SYSTEM_PYTHON, "-I", "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{SYSTEM_PYTHON} has torch here: this test needs a site without it")

    def qualify(base: Path) -> str:
        return (
            "qualify:\n"
            f"  python: {SYSTEM_PYTHON}\n"
            f"  dcgmi: {base / 'not-installed' / 'dcgmi'}\n"  # DCGM is not installed on the nodes
            "  size_mib: 1\n  iters: 2\n  time_limit_min: 3\n  wait_s: 90\n"
        )

    return slurm_site(NODES, config=qualify)


def gpugate(site: Site, cluster: LocalSlurm, *args: str, timeout: float = 150):
    """The site's own `gpugate` (the installed launcher where the package is installed)."""
    argv = [str(site.gpugate), *args, "--config", str(site.config)]
    return subprocess.run(argv, env=cluster.env(), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def queue_empty(cluster: LocalSlurm) -> bool:
    """No job in the queue and no gpugate reservation: nothing was started."""
    jobs = cluster.run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip()
    resv = cluster.run(["scontrol", "show", "reservation"], check=False).stdout
    return not jobs and "gpugate-qualify" not in resv


def test_a_node_without_dcgmi_or_torch_is_not_qualified_and_not_drained(
    cluster: LocalSlurm, site: Site
):
    started = time.monotonic()
    done = gpugate(site, cluster, "qualify", "n1")
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    print(out[-6000:])
    assert done.returncode == 1, out  # not qualified: not a pass, not a usage error
    ids = set(re.findall(r"\bjob (\d+)", out))
    assert ids, f"no job id printed:\n{out}"
    assert "NOT QUALIFIED" in out, out
    assert "not run" in out and "dcgmi" in out and "torch" in out, out
    # The DCGM step itself started (gpugate importable by the job from the installed package's
    # path) and found no dcgmi; it is not "could not start".
    assert "not found on this node" in out and "could not start" not in out, out
    assert "qualify.python" in out  # the fix, named
    for node in NODES:
        assert not cluster.is_drained(node), cluster.node(node)
    assert (
        not (site.state / "drains.jsonl").exists()
        or "qualify" not in (site.state / "drains.jsonl").read_text()
    )
    assert queue_empty(cluster)
    assert took < 90, f"took {took:.0f} s"  # bounded by the job, never by qualify.wait_s


def test_ranks_the_node_cannot_start_are_refused_at_once(cluster: LocalSlurm, site: Site):
    cpus = int(cluster.node("n1")["CPUTot"])
    text = site.config.read_text()
    site.config.write_text(text.replace("qualify:\n", f"qualify:\n  ntasks_per_node: {cpus + 6}\n"))
    try:
        done = gpugate(site, cluster, "qualify", "n1", timeout=30)
    finally:
        site.config.write_text(text)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert f"{cpus} CPU" in out and "ntasks_per_node" in out, out
    assert queue_empty(cluster), out


@pytest.mark.parametrize(
    "args",
    [
        ("n1", "--tests", ""),
        ("n1", "--tests", ","),
        ("n1", "n1"),
        ("n[1-2],n1",),
        ("--idle", "--max-nodes", "-1"),
    ],
)
def test_bad_arguments_are_usage_errors_before_anything_runs(
    cluster: LocalSlurm, site: Site, args: tuple[str, ...]
):
    for extra in ((), ("--no-wait",)):
        done = gpugate(site, cluster, "qualify", *args, *extra, timeout=30)
        assert done.returncode == 2, (args, extra, done.stdout, done.stderr)
        assert "running in the background" not in done.stdout
        assert queue_empty(cluster)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

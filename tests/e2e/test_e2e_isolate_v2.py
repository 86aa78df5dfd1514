"""End to end on Slurm's cgroup/v2 plugin: one faulty GPU out of service, denied by gpugate's eBPF
device program at the node's slurmstepd scope (issue 44; test_e2e_isolate.py is cgroup v1's).

A real local Slurm, `LocalSlurm(cgroup_v2=True)` (tests/slurm/cgroup2ns.py): cgroup.conf
`CgroupPlugin=cgroup/v2`, `ConstrainDevices=yes`; slurmd in a mount namespace with cgroup2 at
/sys/fs/cgroup, its hooks and the detached `gpugate isolate apply` in it too; on a hybrid host
(CI's) slurmd preloads tools/cgroup_v1hide.c, which hides the v1 lines of /proc/<pid>/cgroup
from Slurm (docs/slurm-facts.md, "cgroup v2 on this machine"). 8 fake GPUs (c 195 N), gpugate's
hooks with `isolate.unit: gpu`. n1's snapshot gains an uncorrectable ECC error on GPU 3: the
prolog drains n1, the isolation takes GPU 3 out by the v2 route (`gpugate_nv3` attached at
n1's scope), n1 serves 7 GPUs; a 7-GPU job there is refused nvidia3 (EPERM) and opens its own
(ENXIO: the cgroup let it through, no driver); a job without GPUs is refused all eight;
`gpugate resume n1` after the repair puts GPU 3 back: 8 GPUs, the program detached, an 8-GPU
job opens nvidia3. Slurm 24.11 or later (gpugate.isolate.apply.MIN_SLURM).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

from gpugate.isolate.apply import MIN_SLURM

pytestmark = pytest.mark.slurm

slurm_or_skip()

import cgroup2ns  # noqa: E402 - on the path after slurm_or_skip()
import isolate_e2e as iso  # noqa: E402
from device_probe import opened, probe, refused  # noqa: E402
from localslurm import LocalSlurm, slurm_version, state_flags  # noqa: E402

if slurm_version() < MIN_SLURM:
    major, minor = slurm_version()
    pytest.skip(f"Slurm {major}.{minor:02d}: gpugate isolates a GPU from "
                f"{MIN_SLURM[0]}.{MIN_SLURM[1]:02d} on (gpugate.isolate.apply.MIN_SLURM)",
                allow_module_level=True)  # fmt: skip
if cgroup2ns.problem():
    pytest.skip(f"no cgroup v2 cluster here: {cgroup2ns.problem()}", allow_module_level=True)

NODES = ["n1"]
SCOPE = f"/sys/fs/cgroup/system.slice/{cgroup2ns.scope('n1')}"  # in slurmd's view
# Run in the node's view: the minors gpugate's programs at the scope deny (bpf.denied).
DENIED = "import sys\nfrom gpugate.isolate import bpf\nprint(sorted(bpf.denied(sys.argv[1])))\n"


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site(NODES, config=iso.ISOLATE_GPU, cgroup_v2=True, gpus_per_node=iso.GPUS)


def denied_at_scope(cluster: LocalSlurm) -> list[int]:
    """What gpugate's programs attached at n1's slurmstepd scope deny, asked as root there."""
    import gpugate

    env = {"PATH": os.environ.get("PATH", ""),
           "PYTHONPATH": str(Path(gpugate.__file__).resolve().parents[1])}  # fmt: skip
    proc = subprocess.run(cluster.on_node([sys.executable, "-c", DENIED, SCOPE]), env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [int(m) for m in proc.stdout.strip().strip("[]").split(",") if m.strip()]


def slurmd_view(cluster: LocalSlurm) -> tuple[bool, bool]:
    """(n1's slurmd is in a mount namespace other than ours, it carries the shim if built)."""
    pid = cluster._daemon_pid("slurmd-n1")
    assert pid is not None, cluster.log_tails()
    own = os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    shim = cluster.shim is None or f"LD_PRELOAD={cluster.shim}".encode() in environ
    return own, shim


def why_not(site: Site, cluster: LocalSlurm) -> str:
    """What the isolation and slurmd said, for a failure's message."""
    log = site.state / "isolate.log"
    said = log.read_text() if log.exists() else "(no isolate.log)"
    return f"isolate.log:\n{said}\nevents: {iso.isolate_events(site)}\n{cluster.log_tails(40)}"


def test_slurm_runs_cgroup_v2_and_gpugate_takes_that_route(site: Site, cluster: LocalSlurm) -> None:
    iso.fresh_start(cluster, NODES)
    assert slurmd_view(cluster) == (True, True)
    said = (cluster.log_dir / "slurmd-n1.log").read_text(errors="replace")
    assert "Hybrid mode is not supported" not in said
    # Slurm's own v2 device program: a job without GPUs is refused every one gres.conf lists.
    assert refused(probe(cluster, "n1", None)) == set(range(iso.GPUS))
    check = iso.gpugate(site, cluster, "isolate", "check", "n1")
    assert check.returncode == 0, check.stderr
    assert "by cgroup v2 (/sys/fs/cgroup is a cgroup2 mount)" in check.stdout, check.stdout
    assert f"at {SCOPE}" in check.stdout, check.stdout
    print(f"shim: {cluster.shim or 'none (no cgroup v1 here)'}; {check.stdout.strip()}")


def test_one_bad_gpu_is_denied_by_gpugates_program_and_put_back(
    site: Site, cluster: LocalSlurm
) -> None:
    iso.fresh_start(cluster, NODES)
    assert denied_at_scope(cluster) == []
    site.use_snapshot("n1", "h100-ecc")
    # Any job on n1 meets the fault in its prolog: the drain, then the isolation.
    first = cluster.submit(wrap="true", nodelist="n1", gres="gpu:1")
    try:
        fields = iso.wait_for(cluster, "n1", iso.in_service(iso.GPUS - 1), timeout=180)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{why_not(site, cluster)}") from None
    assert "gpugate-isolated: gpu3 minor=3 serial=1652123000003" in fields.get("Comment", "")
    applied = [e for e in iso.isolate_events(site) if e.get("outcome") == "applied"]
    assert applied and applied[-1]["gpus"][0]["index"] == iso.BAD, why_not(site, cluster)
    # The route taken: gpugate's program for minor 3 at n1's scope, Slurm's below it.
    assert denied_at_scope(cluster) == [iso.BAD]
    # 24.11's reconfigure restarted slurmd: still in its namespace, still preloaded.
    assert slurmd_view(cluster) == (True, True)

    seven = probe(cluster, "n1", iso.GPUS - 1)
    assert refused(seven) == {iso.BAD}, seven
    assert opened(seven) == set(range(iso.GPUS)) - {iso.BAD}, seven
    assert refused(probe(cluster, "n1", None)) == set(range(iso.GPUS))

    # Repaired: the node's facts pass again; the admin puts the GPU back, on the node.
    site.use_snapshot("n1", "h100-healthy")
    done = iso.gpugate(site, cluster, "resume", "n1", "--why", "GPU3 replaced")
    assert done.returncode == 0, done.stderr + done.stdout
    fields = iso.wait_for(cluster, "n1", iso.in_service(iso.GPUS))
    assert "gpugate-isolated" not in fields.get("Comment", "")
    assert denied_at_scope(cluster) == []
    assert opened(probe(cluster, "n1", iso.GPUS)) == set(range(iso.GPUS))
    assert "DRAIN" not in state_flags(fields["State"])
    cluster.run(["scancel", str(first)], check=False)


def test_the_cluster_leaves_no_cgroup_behind(cluster: LocalSlurm) -> None:
    """What slurmd made in the machine's one cgroup2 hierarchy goes with the cluster."""
    cluster.stop()
    assert cluster.cgroup_leftovers == []
    probe_scope = cgroup2ns.in_view(["/bin/sh", "-c", f"if [ -e {SCOPE} ]; then echo there; fi"])
    out = subprocess.run(probe_scope, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and "there" not in out.stdout, out.stderr

"""End to end: one faulty GPU out of service instead of its node (issue 31, `isolate.unit: gpu`).

A real local Slurm with device cgroups (TaskPlugin=task/cgroup, ConstrainDevices=yes) and 8
fake GPUs per node, SlurmUser=slurm, gpugate's hooks; node n1's snapshot gains an
uncorrectable ECC error on GPU 3 (the bundled h100-ecc). On Slurm 24.11 the isolation must
keep n1 schedulable with 7 GPUs, a 7-GPU job must run there and be unable to open GPU 3's
device (asked from inside the job), an 8-GPU job must wait, Slurm must never mark n1 INVAL
or drain it itself, and `gpugate resume n1` after the repair must give the 8 GPUs back. On
22.05, whose reconfigure does not take a count change (docs/slurm-facts.md), the node must
stay drained, saying why. With `isolate.unit: node` the same fault drains the node as today.
An isolation asked for while EpilogSlurmctld runs (gpugate's own, slowed down) waits for it:
slurmctld stays up and no script of its is killed (issue 44; docs/slurm-facts.md,
"Reconfigure and the controller's scripts").
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from device_probe import opened, probe, refused  # noqa: E402 - on the path after slurm_or_skip()
from isolate_e2e import (  # noqa: E402
    BAD,
    GPUS,
    ISOLATE_GPU,
    fresh_start,
    gpugate,
    gres,
    isolate_events,
    node_fields,
    wait_for,
)
from localslurm import (  # noqa: E402
    LocalSlurm,
    LocalSlurmError,
    device_cgroups_usable,
    slurm_version,
    state_flags,
)

if device_cgroups_usable():
    pytest.skip(f"no device cgroups: {device_cgroups_usable()}", allow_module_level=True)

NODES = ["n1", "n2"]
ISOLATES = slurm_version() >= (24, 11)  # gpugate.isolate.apply.MIN_SLURM, measured


def snapshot(site: Site, node: str, name: str) -> None:
    """`name` for `node`: the bundled snapshots carry each GPU's device minor (= its index, as
    the fake devices of `LocalSlurm(device_cgroups=True)` are made), what the isolation needs."""
    site.use_snapshot(node, name)


# EpilogSlurmctld: gpugate's, as the site installs it, after a sleep while SLOW_FLAG (in the
# site's base, 1777) names a number of seconds; each slowed run logs its start and end there.
SLOW_WRAPPER = """#!/bin/sh
flag={base}/slow-epilog.seconds
if [ -r "$flag" ]; then
    echo "start $SLURM_JOB_ID $(date +%s.%N)" >> {base}/slow-epilog.log
    sleep "$(cat "$flag")"
    echo "end $SLURM_JOB_ID $(date +%s.%N)" >> {base}/slow-epilog.log
fi
exec {hook} "$@"
"""


def slow_epilog_slurmctld(site: Site) -> str:
    """The wrapper above, for slurm.conf's EpilogSlurmctld."""
    path = site.base / "slow-epilog-slurmctld"
    hook = site.hook("epilog-slurmctld")
    path.write_text(SLOW_WRAPPER.format(base=site.base, hook=hook))
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    def with_minors(site: Site) -> dict[str, object]:
        for node in NODES:
            snapshot(site, node, "h100-healthy")
        return {"epilog_slurmctld": slow_epilog_slurmctld(site)}

    return slurm_site(NODES, snapshots=None, config=ISOLATE_GPU, prepare=with_minors,
                      device_cgroups=True, gpus_per_node=GPUS)  # fmt: skip


class Watch:
    """Every state and reason of a node, polled in the background."""

    def __init__(self, cluster: LocalSlurm, node: str) -> None:
        self.cluster, self.node, self.seen = cluster, node, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                fields = self.cluster.node(self.node)
                self.seen.append((fields.get("State", ""), fields.get("Reason", "")))
            except (LocalSlurmError, OSError, IndexError, subprocess.SubprocessError):
                pass  # slurmctld restarting (24.11's reconfigure)
            self.stop.wait(0.2)

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def slurms_own(self) -> list[tuple[str, str]]:
        """Where Slurm itself invalidated the node or drained it with its own reason."""
        return [
            (s, r)
            for s, r in self.seen
            if "INVALID_REG" in state_flags(s) or "reported lower than configured" in r
        ]


def test_one_bad_gpu_is_isolated_and_put_back(site: Site, cluster: LocalSlurm) -> None:
    fresh_start(cluster, NODES)
    busy = cluster.submit(wrap="sleep 600", nodelist="n2", gres=f"gpu:{GPUS}")
    cluster.wait_job(busy, "RUNNING")
    snapshot(site, "n1", "h100-ecc")
    with Watch(cluster, "n1") as watch:
        # Any job on n1 meets the fault in its prolog: the drain, then the isolation.
        first = cluster.submit(wrap="true", nodelist="n1", gres="gpu:1")
        if not ISOLATES:
            fields = wait_for(cluster, "n1", lambda f: "DRAIN" in state_flags(f["State"]))
            assert fields["Reason"].startswith("gpugate: gpu.ecc")
            time.sleep(3)
            assert "DRAIN" in state_flags(node_fields(cluster, "n1")["State"])
            assert gres(node_fields(cluster, "n1")) == f"gpu:{GPUS}"
            refusals = [e for e in isolate_events(site) if e.get("outcome") == "refused"]
            assert refusals and "reconfigure" in refusals[-1]["why"]
            check = gpugate(site, cluster, "isolate", "check", "n1")
            assert check.returncode == 1 and "scontrol reconfigure" in check.stderr
            cluster.run(["scancel", str(first), str(busy)], check=False)
            return
        fields = wait_for(
            cluster, "n1", lambda f: gres(f) == "gpu:7" and "DRAIN" not in state_flags(f["State"])
        )
        comment = fields.get("Comment", "")
        log = site.state / "isolate.log"
        said = log.read_text() if log.exists() else "(no isolate.log)"
        assert "gpugate-isolated: gpu3 minor=3 serial=1652123000003" in comment, json.dumps(
            [fields, said]
        )
        assert "gpu.ecc" in comment
        applied = [e for e in isolate_events(site) if e.get("outcome") == "applied"]
        assert applied and applied[-1]["gpus"][0]["index"] == BAD

        seven = probe(cluster, "n1", 7)
        assert refused(seven) == {BAD}, seven
        assert opened(seven) == set(range(GPUS)) - {BAD}
        assert refused(probe(cluster, "n1", None)) == set(range(GPUS))
        # Nowhere has 8 free GPUs (n2 is busy, n1 has 7): the job waits, never runs on n1.
        eight = cluster.submit(wrap="true", gres=f"gpu:{GPUS}")
        time.sleep(4)
        assert cluster.job_state(eight)["JobState"] == "PENDING"
        cluster.run(["scancel", str(eight)])

        # Repaired: the node's facts pass again; the admin puts the GPU back.
        snapshot(site, "n1", "h100-healthy")
        # Asked from another host, on a site without a HealthCheckProgram (this cluster's):
        # nothing on n1 would act on the request, so it is refused with the fix, n1 untouched.
        asked = gpugate(site, cluster, "resume", "n1", "--why", "GPU3 replaced", node="admin1")
        assert asked.returncode == 1 and "no HealthCheckProgram" in asked.stderr, asked.stderr
        assert "on n1 itself" in asked.stderr
        fields = node_fields(cluster, "n1")
        assert gres(fields) == "gpu:7" and "DRAIN" not in state_flags(fields["State"]), fields
        done = gpugate(site, cluster, "resume", "n1", "--why", "GPU3 replaced")
        assert done.returncode == 0, done.stderr + done.stdout
        fields = wait_for(
            cluster, "n1",
            lambda f: gres(f) == f"gpu:{GPUS}" and "DRAIN" not in state_flags(f["State"]),
        )  # fmt: skip
        assert "gpugate-isolated" not in fields.get("Comment", "")
        # No stale reason (docs/slurm-facts.md, "A resumed node's reason"): gpugate's view
        # shows none for the node in service; Slurm 23.02-25.11 without accounting storage
        # keep it past the resume until the node's next job, which the probe below is.
        listed = json.loads(gpugate(site, cluster, "nodes", "--json").stdout)["nodes"]
        (row,) = [r for r in listed if r["node"] == "n1"]
        assert (row["reason"], row["set_by"], row["since"]) == ("", "", ""), row
        kept = fields.get("Reason", "")
        print(f"n1 right after the put-back, Slurm {slurm_version()}: Reason={kept!r}")
        assert bool(kept) == ((23, 2) <= slurm_version() < (26, 5)), kept
        assert opened(probe(cluster, "n1", GPUS)) == set(range(GPUS))
        assert "Reason" not in node_fields(cluster, "n1"), node_fields(cluster, "n1")
    assert watch.seen
    assert watch.slurms_own() == []
    assert cluster.job_state(busy)["JobState"] == "RUNNING"  # lived through two reconfigures
    audit = (site.state / "audit.jsonl").read_text().splitlines()
    assert any(json.loads(line).get("node") == "n1" for line in audit)
    cluster.run(["scancel", str(busy)])


def test_isolate_off_drains_the_node_as_today(site: Site, cluster: LocalSlurm) -> None:
    site.write_config("")  # isolate.unit: node, the default
    try:
        fresh_start(cluster, NODES)
        snapshot(site, "n1", "h100-ecc")
        cluster.submit(wrap="true", nodelist="n1", gres="gpu:1")
        fields = wait_for(cluster, "n1", lambda f: "DRAIN" in state_flags(f["State"]), 60)
        assert fields["Reason"].startswith("gpugate: gpu.ecc")
        time.sleep(3)
        fields = node_fields(cluster, "n1")
        assert "DRAIN" in state_flags(fields["State"])
        assert gres(fields) == f"gpu:{GPUS}"
        assert "gpugate-isolated" not in fields.get("Comment", "")
    finally:
        site.write_config(ISOLATE_GPU)
        snapshot(site, "n1", "h100-healthy")


def test_the_site_says_whether_it_can_isolate(site: Site, cluster: LocalSlurm) -> None:
    check = gpugate(site, cluster, "isolate", "check", "n1")
    if ISOLATES:
        assert check.returncode == 0, check.stderr
        assert "can isolate" in check.stdout
    else:
        assert check.returncode == 1
        assert "does not take a GPU count change" in check.stderr


def script_jobs(cluster: LocalSlurm) -> list[str]:
    """Jobs during which slurmctld may run PrologSlurmctld/EpilogSlurmctld (CF or CG)."""
    out = cluster.run(["squeue", "--all", "-h", "-t", "CF,CG", "-o", "%i %T"], check=False)
    return out.stdout.split()


def test_an_isolation_waits_for_epilog_slurmctld_and_slurmctld_stays_up(
    site: Site, cluster: LocalSlurm
) -> None:
    """The admin's report (issue 44): the refused job's EpilogSlurmctld starts right as the
    node turns idle; a reconfigure then kills it and 24.11's slurmctld may die (SIGSEGV in
    prep_epilog_slurmctld_callback). Here that EpilogSlurmctld sleeps 15 s first: the
    isolation must wait for it, reconfigure after, and slurmctld must live on."""
    if not ISOLATES:
        pytest.skip("22.05 does not isolate (test_one_bad_gpu_is_isolated_and_put_back)")
    flag, slow_log = site.base / "slow-epilog.seconds", site.base / "slow-epilog.log"
    fresh_start(cluster, NODES)
    deadline = time.monotonic() + 60
    while script_jobs(cluster) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert script_jobs(cluster) == []
    ctld_log = Path(cluster.log_dir) / "slurmctld.log"
    log_from = ctld_log.stat().st_size if ctld_log.exists() else 0
    applied_before = len([e for e in isolate_events(site) if e.get("outcome") == "applied"])
    flag.write_text("15\n")
    flag.chmod(0o644)
    started = time.monotonic()
    try:
        snapshot(site, "n1", "h100-ecc")
        refused_job = cluster.submit(wrap="true", nodelist="n1", gres="gpu:1")
        # The prolog refuses the job and drains n1; its EpilogSlurmctld sleeps while the
        # detached `gpugate isolate apply` finds n1 idle and waits for a quiet controller.
        wait_for(cluster, "n1", lambda f: "DRAIN" in state_flags(f["State"]), 60)
        listed = time.monotonic() + 30
        while str(refused_job) not in script_jobs(cluster):  # COMPLETING while it sleeps
            assert time.monotonic() < listed, f"job {refused_job} never COMPLETING"
            time.sleep(0.2)
        fields = wait_for(
            cluster, "n1",
            lambda f: gres(f) == f"gpu:{GPUS - 1}" and "DRAIN" not in state_flags(f["State"]),
            timeout=180,
        )  # fmt: skip
        took = time.monotonic() - started
    finally:
        flag.unlink(missing_ok=True)
    assert "gpugate-isolated: gpu3" in fields.get("Comment", "")
    # slurmctld lived through it: its pid file's process is ours and it answers.
    assert cluster._alive("slurmctld")
    ping = cluster.run(["scontrol", "ping"], check=False)
    assert ping.returncode == 0 and "UP" in ping.stdout, ping.stdout + ping.stderr
    # Every slowed EpilogSlurmctld ran to its end (a reconfigure would have killed it), and
    # the isolation was applied only after the refused job's had ended.
    runs = [line.split() for line in slow_log.read_text().splitlines()]
    ends = {job: float(t) for what, job, t in runs if what == "end"}
    assert {job for what, job, _ in runs if what == "start"} <= set(ends), runs
    assert str(refused_job) in ends, runs
    applied = [e for e in isolate_events(site) if e.get("outcome") == "applied"]
    assert len(applied) == applied_before + 1
    when = datetime.fromisoformat(applied[-1]["time"].replace("Z", "+00:00")).timestamp()
    assert when >= ends[str(refused_job)], (applied[-1], runs)
    said = ctld_log.read_text(errors="replace")[log_from:] if ctld_log.exists() else ""
    assert "killed by signal" not in said and "SIGSEGV" not in said
    print(f"isolation applied {took:.1f} s after the refused job, waiting out EpilogSlurmctld")

    # Put the GPU back for the module's other tests (as the admin would after a repair).
    snapshot(site, "n1", "h100-healthy")
    done = gpugate(site, cluster, "resume", "n1", "--why", "GPU3 replaced")
    assert done.returncode == 0, done.stderr + done.stdout
    wait_for(cluster, "n1", lambda f: gres(f) == f"gpu:{GPUS}")
    cluster.run(["scancel", str(refused_job)], check=False)

"""End to end: an Xid 79 drill on a 2-node local Slurm, from injection to the node's resume.

A job that writes a checkpoint every second (the next one always half-written, as a node dying
mid-save leaves it) runs on one node. `gpugate drill NODE --fault xid79 --minutes 0.5` lays an
Xid 79 over that node's facts and kills the job's batch step as the fault would; the real
hooks then drain the node with a reason that says DRILL, requeue the job onto the other node
from its newest complete checkpoint, and the drill resumes the node once its window ends and
writes a drill record with each step's time, marked pass. The requeue test's harness is used
as it is (its torch-like checkpoints and its decision reader).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm, ensure_user  # noqa: E402
from requeue_e2e import decision, torch_zip  # noqa: E402

NODES = ["n1", "n2"]


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    # The requeue test's cluster, on two nodes: every gpugate hook, a refused job requeued.
    return slurm_site(NODES, config="requeue:\n  wait_for_bundles_s: 45\n", slurm_user="root",
                      scheduler_parameters="nohold_on_prolog_fail")  # fmt: skip


def training_job(site: Site) -> tuple[str, Path, Path]:
    """Run 1 trains: a complete checkpoint a second, the next one half-written; run 2 resumes."""
    ckpt = site.base / "ckpt"
    ckpt.mkdir()
    uid, gid = ensure_user()
    os.chown(ckpt, uid, gid)
    template = site.base / "template.pt"
    torch_zip(template)
    log = site.base / "train.runs"
    script = f"""#!/bin/sh
echo "run=${{SLURM_RESTART_COUNT:-0}} node=$SLURMD_NODENAME resume=$GPUGATE_RESUME_FROM" >> {log}
[ -n "$SLURM_RESTART_COUNT" ] && exit 0
i=1
while [ $i -lt 300 ]; do
    cp {template} {ckpt}/.w && mv {ckpt}/.w {ckpt}/ckpt_$((i * 100)).pt
    head -c 200 {template} > {ckpt}/ckpt_$(((i + 1) * 100)).pt
    sleep 1
    i=$((i + 1))
done
"""
    return script, log, ckpt


def newest_complete(ckpt: Path) -> Path:
    """The highest-numbered checkpoint that is a whole zip (what a resume must pick)."""
    whole = [p for p in ckpt.glob("ckpt_*.pt") if zipfile.is_zipfile(p)]
    return max(whole, key=lambda p: int(p.stem.split("_")[1]))


def drill(site: Site, cluster: LocalSlurm, node: str, *args: str) -> subprocess.CompletedProcess:
    """`gpugate drill` as root on `node` (its SLURMD_NODENAME), against this site's Slurm."""
    env = dict(os.environ, SLURMD_NODENAME=node, SLURM_CONF=str(cluster.conf_path))
    gpugate = str(Path(sys.executable).parent / "gpugate")
    argv = [gpugate, "drill", *args, "--config", str(site.config)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=110)


def gpugate_report(site: Site, cluster: LocalSlurm) -> str:
    """`gpugate report --json` as root: the window's runs, qualifications, drills, drains."""
    argv = [str(Path(sys.executable).parent / "gpugate"), "report", "--json", "--config",
            str(site.config)]  # fmt: skip
    env = dict(os.environ, SLURM_CONF=str(cluster.conf_path))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_xid79_drill_drains_requeues_from_the_checkpoint_and_resumes(
    cluster: LocalSlurm, site: Site
):
    started = time.monotonic()
    script, log, ckpt = training_job(site)
    job = cluster.submit(script=script, output=str(site.base / "train.out"),
                         comment=f"gpugate:ckpt={ckpt}")  # fmt: skip
    state = cluster.wait_job(job, "RUNNING", timeout=30)
    node = state["NodeList"]
    other = next(n for n in NODES if n != node)
    deadline = time.monotonic() + 20
    while len(list(ckpt.glob("ckpt_*.pt"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)

    done = drill(site, cluster, node, node, "--fault", "xid79", "--minutes", "0.5")
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr

    records = json.loads(drill(site, cluster, node, "--report", "--json").stdout)
    record = records[-1]
    assert record["passed"] and record["fault"] == "xid79" and record["node"] == node, record
    steps = {s["step"]: s for s in record["steps"]}
    assert list(steps) == [
        "injected",
        "job_killed",
        "drained",
        "requeued",
        "window_ended",
        "resumed",
    ]
    assert steps["drained"]["detail"].startswith(f"gpugate: DRILL {record['id']}: kernel.xid:")
    assert steps["requeued"]["nodes"] == [other]
    expected = newest_complete(ckpt)
    assert steps["requeued"]["checkpoint"] == str(expected), (
        steps["requeued"],
        sorted(ckpt.iterdir()),
    )
    times = [s["when"] for s in record["steps"]]
    assert times == sorted(times) and steps["window_ended"]["when"] >= record["drill"]["end"]

    final = cluster.wait_job(job, "COMPLETED", timeout=30)
    runs = log.read_text().splitlines()
    assert len(runs) == 2 and final["Restarts"] == "1", runs
    assert runs[1] == f"run=1 node={other} resume={expected}", runs
    assert not cluster.is_drained(node), cluster.node(node)
    assert decision(site, job, runs=2)["requeue"] is False  # the second run ended well
    # The hooks' runs under the drill say so in their event lines.
    assert any(e.get("drill") == record["id"] for e in site.events() if e["hook"] == "epilog")
    assert not (site.state / "drill.json").exists()
    # No admin mistakes it for a fault: the requeued job's AdminComment says DRILL, and the
    # report shows a drill, no failed run and no false drain.
    comment = cluster.job_state(job).get("AdminComment", "")
    assert f"DRILL {record['id']}" in comment, comment
    report = json.loads(gpugate_report(site, cluster))
    assert [d["drill"] for d in report["drills"]] == [record["id"]], report["drills"]
    assert report["failed_runs"] == [], report["failed_runs"]
    assert report["false_drains"] == 0, report["drains_by_check"]
    assert [d["node"] for d in report["drill_drains"]] == [node], report["drill_drains"]
    assert time.monotonic() - started < 120


def test_a_drills_drain_carries_slurms_own_lift_where_slurm_has_resume_after(
    cluster: LocalSlurm, site: Site
):
    """ResumeAfter (Slurm 23.02+; docs/slurm-facts.md, "ResumeAfter"): a drill's drain is
    lifted by Slurm SLURM_LIFT_MARGIN_S after the window even if the drill command dies;
    22.05 has no such timer and keeps the older path (the drill command, the health run)."""
    from localslurm import slurm_version

    from gpugate.drill import SLURM_LIFT_MARGIN_S

    site.restore(cluster, NODES)
    node = NODES[1]
    argv = [str(Path(sys.executable).parent / "gpugate"), "drill", node, "--fault", "xid79",
            "--minutes", "0.5", "--config", str(site.config)]  # fmt: skip
    env = dict(os.environ, SLURMD_NODENAME=node, SLURM_CONF=str(cluster.conf_path))
    started = time.time()
    # No job on the node: the drill's own health run drains it at once.
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        drained = cluster.wait_node(node, lambda n: "DRAIN" in n.get("State", ""), timeout=30)
        assert " DRILL " in f" {drained['Reason']}", drained
        shown = cluster.run(["scontrol", "-o", "show", "node", node],
                            extra_env={"SLURM_TIME_FORMAT": "%s"}).stdout  # fmt: skip
    finally:
        os.killpg(proc.pid, 9)  # the drill command dies: only Slurm's timer is left
        proc.wait(timeout=10)
        (site.state / "drill.json").unlink(missing_ok=True)  # its window, ended early
        site.restore(cluster, NODES)
    words = dict(w.split("=", 1) for w in shown.split() if "=" in w)
    if slurm_version() < (23, 2):
        assert words.get("ResumeAfterTime") in (None, "None"), shown  # 22.05: no such field
        return
    lift = int(words["ResumeAfterTime"])
    expected = started + 30 + SLURM_LIFT_MARGIN_S  # the window's end (0.5 min) plus the margin
    assert expected - 5 <= lift <= expected + 15, (lift, expected, shown)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""Both Slurm backends on a real Slurm: the same calls act on exactly the same jobs (issue 29).

pyslurm's Job(...) takes only an integer, and `int("1_1")` is 11: before the fix, `requeue("1_2")`
went to job 12. So each cluster here is fresh (job ids from 1), and held jobs 2-12 stand where a
misread array task id would land: a call that reaches one of them fails the test. The backends
run in a child each (tests/slurm/backend_driver.py): `import pyslurm` reads SLURM_CONF once per
process. pyslurm is built by `.ci/pyslurm`; without it the pyslurm cases skip, unless
GPUGATE_REQUIRE_PYSLURM=1 (CI), where they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import paths
import pytest

ROOT = paths.ROOT
sys.path.insert(0, str(ROOT))

from tests.slurm.localslurm import JOB_FREE_TEXT, LocalSlurm, parse_kv  # noqa: E402

pytestmark = pytest.mark.slurm

DRIVER = ROOT / "tests" / "slurm" / "backend_driver.py"
KINDS = ("cli", "pyslurm")
HET_SCRIPT = """#!/bin/sh
#SBATCH -N1 -n1
#SBATCH hetjob
#SBATCH -N1 -n1
sleep 600
"""


def pyslurm_missing() -> str | None:
    """Why the pyslurm backend cannot run here, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("pyslurm")
    except PackageNotFoundError:
        return "pyslurm is not installed (.ci/pyslurm builds it from ../shared/vendor/pyslurm)"
    return None


def need(kind: str) -> None:
    """Skip the pyslurm cases where it is not built; in CI (GPUGATE_REQUIRE_PYSLURM=1) fail."""
    problem = pyslurm_missing() if kind == "pyslurm" else None
    if problem and os.environ.get("GPUGATE_REQUIRE_PYSLURM") == "1":
        pytest.fail(f"GPUGATE_REQUIRE_PYSLURM=1: {problem}")
    if problem:
        pytest.skip(problem)


def call(cluster: LocalSlurm, kind: str, *calls: list) -> list[dict]:
    """Run the adapter calls on backend `kind` against `cluster`; one result per call."""
    env = {**cluster.env(), "GPUGATE_SLURM_BACKEND": kind}
    done = subprocess.run([sys.executable, str(DRIVER), kind], input=json.dumps(calls), env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["kind"] == kind, out["why"]
    return out["results"]


def show(cluster: LocalSlurm, job: str) -> dict[str, str]:
    """`scontrol show job -o JOB` (an array task `1_2`, a het component `13+1`) as fields."""
    text = cluster.run(["scontrol", "show", "job", "-o", job]).stdout.strip().splitlines()[0]
    return parse_kv(text, free_text=JOB_FREE_TEXT)


def wait_for(what: str, predicate, timeout: float = 30.0) -> None:
    """Poll `predicate` until true; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def differences(a: object, b: object, where: str = "") -> list[str]:
    """Where two JSON values differ, one line each: `[1].ok.state: 'MIXED' != 'ALLOCATED'`."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = dict.fromkeys([*a, *b])
        return [d for k in keys for d in differences(a.get(k), b.get(k), f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


@pytest.fixture
def cluster(tmp_path: Path):
    """A fresh 3-node Slurm (job ids from 1), as Debian ships it (SlurmUser=slurm)."""
    with LocalSlurm(tmp_path / "slurm", nodes=["n1", "n2", "n3"], slurm_user="slurm") as c:
        yield c


def lay_out_jobs(cluster: LocalSlurm) -> tuple[int, int]:
    """Array job 1 (tasks 1_1, 1_2 running on n1), held jobs 2-12 (the decoys), het job 13
    running on n2 and n3 (Slurm gives a het job's components distinct nodes)."""
    array = cluster.submit(wrap="sleep 600", array="1-2", ntasks=1, nodelist="n1", requeue=True)
    assert array == 1, "a fresh cluster numbers jobs from 1"
    decoys = [cluster.submit(wrap="true", hold=True, requeue=True) for _ in range(11)]
    assert decoys[-1] == 12
    het = cluster.submit(HET_SCRIPT, requeue=True)
    for job in ("1_1", "1_2", f"{het}+0", f"{het}+1"):
        wait_for(f"{job} running", lambda j=job: show(cluster, j)["JobState"] == "RUNNING")
    return array, het


def decoys_untouched(cluster: LocalSlurm) -> None:
    """Jobs 2-12 are as submitted: held, never requeued, no AdminComment."""
    for job in range(2, 13):
        fields = show(cluster, str(job))
        assert fields["JobState"] == "PENDING", (job, fields["JobState"])
        assert fields["Restarts"] == "0", job
        assert fields.get("AdminComment", "") in ("", "(null)"), (job, fields["AdminComment"])


@pytest.mark.parametrize("kind", KINDS)
def test_array_task_and_het_component_ids_reach_exactly_that_job(
    cluster: LocalSlurm, kind: str
) -> None:
    need(kind)
    array, het = lay_out_jobs(cluster)
    task1, task2 = show(cluster, f"{array}_1"), show(cluster, f"{array}_2")
    comp1 = show(cluster, f"{het}+1")
    got = call(cluster, kind,
               ["job", f"{array}_1"], ["job", f"{array}_2"], ["job", f"{het}+1"],
               ["set_admin_comment", f"{array}_1", "task one"],
               ["set_admin_comment", f"{het}+1", "het one"],
               ["requeue", f"{array}_2"])  # fmt: skip
    assert all("ok" in r for r in got), got
    assert got[0]["ok"]["job_id"] == int(task1["JobId"])
    assert got[1]["ok"]["job_id"] == int(task2["JobId"])
    assert got[2]["ok"]["job_id"] == int(comp1["JobId"]) == het + 1
    assert got[0]["ok"]["state"] == got[2]["ok"]["state"] == "RUNNING"
    assert show(cluster, f"{array}_1")["AdminComment"] == "gpugate: task one"
    assert show(cluster, f"{het}+1")["AdminComment"] == "gpugate: het one"
    assert show(cluster, f"{het}+0").get("AdminComment", "") in ("", "(null)")
    assert show(cluster, f"{array}_2").get("AdminComment", "") in ("", "(null)")
    # The requeue reached task 2, and only it.
    wait_for("task 2 requeued", lambda: show(cluster, f"{array}_2")["Restarts"] == "1")
    assert show(cluster, f"{array}_1")["JobState"] == "RUNNING"
    assert show(cluster, f"{array}_1")["Restarts"] == "0"
    decoys_untouched(cluster)


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_jobs_are_job_not_found_for_every_call(cluster: LocalSlurm, kind: str) -> None:
    need(kind)
    array = cluster.submit(wrap="sleep 600", array="1-2", ntasks=1)
    got = call(cluster, kind,
               ["job", "999999"], ["job", f"{array}_9"], ["requeue", "999999"],
               ["release", "999999"], ["set_excluded", "999999", ["n1"]],
               ["set_admin_comment", "999999", "x"], ["requeue", f"{array}_9"])  # fmt: skip
    assert [r.get("error") for r in got] == ["JobNotFound"] * len(got), got


def test_both_backends_read_the_same_records(cluster: LocalSlurm) -> None:
    need("pyslurm")
    running = cluster.submit(wrap="sleep 600", ntasks=1, nodelist="n1", time="10")
    cluster.wait_job(running, "RUNNING")
    cluster.drain("n2", "gpugate: test")
    reads = [["job", str(running)], ["node", "n1"], ["node", "n2"], ["nodes"]]
    cli, pyslurm = call(cluster, "cli", *reads), call(cluster, "pyslurm", *reads)
    diffs = differences(cli, pyslurm)
    assert not diffs, "\n".join(diffs)
    job, n1, n2 = (r["ok"] for r in cli[:3])
    # Running: no reason, no end yet (the CLI gave the expected end, start + --time).
    assert job["reason"] == "" and job["end_time"] is None
    assert n1["state"] == "MIXED"  # one CPU of two used (pyslurm 22.5.3 said ALLOCATED)
    assert n1["reason"] == n1["reason_user"] == ""  # pyslurm 24.11 said reason_user "root"
    assert n2["reason"] == "gpugate: test" and "DRAIN" in n2["flags"]


@pytest.mark.parametrize("kind", KINDS)
def test_requeue_held_then_released_at_once_runs_again_on_the_same_node(
    cluster: LocalSlurm, kind: str
) -> None:
    # 24.11 failed such a job ("Job credential revoked") when it restarted within the second
    # its node revoked the old credential: release() waits for the node's cleanup first.
    need(kind)
    job = cluster.submit(wrap="sleep 600", ntasks=1, nodelist="n1", requeue=True)
    cluster.wait_job(job, "RUNNING")
    got = call(cluster, kind, ["requeue", str(job), True], ["release", str(job)])
    assert all("ok" in r for r in got), got
    fields = cluster.wait_job(job, "RUNNING", timeout=60)
    assert fields["Restarts"] == "1" and fields["NodeList"] == "n1"


def test_auto_names_the_backend_it_takes_here_and_why(cluster: LocalSlurm) -> None:
    """selftest's backend line on this Slurm: pyslurm where built, else the CLI, and whether a
    pyslurm exists for this Slurm at all (26.05: none, so "install pyslurm" would mislead)."""
    from gpugate.admin.backendcheck import check_backend
    from gpugate.slurm.choose import PYSLURM_NEWEST, slurm_release
    from gpugate.slurm.cli import CliBackend

    note, problems = check_backend("auto", str(cluster.conf_path))
    assert problems == []
    if not pyslurm_missing():
        assert note.startswith("slurm backend: pyslurm ("), note
        return
    version = CliBackend(slurm_conf=str(cluster.conf_path)).version()
    assert version is not None
    assert note.startswith("slurm backend: cli (pyslurm is not installed: the scontrol/sinfo "
                           "command line is used; "), note  # fmt: skip
    if version > PYSLURM_NEWEST:
        assert f"pyslurm has no release for Slurm {slurm_release(version)} " in note, note
    else:
        assert f"pyslurm {version[0]}.{version[1]}.x is the release for this Slurm" in note, note

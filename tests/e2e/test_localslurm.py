"""End-to-end tests of tests/slurm/localslurm.py against a real local Slurm.

They need root (SlurmUser=root, mknod) and Slurm from apt; they skip otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import paths
import pytest

ROOT = paths.ROOT
sys.path.insert(0, str(ROOT))

from tests.slurm.localslurm import (  # noqa: E402
    JOB_USER,
    LocalSlurm,
    SlurmUnavailable,
    ensure_available,
    open_path,
    slurm_version,
    state_flags,
)

pytestmark = pytest.mark.slurm

HOOK_VAR = "GPUGATE_CONFIG"
HOOK_VALUE = "/etc/gpugate/test config.yaml"

# Records its environment, then fails when the job's comment asks for it (a batch job's
# comment reaches the prolog as SLURM_JOB_COMMENT on 22.05 and 24.11).
PROLOG = """#!/bin/sh
env | sort > "{dir}/prolog.$SLURMD_NODENAME.$SLURM_JOB_ID.env"
case "$SLURM_JOB_COMMENT" in
  *fail-prolog*) exit 1 ;;
  *fail-on-"$SLURMD_NODENAME"*) exit 1 ;;
esac
exit 0
"""


def write_prolog(directory: Path) -> Path:
    """Write the test prolog into ``directory`` and return its path."""
    path = directory / "prolog.sh"
    path.write_text(PROLOG.format(dir=directory))
    path.chmod(0o755)
    return path


def read_env(path: Path) -> dict[str, str]:
    """Parse an ``env | sort`` dump."""
    pairs = (line.partition("=") for line in path.read_text().splitlines())
    return {name: value for name, _, value in pairs}


@pytest.fixture(scope="module")
def slurm_ok() -> None:
    """Skip unless a local Slurm can run here (root, Slurm installed or installable)."""
    if os.geteuid() != 0:
        pytest.skip("local Slurm tests need root")
    try:
        ensure_available()
    except SlurmUnavailable as exc:
        pytest.skip(f"Slurm is not available: {exc}")


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory, slurm_ok: None):
    """A one-node cluster (8 fake GPUs) with the test prolog and a hook variable."""
    base = tmp_path_factory.mktemp("one")
    cluster = LocalSlurm(base, prolog=write_prolog(base), extra_env={HOOK_VAR: HOOK_VALUE})
    started = time.monotonic()
    with cluster:
        print(f"one-node start: {time.monotonic() - started:.2f} s")
        yield cluster


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory, slurm_ok: None):
    """A two-node cluster (two slurmd on this host, 2 fake GPUs each) with the test prolog."""
    base = tmp_path_factory.mktemp("two")
    cluster = LocalSlurm(base, nodes=["n1", "n2"], gpus_per_node=2, prolog=write_prolog(base))
    started = time.monotonic()
    with cluster:
        print(f"two-node start: {time.monotonic() - started:.2f} s")
        yield cluster


# ------------------------------------------------------------------------- one node


def test_node_is_idle_with_eight_gpus(one: LocalSlurm) -> None:
    node = one.node("gpu-node-01")
    assert node["State"] == "IDLE"
    assert node["Gres"] == "gpu:8"
    assert one.sinfo_states() == {"gpu-node-01": "idle"}


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A directory the ordinary job user can write its output to."""
    tmp_path.chmod(0o1777)
    open_path(tmp_path)
    return tmp_path


def test_jobs_run_as_the_ordinary_user(one: LocalSlurm, job_dir: Path) -> None:
    job = one.submit(wrap="id -un", output=str(job_dir / "who.out"))
    done = one.wait_job(job, "COMPLETED", timeout=30)
    assert done["UserId"].startswith(f"{JOB_USER}(")
    assert (job_dir / "who.out").read_text().strip() == JOB_USER
    assert (job_dir / "who.out").stat().st_uid == one.job_uid != 0


def test_wrap_job_runs_to_completion(one: LocalSlurm, job_dir: Path) -> None:
    tmp_path = job_dir
    job = one.submit(wrap="echo hi", output=str(tmp_path / "out.%j"))
    done = one.wait_job(job, "COMPLETED", timeout=30)
    assert done["ExitCode"] == "0:0"
    assert done["NodeList"] == "gpu-node-01"
    assert done["StdOut"] == str(tmp_path / f"out.{job}")
    assert Path(done["StdOut"]).read_text() == "hi\n"


def test_script_job_gets_gpus(one: LocalSlurm, job_dir: Path) -> None:
    tmp_path = job_dir
    script = "#!/bin/sh\n#SBATCH --gres=gpu:2\necho $CUDA_VISIBLE_DEVICES\n"
    job = one.submit(script, output=str(tmp_path / "gpus.out"))
    one.wait_job(job, "COMPLETED", timeout=30)
    assert (tmp_path / "gpus.out").read_text() == "0,1\n"


def test_hooks_get_extra_env_but_no_path(one: LocalSlurm) -> None:
    job = one.submit(wrap="true", comment="hello")
    one.wait_job(job, "COMPLETED", timeout=30)
    env = read_env(one.base / f"prolog.gpu-node-01.{job}.env")
    assert env[HOOK_VAR] == HOOK_VALUE  # exported by the wrapper, not inherited from slurmd
    assert "PATH" not in env  # slurmd gives hooks no PATH
    assert env["SLURM_JOB_COMMENT"] == "hello"
    assert env["SLURM_SCRIPT_CONTEXT"] == "prolog_slurmd"


def test_drain_with_reason_then_resume(one: LocalSlurm) -> None:
    reason = "gpugate: kernel.xid: XID=79 on gpu 3 (test)"  # `=` kept: Slurm stores it as given
    one.drain("gpu-node-01", reason)
    node = one.node("gpu-node-01")
    assert "DRAIN" in state_flags(node["State"])
    assert node["Reason"].startswith(reason + " [root@")
    assert one.is_drained("gpu-node-01")
    one.resume("gpu-node-01")
    assert not one.is_drained("gpu-node-01")
    assert one.sinfo_states()["gpu-node-01"] == "idle"


def test_failing_prolog_drains_node_and_holds_job(one: LocalSlurm) -> None:
    job = one.submit(wrap="true", comment="fail-prolog")
    node = one.wait_node("gpu-node-01", lambda n: "DRAIN" in state_flags(n["State"]))
    assert node["Reason"].startswith("Prolog error")
    held = one.wait_job(job, "PENDING", timeout=30, reason="launch failed requeued held")
    assert held["Restarts"] == "1"
    assert held["Priority"] == "0"

    # Recover: fix the job, resume the node, release the job (StartTime=now skips +120 s).
    one.run(["scontrol", "update", f"jobid={job}", "comment=fixed"])
    one.resume("gpu-node-01")
    one.release(job)
    assert one.wait_job(job, "COMPLETED", timeout=30)["Restarts"] == "1"


def test_jobs_start_fast(one: LocalSlurm) -> None:
    started = time.monotonic()
    job = one.submit(wrap="true")
    one.wait_job(job, "COMPLETED", timeout=30)
    elapsed = time.monotonic() - started
    print(f"sbatch -> COMPLETED: {elapsed:.2f} s")
    assert elapsed < 5  # batch_sched_delay=0: next 1 s scheduler tick, not 2-10 s


# ------------------------------------------------------------------------- two nodes


def test_two_nodes_are_idle(two: LocalSlurm) -> None:
    assert two.sinfo_states() == {"n1": "idle", "n2": "idle"}
    assert two.node("n2")["Gres"] == "gpu:2"


def test_job_spans_both_nodes(two: LocalSlurm, job_dir: Path) -> None:
    out = job_dir / "n2.out"
    job = two.submit(wrap="srun sh -c 'echo $SLURMD_NODENAME'", nodes=2, output=str(out))
    done = two.wait_job(job, "COMPLETED", timeout=30)
    assert done["NodeList"] == "n[1-2]"
    assert sorted(out.read_text().split()) == ["n1", "n2"]


def test_prolog_failing_on_one_node_drains_only_that_node(two: LocalSlurm) -> None:
    job = two.submit(wrap="true", nodes=2, comment="fail-on-n1", no_requeue=True)
    two.wait_job(job, "CANCELLED", timeout=30)  # --no-requeue: cancelled, not held
    two.wait_node("n1", lambda n: "DRAIN" in state_flags(n["State"]))
    assert not two.is_drained("n2")
    two.resume("n1")


def test_drained_node_gets_no_jobs(two: LocalSlurm) -> None:
    two.drain("n1", "test: keep off")
    job = two.submit(wrap="true")
    assert two.wait_job(job, "COMPLETED", timeout=30)["BatchHost"] == "n2"
    two.resume("n1")
    two.wait_idle()


# ------------------------------------------------------------------------- CLI, stop


def test_cli_start_status_stop(slurm_ok: None, tmp_path: Path) -> None:
    cli = [sys.executable, str(ROOT / "tests" / "slurm" / "localslurm.py")]
    base = tmp_path / "cli"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*cli, *args], capture_output=True, text=True, timeout=120, check=True
        )

    started = run("start", "--dir", str(base), "--nodes", "a,b", "--gpus", "1")
    assert started.stdout.strip() == str(base / "etc" / "slurm.conf")
    assert "a idle" in run("status", "--dir", str(base)).stdout
    cluster = LocalSlurm.from_dir(base)
    assert cluster.processes()
    run("stop", "--dir", str(base))
    run("stop", "--dir", str(base))  # twice is fine
    assert cluster.processes() == []


def test_stop_kills_running_jobs_and_is_idempotent(slurm_ok: None, tmp_path: Path) -> None:
    cluster = LocalSlurm(tmp_path / "c", gpus_per_node=0).start()
    job = cluster.submit(wrap="sleep 300")
    cluster.wait_job(job, "RUNNING", timeout=30)
    cluster.stop()
    cluster.stop()
    assert cluster.processes() == []


def test_version_is_known(slurm_ok: None) -> None:
    assert slurm_version() >= (22, 5)


# ------------------------------------------------------------------------- SlurmUser=slurm

# Records who runs it: slurmctld runs EpilogSlurmctld as SlurmUser.
CTLD_EPILOG = """#!/bin/sh
id -u > "{dir}/ctld-epilog.$SLURM_JOB_ID.uid"
"""


def test_slurm_user_slurm_runs_the_controller_epilog_as_slurm(
    tmp_path_factory: pytest.TempPathFactory, slurm_ok: None
) -> None:
    import pwd

    base = tmp_path_factory.mktemp("slurmuser")
    out = base / "out"
    out.mkdir()
    out.chmod(0o1777)  # the controller epilog (slurm) and the job (the job user) write here
    hook = base / "ctld-epilog.sh"
    hook.write_text(CTLD_EPILOG.format(dir=out))
    hook.chmod(0o755)
    open_path(out)
    with LocalSlurm(base / "c", epilog_slurmctld=hook, slurm_user="slurm") as cluster:
        assert "SlurmUser=slurm" in cluster.conf_path.read_text().splitlines()
        slurm_uid = pwd.getpwnam("slurm").pw_uid
        assert slurm_uid != 0
        # slurmctld itself dropped to slurm (slurmd stays root).
        ctld_pid = int((cluster.base / "run" / "slurmctld.pid").read_text().split()[0])
        assert os.stat(f"/proc/{ctld_pid}").st_uid == slurm_uid
        job = cluster.submit(wrap="true", output=str(out / "job.%j"))
        cluster.wait_job(job, "COMPLETED", timeout=30)
        uid_file = out / f"ctld-epilog.{job}.uid"
        deadline = time.monotonic() + 20
        while not uid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert uid_file.read_text().strip() == str(slurm_uid)

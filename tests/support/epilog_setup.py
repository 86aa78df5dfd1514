"""An epilog's site in a tmp dir: the config, the snapshot, the job Slurm reports, the environment."""

from __future__ import annotations

import os

from factories import default_config, make_facts
from fakes import FakeSlurm

from gpugate.hooks.epilog import run_epilog
from gpugate.hooks.prolog import run_prolog
from gpugate.slurm.hookenv import HookEnv
from gpugate.slurm.records import JobInfo
from gpugate.yamlio import dump_yaml

XID79 = "[Sun Nov 29 11:02:03 2026] NVRM: Xid (PCI:0000:58:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


NCCL_TIMEOUT = (
    "[rank3]:[E1129 11:00:01.1 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600061 milliseconds before timing out.\n"
)


def job_77(stdout: str, job_id: str = "77") -> JobInfo:
    """Job 77 (or `job_id`) of alice as Slurm reports it, its output in `stdout`."""
    return JobInfo(job_id=int(job_id), user="alice", uid=os.getuid(), state="FAILED", reason="",
                   nodes=("gpu-node-01",), batch_host="gpu-node-01", stdout=stdout,
                   stderr=stdout, work_dir="/", exit_code=1, exit_signal=0, restarts=0,
                   comment="", admin_comment="", excluded_nodes=(), requeue=True, partition="gpu")  # fmt: skip


def slurm_with_job(stdout: str, job_id: str = "77") -> FakeSlurm:
    """The one node, in service, and job 77 (or `job_id`)."""
    return FakeSlurm(jobs=[job_77(stdout, job_id)])


def setup(tmp_path, **epilog):
    """The packaged config with its state, evidence and snapshots under tmp_path; EPILOG changed."""
    config = default_config()
    return config.replace(
        facts_file=str(tmp_path / "{node}.yaml"),
        state_dir=str(tmp_path / "state"),
        evidence_dir=str(tmp_path / "evidence"),
        epilog=config.epilog.replace(**epilog),
        task_prolog=config.task_prolog.replace(nccl_debug_dir=None),
        budget=config.budget.replace(settle_s=0, jitter_s=0),
    )


def snapshot(tmp_path, facts) -> None:
    """gpu-node-01's replayed snapshot: FACTS."""
    (tmp_path / "gpu-node-01.yaml").write_text(dump_yaml(facts.to_dict()))


def env(**changes) -> HookEnv:
    """Job 77's epilog environment as Slurm gives it (alice, exit code 1), with CHANGES."""
    values = {"node": "gpu-node-01", "job_id": "77", "uid": os.getuid(), "gid": os.getgid(), "user": "alice",
              "exit_code": 256, "exit_code2": "1:0", "derived_ec": 0}  # fmt: skip
    values.update(changes)
    return HookEnv(**values)


def job_run(tmp_path, log_text: str, after=None, **env_changes):
    """Prolog on a healthy node, the job writes its log, the node changes, then the epilog."""
    config = setup(tmp_path)
    snapshot(tmp_path, make_facts())
    assert run_prolog(config, env(), slurm_with_job("")).exit_code == 0
    out = tmp_path / "job.out"
    out.write_text(log_text)
    snapshot(tmp_path, after or make_facts())
    slurm = slurm_with_job(str(out))
    return run_epilog(config, env(**env_changes), slurm), slurm, config


def member(result, name: str) -> str:
    """The text of NAME in the epilog RESULT's bundle."""
    with open(os.path.join(result.bundle, name)) as fh:
        return fh.read()

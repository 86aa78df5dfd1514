"""A prolog's site in a tmp dir: the config and snapshot it reads, and the hook environment."""

from __future__ import annotations

import os

from factories import default_config

from gpugate.slurm.hookenv import HookEnv
from gpugate.yamlio import dump_yaml


def setup(tmp_path, facts, **prolog):
    """The packaged config replaying FACTS, its state under tmp_path; PROLOG changed."""
    snap = tmp_path / "node.yaml"
    snap.write_text(dump_yaml(facts.to_dict()))
    config = default_config()
    config = config.replace(
        facts_file=str(snap),
        state_dir=str(tmp_path / "state"),
        prolog=config.prolog.replace(**prolog),
        task_prolog=config.task_prolog.replace(nccl_debug_dir=None),
        budget=config.budget.replace(settle_s=0),
    )
    return config


def env(**changes) -> HookEnv:
    """Job 42's prolog environment on gpu-node-01, with CHANGES."""
    values = {"node": "gpu-node-01", "job_id": "42", "uid": os.getuid(), "gid": os.getgid()}
    values.update(changes)
    return HookEnv(**values)

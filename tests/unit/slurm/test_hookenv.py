"""The hook environment Slurm gives, from real dumps (docs/slurm-facts.md)."""

from __future__ import annotations

from gpugate.slurm.hookenv import comment_tokens, from_environ


def test_prolog_environment_with_gpus():
    env = from_environ(
        {
            "SLURMD_NODENAME": "vm",
            "SLURM_JOB_ID": "3",
            "SLURM_JOB_UID": "1000",
            "SLURM_JOB_GID": "1000",
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_GPUS": "0,1",
            "SLURM_NODELIST": "vm",
            "SLURM_JOB_NUM_NODES": "1",
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        }
    )
    assert env.node == "vm" and env.job_id == "3" and env.uid == 1000
    assert env.gpus == (0, 1) and env.nodelist == "vm" and env.restart_count == 0


def test_epilog_exit_codes_and_newer_nodelist_name():
    env = from_environ(
        {
            "SLURM_JOB_ID": "2",
            "SLURM_JOB_EXIT_CODE": "768",
            "SLURM_JOB_EXIT_CODE2": "3:0",
            "SLURM_JOB_DERIVED_EC": "0",
            "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURM_NODELIST": "n[1-2]",
            "SLURM_JOB_RESTART_COUNT": "1",
        }
    )
    assert env.exit_code == 768 and env.exit_code2 == "3:0" and env.derived_ec == 0
    assert env.nodelist == "n[1-2]" and env.restart_count == 1
    assert env.gpus is None  # a job without GPUs: all of the node's GPUs count as its own


def test_comment_tokens_take_only_gpugate_words():
    tokens = comment_tokens("my run 7, gpugate:skip gpugate:ckpt=/data/run7 gpugate:restarts=3")
    assert tokens == {"skip": "", "ckpt": "/data/run7", "restarts": "3"}
    assert comment_tokens("notgpugate:skip") == {}
    assert comment_tokens("") == {}


def test_the_sluid_is_read_where_slurm_gives_one():
    base = {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "n1"}
    assert from_environ({**base, "SLURM_JOB_SLUID": "s1KSM94MJ1KK00"}).sluid == "s1KSM94MJ1KK00"
    assert from_environ(base).sluid is None  # Slurm before 25.11
    # Not a SLUID (sluid.h: "s" and 13 Crockford Base32 characters): not taken for one.
    for bad in ("", "s1KSM94MJ1KK0", "s1KSM94MJ1KK000", "S1KSM94MJ1KK00", "s1KSM94MJ1KL00",
                "s../../etc/xx0", "5"):  # fmt: skip
        assert from_environ({**base, "SLURM_JOB_SLUID": bad}).sluid is None, bad

"""Once the prolog has decided, its bookkeeping cannot undo the decision (issue 11, point 3).

The real `gpugate prolog` path (cli.run_guarded -> guard.run_hook -> cmd_prolog -> run_prolog)
on a replayed node whose GPU 3 fails `gpu.ecc`, with Slurm faked at the adapter (passed in): a hostile
drains.jsonl, a drain that raises, a read-only or full state directory, bookkeeping that
raises. The job on GPU 3 is refused (exit 1) every time.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest
from factories import make_facts, run_command
from fakes import FakeSlurm

from gpugate.store import history as H
from gpugate.yamlio import dump_yaml

NODE = "gpu-node-01"
T0 = 1_790_000_000.0


@pytest.fixture
def broken_node(tmp_path, monkeypatch):
    """(site file, state dir, fake Slurm) for a node whose GPU 3 is the job's and fails."""
    snap = tmp_path / f"{NODE}.yaml"
    snap.write_text(dump_yaml(make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}}).to_dict()))
    state = tmp_path / "state"
    site = tmp_path / "site.yaml"
    site.write_text(
        f"facts_file: {tmp_path}/{{node}}.yaml\nstate_dir: {state}\n"
        f"evidence_dir: {tmp_path / 'ev'}\ntask_prolog:\n  nccl_debug_dir: null\n"
        f"budget:\n  settle_s: 0\n  jitter_s: 0\nadmin:\n  metrics_file: {tmp_path / 'prom' / 'gpugate.prom'}\n"
    )
    (tmp_path / "prom").mkdir()
    env = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": NODE, "SLURM_JOB_GPUS": "2,3",
           "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GID": str(os.getgid())}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return site, state, FakeSlurm()


def prolog(site, slurm) -> int:
    """`gpugate prolog`, its Slurm adapter `slurm`."""
    return run_command(["prolog", "--config", str(site)], make_slurm=lambda config: slurm)


HOSTILE = {
    "time_is_text": b'{"time": "x"}\n',
    "a_list": b"[]\n",
    "node_is_a_number": b'{"node": 5}\n',
    # The line that made a refused job run: the same node, a `when` that is not a number
    # (the repeat-drain check subtracted it: TypeError, past the guard, exit 0).
    "when_is_text": b'{"node": "gpu-node-01", "when": "x", "check": "gpu.ecc"}\n',
    "when_is_infinite": b'{"node": "gpu-node-01", "when": 1e400, "check": "gpu.ecc"}\n',
    "check_is_a_mapping": b'{"node": "gpu-node-01", "when": 1, "check": {"a": 1}}\n',
    "binary": b"\xff\xfe\x00\x01garbage\x9b\n",
    "deep": b"[" * 50_000 + b"\n",
    "torn": b'{"node": "gpu-node-01", "wh\n',
}


@pytest.mark.parametrize("content", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_drains_line_never_lets_a_refused_job_run(broken_node, content, capsys):
    site, state, slurm = broken_node
    state.mkdir()
    good = json.dumps({"node": "gpu-node-09", "when": T0, "check": "gpu.ecc", "reason": "r"})
    (state / H.DRAINS).write_bytes(content + good.encode() + b"\n")
    assert prolog(site, slurm) == 1
    assert [n for n, _ in slurm.drains] == [NODE]
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    # The history survived the bad line: the good entry and the new drain, nothing else.
    assert [e.node for e in H.drains(str(state))] == ["gpu-node-09", NODE]


def test_a_gigabyte_line_in_drains_is_skipped_quickly(broken_node, capsys):
    """A sparse 1 GiB line (no newline): only the newest READ_MAX bytes are read."""
    site, state, slurm = broken_node
    state.mkdir()
    with open(state / H.DRAINS, "wb") as fh:
        fh.write(b'{"node": "gpu-node-01", "reason": "')
        fh.truncate(1 << 30)
    assert prolog(site, slurm) == 1
    assert slurm.drains and [e.node for e in H.drains(str(state))] == [NODE]
    assert "read only the newest 32 MiB" in capsys.readouterr().err


def test_a_drain_that_raises_still_refuses_the_job(broken_node, monkeypatch, capsys):
    from gpugate.slurm.control import SlurmError

    site, state, slurm = broken_node
    slurm.errors["drain"] = SlurmError("scontrol: error: Unable to contact slurm controller")
    assert prolog(site, slurm) == 1
    err = capsys.readouterr().err
    assert "could not drain gpu-node-01" in err and "refusing the job anyway" in err
    assert "Unable to contact slurm controller" in err
    event = json.loads((state / "events.jsonl").read_text().splitlines()[-1])
    assert (event["refused"], event["drained"], event["blocked_by"]) == (True, False, "error")
    assert (state / "jobs" / "42" / "refused.json").exists()  # the epilog collects nothing


def test_an_unexpected_error_from_the_adapter_also_refuses(broken_node):
    site, _, _ = broken_node

    def no_backend(config):
        raise RuntimeError("pyslurm exploded")

    assert run_command(["prolog", "--config", str(site)], make_slurm=no_backend) == 1


def test_an_error_between_the_decision_and_the_exit_keeps_the_refusal(broken_node, monkeypatch):
    site, _, slurm = broken_node

    def boom(*args, **kwargs):
        raise RuntimeError("bug after the decision")

    for name in ("summary", "check_statuses", "prepare_job"):
        monkeypatch.setattr(f"gpugate.hooks.prolog.{name}", boom)
    # The refusal's note and AdminComment are the executor's steps (gpugate/act/execute.py).
    monkeypatch.setattr("gpugate.act.execute.write_private", boom)
    slurm.errors["admin_comment"] = RuntimeError("bug after the decision")
    assert prolog(site, slurm) == 1
    assert slurm.drains


@pytest.mark.parametrize(
    "target",
    [
        "gpugate.store.history.record_drain",
        "gpugate.store.metrics.update_metrics",
        "gpugate.hooks.prolog.say_verdict",
        "gpugate.log.event",
    ],
)
@pytest.mark.parametrize("error", [MemoryError(), TypeError("x"), OSError(errno.ENOSPC, "full")])
def test_bookkeeping_that_raises_changes_nothing(broken_node, monkeypatch, target, error):
    site, state, slurm = broken_node

    def boom(*args, **kwargs):
        raise error

    monkeypatch.setattr(target, boom)
    assert prolog(site, slurm) == 1
    assert slurm.drains
    if target != "gpugate.log.event":  # the other steps still ran: the event is written
        event = json.loads((state / "events.jsonl").read_text().splitlines()[-1])
        assert event["hook"] == "prolog" and event["refused"] is True


def test_a_full_state_disk_changes_nothing(broken_node, monkeypatch):
    """Every write under the state directory fails with ENOSPC (simulated at the fsutil seam)."""
    from gpugate import fsutil

    site, _, slurm = broken_node

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsutil, "atomic_write", full)
    monkeypatch.setattr(fsutil, "open_private", full)
    monkeypatch.setattr(fsutil, "private_dir", full)
    assert prolog(site, slurm) == 1
    assert slurm.drains


def _mount_tmpfs(path, options: str) -> bool:
    os.makedirs(path, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                              capture_output=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`
@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_a_real_read_only_or_full_state_dir_changes_nothing(broken_node, kind):
    site, state, slurm = broken_node
    if os.geteuid() != 0 or not _mount_tmpfs(state, "size=64k,mode=0751"):
        pytest.skip("needs root and permission to mount a tmpfs")
    try:
        if kind == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True, timeout=10)
        else:
            fd = os.open(state / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
            with pytest.raises(OSError):
                while True:  # until ENOSPC
                    os.write(fd, b"\0" * 4096)
            os.close(fd)
        assert prolog(site, slurm) == 1
        assert [n for n, _ in slurm.drains] == [NODE]
    finally:
        # umount fails while gpugate still holds a file there (a log left open after ENOSPC)
        done = subprocess.run(["umount", str(state)], capture_output=True, timeout=10)
    assert done.returncode == 0, done.stderr


def test_the_epilogs_bookkeeping_steps_are_independent(tmp_path, monkeypatch):
    """A history that raises after an epilog drain still leaves the event line."""
    from gpugate.commands import epilog as cmd_epilog
    from gpugate.config import load_config
    from gpugate.hooks.epilog import EpilogResult
    from gpugate.slurm.hookenv import HookEnv

    config = load_config("/dev/null").replace(state_dir=str(tmp_path))
    result = EpilogResult(abnormal=True, why="exit code 1", drained=True,
                          reason="gpugate: kernel.xid: GPU1 Xid 79")  # fmt: skip
    monkeypatch.setattr(
        "gpugate.slurm.hookenv.from_environ", lambda: HookEnv(node=NODE, job_id="7")
    )
    # The epilog's judgement and acts stand in; its bookkeeping (the executor's) runs for real.
    monkeypatch.setattr("gpugate.hooks.epilog.judge_and_act", lambda config, env, hands: result)

    def boom(*args, **kwargs):
        raise TypeError("hostile history")

    monkeypatch.setattr(H, "record_drain", boom)
    assert cmd_epilog._body(config) == 0
    event = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert event["hook"] == "epilog" and event["drained"] is True


def test_the_drain_history_names_the_failing_gpus_serial(broken_node):
    """The part that failed, by its serial (NVML's index moves between boots): the repair
    ladder counts its drains on any node toward its RMA (gpugate/gate/ladder.py)."""
    site, state, slurm = broken_node
    assert prolog(site, slurm) == 1
    [entry] = H.drains(str(state))
    assert entry.gpu == "1652123000003"

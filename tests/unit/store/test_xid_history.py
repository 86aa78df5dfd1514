"""Application-class Xids per job: one job's own never drain; the same GPU across users may."""

from __future__ import annotations

import json
import os
import stat
import time

from epilog_setup import env, setup, slurm_with_job, snapshot
from factories import make_facts

from gpugate.hooks.epilog import run_epilog
from gpugate.hooks.prolog import run_prolog
from gpugate.store import app_xids as H

GPU2 = "0000:38:00"  # make_gpu(2)


def xid31_bursts(n: int, pci: str = GPU2) -> tuple[str, ...]:
    """`n` faults ten minutes apart from the job's own process (three lines each)."""
    return tuple(
        f"[Sun Nov 29 1{hour // 6}:{hour % 6}0:0{i} 2026] NVRM: Xid (PCI:{pci}): 31, pid=1234, "
        "name=python, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2"
        for hour in range(n)
        for i in range(3)
    )


def epilog_after(tmp_path, config, kernel_lines, job_id="77", **env_changes):
    snapshot(tmp_path, make_facts())
    assert run_prolog(config, env(job_id=job_id), slurm_with_job("", job_id)).exit_code == 0
    out = tmp_path / "job.out"
    out.write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    snapshot(tmp_path, make_facts(kernel_log=kernel_lines))
    slurm = slurm_with_job(str(out), job_id)
    return run_epilog(config, env(job_id=job_id, **env_changes), slurm), slurm


def history_file(config) -> str:
    return os.path.join(config.state_dir, H.NAME)


def test_five_bursts_of_xid_31_from_one_jobs_process_never_drain(tmp_path):
    config = setup(tmp_path)
    result, slurm = epilog_after(tmp_path, config, xid31_bursts(5))
    assert slurm.drains == [] and not result.hardware_fault and not result.drained
    with open(history_file(config)) as fh:
        entries, bad = H.parse(fh.read(), 0)
    assert bad == 0 and [(e.gpu, e.xid, e.job, e.pid, e.name) for e in entries] == [
        (GPU2, 31, "77", 1234, "python")
    ]
    assert stat.S_IMODE(os.stat(history_file(config)).st_mode) == 0o600
    # The next job's prolog sees the same lines in the kernel log: still no drain.
    assert run_prolog(config, env(job_id="78"), slurm_with_job("", "78")).exit_code == 0


def as_root(monkeypatch):
    from gpugate.gate import suspicion

    monkeypatch.setattr(suspicion.os, "geteuid", lambda: 0)


def shared_history(config, tmp_path):
    """The config with admin.history_dir set: every node's flags counted in one place."""
    return config.replace(admin=config.admin.replace(history_dir=str(tmp_path / "hist")))


def test_the_same_gpu_in_jobs_of_three_users_flags_the_node_never_drains(
    tmp_path, monkeypatch, qualifications_started
):
    from gpugate.store.suspects import open_flags

    as_root(monkeypatch)
    config = shared_history(setup(tmp_path), tmp_path)
    now = time.time()
    H.record(config, [H.AppXidEntry(t=now - 3600, gpu=GPU2, xid=13, job="70", uid=5001),
                      H.AppXidEntry(t=now - 1800, gpu=GPU2, xid=31, job="71", uid=5002)], now)  # fmt: skip
    result, slurm = epilog_after(tmp_path, config, xid31_bursts(1))
    assert not result.drained and not result.hardware_fault and slurm.drains == []
    flag = open_flags(config.admin.history_dir or config.state_dir)["gpu-node-01"]
    assert flag.source == "app_xid" and flag.jobs == ["70", "71", "77"]
    assert "in 3 jobs of 3 users" in (flag.detail or "")
    assert [n for n, _ in qualifications_started] == ["gpu-node-01"]


def test_one_user_primes_and_a_second_does_not_tip(tmp_path, monkeypatch, qualifications_started):
    # Attack 5 of issue 25: four jobs of one user, then one job of another.
    as_root(monkeypatch)
    config = shared_history(setup(tmp_path), tmp_path)
    now = time.time()
    H.record(config, [H.AppXidEntry(t=now - 600 + i, gpu=GPU2, xid=31, job=str(60 + i),
                                    uid=5001) for i in range(4)], now)  # fmt: skip
    _, slurm = epilog_after(tmp_path, config, xid31_bursts(1))  # uid of env(): another
    assert slurm.drains == [] and qualifications_started == []
    # A second job of that second user makes two users with two jobs each: a suspect.
    _, slurm = epilog_after(tmp_path, config, xid31_bursts(1), job_id="79")
    assert slurm.drains == [] and [n for n, _ in qualifications_started] == ["gpu-node-01"]


def test_with_the_node_local_history_an_app_xid_flag_is_a_review(
    tmp_path, monkeypatch, qualifications_started
):
    # Issue 41 R8: each node counting its own flags would qualify every node each day.
    from gpugate.store.suspects import open_flags

    as_root(monkeypatch)
    config = setup(tmp_path)
    assert config.admin.history_dir is None  # the packaged default
    now = time.time()
    H.record(config, [H.AppXidEntry(t=now - 3600, gpu=GPU2, xid=13, job="70", uid=5001),
                      H.AppXidEntry(t=now - 1800, gpu=GPU2, xid=31, job="71", uid=5002)], now)  # fmt: skip
    _, slurm = epilog_after(tmp_path, config, xid31_bursts(1))
    flag = open_flags(config.state_dir)["gpu-node-01"]
    assert flag.action == "review" and "node-local history" in (flag.note or ""), flag
    assert flag.uids == sorted([5001, 5002, os.getuid()])
    assert qualifications_started == [] and slurm.drains == []


def test_a_resume_starts_the_count_afresh(tmp_path, monkeypatch, qualifications_started):
    from gpugate.store.history import record_resume

    as_root(monkeypatch)
    config = setup(tmp_path)
    now = time.time()
    H.record(config, [H.AppXidEntry(t=now - 600, gpu=GPU2, xid=31, job="70", uid=5001),
                      H.AppXidEntry(t=now - 500, gpu=GPU2, xid=31, job="71", uid=5002)], now)  # fmt: skip
    record_resume(
        config.admin.history_dir or config.state_dir, "gpu-node-01", "admin", when=now - 60
    )
    epilog_after(tmp_path, config, xid31_bursts(1))
    assert qualifications_started == []


def test_old_entries_and_other_gpus_do_not_count(tmp_path):
    config = setup(tmp_path)
    now = time.time()
    H.record(config, [H.AppXidEntry(t=now - 200 * 3600, gpu=GPU2, xid=31, job="70", uid=5001),
                      H.AppXidEntry(t=now - 60, gpu="0000:68:00", xid=31, job="71", uid=5002)],
             now)  # fmt: skip
    result, slurm = epilog_after(tmp_path, config, xid31_bursts(1))
    assert slurm.drains == [] and not result.hardware_fault


def test_only_the_jobs_own_gpus_are_recorded():
    facts = make_facts()
    lines = list(xid31_bursts(1)) + list(xid31_bursts(1, "0000:68:00"))  # GPU2 and GPU5
    events = H.job_events(lines, env(gpus=(5,)), facts, 1.0)
    assert [(e.gpu, e.job) for e in events] == [("0000:68:00", "77")]
    assert H.job_events(lines, env(job_id="../x"), facts, 1.0) == []


def test_bad_lines_are_skipped_and_the_file_stays_bounded(tmp_path):
    config = setup(tmp_path)
    os.makedirs(config.state_dir)
    good = {"t": time.time(), "gpu": GPU2, "xid": 31, "job": "9", "uid": 1}
    with open(history_file(config), "w") as fh:
        fh.write("not json\n" + json.dumps(dict(good, gpu="../../etc")) + "\n")
        fh.write(json.dumps(dict(good, uid=True)) + "\n" + "[1, 2]\n" + "x" * 5000 + "\n")
        fh.write(json.dumps(good) + "\n")
    assert [e.to_json() for e in H.load(config, time.time())] == [
        dict(good, pid=None, name=None)  # absent: their defaults
    ]
    now = time.time()
    for i in range(3000):
        H.record(config, [H.AppXidEntry.from_json(dict(good, job=str(i), t=now))], now)
    entries = H.load(config, now)
    assert len(entries) <= H.MAX_ENTRIES and entries[-1].job == "2999"
    assert os.path.getsize(history_file(config)) < H.MAX_ENTRIES * H.MAX_LINE


def test_a_symlink_in_place_of_the_history_is_not_followed(tmp_path):
    config = setup(tmp_path)
    os.makedirs(config.state_dir)
    target = tmp_path / "elsewhere"
    target.write_text(json.dumps({"t": time.time(), "gpu": GPU2, "xid": 31, "job": "9", "uid": 1}))
    os.symlink(target, history_file(config))
    assert H.load(config, time.time()) == []
    assert H.record(config, [H.AppXidEntry(t=1.0, gpu=GPU2, xid=31, job="9", uid=1)], 1.0) is False
    assert "xid" in target.read_text() and target.read_text().count("\n") == 0

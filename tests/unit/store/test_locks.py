"""No lock a user can hold, and none waited for without a bound (issue 25, deliverable 7).

Each store's lock is held from another process, opened read-only as a user would open a
readable file, and the store's operation still returns, doing what locks.py says it does
without the lock. Every lock path is 0600 in a root-only 0700 directory, and every module
that takes a lock names its file through gpugate/store/locks.py, so the list the red-team
test walks (lock_paths) is the whole list.
"""

from __future__ import annotations

import os
import re
import time

import paths
import pytest
from factories import site
from heldlock import held

from gpugate import fsutil
from gpugate.store import app_xids, history, locks, metrics
from gpugate.store import evidence as E
from gpugate.store.locks import lock_paths

ROOT = paths.ROOT
# The modules that may take a lock; a new one must name its file in store/locks.py and appear
# in lock_paths (the red-team e2e test locks each of them as a user).
LOCKERS = {
    "gpugate/fsutil.py",
    "gpugate/store/history.py",
    "gpugate/store/app_xids.py",
    "gpugate/store/evidence.py",
    "gpugate/store/metrics.py",
    "gpugate/gate/repair.py",
    "gpugate/isolate/apply.py",
    "gpugate/commands/isolate.py",  # `isolate put-back`: apply's own isolate.lock
    "gpugate/isolate/quiet.py",
    # A job's digest lock, one per job and run below evidence_dir (not a fixed path, so not in
    # lock_paths): private as the others, tests/unit/store/test_controller_view_scale.py.
    "gpugate/store/controller_view.py",
}


@pytest.fixture
def config(tmp_path):
    (tmp_path / "textfile").mkdir()
    return site(tmp_path, f"state_dir: {tmp_path / 'state'}\n"
                f"admin:\n  metrics_file: {tmp_path / 'textfile' / 'gpugate.prom'}\n")  # fmt: skip


@pytest.fixture
def short(monkeypatch):
    """Bounded waits of 0.1 s, so a held lock costs the test little (the evidence's: its
    Retention's lock_wait_s)."""
    for name in ("HISTORY_WAIT_S", "APP_XIDS_WAIT_S", "REPAIRS_WAIT_S", "EVIDENCE_WAIT_S"):
        monkeypatch.setattr(locks, name, 0.1)


def _lock(config, name: str) -> str:
    # The history's own lock (the controller's, in controller_dir, is the second of that name).
    path = next(p for p in lock_paths(config) if os.path.basename(p) == name)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    return path


def test_the_history_is_written_without_a_lock_held_past_its_wait(config, short, capsys):
    where = history.history_dir(config)
    history.record_drain(where, "n1", "gpugate: gpu.ecc: x", when=1000)
    with held(_lock(config, locks.HISTORY)):
        history.record_drain(where, "n2", "gpugate: gpu.ecc: y", when=1001)
        history.record_resume(where, "n1", who="admin", why="fixed", when=1002)
    assert [e.node for e in history.drains(where)] == ["n1", "n2"]
    assert [e.node for e in history.resumes(where)] == ["n1"]
    err = capsys.readouterr().err
    assert "drains.jsonl: history.lock held over 0.1 s by another writer: written without it" in err
    assert "audit.jsonl: history.lock held" in err


def test_app_xids_are_appended_without_a_held_lock_and_pruned_later(config, short, capsys):
    entry = app_xids.AppXidEntry(t=time.time(), gpu="0000:18:00", xid=31, job="7", uid=1000)
    assert app_xids.record(config, [entry], time.time())
    with held(_lock(config, locks.APP_XIDS)):
        assert app_xids.record(config, [entry.replace(job="8")], time.time())
    assert [e.job for e in app_xids.load(config, time.time())] == ["7", "8"]
    assert "appended without it, not pruned" in capsys.readouterr().err


def test_a_repair_is_recorded_without_a_held_lock(config, short, capsys):
    from gpugate.gate import repair

    with held(_lock(config, locks.REPAIRS)):
        repair._record(config, repair.RESET, "n1", {"gpus": [0]})
    assert repair.reset_recorded("n1", config) is not None
    assert "repairs.json: lock held over 0.1 s: written without it" in capsys.readouterr().err


def test_the_evidence_index_is_written_without_a_held_lock(config, short, tmp_path):
    retention = E.retention_for(config).replace(max_bytes=1, lock_wait_s=0.1)
    evidence = str(tmp_path / "evidence")
    old = E.write_bundle(evidence, "1", "n1", 0, {"a": "x"}, {"job_id": "1"}, retention=retention)
    with held(_lock(config, locks.EVIDENCE)):
        new = E.write_bundle(evidence, "2", "n1", 0, {"a": "x"}, {"job_id": "2"},
                             retention=retention)  # fmt: skip
    assert os.path.isdir(old) and os.path.isdir(new)  # not pruned while another prunes
    paths, _ = E.node_bundle_paths(evidence, "n1")
    assert sorted(paths) == sorted([old, new])


def test_metrics_are_skipped_not_waited_for(config):
    assert metrics.note_run(config, "n1", "prolog", findings={"gpu.ecc": "ok"})
    with held(_lock(config, locks.metrics_lock(config.admin.metrics_file))):
        assert metrics.note_run(config, "n1", "epilog", category="ecc_error") is False
    assert metrics.note_run(config, "n1", "epilog") is True


def test_every_lock_is_0600_in_a_root_only_0700_directory(config, tmp_path, monkeypatch):
    """Run every store once, spying on the locks taken: each is in lock_paths, and private."""
    from gpugate.gate import repair

    taken = []
    enter = fsutil.FileLock.__enter__
    monkeypatch.setattr(
        fsutil.FileLock, "__enter__", lambda self: taken.append(self.path) or enter(self)
    )
    where = history.history_dir(config)
    history.record_drain(where, "n1", "gpugate: gpu.ecc: x")
    from gpugate.store import suspects

    suspects.record_vote(history.controller_dir(config), "n1", "7")  # the controller's
    entry = app_xids.AppXidEntry(t=time.time(), gpu="0000:18:00", xid=31, job="7", uid=1000)
    app_xids.record(config, [entry], time.time())
    repair._record(config, repair.RESET, "n1", {"gpus": [0]})
    E.write_bundle(
        str(tmp_path / "ev"), "1", "n1", 0, {"a": "x"}, {}, retention=E.retention_for(config)
    )
    metrics.note_run(config, "n1", "prolog")
    from gpugate.store.qualify import QualifyEntry

    passed = QualifyEntry(node="n1", when=1.0, run_id="q", level=1, passed=True, tests=[],
                          job_ids=[], why="", by="root")  # fmt: skip
    metrics.note_qualification(config, [passed])
    from gpugate.isolate import apply

    with pytest.raises(apply.IsolationFailed, match="no isolation requested"):
        apply.apply(config, None, "n1")  # type: ignore[arg-type]  # stops before asking Slurm
    from gpugate.isolate import quiet

    class Quiet:
        def script_jobs(self) -> list[tuple[str, str]]:
            return []

    monkeypatch.setattr(quiet, "HOLD_S", 0.0)
    with quiet.reconfigure_slot(config, Quiet(), 1.0):
        pass
    # A drain takes the history's lock twice: its history entry, then its repair ledger line.
    assert sorted(set(taken)) == sorted(lock_paths(config))
    for path in lock_paths(config):
        st, top = os.lstat(path), os.lstat(os.path.dirname(path))
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid(), path
        assert top.st_mode & 0o777 == 0o700 and top.st_uid == os.geteuid(), path
        assert not path.startswith(str(tmp_path / "textfile")), path  # node_exporter's


def test_the_evidence_lock_stays_node_local_when_the_evidence_is_shared(config):
    """evidence_dir may be on shared storage: flock there is slow or unreliable."""
    (path,) = [p for p in lock_paths(config) if p.endswith(locks.EVIDENCE)]
    assert path.startswith(config.state_dir + os.sep)
    assert E.retention_for(config).lock_dir == config.state_dir


def test_every_module_that_locks_is_listed():
    """A lock taken outside these modules would be missing from lock_paths (and from the
    red-team test); fcntl.flock is taken in fsutil.FileLock only."""
    found = set()
    for top in ("gpugate",):
        for path in (ROOT / top).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if re.search(r"\bFileLock\(|\bflock\(|\blockf\(", text):
                found.add(str(path.relative_to(ROOT)))
    assert found == LOCKERS
    flockers = [p for p in LOCKERS if "fcntl.flock(" in (ROOT / p).read_text(encoding="utf-8")]
    assert flockers == ["gpugate/fsutil.py"]

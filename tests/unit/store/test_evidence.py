"""Evidence bundles: the per-node index (written by write_bundle, validated on read, the scan only
where a node has none) and retention (age, one user's share, the node's total; oldest first,
never the bundle just written, under the node-local lock)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from factories import site
from heldlock import held

from gpugate import fstree
from gpugate.config import ConfigError
from gpugate.fsutil import lock_file
from gpugate.store import evidence as E

DAY = 86400.0
T0 = 1_790_000_000.0


def write(root, job: str, node: str = "gpu-01", user: str = "alice", size: int = 1000,
          at: float = T0, retention: E.Retention | None = None, restart: int = 0) -> str:  # fmt: skip
    files = {"kernel.log": "x" * size}
    summary = {"job_id": job, "node": node, "user": user}
    return E.write_bundle(
        str(root), job, node, restart, files, summary, retention=retention, now=at
    )


def index_lines(root, node: str = "gpu-01") -> list[dict]:
    with open(E.index_path(str(root), node)) as fh:
        return [json.loads(line) for line in fh]


def gone(path: str) -> bool:
    return not os.path.lexists(path)


# ------------------------------------------------------------------------------ the index


def test_write_bundle_appends_one_index_line_with_size_user_and_time(tmp_path):
    path = write(tmp_path, "100", size=500)
    [entry] = index_lines(tmp_path)
    assert entry["path"] == "100/gpu-01-r0" and os.path.join(str(tmp_path), entry["path"]) == path
    assert entry["user"] == "alice" and entry["at"] == T0 and entry["node"] == "gpu-01"
    on_disk = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    assert entry["bytes"] == on_disk  # kernel.log and summary.json, as written
    assert oct(os.stat(E.index_path(str(tmp_path), "gpu-01")).st_mode & 0o777) == "0o640"


def test_lookup_reads_the_index_not_every_job_directory(tmp_path, monkeypatch):
    mine = [write(tmp_path, str(j)) for j in (1, 2)]
    write(tmp_path, "3", node="gpu-02")

    def no_listing(*a, **k):
        raise AssertionError("listed a directory")

    monkeypatch.setattr(os, "listdir", no_listing)
    monkeypatch.setattr(os, "scandir", no_listing)
    paths, notes = E.node_bundle_paths(str(tmp_path), "gpu-01")
    assert paths == sorted(mine) and notes == []


def test_without_an_index_the_scan_finds_old_bundles_and_says_so(tmp_path):
    path = write(tmp_path, "7")
    os.unlink(E.index_path(str(tmp_path), "gpu-01"))  # a bundle from before the index
    paths, notes = E.node_bundle_paths(str(tmp_path), "gpu-01")
    assert paths == [path]
    assert (
        len(notes) == 1 and "no index for gpu-01" in notes[0] and "every job directory" in notes[0]
    )


def test_scan_on_request_adds_unindexed_bundles(tmp_path):
    new = write(tmp_path, "8")
    old = os.path.join(str(tmp_path), "5", "gpu-01-r0")
    os.makedirs(old)  # written by an older gpugate: not in the index
    assert E.node_bundle_paths(str(tmp_path), "gpu-01")[0] == [new]
    assert E.node_bundle_paths(str(tmp_path), "gpu-01", scan=True)[0] == sorted([new, old])


def test_bad_lines_are_skipped_with_a_warning_and_gone_bundles_left_out(tmp_path):
    kept = write(tmp_path, "10")
    removed = write(tmp_path, "11")
    shutil.rmtree(removed)  # an admin removed it by hand
    (tmp_path / "12").mkdir()
    os.symlink("/etc", tmp_path / "12" / "gpu-01-r0")  # not a bundle: never followed
    with open(E.index_path(str(tmp_path), "gpu-01"), "a") as fh:
        fh.write('{"path": "12/gpu-01-r0", "bytes": 1, "at": 1}\n')
        fh.write("{torn\n")
        fh.write('["a list"]\n')
        fh.write('{"path": "../../etc/gpu-01-r0", "bytes": 1, "at": 1}\n')
        fh.write('{"path": "13/gpu-02-r0", "bytes": 1, "at": 1}\n')
        fh.write('{"path": "14/gpu-01-r0", "bytes": -4, "at": 1}\n')
        fh.write('{"path": "15/gpu-01-r0", "bytes": 1, "at": "soon"}\n')
    paths, notes = E.node_bundle_paths(str(tmp_path), "gpu-01")
    assert paths == [kept]
    assert len(notes) == 6 and all("skipped" in n for n in notes)
    assert "not JSON" in notes[0] and "no valid bundle path" in notes[2]
    assert "another node" in notes[3]


def test_a_rewritten_run_keeps_the_older_copy_indexed_for_retention(tmp_path):
    first = write(tmp_path, "20", size=100)
    second = write(tmp_path, "20", size=200)
    assert first == second
    lines = index_lines(tmp_path)
    assert [e["path"].split("/")[1].split(".")[0] for e in lines] == ["gpu-01-r0"] * 3
    older = [e for e in lines if ".old-" in e["path"]]
    assert len(older) == 1 and os.path.isdir(os.path.join(str(tmp_path), older[0]["path"]))
    assert older[0]["bytes"] == lines[0]["bytes"]  # measured on disk: the first bundle's size
    # Listed once (the current copy), counted twice (both take space).
    assert E.node_bundle_paths(str(tmp_path), "gpu-01")[0] == [second]


# ------------------------------------------------------------------------------ retention


def keep(days=None, max_bytes=None, share=None, lock_dir=None) -> E.Retention:
    return E.Retention(days=days, max_bytes=max_bytes, user_share=share, lock_dir=lock_dir)


def test_age_prunes_old_bundles_and_their_empty_job_directories(tmp_path):
    old = write(tmp_path, "1", at=T0)
    other_node = write(tmp_path, "1", node="gpu-02", at=T0)
    mid = write(tmp_path, "2", at=T0 + 20 * DAY)
    removed = E.prune(str(tmp_path), "gpu-01", keep(days=30), now=T0 + 40 * DAY)
    assert removed == ["1/gpu-01-r0"] and gone(old) and os.path.isdir(mid)
    assert os.path.isdir(other_node)  # another node's bundle in the same job directory stays
    assert [e["path"] for e in index_lines(tmp_path)] == ["2/gpu-01-r0"]  # compacted
    E.prune(str(tmp_path), "gpu-01", keep(days=10), now=T0 + 40 * DAY)
    assert gone(mid) and gone(os.path.dirname(mid))  # no bundle left: the job dir goes too


def test_total_size_prunes_oldest_first_through_write_bundle(tmp_path):
    # About 2,000 bytes each with the summary (every key of EvidenceSummary): three fit.
    limit = keep(max_bytes=3 * 2300, lock_dir=str(tmp_path / "state"))
    paths = [write(tmp_path, str(j), at=T0 + j, size=1000, retention=limit) for j in range(1, 6)]
    alive = [p for p in paths if os.path.isdir(p)]
    assert alive == paths[-3:]
    assert os.path.isfile(tmp_path / "state" / "locks" / E.LOCK)
    assert sum(e["bytes"] for e in index_lines(tmp_path)) <= 3 * 2300


def test_the_bundle_just_written_stays_even_when_alone_over_the_limit(tmp_path):
    limit = keep(max_bytes=10, share=0.5, lock_dir=str(tmp_path / "state"))
    older = write(tmp_path, "1", at=T0, retention=limit)
    newest = write(tmp_path, "2", at=T0 + 1, retention=limit)
    assert gone(older) and os.path.isdir(newest)  # a drain reason may name it


def test_one_users_share_cannot_push_out_other_users_evidence(tmp_path):
    bob = write(tmp_path, "1", user="bob", at=T0)
    alice = [write(tmp_path, str(j), user="alice", at=T0 + j) for j in range(2, 8)]
    # 10 bundles' room on the node, one user 40% of it: alice keeps her 4 newest, bob his one.
    size = max(e["bytes"] for e in index_lines(tmp_path))  # about the same for each
    E.prune(str(tmp_path), "gpu-01", keep(max_bytes=10 * size, share=0.4), now=T0 + 10)
    assert os.path.isdir(bob)
    assert [os.path.isdir(p) for p in alice] == [False, False, True, True, True, True]


def test_total_limit_still_applies_across_users(tmp_path):
    paths = [write(tmp_path, str(j), user=f"u{j}", at=T0 + j) for j in range(1, 5)]
    size = max(e["bytes"] for e in index_lines(tmp_path))
    E.prune(str(tmp_path), "gpu-01", keep(max_bytes=2 * size, share=1.0), now=T0 + 9)
    assert [os.path.isdir(p) for p in paths] == [False, False, True, True]


def test_busy_lock_indexes_but_leaves_pruning_to_the_next_run(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    limit = keep(max_bytes=1, lock_dir=str(state)).replace(lock_wait_s=0.1)
    old = write(tmp_path, "1", at=T0)
    lock = lock_file(str(state), E.LOCK)
    with held(lock):  # another process (an epilog on this node pruning) holds it
        new = write(tmp_path, "2", at=T0 + 1, retention=limit)
    assert os.path.isdir(old) and os.path.isdir(new)
    assert [e["path"] for e in index_lines(tmp_path)] == ["1/gpu-01-r0", "2/gpu-01-r0"]
    write(tmp_path, "3", at=T0 + 2, retention=limit)
    assert gone(old) and gone(new)


def test_a_failing_prune_never_fails_the_written_bundle(tmp_path, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    path = write(tmp_path, "1", retention=keep(max_bytes=1, lock_dir=str(blocker)))
    assert os.path.isdir(path)
    assert "written, but indexing or pruning failed" in capsys.readouterr().err


def test_retention_comes_from_the_config_with_documented_defaults(tmp_path):
    config = site(tmp_path, f"state_dir: {tmp_path}\n")
    r = E.retention_for(config)
    assert (r.days, r.max_bytes, r.user_share, r.lock_dir) == (90, 1024 << 20, 0.25, str(tmp_path))
    off = E.retention_for(
        site(tmp_path, "epilog: {retention_days: null, evidence_max_mib: null}\n")
    )
    assert off.days is None and off.max_bytes is None
    with pytest.raises(ConfigError, match=r"epilog.evidence_user_share: must be at most 1"):
        site(tmp_path, "epilog: {evidence_user_share: 1.5}\n")


# ------------------------------------------------------------------------------ removal


def test_remove_tree_never_follows_a_users_symlink(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("root's")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    os.symlink(precious, tree / "sub" / "link")
    os.symlink(precious / "keep.txt", tree / "file-link")
    assert fstree.remove_tree(str(tree)) and gone(str(tree))
    assert (precious / "keep.txt").read_text() == "root's"
    os.symlink(precious, tmp_path / "top-link")
    assert fstree.remove_tree(str(tmp_path / "top-link"))  # the link goes, not its target
    assert (precious / "keep.txt").exists()


def test_the_newest_hardware_bundle_outlives_the_limits(tmp_path):
    files = {"kernel.log": "Xid 79"}
    hw = E.write_bundle(str(tmp_path), "1", "gpu-01", 0, files, {"hardware_fault": True}, now=T0)
    later = [write(tmp_path, str(j), at=T0 + j) for j in range(2, 5)]
    removed = E.prune(str(tmp_path), "gpu-01", keep(days=1, max_bytes=1), now=T0 + 9 * DAY)
    assert os.path.isdir(hw)  # a standing drain reason names it
    assert sorted(removed) == ["2/gpu-01-r0", "3/gpu-01-r0", "4/gpu-01-r0"]
    assert all(gone(p) for p in later)

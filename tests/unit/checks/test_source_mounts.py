"""The mounts source: mountinfo parsing, the write+fsync probe, and a probe that hangs."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import paths
import pytest
from factories import default_config

from gpugate.checks.facts import facts_from_dict
from gpugate.checks.sources import mounts as m
from gpugate.config.schema import RequiredMount

FIXTURES = paths.FIXTURES
SELFTEST = "gpugate.child:selftest"  # a test-only child task: sleep, exit, fail, list fds


def mountinfo_line(path: str, options: str = "rw,relatime", fstype: str = "nfs4",
                   super_options: str = "rw,vers=4.2,hard") -> str:  # fmt: skip
    escaped = path.replace("\\", "\\134").replace(" ", "\\040")
    return f"95 28 0:52 / {escaped} {options} shared:200 - {fstype} srv:/export {super_options}"


def config(tmp_path: Path, paths: list[str], lines: list[str], timeout: float = 3.0):
    """Packaged defaults with `paths` required and a mountinfo of `lines` under tmp_path."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    root = "28 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro"
    (proc / "self" / "mountinfo").write_text("\n".join([root, *lines]) + "\n")
    cfg = default_config()
    sources = cfg.sources.replace(
        proc_root=str(proc),
        required_mounts=[RequiredMount(path=p, fsync_ms_max=500.0) for p in paths],
        timeout_s=cfg.sources.timeout_s.replace(mounts=timeout),
    )
    return cfg.replace(sources=sources)


def mounts_of(cfg, **kwargs) -> list[dict]:
    data = m.read_mounts(cfg, **kwargs)
    facts_from_dict(data)  # the snapshot contract accepts it
    return data["mounts"]


@pytest.fixture
def share(tmp_path: Path) -> Path:
    d = tmp_path / "check points"  # a space, escaped as \040 in mountinfo
    d.mkdir()
    return d


def test_parse_mountinfo_fixture():
    table = m.parse_mountinfo((FIXTURES / "proc-h100" / "self" / "mountinfo").read_text())
    assert table["/datasets"]["fstype"] == "lustre"
    assert table["/datasets"]["source"] == "10.0.0.7@o2ib:/fs1"
    assert "/scratch space" in table  # \040 unescaped
    # Mounted over: the later line for /checkpoints is the one in effect.
    assert table["/checkpoints"]["source"] == "10.0.0.6:/export/ckpt2"
    assert table["/"]["super_options"] == ["rw", "errors=remount-ro"]


def test_mount_status_from_the_fixture():
    table = m.parse_mountinfo((FIXTURES / "proc-h100" / "self" / "mountinfo").read_text())
    ckpt = m.mount_status("/checkpoints/", table)
    assert ckpt["path"] == "/checkpoints/"  # as configured: the checks match on it
    assert (ckpt["mounted"], ckpt["writable"]) == (True, None)  # rw: to be probed
    assert m.mount_status("/datasets", table)["error"] == "mounted read-only"
    # ext4 remounted read-only after an error: the mount says rw, the superblock says ro.
    local = m.mount_status("/local", table)
    assert (local["mounted"], local["writable"], local["fstype"]) == (True, False, "ext4")
    sub = m.mount_status("/checkpoints/job1", table)
    assert sub["mounted"] is False
    assert sub["error"] == "not a mount point, on /checkpoints (nfs4)"


def test_writable_mount_is_probed(share):
    cfg = config(share.parent, [str(share)], [mountinfo_line(str(share))])
    (found,) = mounts_of(cfg)
    assert found["path"] == str(share)
    assert (found["mounted"], found["writable"], found["fstype"]) == (True, True, "nfs4")
    assert found["error"] is None
    assert 0 < found["fsync_ms"] < 3000
    assert list(share.iterdir()) == []  # the probe file is gone


def test_read_only_mount_is_not_probed(share):
    cfg = config(share.parent, [str(share)], [mountinfo_line(str(share), options="ro,relatime")])
    (found,) = mounts_of(cfg, probe=m.probe_task)
    assert (found["mounted"], found["writable"], found["fsync_ms"]) == (True, False, None)
    assert found["error"] == "mounted read-only"
    assert list(share.iterdir()) == []
    assert list(share.iterdir()) == []


def test_path_not_mounted(share):
    cfg = config(share.parent, [str(share)], [])
    (found,) = mounts_of(cfg)
    assert (found["mounted"], found["writable"], found["fsync_ms"]) == (False, None, None)
    assert found["error"] == "not a mount point, on / (ext4)"
    assert list(share.iterdir()) == []  # never write into the directory under a missing mount


def test_failing_probe(share):
    def probe(path: str) -> tuple[str, dict]:
        return SELFTEST, {"action": "oserror", "errno": errno.EROFS, "path": path}

    cfg = config(share.parent, [str(share)], [mountinfo_line(str(share))])
    (found,) = mounts_of(cfg, probe=probe)
    assert (found["writable"], found["fsync_ms"]) == (False, None)
    assert found["error"] == "probe failed: Read-only file system"


def test_hanging_probe_times_out_in_time(share, tmp_path):
    other = tmp_path / "fast"
    other.mkdir()
    lines = [mountinfo_line(str(share)), mountinfo_line(str(other))]
    cfg = config(tmp_path, [str(share), str(other)], lines, timeout=1.0)

    def probe(path: str) -> tuple[str, dict]:
        if "check points" in path:  # stands in for a write stuck on a dead NFS server
            return SELFTEST, {"action": "sleep", "seconds": 60}
        return m.probe_task(path)

    started = time.monotonic()
    hung, fast = mounts_of(cfg, probe=probe)
    took = time.monotonic() - started
    assert took < 1.5  # 0.8 s probe limit, well inside the 1 s source timeout
    assert (hung["mounted"], hung["writable"], hung["fsync_ms"]) == (True, False, None)
    assert hung["error"] == "probe timed out after 0.8 s"
    assert fast["writable"] is True and fast["fsync_ms"] is not None  # probed alongside


def test_probe_that_dies_without_a_result(share):
    cfg = config(share.parent, [str(share)], [mountinfo_line(str(share))])
    (found,) = mounts_of(cfg, probe=lambda path: (SELFTEST, {"action": "exit"}))
    assert found["error"] == "probe process exited without a result"


def test_probes_never_fork_this_process(share, tmp_path, monkeypatch):
    # The gatherer runs this source in a thread: fork() there can deadlock the child (Python
    # 3.12 warns). The probes are fresh interpreters started by subprocess instead.
    def no_fork() -> int:
        raise AssertionError("os.fork() called from a threaded process")

    monkeypatch.setattr(os, "fork", no_fork)
    cfg = config(tmp_path, [str(share)], [mountinfo_line(str(share))])
    result: list = []
    worker = threading.Thread(target=lambda: result.append(mounts_of(cfg)))
    worker.start()
    worker.join(10)
    ((found,),) = result
    assert (found["writable"], found["error"]) == (True, None)
    assert found["fsync_ms"] >= 0
    assert list(share.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_probe_child_holds_none_of_the_parent_descriptors(share):
    # A child stuck in the kernel must not keep slurmd's pipes (or ours) open.
    from gpugate import child

    keep_r, keep_w = os.pipe()
    os.set_inheritable(keep_w, True)  # even one marked inheritable stays behind
    try:
        c = child.start(SELFTEST, {"action": "fds"}, 5)
        child.wait([c], time.monotonic() + 5, 4096)
        fds = child.answer(c)
    finally:
        os.close(keep_r)
        os.close(keep_w)
    # stdin, stdout, stderr (/dev/null) and the listing's own descriptor: nothing else.
    assert fds == ["0", "1", "2", "3"]


def test_a_probe_that_cannot_start_is_reported(share, monkeypatch):
    monkeypatch.setattr("sys.executable", "/nonexistent/python3")
    cfg = config(share.parent, [str(share)], [mountinfo_line(str(share))])
    (found,) = mounts_of(cfg)
    assert found["writable"] is False
    assert found["error"].startswith("cannot start probe: cannot start a child:")


def test_parse_mountinfo_skips_what_is_not_a_mount_line():
    text = "\ngarbage\n36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw\n"
    assert list(m.parse_mountinfo(text)) == ["/mnt2"]


def test_write_probe_refuses_an_existing_file_or_symlink(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    link = tmp_path / ".probe"
    link.symlink_to(target)
    with pytest.raises(FileExistsError):
        m.write_probe(str(link))
    assert target.read_text() == "keep"


def test_write_probe_leaves_nothing(tmp_path):
    m.write_probe(str(tmp_path / ".probe"))
    assert list(tmp_path.iterdir()) == []


def test_no_required_mounts_reads_nothing(tmp_path):
    cfg = config(tmp_path, [], [])
    os.unlink(tmp_path / "proc" / "self" / "mountinfo")
    assert m.read_mounts(cfg) == {"mounts": []}


def test_unreadable_mountinfo_is_a_source_error(tmp_path):
    cfg = config(tmp_path, ["/checkpoints"], [])
    os.unlink(tmp_path / "proc" / "self" / "mountinfo")
    with pytest.raises(OSError, match="mountinfo"):
        m.read_mounts(cfg)

"""Reading users' files as root: no symlinks, no FIFOs, capped, as the user, with a timeout."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import subprocess
import sys
import time

import paths
import pytest

from gpugate.userfiles import UserFileError, as_user, read_tail


def test_tail_of_a_regular_file(tmp_path):
    f = tmp_path / "out.log"
    f.write_bytes(b"x" * 1000 + b"THE END\n")
    assert read_tail(str(f), 8) == b"THE END\n"


def test_symlink_is_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root only")
    link = tmp_path / "out.log"
    link.symlink_to(secret)
    with pytest.raises(UserFileError, match="symlink"):
        read_tail(str(link), 100)


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "out.log"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(UserFileError, match="not a regular file"):
        read_tail(str(fifo), 100)
    assert time.monotonic() - started < 1


def test_vanished_file_is_a_clear_error(tmp_path):
    with pytest.raises(UserFileError, match="No such file"):
        read_tail(str(tmp_path / "gone.log"), 100)


SELFTEST = "gpugate.child:selftest"  # a test-only child task: sleep, exit, fds, ids
READER = "gpugate.hooks.collect:_read_and_diagnose"
ME = (os.getuid(), os.getgid())


def test_child_result_comes_back(tmp_path):
    f = tmp_path / "out.log"
    f.write_text("hello\n")
    kwargs = {"files": [str(f)], "kernel_text": "", "cap": 100, "max_files": 4}
    got = as_user(*ME, READER, kwargs, 5)
    assert got["tails"] == {str(f): "hello\n"}
    assert as_user(*ME, SELFTEST, {"action": "ids"}, 5)["uid"] == os.getuid()


def test_child_that_hangs_is_killed(tmp_path):
    started = time.monotonic()
    with pytest.raises(UserFileError, match=r"timed out after 0\.5 s"):
        as_user(*ME, SELFTEST, {"action": "sleep", "seconds": 30}, 0.5)
    assert time.monotonic() - started < 3
    # Killed, not left behind: the parent gives the SIGKILL 50 ms to land (a hook never blocks
    # on a child stuck in the kernel), and on a loaded machine the kernel may take longer to
    # end a process still starting up; within a few seconds it is gone, not sleeping its 30 s.
    assert _wait_for(lambda: _children_of(os.getpid()) == [], 5)


def test_the_reader_never_forks_this_process(tmp_path, monkeypatch):
    # The epilog runs threads; fork() there can deadlock the child (Python 3.12 warns).
    def no_fork() -> int:
        raise AssertionError("os.fork() called")

    monkeypatch.setattr(os, "fork", no_fork)
    assert as_user(*ME, SELFTEST, {"action": "ids"}, 5)["gid"] == os.getgid()


def test_only_allow_listed_tasks_run():
    with pytest.raises(UserFileError, match="not a task a gpugate child runs"):
        as_user(*ME, "os:system", {"command": "true"}, 5)


def test_the_answer_is_capped():
    with pytest.raises(UserFileError, match="larger than 1000 bytes"):
        as_user(*ME, SELFTEST, {"action": "flood", "seconds": 100_000}, 5, max_bytes=1000)


def test_a_child_that_dies_says_so():
    with pytest.raises(UserFileError, match=r"died without an answer \(exit 3\)"):
        as_user(*ME, SELFTEST, {"action": "exit"}, 5)


def test_a_child_error_comes_back_as_the_error():
    with pytest.raises(UserFileError, match=r"PermissionError: .*Permission denied: '/x'"):
        as_user(*ME, SELFTEST, {"action": "oserror", "errno": errno.EACCES, "path": "/x"}, 5)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_the_reader_holds_none_of_our_descriptors():
    # slurmd waits for EOF on the hook's stdout/stderr: a reader that kept them would leave it
    # waiting after the epilog ended (and Slurm drains the node as "Epilog error").
    keep_r, keep_w = os.pipe()
    os.set_inheritable(keep_w, True)
    try:
        fds = as_user(*ME, SELFTEST, {"action": "fds"}, 5)
    finally:
        os.close(keep_r)
        os.close(keep_w)
    assert fds == ["0", "1", "2", "3"]  # our two pipes, /dev/null, the listing itself


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_the_reader_dies_with_its_parent(tmp_path):
    # A parent (an epilog) that starts a reader which hangs, then is killed (slurmd's
    # EpilogTimeout): the reader must not outlive it.
    code = (
        "from gpugate.userfiles import as_user\n"
        f"as_user({os.getuid()}, {os.getgid()}, {SELFTEST!r}, "
        "{'action': 'sleep', 'seconds': 60}, 60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        reader = _wait_for(lambda: _children_of(parent.pid, exec_of="gpugate.child"), 10)
        assert reader, "the reader never started"
        time.sleep(0.3)  # past its prctl
        parent.kill()
        parent.wait(5)
        gone = _wait_for(lambda: all(not _alive(pid) for pid in reader), 2)
        assert gone, f"reader {reader} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_child_left_alone_ends_on_its_own_alarm():
    # The backstop when no kill comes (the parent stuck, or its kill lost): SIGALRM at the
    # request's timeout plus 2 s.
    import signal

    from gpugate import child

    c = child.start(SELFTEST, {"action": "sleep", "seconds": 60}, 0.1)
    os.write(c.stdin_fd, c.pending)  # the request, then nobody reads the answer
    os.close(c.stdin_fd)
    c.stdin_fd = None
    try:
        assert c.proc.wait(10) == -signal.SIGALRM
    finally:
        os.close(c.stdout_fd)
        if c.proc.poll() is None:
            c.proc.kill()


def test_a_non_root_reader_refuses_another_users_files(monkeypatch):
    # EpilogSlurmctld runs as the SlurmUser: it cannot become the job's user, and must not
    # read the user's files with its own rights instead.
    monkeypatch.setattr(os, "geteuid", lambda: 990)
    with pytest.raises(
        UserFileError, match="running as uid 990, not root: cannot read as user 1234; not reading"
    ):
        as_user(1234, 1234, SELFTEST, {"action": "ids"}, 5)


def test_a_non_root_reader_reads_its_own_users_files(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid())
    assert as_user(*ME, SELFTEST, {"action": "ids"}, 5)["uid"] == os.getuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as nobody")
def test_a_real_non_root_process_refuses(installed):
    python, lib = installed
    code = (
        f"import sys; sys.path.insert(0, {lib!r})\n"
        "from gpugate.userfiles import UserFileError, as_user\n"
        "try:\n"
        f"    as_user(0, 0, {SELFTEST!r}, {{'action': 'ids'}}, 5)\n"
        "except UserFileError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([python, "-Es", "-c", code], user=NOBODY, group=NOBODY,
                         extra_groups=[], capture_output=True, text=True, timeout=30, cwd="/")  # fmt: skip
    assert out.stdout.strip() == (
        f"running as uid {NOBODY}, not root: cannot read as user 0; not reading"
    ), out.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")
def test_root_reads_only_what_the_user_could(installed):
    import shutil
    import tempfile

    # pytest's own tmp dirs are 0700: the user could not even reach them.
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="gpugate-userfiles-"))
    try:
        _check_drop(tmp_path, *installed)
    finally:
        shutil.rmtree(tmp_path)


def _check_drop(tmp_path, python, lib):
    private = tmp_path / "root-only.log"
    private.write_text("secret")
    os.chmod(private, 0o600)
    os.chmod(tmp_path, 0o755)
    public = tmp_path / "public.log"
    public.write_text("ok")
    os.chmod(public, 0o644)
    # The parent runs as root with the installed layout (an interpreter nobody may run).
    code = (
        f"import json, sys; sys.path.insert(0, {lib!r})\n"
        "from gpugate.userfiles import as_user\n"
        f"ids = as_user({NOBODY}, {NOBODY}, {SELFTEST!r}, {{'action': 'ids'}}, 10)\n"
        f"kw = {{'files': [{str(private)!r}, {str(public)!r}], 'kernel_text': '', 'cap': 100,"
        " 'max_files': 4}\n"
        f"got = as_user({NOBODY}, {NOBODY}, {READER!r}, kw, 20)\n"
        "print(json.dumps({'ids': ids, 'tails': got['tails'], 'errors': got['errors']}))\n"
    )
    out = subprocess.run([python, "-Es", "-c", code], capture_output=True, text=True,
                         timeout=60, cwd="/")  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["ids"] == {"uid": NOBODY, "gid": NOBODY, "groups": _groups_of_nobody()}
    assert got["tails"] == {str(public): "ok"}
    assert any("Permission denied" in e for e in got["errors"])


def test_the_child_imports_gpugate_as_its_parent_did(installed):
    # The RPM's launcher runs `python3 -Es` and puts its lib first on sys.path by hand; -E
    # ignores PYTHONPATH, so the child is given the parent's path, and runs without `site`.
    python, lib = installed
    code = (
        f"import sys; sys.path.insert(0, {lib!r})\n"
        "from gpugate import child\n"
        "print(child.command()[1:3])\n"
        f"print(child.call({SELFTEST!r}, {{'action': 'ids'}}, 10, 4096)['uid'])\n"
        "import json; print(json.dumps(child.call('gpugate.child:selftest', {'action': 'fds'},"
        " 10, 4096)))\n"
    )
    out = subprocess.run([python, "-Es", "-c", code], capture_output=True, text=True,
                         timeout=60, cwd="/")  # fmt: skip
    assert out.returncode == 0, out.stderr
    flags, uid, _fds = out.stdout.splitlines()
    assert flags == "['-I', '-S']" and uid == str(os.getuid())


def test_unknown_user_is_refused():
    with pytest.raises(UserFileError, match="unknown"):
        as_user(None, None, SELFTEST, {"action": "ids"}, 1)


def test_latest_checkpoint_task(tmp_path):
    import zipfile

    ckpt = tmp_path / "ckpt_100.pt"
    with zipfile.ZipFile(ckpt, "w") as z:
        z.writestr("archive/data.pkl", b"x")
    task = "gpugate.checkpoints.discover:latest_checkpoint_path"
    assert as_user(*ME, task, {"ckpt_dir": str(tmp_path)}, 10) == str(ckpt)


# ---- helpers --------------------------------------------------------------------------

NOBODY = 65534


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, lib): gpugate laid out as the RPM installs it, in a directory nobody can read.

    The test's own interpreter may sit where nobody may run it (a pyenv under /root), and the
    development install maps folders with a finder only `site` knows: the RPM's layout and the
    system python3 are what the nodes run.
    """
    import shutil
    import tempfile

    python = _reachable_python()
    if python is None:
        pytest.skip("no python3 that nobody may run")
    root = pathlib.Path(tempfile.mkdtemp(prefix="gpugate-lib-"))
    os.chmod(root, 0o755)
    repo = paths.ROOT
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    # The symlinks to config/ and slurm_hooks/ are copied as the files they name (a wheel's way).
    shutil.copytree(repo / "gpugate", root / "gpugate", ignore=ignore)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    yield python, str(root)
    shutil.rmtree(root)


def _reachable_python() -> str | None:
    """A python3 >= 3.9 that nobody may run (any python3 when we are not root)."""
    if os.geteuid() != 0:
        return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    # The system python3 first: with the copied layout it is what the RPM's launcher runs.
    for python in ("/usr/bin/python3", sys.executable):
        try:
            out = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 9))"],
                                 user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True,
                                 text=True, timeout=30, cwd="/")  # fmt: skip
        except OSError:
            continue
        if out.stdout.strip() == "True":
            return python
    return None


def _groups_of_nobody() -> list[int]:
    import pwd

    entry = pwd.getpwuid(NOBODY)
    return sorted(set(os.getgrouplist(entry.pw_name, NOBODY)))


def _children_of(ppid: int, exec_of: str = "") -> list[int]:
    """Live children of `ppid` (from /proc), optionally only those whose argv holds `exec_of`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat_line = fh.read()
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat_line.rsplit(")", 1)[1].split()
        if int(fields[1]) == ppid and fields[0] != "Z" and exec_of in cmdline:
            found.append(int(name))
    return found


def _alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an unreaped corpse is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(predicate, seconds: float):
    deadline = time.monotonic() + seconds
    while True:
        got = predicate()
        if got or time.monotonic() >= deadline:
            return got
        time.sleep(0.02)


def test_a_huge_file_costs_only_its_tail(tmp_path):
    huge = tmp_path / "out.log"
    with open(huge, "wb") as fh:
        fh.truncate(50 << 30)  # 50 GiB, sparse: a runaway job's stdout
        fh.seek((50 << 30) - 9)
        fh.write(b"last line")
    started = time.monotonic()
    assert read_tail(str(huge), 9) == b"last line"
    assert len(read_tail(str(huge), 1 << 20)) == 1 << 20
    assert time.monotonic() - started < 2


def test_a_directory_in_place_of_a_log_is_refused(tmp_path):
    with pytest.raises(UserFileError, match="not a regular file"):
        read_tail(str(tmp_path), 100)

"""Reading users' files as root: no symlinks, no FIFOs, capped, as the user, with a timeout."""

from __future__ import annotations

import os
import time

import pytest
from gpugate.slurm_hooks.userfiles import UserFileError, as_user, read_tail


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


def test_child_result_comes_back(tmp_path):
    f = tmp_path / "out.log"
    f.write_text("hello\n")
    got = as_user(os.getuid(), os.getgid(), lambda: read_tail(str(f), 100).decode(), 5)
    assert got == "hello\n"


def test_child_that_hangs_is_killed(tmp_path):
    started = time.monotonic()
    with pytest.raises(UserFileError, match="timed out"):
        as_user(os.getuid(), os.getgid(), lambda: time.sleep(30), 0.5)
    assert time.monotonic() - started < 3


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")
def test_root_reads_only_what_the_user_could():
    import pathlib
    import shutil
    import tempfile

    # pytest's own tmp dirs are 0700: the user could not even reach them.
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="gpugate-userfiles-"))
    try:
        _check_drop(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _check_drop(tmp_path):
    private = tmp_path / "root-only.log"
    private.write_text("secret")
    os.chmod(private, 0o600)
    os.chmod(tmp_path, 0o755)
    with pytest.raises(UserFileError, match="Permission denied"):
        as_user(65534, 65534, lambda: read_tail(str(private), 100).decode(), 5)
    public = tmp_path / "public.log"
    public.write_text("ok")
    os.chmod(public, 0o644)
    assert as_user(65534, 65534, lambda: read_tail(str(public), 100).decode(), 5) == "ok"


def test_unknown_user_is_refused():
    with pytest.raises(UserFileError, match="unknown"):
        as_user(None, None, lambda: 1, 1)


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

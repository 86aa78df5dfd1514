"""Removing a user's tree as root: any depth, never through a symlink, bounded by a deadline."""

from __future__ import annotations

import os
import stat
import sys

import pytest
from deep_trees import deep_chain

from gpugate import fstree

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chowns files to another user")


def outside(tmp_path):
    """Files and a directory of someone else's, outside the tree, that must survive."""
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "file").write_text("not yours")
    (keep / "dir").mkdir()
    (keep / "dir" / "inner").write_text("not yours either")
    return keep


def test_a_tree_deeper_than_the_recursion_limit_is_removed(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    deep_chain(tree, sys.getrecursionlimit() + 200)
    assert fstree.remove_tree(str(tree)) is True
    assert not os.path.lexists(tree) and os.listdir(tmp_path) == []


def test_links_are_removed_as_names_and_their_targets_survive(tmp_path):
    keep = outside(tmp_path)
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    os.symlink(keep / "file", tree / "file-link")
    os.symlink(keep / "dir", tree / "a" / "dir-link")
    os.symlink(keep, tree / "a" / "b" / "top-link")
    os.symlink("/etc", tree / "a" / "etc")
    os.symlink("dangling-target", tree / "dangling")
    os.link(keep / "file", tree / "a" / "hardlink")  # a second name: only that name goes
    assert fstree.remove_tree(str(tree)) is True and not os.path.lexists(tree)
    assert (keep / "file").read_text() == "not yours"
    assert (keep / "dir" / "inner").read_text() == "not yours either"
    assert os.path.isdir("/etc")


def test_a_symlink_at_the_top_is_unlinked_not_followed(tmp_path):
    keep = outside(tmp_path)
    os.symlink(keep, tmp_path / "link")
    assert fstree.remove_tree(str(tmp_path / "link")) is True
    assert not os.path.lexists(tmp_path / "link") and (keep / "file").exists()


def test_a_fifo_socket_and_empty_dirs_go_without_blocking(tmp_path):
    import socket

    tree = tmp_path / "tree"
    (tree / "empty" / "emptier").mkdir(parents=True)
    os.mkfifo(tree / "fifo")  # opening it would block: it must only ever be unlinked
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tree / "sock"))
    finally:
        s.close()
    assert fstree.remove_tree(str(tree)) is True and not os.path.lexists(tree)


@as_root
def test_files_and_directories_of_another_user_and_closed_modes_go(tmp_path):
    tree = tmp_path / "tree"
    (tree / "theirs" / "closed").mkdir(parents=True)
    for i in range(5):
        (tree / "theirs" / "closed" / f"f{i}").write_text("x")
    os.mkfifo(tree / "theirs" / "fifo")
    for path in (tree, tree / "theirs", tree / "theirs" / "closed", tree / "theirs" / "fifo"):
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    os.chmod(tree / "theirs" / "closed", 0)  # root removes it all the same
    os.chmod(tree / "theirs", stat.S_ISVTX | 0o777)
    assert fstree.remove_tree(str(tree)) is True and not os.path.lexists(tree)


def test_many_files_in_one_directory(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(5000):
            os.close(os.open(f"f{i}", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
            if i % 1000 == 0:
                os.mkdir(f"d{i}", dir_fd=fd)
    finally:
        os.close(fd)
    assert fstree.remove_tree(str(tree)) is True and not os.path.lexists(tree)


def test_a_passed_deadline_stops_the_walk_and_a_later_call_finishes_it(tmp_path):
    import time

    tree = tmp_path / "tree"
    tree.mkdir()
    deep_chain(tree, 50)
    for i in range(2000):
        (tree / f"f{i}").write_text("")
    assert fstree.remove_tree(str(tree), deadline=time.monotonic() - 1) is False
    assert tree.is_dir()  # left for later, nothing half-followed
    assert fstree.remove_tree(str(tree)) is True and not os.path.lexists(tree)


def test_remove_at_works_in_an_open_directory(tmp_path):
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "file").write_text("")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert fstree.remove_at(fd, "x") is True
        assert fstree.remove_at(fd, "file") is True
        assert fstree.remove_at(fd, "never-there") is True
    finally:
        os.close(fd)
    assert os.listdir(tmp_path) == []


def test_a_directory_moved_out_of_the_tree_mid_walk_stops_the_walk(tmp_path, monkeypatch):
    """The walk climbs back through "..": if a user moved the directory it is in elsewhere,
    ".." is no longer the directory it came down from, and nothing more is removed."""
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim").write_text("must survive")
    real_open = os.open
    moved = []

    def open_and_move(path, flags, mode=0o777, *, dir_fd=None):
        if path == ".." and not moved:  # on its way up from b: a user moves a away first
            os.rename(tree / "a", elsewhere / "a")
            moved.append(True)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(fstree.os, "open", open_and_move)
    assert fstree.remove_tree(str(tree)) is False
    monkeypatch.undo()
    assert moved and (elsewhere / "victim").read_text() == "must survive"
    assert (elsewhere / "a").is_dir()  # the walk stopped where ".." changed
    assert sorted(os.listdir(elsewhere)) == ["a", "victim"]

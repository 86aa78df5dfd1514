"""Every build's own version (packaging/version.sh): from git, sorting upward with commits.

The packages (.deb, .rpm), the wheel's metadata and `gpugate --version` carry the same one
(stage.sh writes it into the wheel's copy; test_deb.py and test_rpm.py check the packages).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile

import pytest
from versions import REPO, VERSION_RE, build_version


def git(*args: str) -> str:
    """A git command in this checkout, its output."""
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()  # fmt: skip


@pytest.fixture
def checkout():
    """Skip where this is no git checkout (a tarball, .ci/second-slurm's copy)."""
    if shutil.which("git") is None or not os.path.exists(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout")


def test_the_version_names_this_commit(checkout, monkeypatch):
    monkeypatch.delenv("GPUGATE_VERSION", raising=False)
    version = build_version()
    assert re.fullmatch(VERSION_RE, version), version
    count = git("rev-list", "--count", "HEAD")
    head = git("rev-parse", "HEAD")
    base, _, local = version.partition("+git")
    assert local.split(".")[0] == count
    assert head.startswith(local.split(".")[2])
    with open(os.path.join(REPO, "pyproject.toml")) as fh:
        assert f'version = "{base}"' in fh.read()


def test_later_commits_sort_higher_for_dpkg():
    if shutil.which("dpkg") is None:
        pytest.skip("no dpkg")
    older, newer = "0.1.0+git99.20261231.abcdef1", "0.1.0+git100.20261201.1234567"
    for low, high in ((older, newer), ("0.1.0", older), (older, older + ".dirty")):
        done = subprocess.run(["dpkg", "--compare-versions", low, "lt", high], timeout=60)
        assert done.returncode == 0, (low, high)


def test_without_git_the_plain_version_or_gpugate_version(tmp_path):
    """A tarball: GPUGATE_VERSION when set, else the plain version, said on stderr."""
    tar = tmp_path / "src.tar"
    with tarfile.open(tar, "w") as archive:
        for name in ("pyproject.toml", "packaging/version.sh"):
            archive.add(os.path.join(REPO, name), arcname=name)
    with tarfile.open(tar) as archive:
        archive.extractall(tmp_path / "src", filter="tar")
    script = str(tmp_path / "src" / "packaging" / "version.sh")
    done = subprocess.run([script], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"]})  # fmt: skip
    assert done.returncode == 0 and done.stdout == "0.1.0\n", done
    assert "no git checkout" in done.stderr and "GPUGATE_VERSION" in done.stderr
    assert build_version({"GPUGATE_VERSION": "0.1.0+git7.20261201.abcdef1"}, script) == (
        "0.1.0+git7.20261201.abcdef1"
    )


def test_gpugate_version_from_a_checkout_names_the_commit(capsys):
    """No build stamped this tree: --version says the commit's version, as version.sh does."""
    from gpugate.cli import main

    assert main(["--version"]) == 0
    said = capsys.readouterr().out.strip()
    assert said == f"gpugate {build_version()}"
    if os.path.isdir(os.path.join(REPO, ".git")):
        assert "+git" in said  # not the plain pyproject version: this commit's own

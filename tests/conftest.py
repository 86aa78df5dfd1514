"""Shared pytest setup: nothing a test runs reads or writes the host's own gpugate.

The host may have gpugate installed and configured (issue 26): its parsed-YAML cache
(/var/cache/gpugate), its site file (/etc/gpugate/gpugate.yaml) and the state directory a hook
with a broken config logs to (/var/lib/gpugate) are replaced by the test run's own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    import gpugate.config
    from gpugate.gate.guard import FALLBACK_ENV

    os.environ["GPUGATE_CACHE_DIR"] = str(tmp_path_factory.mktemp("yamlcache"))
    os.environ[FALLBACK_ENV] = str(tmp_path_factory.mktemp("fallback-state"))
    os.environ.pop("GPUGATE_CONFIG", None)
    # No --config and no GPUGATE_CONFIG means the packaged defaults, never the host's site file.
    site_file = gpugate.config.DEFAULT_SITE_FILE
    gpugate.config.DEFAULT_SITE_FILE = str(tmp_path_factory.mktemp("no-site") / "gpugate.yaml")
    yield
    gpugate.config.DEFAULT_SITE_FILE = site_file


@pytest.fixture(autouse=True)
def qualifications_started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The suspect qualifications a test's hooks asked for, recorded instead of started.

    A flag starts `gpugate qualify` in a detached child (gpugate/gate/suspicion.py): in a unit
    test that child would outlive it and talk to whatever Slurm the host has. The end-to-end
    tests run the hooks in their own processes, where the real child starts.
    """
    from gpugate.gate import suspicion

    calls: list[tuple[str, str]] = []

    def start(config: object, node: str, trigger: str) -> int:
        calls.append((node, trigger))
        return 4242

    monkeypatch.setattr(suspicion, "start_qualification", start)
    return calls


@pytest.fixture
def open_tmp(tmp_path):
    """pytest's tmp dirs are 0700: open them to be traversed, as an install's directories are."""
    for directory in (tmp_path, *tmp_path.parents):
        mode = directory.stat().st_mode
        if not mode & 0o001 and directory.stat().st_uid == os.geteuid():
            directory.chmod((mode & 0o7777) | 0o001)

"""Shared pytest setup: keep the parsed-YAML cache private to the test run."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["GPUGATE_CACHE_DIR"] = str(tmp_path_factory.mktemp("yamlcache"))
    os.environ.pop("GPUGATE_CONFIG", None)


@pytest.fixture(autouse=True)
def qualifications_started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The suspect qualifications a test's hooks asked for, recorded instead of started.

    A flag starts `gpugate qualify` in a detached child (slurm_hooks/suspicion.py): in a unit
    test that child would outlive it and talk to whatever Slurm the host has. The end-to-end
    tests run the hooks in their own processes, where the real child starts.
    """
    from gpugate.slurm_hooks import suspicion

    calls: list[tuple[str, str]] = []

    def start(config: object, node: str, trigger: str) -> int:
        calls.append((node, trigger))
        return 4242

    monkeypatch.setattr(suspicion, "start_qualification", start)
    return calls

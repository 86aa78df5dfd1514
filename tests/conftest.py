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

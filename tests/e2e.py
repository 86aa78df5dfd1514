"""pytest glue for the end-to-end tests against the real local Slurm."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))

from gpugate_site import SNAPSHOTS, Site, gpugate_for_job_user, installed_hooks

__all__ = ["SNAPSHOTS", "Site", "gpugate_for_job_user", "installed_hooks", "slurm_or_skip"]


def slurm_or_skip() -> None:
    """Skip the calling test module unless a real Slurm can be run here (root + apt)."""
    from localslurm import SlurmUnavailable, ensure_available

    try:
        ensure_available()
    except SlurmUnavailable as exc:
        pytest.skip(f"no local Slurm: {exc}", allow_module_level=True)

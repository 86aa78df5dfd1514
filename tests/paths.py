"""Where things are, for the tests: the one place that knows tests/ from the checkout's root.

Test modules sit at different depths (tests/unit/<package>/, tests/e2e/, tests/packaging/);
they name what they read from here rather than count `.parent`s from their own file.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the checkout: gpugate/, config/, docs/, packaging/
SUPPORT = TESTS / "support"  # helpers the test modules import (factories, fakes, harnesses)
FIXTURES = TESTS / "fixtures"  # committed sysfs trees, recorded command output, dumps
SLURM_HARNESS = TESTS / "slurm"  # the local Slurm harness (localslurm.py and its helpers)
DCGMI_STANDIN = TESTS / "dcgmi_standin"  # a stand-in dcgmi replaying recorded runs
NVML_STUB = TESTS / "nvml_stub"  # the C stand-in libnvidia-ml.so.1
CONFIG = ROOT / "config"  # the packaged defaults, alerts and example snapshots
SNAPSHOTS = CONFIG / "snapshots"
DOCS = ROOT / "docs"
SLURM_HOOKS = ROOT / "slurm_hooks"
# ../shared beside the checkout (corpus, captures, reference), resolved as conftest always has.
SHARED = (ROOT.parent / "shared").resolve()

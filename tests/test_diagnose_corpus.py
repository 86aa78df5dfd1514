"""The diagnosis against the labelled development corpus (`../shared/corpus` beside the repo).

The corpus is real logs published by others; it is read in place, never copied into the repo.
Skipped cleanly where the checkout has no `shared/` beside it.
"""

from __future__ import annotations

import csv
import os
import shutil

import pytest

from gpugate.diagnosis import engine as D

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                      "shared", "corpus")  # fmt: skip
# labels.csv: the first 14 logs; labels-2.csv: 96 more (NCCL, timeouts, launchers, Slurm,
# Xid/ECC/NVLink, OOM); labels-3.csv: 22 real logs of other runtimes (Ray, Horovod, JAX,
# sglang, vLLM), same columns and rules (see the corpus README).
LABEL_FILES = ("labels.csv", "labels-2.csv", "labels-3.csv")
ENGINES = ["python"] + (["grep"] if shutil.which("grep") else [])


def load_labels() -> list:
    """One pytest param per labelled log, or a single skip when the corpus is absent."""
    paths = [os.path.join(CORPUS, name) for name in LABEL_FILES]
    if not os.path.exists(paths[0]):
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no corpus at {CORPUS}"))]
    rows = []
    for path in paths:
        if os.path.exists(path):
            with open(path, newline="") as f:
                rows += list(csv.DictReader(f))
    return [pytest.param(row, id=row["file"].split("-", 1)[0]) for row in rows]


def optional_int(text: str) -> int | None:
    """An empty label means null."""
    return int(text) if text.strip() else None


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("row", load_labels())
def test_corpus_label(row, engine):
    path = os.path.join(CORPUS, "logs", row["file"])
    d = D.diagnose([path], engine=engine)
    want = (
        row["expected_category"],
        optional_int(row["expected_xid"]),
        optional_int(row["failing_rank"]),
    )
    got = (d.category, d.xid, d.failing_rank)
    assert got == want, d.to_json()
    if want[0] != "no_failure":
        assert d.evidence

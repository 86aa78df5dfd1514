"""The diagnosis against the repository's own labelled corpus of issue 43 (`corpus/labels-43*.csv`).

Real logs from public sources (cited in each row), kept in the repository. The held-out files
(`corpus/heldout-43*.csv`) are never tested here: they are for scoring (bench/score_corpus.py).
"""

from __future__ import annotations

import csv
import os

import paths
import pytest
from corpus_labels import ENGINES, optional_int

from gpugate.diagnosis import engine as D

CORPUS = str(paths.ROOT / "corpus")
LABEL_FILES = ("labels-43a.csv", "labels-43b.csv", "labels-43c.csv", "labels-43d.csv")
# Labels the diagnosis does not meet yet, each with why; strict, so meeting one fails the test
# and its entry must go.
NOT_YET: dict[str, str] = {}


def load_labels() -> list:
    """One pytest param per labelled log of the repository's corpus."""
    out = []
    for name in LABEL_FILES:
        with open(os.path.join(CORPUS, name), newline="") as f:
            for row in csv.DictReader(f):
                key = row["file"].split("-", 1)[0]
                why = NOT_YET.get(key)
                marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
                out.append(pytest.param(row, id=key, marks=marks))
    return out


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("row", load_labels())
def test_corpus_43_label(row, engine):
    d = D.diagnose([os.path.join(CORPUS, "logs", row["file"])], engine=engine)
    want = (row["expected_category"], optional_int(row["expected_xid"]),
            optional_int(row["failing_rank"]))  # fmt: skip
    assert (d.category, d.xid, d.failing_rank) == want, d.to_json()
    # A verdict on a failure names its line; no_failure and unknown name none.
    assert bool(d.evidence) == (want[0] not in ("no_failure", "unknown"))

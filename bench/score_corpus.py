"""Score the diagnosis on labelled corpora: category, Xid and failing-rank accuracy, with misses.

Reads label files (`file, expected_category, expected_xid, failing_rank, ...`; the logs are in
`logs/` beside each file) and diagnoses each log as `gpugate diagnose LOG` would. Per file it
prints category right/all, Xid right/rows that expect one (and wrong Xids on rows that expect
none), rank right/rows that expect one (and ranks named where none is expected), then each miss.
Held-out files are for scoring only: run them to measure, never to tune signatures.

    python bench/score_corpus.py                 # the shared corpus, corpus/labels-43*, heldout-43*
    python bench/score_corpus.py FILE.csv ...    # those label files
    python bench/score_corpus.py --no-misses ... # figures only
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SHARED = os.path.join(ROOT, "..", "shared", "corpus")


def default_files() -> list[str]:
    """The shared corpus's label files, then the repository's own (labels, then held out)."""
    own = os.path.join(ROOT, "corpus")
    return (sorted(glob.glob(os.path.join(SHARED, "labels*.csv")))
            + sorted(glob.glob(os.path.join(own, "labels-*.csv")))
            + sorted(glob.glob(os.path.join(own, "heldout-*.csv"))))  # fmt: skip


def optional_int(text: str | None) -> int | None:
    """An empty label means null."""
    return int(text) if text and text.strip() else None


def score(path: str, engine: str) -> tuple[dict[str, list[int]], list[str]]:
    """(counts, misses) for one label file: counts name -> [right, of]."""
    from gpugate.diagnosis import engine as D

    logs = os.path.join(os.path.dirname(path), "logs")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    counts = {"category": [0, 0], "xid": [0, 0], "xid_extra": [0, 0],
              "rank": [0, 0], "rank_extra": [0, 0]}  # fmt: skip
    misses = []
    for row in rows:
        d = D.diagnose([os.path.join(logs, row["file"])], engine=engine)
        want_x, want_r = optional_int(row["expected_xid"]), optional_int(row["failing_rank"])
        wrong = []
        counts["category"][1] += 1
        if d.category == row["expected_category"]:
            counts["category"][0] += 1
        else:
            wrong.append(f"category {d.category} (want {row['expected_category']})")
        for name, want, got in (("xid", want_x, d.xid), ("rank", want_r, d.failing_rank)):
            key = name if want is not None else f"{name}_extra"
            counts[key][1] += 1
            if got == want:
                counts[key][0] += 1
            else:
                wrong.append(f"{name} {got} (want {want})")
        if wrong:
            line = d.evidence[0].text[:100] if d.evidence else "-"
            misses.append(f"  {row['file'][:70]}: {'; '.join(wrong)} [{d.confidence}] {line}")
    return counts, misses


def main() -> int:
    """Print the figures of each label file (and the misses)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("files", nargs="*", help="label files (default: all known)")
    ap.add_argument("--no-misses", action="store_true", help="figures only")
    ap.add_argument("--engine", default="python", help="scan engine (python, grep, auto)")
    args = ap.parse_args()
    total = {"category": [0, 0], "xid": [0, 0], "rank": [0, 0]}
    for path in args.files or default_files():
        counts, misses = score(path, args.engine)
        c, x, r = counts["category"], counts["xid"], counts["rank"]
        xe, re_ = counts["xid_extra"], counts["rank_extra"]
        print(f"{os.path.relpath(path, ROOT)}: category {c[0]}/{c[1]} ({100 * c[0] / max(c[1], 1):.0f}%), "
              f"xid {x[0]}/{x[1]} (+{xe[1] - xe[0]} wrong where none), "
              f"rank {r[0]}/{r[1]} (+{re_[1] - re_[0]} named where none)")  # fmt: skip
        for k in total:
            total[k][0] += counts[k][0]
            total[k][1] += counts[k][1]
        if not args.no_misses:
            print("\n".join(misses) if misses else "  no misses")
    c, x, r = total["category"], total["xid"], total["rank"]
    print(f"all: category {c[0]}/{c[1]}, xid {x[0]}/{x[1]}, rank {r[0]}/{r[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

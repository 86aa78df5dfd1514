"""docs/interfaces.md's field tables are the record classes' own (gpugate.jsonrecord.field_table).

Between `<!-- generated: NAME -->` and `<!-- end -->` the page holds the table of the record
NAME (one of RECORDS). `python tests/unit/docs/test_interfaces_tables.py` writes them again after a
record changes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a program (below) pytest's pythonpath is not set: tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import paths

from gpugate.drill import DrillWindow
from gpugate.flightrec.records import Culprit, FlightrecFile, Refusal
from gpugate.jsonrecord import JsonRecord, field_table
from gpugate.log import Event
from gpugate.qualify.records import H2dGpu, PayloadResult
from gpugate.store.app_xids import AppXidEntry
from gpugate.store.drills import DrillEntry, DrillStep
from gpugate.store.entries import (
    AuditEntry,
    DrainEntry,
    HeldEntry,
    LedgerEntry,
    UnknownXidsEntry,
)
from gpugate.store.evidence import IndexEntry
from gpugate.store.fleet_view import FleetNode, FleetView
from gpugate.store.healing import HealingEntry, HealingFile
from gpugate.store.qualify import DcgmFindingEntry, QualifyEntry, QualifyTestResult
from gpugate.store.state import Baseline, KnownFault
from gpugate.store.summary import CheckpointAtEnd, EvidenceSummary, QualifySummary, SummaryJob
from gpugate.store.suspects import FlagEntry, VoteEntry
from gpugate.store.view_records import ControllerRecord, Digest, DigestEntry

DOC = paths.DOCS / "interfaces.md"
RECORDS: dict[str, type[JsonRecord]] = {
    "EvidenceSummary": EvidenceSummary,
    "LedgerEntry": LedgerEntry,
    "SummaryJob": SummaryJob,
    "CheckpointAtEnd": CheckpointAtEnd,
    "QualifySummary": QualifySummary,
    "ControllerRecord": ControllerRecord,
    "Digest": Digest,
    "DigestEntry": DigestEntry,
    "DrainEntry": DrainEntry,
    "AuditEntry": AuditEntry,
    "HeldEntry": HeldEntry,
    "UnknownXidsEntry": UnknownXidsEntry,
    "VoteEntry": VoteEntry,
    "FlagEntry": FlagEntry,
    "AppXidEntry": AppXidEntry,
    "FlightrecFile": FlightrecFile,
    "Refusal": Refusal,
    "Culprit": Culprit,
    "Baseline": Baseline,
    "KnownFault": KnownFault,
    "Event": Event,
    "QualifyEntry": QualifyEntry,
    "QualifyTestResult": QualifyTestResult,
    "DcgmFindingEntry": DcgmFindingEntry,
    "PayloadResult": PayloadResult,
    "H2dGpu": H2dGpu,
    "DrillEntry": DrillEntry,
    "DrillStep": DrillStep,
    "DrillWindow": DrillWindow,
    "IndexEntry": IndexEntry,
    "FleetView": FleetView,
    "FleetNode": FleetNode,
    "HealingFile": HealingFile,
    "HealingEntry": HealingEntry,
}
BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end -->)", re.S)


def render(text: str) -> str:
    """The page with every generated block written from its record."""
    return BLOCK.sub(lambda m: m[1] + field_table(RECORDS[m[2]]) + m[4], text)


def test_every_record_has_its_table_on_the_page():
    names = [m[2] for m in BLOCK.finditer(DOC.read_text())]
    assert sorted(names) == sorted(RECORDS)


def test_the_tables_are_the_classes():
    text = DOC.read_text()
    assert render(text) == text, (
        "run `python tests/unit/docs/test_interfaces_tables.py` to write them"
    )


def test_every_key_says_what_it_is():
    bare = [f"{name}.{f}" for name, cls in RECORDS.items() for f in cls._fields
            if f != "extra" and not cls._doc.get(f)]  # fmt: skip
    assert not bare, f"fields without a description in their class's _doc: {bare}"


if __name__ == "__main__":
    sys.exit(DOC.write_text(render(DOC.read_text())) and 0)

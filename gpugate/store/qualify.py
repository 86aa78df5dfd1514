"""Qualification records: `qualify.jsonl` in the state directory (`admin.history_dir`).

One QualifyEntry per node per `gpugate qualify` run: node, when (epoch), at, run_id, level,
passed, tests (each a QualifyTestResult, the shared TEST RESULT of issue 17), job_ids, why, by,
trigger. Bounded and written like the drain history (gpugate/store/history.py): at most
`admin.history_max_per_node` entries per node and `history_max_entries` in all, the file
rewritten whole and atomically under the history's lock, 0640 root and the admin group's;
readers skip what gpugate does not write.

A QualifyTestResult is also what crosses the qualification job's process: the DCGM step
(`gpugate qualify --step dcgm`) writes one to its result file and the judge reads it back.
"""

from __future__ import annotations

import os
import time

from gpugate.jsonrecord import JsonRecord
from gpugate.store.entries import _COMMON, NodeEntry
from gpugate.store.history import (
    MAX_ENTRIES,
    MAX_PER_NODE,
    _add,
    _common_ok,
    _read_lines,
    _select,
    iso,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar

QUALIFY = "qualify.jsonl"
_TEXT = ("at", "run_id", "why", "by", "trigger")


class DcgmFindingEntry(JsonRecord):
    """One problem DCGM reported, as a DCGM TEST RESULT's `findings` list holds it
    (gpugate/qualify/dcgm.DcgmFinding with its sentence)."""

    test: str
    gpu: int | None
    status: str
    message: str
    error_id: int | None = None
    error_category: int | None = None
    error_severity: int | None = None
    kind: str = "hardware"
    cause: str = ""
    text: str = ""

    _doc: ClassVar[dict[str, str]] = {
        "test": "DCGM's plugin: `memory`, `pcie`, `software`, ...",
        "gpu": "the GPU's index; null: no entity",
        "status": "as DCGM wrote it: `Fail`, `Warn`",
        "message": "DCGM's message",
        "error_id": "DCGM's error id (dcgm_catalog)",
        "error_category": "DCGM's error category",
        "error_severity": "DCGM's error severity",
        "kind": "`hardware`, `software`, `config` or `not_tested` (older findings: hardware)",
        "cause": "what on the node, when it is not the GPU (`fabric manager`, ...)",
        "text": "the finding in one sentence",
    }


class QualifyTestResult(JsonRecord):
    """One TEST RESULT (issue 17): a qualification test's verdict on its node(s).

    The first seven keys every result has, in this order; the others only where they apply,
    each after those in the order the writers always put them (a DCGM step's, a bandwidth
    test's), so a line reads and writes back the same.
    """

    test: str
    nodes: list[str]
    ok: bool | None
    value_gbps: float | None = None
    floor_gbps: float | None = None
    detail: str
    job_id: str | None = None
    level: int | None = None
    not_run: bool | str | None = None
    fix: str | None = None
    not_tested: bool | None = None
    error: str | None = None
    mig: list[int] | None = None
    floor_source: str | None = None
    findings: list[DcgmFindingEntry] | None = None
    dcgm_version: str | None = None
    exit_code: int | None = None

    _omit = frozenset({"level", "not_run", "fix", "not_tested", "error", "mig", "floor_source",
                       "findings", "dcgm_version", "exit_code"})  # fmt: skip
    _doc: ClassVar[dict[str, str]] = {
        "test": "`dcgm`, `allreduce`, `h2d` or `pair`",
        "nodes": "the node, or a pair's two",
        "ok": "true: passed; false: failed (a drain); null: not judged (nothing proven)",
        "value_gbps": "the bandwidth measured, GB/s (a bandwidth test)",
        "floor_gbps": "the bar it was judged against, GB/s",
        "detail": "the verdict in words, starting with the test",
        "job_id": "the qualification job that ran it",
        "level": "the DCGM diagnostic's level (the DCGM step's)",
        "not_run": "a step the site could not run (a tool it lacks): true, or why (the DCGM "
        "step's); never the node's failure",
        "fix": "the exact fix of a step not run",
        "not_tested": "DCGM could not test (never a failure)",
        "error": "why the DCGM step has no verdict: `missing`, `timeout`, `hostengine`, `mig`, "
        "`output`, ...",
        "mig": "the GPUs in MIG mode (DCGM cannot test them)",
        "floor_source": "where the floor comes from (the board profile, the site, the median)",
        "findings": "DCGM's findings (DcgmFindingEntry)",
        "dcgm_version": "DCGM's version (written with the findings)",
        "exit_code": "dcgmi's exit code (written with the findings)",
    }

    def _omitted(self) -> set[str]:
        # A parsed DCGM run writes its version and exit code with its findings, known or not.
        keep = {"dcgm_version", "exit_code"} if self.findings is not None else set()
        return {f for f in self._omit if getattr(self, f) is None and f not in keep}


class QualifyEntry(NodeEntry):
    """`qualify.jsonl`: one node's outcome of one qualification run."""

    run_id: str
    level: int
    passed: bool
    tests: list[QualifyTestResult]
    job_ids: list[str]
    why: str
    by: str
    trigger: str = ""

    _doc: ClassVar[dict[str, str]] = {
        **_COMMON,
        "run_id": "the qualification run",
        "level": "its level",
        "passed": "every test passed and nothing was left unproven",
        "tests": "each test's result (QualifyTestResult)",
        "job_ids": "the node's qualification jobs",
        "why": "the verdict in words",
        "by": "who ran it",
        "trigger": "what asked for the run: empty for an admin, a sweep, a suspect flag's "
        "detail (since c0869b5)",
    }


def valid_qualification(e: object) -> bool:
    """Whether `e` has the common ranges of a history line (the record checks the rest)."""
    return _common_ok(e, _TEXT)


def record_qualification(
    state_dir: str,
    entry: QualifyEntry,
    *,
    max_per_node: int = MAX_PER_NODE,
    max_entries: int = MAX_ENTRIES,
) -> QualifyEntry:
    """Add one node's qualification outcome; the entry as written (its `when` rounded, `at`;
    a `when` of 0 is now)."""
    when = round(entry.when or time.time(), 3)
    full = entry.replace(when=when, at=iso(when))
    if not valid_qualification(full.to_json()):
        raise ValueError(f"not a qualification entry: {full!r}")
    # Every run is its own entry: nothing repeats (unlike two prologs seeing one fault).
    _add(state_dir, QUALIFY, valid_qualification, full, lambda last: False,
         max_per_node, max_entries)  # fmt: skip
    return full


def qualifications(
    state_dir: str, node: str | None = None, since: float | None = None
) -> list[QualifyEntry]:
    """Qualification entries (of one node, or all; since an epoch time, or all), oldest first."""
    path = os.path.join(state_dir, QUALIFY)
    return _select(_read_lines(path, QualifyEntry, valid_qualification), node, since)


def latest_pass(
    state_dir: str, node: str, since: float | None = None, level: int = 1
) -> QualifyEntry | None:
    """The node's newest qualification of at least `level` (since a time), if it passed.

    A later failure voids an earlier pass: a node that passed, then failed, has no pass.
    """
    for entry in reversed(qualifications(state_dir, node, since)):
        if entry.level >= level:
            return entry if entry.passed else None
    return None

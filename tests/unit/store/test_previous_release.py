"""A site upgrading keeps its stores: files the previous release wrote read into records.

The files are tests/fixtures/previous-release/ (its README says how they were made: by the
previous release's own code). Each is read by today's reader; writing the record again gives
the same JSON, where a key the old file lacks comes back as its default.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import paths
import pytest
from factories import default_config

from gpugate import drill, log
from gpugate.drill import DrillWindow
from gpugate.flightrec.culprit import job_culprit
from gpugate.flightrec.records import FlightrecFile, Refusal
from gpugate.jsonrecord import JsonRecord
from gpugate.qualify import judge
from gpugate.qualify.records import PayloadResult
from gpugate.record import to_plain
from gpugate.store import (
    app_xids,
    controller_view,
    drills,
    evidence,
    fleet_view,
    healing,
    held,
    history,
    qualify,
    state,
    suspects,
)
from gpugate.store.app_xids import AppXidEntry
from gpugate.store.drills import DrillEntry
from gpugate.store.evidence import IndexEntry
from gpugate.store.fleet_view import FleetView
from gpugate.store.healing import HealingEntry, HealingFile
from gpugate.store.qualify import QualifyEntry, QualifyTestResult
from gpugate.store.state import Baseline
from gpugate.store.summary import EvidenceSummary, summary_from_json
from gpugate.store.suspects import FlagEntry, VoteEntry
from gpugate.store.view_records import ControllerRecord, Digest

OLD = paths.FIXTURES / "previous-release"
BUNDLE = OLD / "evidence" / "77" / "gpu-node-01-r0"


def same_json(record: JsonRecord, old: dict) -> None:
    """`record` writes `old` again: every old key, and its defaults for the keys it lacked."""
    out = record.to_json()
    assert {k: out.get(k) for k in old} == old
    added = {k: v for k, v in out.items() if k not in old}
    assert added == {k: to_plain(record._defaults[k]) for k in added}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_previous_releases_bundle_summary_is_read_into_a_record(tmp_path):
    bundle = tmp_path / "77" / "gpu-node-01-r0"
    shutil.copytree(BUNDLE, bundle)
    summary = evidence.read_summary(str(bundle))
    assert isinstance(summary, EvidenceSummary)
    assert (summary.job_id, summary.node, summary.xid) == ("77", "gpu-node-01", 79)
    assert summary.hardware_fault and summary.category == "gpu_xid_hardware"
    assert summary.kernel_log_lost is None  # newer than that release: its default
    same_json(summary, load(BUNDLE / "summary.json"))


def test_the_first_releases_summary_is_read_too():
    old = load(BUNDLE / "summary-2026-11-29.json")
    summary = summary_from_json(old)
    assert isinstance(summary, EvidenceSummary)
    assert summary.kind is None and evidence.bundle_kind(summary) == "job"
    assert summary.confidence is None  # the requeue reads a missing confidence as before
    same_json(summary, old)


@pytest.mark.parametrize("key", ["job_id", "node"])
def test_a_summary_without_a_required_key_names_it(key):
    old = load(BUNDLE / "summary.json")
    del old[key]
    with pytest.raises(ValueError, match=f"summary.json: missing key '{key}'"):
        summary_from_json(old)


def test_a_summary_with_a_wrong_type_names_the_key():
    old = dict(load(BUNDLE / "summary.json"), xid="79")
    with pytest.raises(ValueError, match=r"summary.json: key 'xid': expected int \| None, got str"):
        summary_from_json(old)


def test_the_previous_releases_decision_record_and_digest_are_read(tmp_path):
    view = tmp_path / "controller-view" / "77"
    shutil.copytree(OLD / "controller-view" / "77", view)
    os.chmod(view, 0o750)
    record, why = controller_view.read_record(str(view / "gpu-node-01-r0.json"))
    assert why is None and isinstance(record, ControllerRecord)
    assert record.hardware_fault is True and record.state == "done" and record.bundle is True
    same_json(record, load(view / "gpu-node-01-r0.json"))
    digest, why = controller_view.read_digest(str(view / "@digest-r0.json"), "77", 0)
    assert why is None and isinstance(digest, Digest)
    assert digest.nodes["gpu-node-01"].category == "gpu_xid_hardware"
    assert digest.to_json() == load(view / "@digest-r0.json")


@pytest.mark.parametrize(
    ("name", "read"),
    [
        ("drains.jsonl", history.drains),
        ("audit.jsonl", history.resumes),
        ("held.jsonl", held.held_entries),
        ("suspects.jsonl", suspects.votes),
        ("suspect-flags.jsonl", suspects.flags),
    ],
)
def test_the_previous_releases_history_lines_are_read_into_records(tmp_path, name, read):
    shutil.copy(OLD / "state" / name, tmp_path / name)
    old = [json.loads(line) for line in (OLD / "state" / name).read_text().splitlines()]
    got = read(str(tmp_path))
    assert len(got) == len(old) > 0
    for record, line in zip(got, old):
        same_json(record, line)


def test_the_previous_releases_drill_drain_and_repair_are_kept():
    drains = history.drains(str(OLD / "state"))
    audit = history.resumes(str(OLD / "state"))
    assert [history.drill_of(d) for d in drains] == [None, "ecc-3"]
    assert audit[0].repair == "gpu reset" and audit[1].resumed is False
    # The reseat's new boot is the repair that makes the lift no false drain.
    assert history.repair_evidence(drains[0], audit[0]) == history.REBOOT


def test_the_previous_releases_votes_and_flag_are_counted(tmp_path):
    shutil.copy(OLD / "state" / "suspects.jsonl", tmp_path / "suspects.jsonl")
    shutil.copy(OLD / "state" / "suspect-flags.jsonl", tmp_path / "suspect-flags.jsonl")
    votes = suspects.open_votes(str(tmp_path), "gpu-node-02", 1e9, now=1796000500.0)
    assert all(isinstance(v, VoteEntry) for v in votes)
    assert [(v.job, v.uid) for v in votes] == [("101", 1000), ("107", None)]
    assert suspects.tally(votes, 1) == (2, 2)  # a vote without a uid: an unknown user's
    (flag,) = suspects.open_flags(str(tmp_path)).values()
    assert isinstance(flag, FlagEntry) and (flag.node, flag.action) == ("gpu-node-02", "review")
    assert flag.uids == []  # written before flags named their users: charged to nobody
    assert suspects.qualifications_charged(str(tmp_path), 0) == {}


def test_the_previous_releases_app_xid_line_is_read_by_the_rule():
    entries, bad = app_xids.parse((OLD / "state" / "app_xids.jsonl").read_text(), 0)
    assert bad == 0 and all(isinstance(e, AppXidEntry) for e in entries)
    assert [(e.gpu, e.xid, e.job, e.pid, e.name) for e in entries] == [
        ("0000:58:00", 31, "77", 1234, "python")
    ]
    for entry, line in zip(entries, load_lines(OLD / "state" / "app_xids.jsonl")):
        same_json(entry, line)


@pytest.mark.parametrize(("record", "name", "key"), [
    (VoteEntry, "suspects.jsonl", "job"),
    (FlagEntry, "suspect-flags.jsonl", "action"),
    (AppXidEntry, "app_xids.jsonl", "gpu"),
])  # fmt: skip
def test_a_line_without_a_required_key_names_it(record, name, key):
    line = load_lines(OLD / "state" / name)[0]
    del line[key]
    with pytest.raises(ValueError, match=f"{name}: missing key '{key}'"):
        record.from_json(line, name)


def test_the_previous_releases_flightrec_member_is_read_into_a_record(tmp_path):
    old = load(BUNDLE / "flightrec.json")
    member = FlightrecFile.from_json(old, "flightrec.json")
    assert [r["rank"] for r in member.records] == [0] and member.kept == [
        "flightrec/fr_rank_0.json"
    ]
    (refused,) = member.errors
    assert isinstance(refused, Refusal) and refused.name == "fr_rank_1" and refused.bytes == 139
    assert member.to_json() == old
    bundle = tmp_path / "77" / "gpu-node-01-r0"
    shutil.copytree(BUNDLE, bundle)
    found = job_culprit([str(bundle)])  # the culprit reads it as the bundle's member
    # One rank's record names no culprit: the refusal is what it says, tagged with the node.
    assert found is not None and found.state is None and "fr_rank_1: refused" in found.text
    assert [(e["name"], e["node"]) for e in found.errors or []] == [("fr_rank_1", "gpu-node-01")]


def test_a_flightrec_member_without_records_names_the_key():
    old = load(BUNDLE / "flightrec.json")
    del old["records"]
    with pytest.raises(ValueError, match=r"flightrec\.json: missing key 'records'"):
        FlightrecFile.from_json(old, "flightrec.json")


def test_the_previous_releases_baseline_is_read_by_the_epilog(tmp_path):
    jobs = tmp_path / "jobs" / "77"
    jobs.mkdir(parents=True)
    shutil.copy(OLD / "state" / "jobs" / "77" / "baseline.json", jobs / "baseline.json")
    baseline = state.load_baseline(str(tmp_path), "77")
    assert isinstance(baseline, Baseline)
    assert baseline.restart_count == 0 and baseline.kernel_log_tail == []
    assert baseline.gpus["4"]["ecc_aggregate_uncorrected"] == 0
    same_json(baseline, load(jobs / "baseline.json"))


def test_a_baseline_of_before_the_run_record_still_reads():
    old = load(OLD / "state" / "jobs" / "77" / "baseline.json")
    for key in ("restart_count", "known_faults", "job_gpus", "started_at"):
        del old[key]
    baseline = Baseline.from_json(dict(old, ckpt_dir="/ck"))
    assert baseline.started_at is None and baseline.known_faults == []
    assert baseline.ckpt_dir == "/ck"  # the TaskProlog's directory, before its own file


def test_the_previous_releases_event_line_is_read_into_a_record():
    (e,) = log.read_events(str(OLD / "state"))
    assert (e.hook, e.extra["status"], e.drill) == ("prolog", "ok", None)
    same_json(e, load_lines(OLD / "state" / "events.jsonl")[0])


def test_the_previous_releases_qualification_line_is_read_into_a_record(tmp_path):
    shutil.copy(OLD / "state" / "qualify.jsonl", tmp_path / "qualify.jsonl")
    (entry,) = qualify.qualifications(str(tmp_path))
    assert isinstance(entry, QualifyEntry) and entry.trigger == "suspect (votes): 3 jobs"
    dcgm, bw = entry.tests
    assert dcgm.ok is False and dcgm.findings[0].kind == "hardware" and dcgm.exit_code == 205
    assert bw.floor_source and bw.value_gbps is None
    assert qualify.latest_pass(str(tmp_path), "gpu-node-01") is None  # it failed
    same_json(entry, load_lines(OLD / "state" / "qualify.jsonl")[0])
    # Appending rewrites the file: the old line comes back as it was.
    qualify.record_qualification(str(tmp_path), entry.replace(when=1796009000.0, passed=True))
    assert (tmp_path / "qualify.jsonl").read_text().splitlines()[0] == (
        OLD / "state" / "qualify.jsonl"
    ).read_text().splitlines()[0]


def test_a_qualification_line_without_trigger_reads_and_one_without_run_id_names_it():
    old = load_lines(OLD / "state" / "qualify.jsonl")[0]
    del old["trigger"]  # before c0869b5
    assert QualifyEntry.from_json(old).trigger == ""
    del old["run_id"]
    with pytest.raises(ValueError, match="missing key 'run_id'"):
        QualifyEntry.from_json(old)


def test_the_previous_releases_job_results_are_read_by_the_judge():
    where = OLD / "qualify" / "q-1" / "gpu-node-01"
    step = judge.read_step(str(where / "dcgm.json"))
    assert isinstance(step, QualifyTestResult) and step.ok is False and step.level == 2
    assert step.to_json() == load(where / "dcgm.json")  # what the step writes, key for key
    payload = judge.read_payload(str(where / "allreduce.json"))
    assert isinstance(payload, PayloadResult) and payload.test == "allreduce"
    assert payload.not_run and payload.fix and payload.rank == 0
    same_json(payload, load(where / "allreduce.json"))


def test_the_previous_releases_drill_window_and_record_are_read(tmp_path):
    window = drill.read_drill(load(OLD / "state" / "drill.json"))
    assert isinstance(window, DrillWindow) and (window.fault, window.node) == ("ecc", "gpu-node-01")
    assert window.to_json() == load(OLD / "state" / "drill.json")
    config = default_config().replace(state_dir=str(tmp_path))
    shutil.copy(OLD / "state" / "drills.jsonl", tmp_path / "drills.jsonl")
    (record,) = drills.drill_records(config)
    assert isinstance(record, DrillEntry) and record.drill == window and not record.passed
    requeued = record.steps[-1]
    assert (requeued.step, requeued.nodes, requeued.checkpoint) == (
        "requeued",
        ["gpu-node-02"],
        None,
    )
    assert record.to_json() == load_lines(OLD / "state" / "drills.jsonl")[0]


def test_the_previous_releases_fleet_view_is_read_into_a_record(tmp_path):
    shutil.copy(OLD / "state" / "fleet" / "nodes.json", tmp_path / "nodes.json")
    os.chmod(tmp_path / "nodes.json", 0o600)  # git keeps 0644: a view others can write is refused
    read_at, nodes = fleet_view.load_view(str(tmp_path))
    node = nodes["gpu-node-01"]
    assert node.drained and node.gpugate_owned and node.partitions == ("gpu",)
    assert node.reason_time == int(read_at) and node.gres_gpus is None and node.comment == ""
    old = load(OLD / "state" / "fleet" / "nodes.json")
    view = FleetView.from_json(old)
    assert view.to_json() == old
    # Written again as the hook writes it: the same bytes.
    fleet_view.save_view(str(tmp_path), read_at, nodes)
    assert (tmp_path / "nodes.json").read_text() == json.dumps(old, separators=(",", ":"))


def test_the_previous_releases_healing_state_is_read_and_written_back_alike(tmp_path):
    shutil.copy(OLD / "state" / "healing.json", tmp_path / "healing.json")
    entries = healing.load(str(tmp_path))
    entry = entries["gpu-node-01"]
    assert (entry.check, entry.fault, entry.passes) == ("kernel.xid", "hardware", 1)
    assert entry.since == 1796000000.0 and entry.boot_id.endswith("0001")
    old = load(OLD / "state" / "healing.json")
    same_json(HealingFile.from_json(old), old)
    same_json(HealingEntry.from_json(old["nodes"]["gpu-node-01"]), old["nodes"]["gpu-node-01"])
    # Written again as `gpugate health` writes it: the same bytes.
    healing.save(str(tmp_path), entries)
    assert (tmp_path / "healing.json").read_text() == (OLD / "state" / "healing.json").read_text()


def test_the_previous_releases_evidence_index_is_read_into_records(tmp_path):
    index = tmp_path / evidence.INDEX_DIR
    index.mkdir()
    shutil.copy(OLD / "evidence" / ".index" / "gpu-node-01.jsonl", index / "gpu-node-01.jsonl")
    read = evidence.read_index(str(tmp_path), "gpu-node-01")
    assert read is not None and read.warnings == [] and read.lines == 1
    (entry,) = read.entries
    assert isinstance(entry, IndexEntry)
    assert (entry.path, entry.user, entry.hw, entry.kind) == (
        "77/gpu-node-01-r0",
        "alice",
        True,
        "job",
    )
    old = load_lines(index / "gpu-node-01.jsonl")
    same_json(entry, old[0])


def test_an_index_line_of_before_hw_and_kind_is_written_back_without_them():
    old = load_lines(OLD / "evidence" / ".index" / "gpu-node-01.jsonl")[0]
    del old["hw"], old["kind"]
    entry = IndexEntry.from_json(old)
    assert entry.hw is None and entry.kind is None
    assert entry.to_json() == old


def load_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


ADDED_SINCE = {
    "evidence/77/gpu-node-01-r0/summary.json": ["kernel_log_lost"],  # 38a7900
    "state/events.jsonl": ["steps"],  # the executor's report of a hook's steps (gpugate/act)
    "state/drains.jsonl": ["gpu"],  # issue 45: the failing GPU's serial (the RMA count by part)
    "state/suspect-flags.jsonl": ["uids"],  # 38e37e7: the users a qualification is charged to
}


def test_this_release_writes_the_keys_of_the_previous_one_in_its_order(tmp_path):
    """The writers build records now; what they write is the JSON they wrote before."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_fixtures", OLD / "make_fixtures.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(str(tmp_path))  # the same run, by this release's code
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(ADDED_SINCE.keys() | _names(OLD) - {"README.md"})
    for name in written:
        old, new = _objects(OLD / name), _objects(tmp_path / name)
        assert len(old) == len(new), name
        for before, now in zip(old, new):
            assert [k for k in now if k not in ADDED_SINCE.get(name, ())] == list(before), name


def _names(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
            and p.suffix in (".json", ".jsonl") and "-2026-11-29" not in p.name}  # fmt: skip


def _objects(path: Path) -> list[dict]:
    return load_lines(path) if path.suffix == ".jsonl" else [load(path)]

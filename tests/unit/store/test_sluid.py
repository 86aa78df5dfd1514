"""SLUIDs (Slurm 25.11+, SLURM_JOB_SLUID): one run's id in its records; a reused job id's runs
never merge (docs/slurm-facts.md, "SLUIDs")."""

from __future__ import annotations

import json
import os

from epilog_setup import NCCL_TIMEOUT, job_run, member

from gpugate.commands import evidence as E
from gpugate.store import controller_view as V
from gpugate.store.evidence import read_index, write_bundle
from gpugate.store.summary import EvidenceSummary

A, B = "s3H1M96THB9700", "s3H1M96THC1200"  # two runs of job 5 (ids wrapped, or state lost)
HW = {"node": "n1", "hardware_fault": True, "category": "gpu_xid_hardware",
      "first_hardware_error_at": "2026-11-29T10:00:00Z"}  # fmt: skip


def test_the_bundle_index_and_record_carry_the_runs_sluid(tmp_path):
    result, _, config = job_run(tmp_path, "step 10\n" + NCCL_TIMEOUT, sluid=A)
    assert json.loads(member(result, "summary.json"))["sluid"] == A
    entries = read_index(config.evidence_dir, "gpu-node-01").entries
    assert [e.sluid for e in entries] == [A]
    record, _ = V.read_record(V.record_path(config.evidence_dir, "77", "gpu-node-01", 0))
    assert record.state == "done" and record.sluid == A
    digest, _ = V.read_digest(V.digest_path(config.evidence_dir, "77", 0), "77", 0, sluid=A)
    assert digest.sluid == A


def test_without_a_sluid_nothing_names_one(tmp_path):
    result, _, config = job_run(tmp_path, "step 10\n" + NCCL_TIMEOUT)
    assert "sluid" not in json.loads(member(result, "summary.json"))
    line = (tmp_path / "evidence" / ".index" / "gpu-node-01.jsonl").read_text()
    assert "sluid" not in line
    path = V.record_path(config.evidence_dir, "77", "gpu-node-01", 0)
    with open(path) as fh:
        assert "sluid" not in json.load(fh)
    with open(V.digest_path(config.evidence_dir, "77", 0)) as fh:
        assert "sluid" not in json.load(fh)


def _done(ev, node: str, sluid: str | None) -> None:
    record = V.done(dict(HW, node=node))
    V.write_record(str(ev), "5", node, 0, record.replace(sluid=sluid) if sluid else record)


def test_an_earlier_jobs_record_under_the_same_id_is_not_this_runs(tmp_path):
    _done(tmp_path, "n1", A)  # job 5 of before, kept by retention; n2 was not in it
    _done(tmp_path, "n2", B)
    summaries, _, found, _ = V.read_records(str(tmp_path), "5", ("n1", "n2"), 0, 0, 0, sluid=B)
    assert [s.node for s in summaries] == ["n2"] and "n1" not in found
    # Without this run's SLUID (Slurm before 25.11, an older EpilogSlurmctld) both are read.
    summaries, _, _, _ = V.read_records(str(tmp_path), "5", ("n1", "n2"), 0, 0, 0)
    assert sorted(s.node for s in summaries) == ["n1", "n2"]


def test_a_record_that_names_no_sluid_is_still_read(tmp_path):
    _done(tmp_path, "n1", None)  # an older release's node epilog, during an upgrade
    summaries, _, _, _ = V.read_records(str(tmp_path), "5", ("n1",), 0, 0, 0, sluid=B)
    assert [s.node for s in summaries] == ["n1"]


def test_a_digest_of_another_sluid_is_refused_and_replaced(tmp_path):
    _done(tmp_path, "n1", A)
    path = V.digest_path(str(tmp_path), "5", 0)
    digest, why = V.read_digest(path, "5", 0, sluid=B)
    assert digest is None and why == f"another run's (SLUID '{A}', not {B})"
    _done(tmp_path, "n2", B)  # this run's first node: A's n1 does not stay in B's digest
    digest, why = V.read_digest(path, "5", 0, sluid=B)
    assert why is None and digest.sluid == B and set(digest.nodes) == {"n2"}


def test_a_large_jobs_digest_of_another_run_is_not_used(tmp_path):
    for node in ("n1", "n2", "n3"):
        _done(tmp_path, node, A)
    _done(tmp_path, "n3", B)  # replaces A's digest: it names n3 only
    _done(tmp_path, "n1", A)  # a stale writer of A: A's digest again, naming n1
    summaries, _, found, account = V.read_records(
        str(tmp_path), "5", ("n1", "n2", "n3"), 0, 0, 0, max_records=1, sluid=B
    )
    assert [s.node for s in summaries] == ["n3"] and set(found) == {"n3"}
    assert account.digest is not None and "another run's" in account.digest


def _bundle(ev, node: str, sluid: str | None, at: str) -> str:
    summary = EvidenceSummary(job_id="5", node=node, sluid=sluid, category="nccl_timeout",
                              collected_at=at)  # fmt: skip
    return write_bundle(str(ev), "5", node, 0, {"kernel.log": ""}, summary)


def test_gpugate_evidence_shows_the_sluid_and_keeps_the_runs_apart(tmp_path):
    old = _bundle(tmp_path, "n1", A, "2026-01-01T00:00:00Z")
    new = _bundle(tmp_path, "n2", B, "2026-12-01T00:00:00Z")
    bare = _bundle(tmp_path, "n3", None, "2026-11-01T00:00:00Z")
    items = E.newest_first([E.describe(b) for b in (old, new, bare)])
    assert [d["sluid"] for d in items] == [B, None, A]
    text = E.render("5", items)
    assert f"job 5 on n2 (run 0, SLUID {B}), collected" in text
    assert "job 5 on n3 (run 0), collected" in text
    # The flight recorder reads one run: the newest's SLUID, and bundles naming none.
    assert sorted(E.one_run([old, new, bare], items)) == sorted([new, bare])
    assert os.path.isdir(old)  # nothing merged, nothing lost

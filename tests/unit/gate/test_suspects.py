"""Cross-job suspect voting and the RMA rule healing asks: votes, first to fail, threshold."""

from __future__ import annotations

import json
import os
import time

import pytest
from factories import default_config, views
from fakes import FakeSlurm

from gpugate.clock import parse_utc
from gpugate.gate import suspicion
from gpugate.gate.requeue import JobEnd
from gpugate.gate.suspicion import vote
from gpugate.store import history, suspects
from gpugate.store.entries import AuditEntry
from gpugate.store.suspects import (
    FlagEntry,
    first_failure_at,
    first_to_fail,
    record_vote,
    votes,
)

NODES = ("a", "b", "c")
T0 = 1_800_000_000.0


def config_for(tmp_path, votes_needed: int = 3, window_h: float = 72, users_min: int = 1):
    config = default_config()
    return config.replace(
        state_dir=str(tmp_path / "state"),
        evidence_dir=str(tmp_path / "ev"),
        admin=config.admin.replace(history_dir=str(tmp_path / "hist")),
        budget=config.budget.replace(settle_s=0, min_drains_allowed=3),
        health=config.health.replace(
            suspect_votes=votes_needed, suspect_window_h=window_h, suspect_users_min=users_min
        ),
    )


def summary(node: str, at: str | None, category: str = "nccl_timeout") -> dict:
    return {"node": node, "first_failure_at": at, "category": category, "hardware_fault": False}


def failed_job(job_id: str, nodes=NODES, **changes) -> JobEnd:
    values = {"job_id": job_id, "state": "FAILED", "exit_code2": "1:0", "nodes": nodes}
    values.update(changes)
    return JobEnd(**values)


B_FIRST = [
    summary("a", "2026-12-01T10:10:00Z"),
    summary("b", "2026-12-01T10:00:00Z", "nccl_error"),
    summary("c", "2026-12-01T10:10:01Z"),
]


# ------------------------------------------------------------------- first_failure_at


WATCHDOG = "[rank0]:[E1201 10:10:05.100000 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600061 milliseconds before timing out."
SYSTEM = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1"


def diagnosed(tmp_path, *lines: str):
    from gpugate.diagnosis.engine import diagnose

    path = tmp_path / "job.log"
    path.write_text("".join(line + "\n" for line in lines))
    return diagnose([str(path)])


def test_first_failure_at_is_the_time_of_the_first_decisive_line(tmp_path):
    # The diagnosis cleans its lines (the stamps go): the time is read from the file again.
    d = diagnosed(tmp_path, "step 10 loss 2.1", f"2026-12-01 10:00:02,500 [rank1]: {SYSTEM}")
    assert d.category == "nccl_error" and "2026" not in d.evidence[0].text
    assert first_failure_at(d) == "2026-12-01T10:00:02.500000Z"


@pytest.mark.parametrize(
    "lines",
    [
        ("step 10 loss 2.1",),  # no failure
        (WATCHDOG,),  # a glog stamp has no year: not comparable across nodes
        (f"[ 1234.5] {SYSTEM}",),  # seconds since boot: neither
    ],
)
def test_first_failure_at_is_none_without_a_full_date(tmp_path, lines):
    assert first_failure_at(diagnosed(tmp_path, *lines)) is None


def test_the_bundle_summary_carries_it(tmp_path):
    from gpugate.hooks.collect import _read_and_diagnose

    path = tmp_path / "out.log"
    path.write_text(f"2026-12-01T10:00:00Z {SYSTEM}\n")
    found = _read_and_diagnose([str(path)], "", 4096, 8)
    assert found["diagnosis"]["first_failure_at"] == "2026-12-01T10:00:00Z"


# ----------------------------------------------------------------------- first_to_fail


def test_the_node_whose_failure_came_first_is_the_suspect():
    assert first_to_fail(views(B_FIRST), NODES) == ("b", parse_utc("2026-12-01T10:00:00Z"))


@pytest.mark.parametrize(
    ("summaries", "nodes"),
    [
        # Within the clocks' tolerance (2 s): too close to tell.
        ([summary("a", "2026-12-01T10:00:01Z"), summary("b", "2026-12-01T10:00:00Z")], ("a", "b")),
        # A node without a time may have failed first.
        ([summary("a", None), summary("b", "2026-12-01T10:00:00Z")], ("a", "b")),
        # A node without a bundle: the same.
        ([summary("b", "2026-12-01T10:00:00Z"), summary("c", "2026-12-01T10:09:00Z")], NODES),
        # A time that is not one, and a single-node job.
        ([summary("a", "yesterday"), summary("b", "2026-12-01T10:00:00Z")], ("a", "b")),
        ([summary("b", "2026-12-01T10:00:00Z")], ("b",)),
    ],
)
def test_no_suspect_is_guessed(summaries, nodes):
    assert first_to_fail(views(summaries), nodes) is None


# -------------------------------------------------------------------------- vote store


def test_votes_are_recorded_once_per_job_and_read_back(tmp_path):
    where = str(tmp_path)
    assert record_vote(where, "b", "101", "nccl_error", "2026-12-01T10:00:00Z", T0)
    assert record_vote(where, "b", "101", "nccl_error", None, T0 + 1) is None  # same job again
    assert record_vote(where, "b", "107", None, None, T0 + 2)
    found = votes(where, "b")
    assert [v.job for v in found] == ["101", "107"]
    assert found[0].first_failure_at == "2026-12-01T10:00:00Z"
    assert votes(where, "b", since=T0 + 1)[0].job == "107"
    assert (os.stat(tmp_path / "suspects.jsonl").st_mode & 0o777) == 0o640


def test_the_vote_store_is_bounded_like_the_drain_history(tmp_path):
    for i in range(5):
        record_vote(str(tmp_path), "b", str(100 + i), when=T0 + i, max_per_node=3)
    assert [v.job for v in votes(str(tmp_path))] == ["102", "103", "104"]


def test_malformed_vote_lines_are_skipped(tmp_path):
    good = {"node": "b", "when": T0, "at": "x", "job": "9", "category": None}
    lines = [json.dumps(good), "{torn", json.dumps({**good, "job": 9}), "[]"]
    (tmp_path / "suspects.jsonl").write_text("\n".join(lines) + "\n")
    assert [v.job for v in votes(str(tmp_path))] == ["9"]


# ---------------------------------------------------------------- the vote and the flag


@pytest.fixture
def started(qualifications_started, monkeypatch):
    """The qualifications the flags asked for (node, trigger), as root would start them."""
    monkeypatch.setattr(suspicion.os, "geteuid", lambda: 0)
    return qualifications_started


def cast(config, job_id: str, summaries=B_FIRST, now: float = T0, **changes) -> str | None:
    return vote(config, failed_job(job_id, **changes), views(summaries), "nccl_timeout", now)


def test_the_third_vote_flags_the_suspect_and_asks_for_its_qualification(tmp_path, started):
    config = config_for(tmp_path)
    assert "1/3 votes" in cast(config, "101", now=T0, uid=1001)
    assert "2/3 votes" in cast(config, "107", now=T0 + 60, uid=1002)
    assert started == [] and suspects.open_flags(history.read_dirs(config)) == {}
    said = cast(config, "112", now=T0 + 120, uid=1001)
    assert "flagged b suspect" in said and "qualification started (pid 4242)" in said, said
    flag = suspects.open_flags(history.read_dirs(config))["b"]
    assert flag.source == "votes" and flag.action == "qualify" and flag.users == 2
    assert flag.jobs == ["101", "107", "112"]
    assert started == [("b", "suspect (votes): first to fail in jobs 101,107,112 of 2 user(s)")]
    # Nothing a user wrote drained anything, nor wrote a drain into the history.
    assert history.drains(config.admin.history_dir) == []


def test_votes_never_drain_however_many(tmp_path, started):
    config = config_for(tmp_path, votes_needed=1)
    slurm = FakeSlurm(nodes=NODES)
    from gpugate.hooks.epilog_slurmctld import run_requeue

    for i in range(6):
        run_requeue(config, failed_job(str(200 + i), comment="", uid=1000 + i), slurm, wait_s=0)
    assert slurm.drains == []


def test_a_flagged_node_is_flagged_once_until_its_suspicion_is_closed(tmp_path, started):
    config = config_for(tmp_path, votes_needed=1)
    assert "flagged b" in cast(config, "101", now=T0, uid=1)
    assert "suspect already" in cast(config, "107", now=T0 + 60, uid=2)
    assert len(started) == 1


def test_one_users_jobs_alone_never_flag_a_node(tmp_path, started):
    # The failure times are the jobs' own output: a user could fake them in every job.
    config = config_for(tmp_path, users_min=2)
    assert default_config().health.suspect_users_min == 2  # the default guards it
    for i, job in enumerate(("101", "107", "112", "113")):
        said = cast(config, job, now=T0 + 60 * i, uid=1001)
    # Capped at suspect_votes_per_user (2), one user never reaches the threshold...
    assert started == [] and "(2/3 votes, 1 user(s))" in said
    assert "flagged b" in cast(config, "120", now=T0 + 600, uid=1002)


def test_without_the_cap_one_user_still_needs_a_second(tmp_path, started):
    config = config_for(tmp_path, users_min=2)
    config = config.replace(health=config.health.replace(suspect_votes_per_user=10))
    for i, job in enumerate(("101", "107", "112")):
        said = cast(config, job, now=T0 + 60 * i, uid=1001)
    assert started == [] and "(3/3 votes, 1 user(s)); 2 users needed: not flagged" in said


def test_each_user_counts_at_most_its_share_of_votes(tmp_path, started):
    config = config_for(tmp_path, users_min=2)
    config = config.replace(health=config.health.replace(suspect_votes_per_user=1))
    cast(config, "101", now=T0, uid=1)
    cast(config, "102", now=T0 + 1, uid=1)
    said = cast(config, "103", now=T0 + 2, uid=2)
    # Three jobs, two users, one vote each: 2 of 3.
    assert "(2/3 votes, 2 user(s))" in said and started == []
    assert "flagged b" in cast(config, "104", now=T0 + 3, uid=3)


def test_an_admin_resume_closes_every_vote_cast_before_it(tmp_path, started):
    config = config_for(tmp_path, users_min=2)
    where = config.admin.history_dir
    cast(config, "101", now=T0, uid=1)
    cast(config, "102", now=T0 + 1, uid=2)
    history.record_resume(where, "b", "admin", when=T0 + 10)
    # One more job after the resume is one vote, not three.
    assert "(1/3 votes, 1 user(s))" in cast(config, "103", now=T0 + 20, uid=1)
    assert suspects.open_flags(history.read_dirs(config)) == {} and started == []


def test_a_passed_qualification_closes_the_flag_and_the_votes(tmp_path, started):
    from gpugate.store.qualify import QualifyEntry, record_qualification

    config = config_for(tmp_path, votes_needed=1)
    where = config.admin.history_dir
    cast(config, "101", now=T0, uid=1)
    assert "b" in suspects.open_flags(history.read_dirs(config))
    entry = QualifyEntry(node="b", when=T0 + 30, passed=True, level=1, tests=[], run_id="q",
                         job_ids=["9"], why="", by="root", trigger="suspect (votes): ...")  # fmt: skip
    record_qualification(where, entry)
    assert suspects.open_flags(history.read_dirs(config)) == {}
    assert suspects.open_votes(history.read_dirs(config), "b", 72, now=T0 + 60) == []
    # A refused resume closes nothing; a failed qualification neither. (Another user: uid 1
    # has had its share of qualifications today.)
    assert "flagged b" in cast(config, "102", now=T0 + 60, uid=2)
    history.record_resume(where, "b", "admin", when=T0 + 70, resumed=False)
    record_qualification(where, entry.replace(when=T0 + 80, passed=False))
    assert "b" in suspects.open_flags(history.read_dirs(config)) and len(started) == 2


def test_the_suspects_allowance_turns_further_flags_into_reviews(tmp_path, started):
    config = config_for(tmp_path, votes_needed=1)
    config = config.replace(health=config.health.replace(suspect_qualify_per_day=1))
    assert "qualify" in cast(config, "101", now=T0, uid=1)
    other = [summary("a", "2026-12-01T10:00:00Z"), summary("b", "2026-12-01T10:10:00Z"),
             summary("c", "2026-12-01T10:10:00Z")]  # fmt: skip
    said = cast(config, "102", summaries=other, now=T0 + 60, uid=2)
    assert "flagged a" in said and "review: the suspects' allowance is spent" in said
    assert len(started) == 1
    assert suspects.open_flags(history.read_dirs(config))["a"].action == "review"
    # A day later there is room again.
    history.record_resume(config.admin.history_dir, "a", "admin", when=T0 + 100)
    assert "qualify" in cast(config, "103", summaries=other, now=T0 + 86400 + 200, uid=3)


def first(node: str) -> list[dict]:
    """Bundles of a job on a, b, c in which `node` failed ten minutes before the others."""
    return [summary(n, "2026-12-01T10:00:00Z" if n == node else "2026-12-01T10:10:00Z")
            for n in NODES]  # fmt: skip


def shares_config(tmp_path):
    """Two votes of two users flag a node; one vote a user; the packaged allowance and share."""
    config = config_for(tmp_path, votes_needed=2, users_min=2)
    hc = config.health
    assert (hc.suspect_qualify_per_day, hc.suspect_qualify_per_user_per_day) == (2, 1)
    return config.replace(health=config.health.replace(suspect_votes_per_user=1))


def test_two_users_spend_their_shares_and_a_genuine_suspect_still_gets_its_qualification(
    tmp_path, started
):
    # Issue 41 R4: two users' faked failures used to spend the cluster's whole allowance.
    config = shares_config(tmp_path)
    cast(config, "101", first("b"), now=T0, uid=1001)
    said = cast(config, "102", first("b"), now=T0 + 1, uid=1002)
    assert "flagged b" in said and "qualification started" in said, said
    cast(config, "103", first("c"), now=T0 + 2, uid=1001)
    said = cast(config, "104", first("c"), now=T0 + 3, uid=1002)
    assert "flagged c" in said and "review: the share of every user" in said, said
    assert "uid 1001, 1002" in said
    # Two other users' jobs point at a: its qualification starts (the allowance has room).
    cast(config, "105", first("a"), now=T0 + 4, uid=2001)
    said = cast(config, "106", first("a"), now=T0 + 5, uid=2002)
    assert "flagged a" in said and "qualification started" in said, said
    assert [n for n, _ in started] == ["b", "a"]
    flags = suspects.open_flags(history.read_dirs(config))
    assert {n: (f.action, f.uids) for n, f in flags.items()} == {
        "b": ("qualify", [1001, 1002]),
        "c": ("review", [1001, 1002]),
        "a": ("qualify", [2001, 2002]),
    }
    charged = suspects.qualifications_charged(history.read_dirs(config), T0 - 1)
    assert charged == dict.fromkeys((1001, 1002, 2001, 2002), 1)
    # A day later the shares are whole again.
    history.record_resume(config.admin.history_dir, "c", "admin", when=T0 + 10)
    cast(config, "107", first("c"), now=T0 + 86400 + 10, uid=1001)
    assert "qualification started" in cast(config, "108", first("c"), now=T0 + 86400 + 11, uid=1002)


def test_a_flag_with_one_user_whose_share_is_left_asks_for_a_qualification(tmp_path, started):
    config = shares_config(tmp_path)
    cast(config, "101", first("b"), now=T0, uid=1001)
    cast(config, "102", first("b"), now=T0 + 1, uid=1002)
    cast(config, "103", first("c"), now=T0 + 2, uid=1001)
    assert "qualification started" in cast(config, "104", first("c"), now=T0 + 3, uid=3001)
    assert [n for n, _ in started] == ["b", "c"]


def test_jobs_of_unknown_users_share_one_share(tmp_path, started):
    config = config_for(tmp_path, votes_needed=1)
    assert "qualification started" in cast(config, "101", first("b"), now=T0)
    said = cast(config, "102", first("c"), now=T0 + 1)
    assert "review: the share of every user" in said and "uid unknown" in said, said


def test_flags_from_before_the_shares_are_charged_to_nobody(tmp_path, started):
    config = config_for(tmp_path, votes_needed=1)
    old = {"node": "c", "when": T0, "at": "x", "source": "votes", "detail": "d", "note": "",
           "jobs": ["1"], "users": 2, "action": "qualify"}  # fmt: skip
    (tmp_path / "hist").mkdir()
    (tmp_path / "hist" / "suspect-flags.jsonl").write_text(json.dumps(old) + "\n")
    assert suspects.qualifications_charged(str(tmp_path / "hist"), T0 - 1) == {}
    assert "qualification started" in cast(config, "101", first("b"), now=T0 + 1, uid=1)


def test_the_controllers_votes_count_in_its_directory_whatever_the_history(tmp_path):
    config = config_for(tmp_path)
    local = config.replace(admin=config.admin.replace(history_dir=None))
    assert suspicion.cluster_wide(local, history.controller_dir(local))
    assert not suspicion.cluster_wide(local, local.state_dir)
    assert suspicion.cluster_wide(config, config.admin.history_dir)


def test_selftest_says_where_the_allowance_is_counted(tmp_path):
    config = config_for(tmp_path)
    note = suspicion.allowance_note(config)
    assert note.startswith(f"suspect allowance: counted cluster-wide in {tmp_path / 'hist'} ")
    local = config.replace(admin=config.admin.replace(history_dir=None))
    note = suspicion.allowance_note(local)
    assert note.startswith("suspect allowance: per node: application-Xid flags go to review")
    assert str(tmp_path / "state" / "controller") in note


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"health": {"suspect_action": "review"}}, "suspect_action: review"),
        ({"qualify": None}, "no qualify: section"),
    ],
)
def test_a_flag_asks_for_an_admins_look_when_gpugate_cannot_qualify(
    tmp_path, started, changes, why
):
    config = config_for(tmp_path, votes_needed=1)
    if "health" in changes:
        config = config.replace(health=config.health.replace(**changes["health"]))
    else:
        config = config.replace(qualify=None)
    said = cast(config, "101", uid=1)
    assert "review: " in said and why in said and started == []


def test_not_as_root_a_flag_waits_for_the_sweep(tmp_path, started, monkeypatch):
    monkeypatch.setattr(suspicion.os, "geteuid", lambda: 64030)  # SlurmUser=slurm
    said = cast(config_for(tmp_path, votes_needed=1), "101", uid=1)
    assert "not root here" in said and started == []


def test_votes_outside_the_window_do_not_count(tmp_path, started):
    config = config_for(tmp_path, window_h=1)
    cast(config, "101", now=T0)
    cast(config, "107", now=T0 + 3600 * 2)
    # 101 is out of the hour: two votes, not three.
    assert "(2/3 votes" in cast(config, "112", now=T0 + 3600 * 2 + 60)
    assert started == []


@pytest.mark.parametrize(
    ("changes", "summaries"),
    [
        ({"state": "CANCELLED by 1000"}, B_FIRST),
        ({"state": "TIMEOUT"}, B_FIRST),
        # The suspect's own failure is the job's doing (its OOM).
        ({}, [*B_FIRST[:1], summary("b", "2026-12-01T10:00:00Z", "cuda_oom"), B_FIRST[2]]),
    ],
)
def test_jobs_ended_by_their_user_cast_no_vote(tmp_path, started, changes, summaries):
    config = config_for(tmp_path, votes_needed=1)
    said = cast(config, "101", summaries=summaries, **changes)
    assert said.startswith("no vote") and started == []
    assert votes(history.read_dirs(config)) == []


@pytest.mark.parametrize(
    "changes",
    [{"nodes": ("b",)}, {"exit_code2": "0:0", "state": "COMPLETED"}],
)
def test_single_node_and_successful_jobs_do_not_vote(tmp_path, changes):
    config = config_for(tmp_path, votes_needed=1)
    assert cast(config, "101", **changes) is None


def test_voting_off_with_zero_votes(tmp_path):
    assert cast(config_for(tmp_path, votes_needed=0), "101") is None


def test_a_tie_records_no_vote(tmp_path):
    config = config_for(tmp_path, votes_needed=1)
    tied = [summary("a", "2026-12-01T10:00:00Z"), summary("b", "2026-12-01T10:00:00Z")]
    said = cast(config, "101", summaries=tied, nodes=("a", "b"))
    assert said.startswith("no suspect") and votes(history.read_dirs(config)) == []


def test_the_controller_epilog_votes_from_the_bundles(tmp_path, started):
    from gpugate.hooks.epilog_slurmctld import run_requeue
    from gpugate.store.controller_view import done, write_record

    config = config_for(tmp_path, votes_needed=1)
    for s in B_FIRST:
        write_record(config.evidence_dir, "101", s["node"], 0, done(s))
    slurm = FakeSlurm(nodes=NODES)
    run_requeue(config, failed_job("101", comment="", uid=5), slurm, wait_s=0)
    assert slurm.drains == [] and [n for n, _ in started] == ["b"]


def test_the_flag_names_the_newest_jobs_when_there_are_many():
    detail = suspects.suspect_detail([str(i) for i in range(10)], 3)
    assert detail == "first to fail in jobs 2,3,4,5,6,7,8,9 +2 more of 3 user(s)"


def test_malformed_flag_lines_are_skipped(tmp_path):
    good = {"node": "b", "when": T0, "at": "x", "source": "votes", "detail": "d", "note": "",
            "jobs": ["1"], "users": 2, "action": "qualify"}  # fmt: skip
    bad = [{**good, "source": "printed"}, {**good, "jobs": [1]}, {**good, "users": -1},
           {**good, "uids": [-1]}, {**good, "uids": ["alice"]}, {**good, "uids": 1001},
           {**good, "uids": list(range(suspects.USERS_KEPT + 1))}]  # fmt: skip
    lines = [json.dumps(good), "{torn", *map(json.dumps, bad)]
    (tmp_path / "suspect-flags.jsonl").write_text("\n".join(lines) + "\n")
    assert len(suspects.flags(str(tmp_path))) == 1


# ------------------------------------------------------------------------ rma_candidate


def test_rma_candidate_counts_drains_for_the_same_hardware_check_in_the_window(tmp_path):
    config = config_for(tmp_path)
    where = config.admin.history_dir
    window = config.admin.history_window_days * 86400
    # Apart by more than SAME_EVENT_S, with a resume between: separate drains.
    for i in range(2):
        history.record_drain(where, "b", "gpugate: gpu.ecc: x", when=T0 + i * 3600)
        history.record_resume(where, "b", "admin", when=T0 + i * 3600 + 1)
    history.record_drain(where, "b", "gpugate: gpu.temperature: hot", when=T0 + 7200)
    assert not history.rma_candidate(config, "b", "gpu.ecc", now=T0 + 8000)
    history.record_drain(where, "b", "gpugate: gpu.ecc: x", when=T0 + 3 * 3600)
    assert history.rma_candidate(config, "b", "gpu.ecc", now=T0 + 4 * 3600)
    # Out of the window, another node, a transient check: no.
    assert not history.rma_candidate(config, "b", "gpu.ecc", now=T0 + window + 1)
    assert not history.rma_candidate(config, "a", "gpu.ecc", now=T0 + 4 * 3600)
    for i in range(3):
        history.record_drain(where, "c", "gpugate: host.mounts: slow", when=T0 + i * 3600)
        history.record_resume(where, "c", "admin", when=T0 + i * 3600 + 1)
    assert not history.rma_candidate(config, "c", "host.mounts", now=T0 + 4 * 3600)


def test_rma_candidate_off_with_zero(tmp_path):
    config = config_for(tmp_path)
    config = config.replace(admin=config.admin.replace(rma_after_drains=0))
    history.record_drain(config.admin.history_dir, "b", "gpugate: gpu.ecc: x", when=T0)
    assert not history.rma_candidate(config, "b", "gpu.ecc", now=T0 + 1)


@pytest.mark.parametrize(("count", "expected"), [(2, False), (3, True), (4, True)])
def test_the_rma_rule_is_the_one_gpugate_nodes_shows(count, expected):
    from gpugate.admin.nodes import RMA, suggest_action

    assert history.reaches_rma(True, count, 3) is expected
    assert (
        suggest_action("gpu.ecc", "gpugate: gpu.ecc: x", same_check_drains=count) == RMA
    ) is expected


def test_a_transient_check_that_keeps_coming_back_is_no_rma_candidate(tmp_path):
    from gpugate.admin.nodes import COOLING, suggest_action

    config = config_for(tmp_path)
    for i in range(3):
        history.record_drain(config.admin.history_dir, "b", "gpugate: gpu.temperature: hot",
                             when=T0 + i * 3600)  # fmt: skip
    # gpu.temperature is the node's own fault (hardware=True) but heals by itself.
    assert not history.rma_candidate(config, "b", "gpu.temperature", now=T0 + 4 * 3600)
    reason = "gpugate: gpu.temperature: GPU4 91 C > 85"
    assert suggest_action("gpu.temperature", reason, same_check_drains=3) == COOLING


# ------------------------------------------------------- gpugate nodes and gpugate report


def open_flag(node: str = "gpu-02", action: str = "qualify", when: float = T0) -> FlagEntry:
    return FlagEntry(node=node, when=when, at=history.iso(when), source="votes",
                     detail="first to fail in jobs 11,12,13 of 2 user(s)", jobs=["11", "12", "13"],
                     users=2, action=action, note="")  # fmt: skip


def test_gpugate_nodes_lists_a_suspect_in_service_with_what_was_asked():
    from admin_site import node

    from gpugate.admin import nodes as A

    nodes = [node("gpu-01", flags=()), node("gpu-02", flags=()), node("gpu-03", flags=())]
    rows = A.node_rows(A.as_groups(nodes), [], "/ev", now=T0, suspects={"gpu-02": open_flag()})
    assert [r.node for r in rows] == ["gpu-02", "gpu-01", "gpu-03"]
    first = rows[0]
    assert first.action == A.SUSPECT and first.drained is False
    assert first.suspect.source == "votes" and first.suspect.asked == "qualify"
    line = next(x for x in A.render_table(rows).splitlines() if x.startswith("gpu-02"))
    assert "pointed at by users' jobs (votes): first to fail in jobs 11,12,13" in line
    assert "(not drained)" in line
    # --drained keeps it too: it waits for an admin or its qualification.
    only = A.node_rows(A.as_groups(nodes), [], "/ev", now=T0, drained_only=True,
                       suspects={"gpu-02": open_flag()})  # fmt: skip
    assert [r.node for r in only] == ["gpu-02"]
    json.loads(A.rows_json(rows))  # every value stays JSON (and hashable for rows_json)


@pytest.mark.parametrize(
    ("qualified", "resumed", "outcome"),
    [
        (None, None, "awaiting: qualification started"),
        (True, None, "qualified and cleared (level 1, job 31): kept in service"),
        (False, None, "qualification failed (job 31): dcgm: memory"),
        (None, True, "closed by a resume (alice"),
    ],
)
def test_the_report_shows_what_became_of_each_suspect(qualified, resumed, outcome):
    from report_page import Page

    from gpugate.admin import report as R
    from gpugate.store.qualify import QualifyEntry

    quals = []
    if qualified is not None:
        quals = [QualifyEntry(node="gpu-02", when=T0 + 600, at=history.iso(T0 + 600), level=1,
                              passed=qualified, tests=[], job_ids=["31"], why="dcgm: memory",
                              run_id="r", by="gpugate (suspect)",
                              trigger="suspect (votes): first to fail in jobs 11,12,13")]  # fmt: skip
    resumes = []
    if resumed:
        resumes = [AuditEntry(node="gpu-02", when=T0 + 60, who="alice", resumed=True)]
    page = R.render_html([], [], resumes, now=T0 + 3600, qualifications=quals,
                         flags=[open_flag()])  # fmt: skip
    text = Page(page).all_text
    assert "first to fail in jobs 11,12,13 of 2 user(s)" in text and outcome in text, text
    if qualified is not None:
        assert "suspect (votes): first to fail in jobs 11,12,13" in text  # "Asked by"


def test_an_admins_resume_of_a_suspect_in_service_clears_it_audited(tmp_path, started):
    from gpugate.commands.resume import clear_suspicion

    config = config_for(tmp_path, votes_needed=1)
    where = config.admin.history_dir
    assert clear_suspicion(config, "b", "looked") is None  # nothing to clear
    cast(config, "101", now=time.time() - 60, uid=1)
    said = clear_suspicion(config, "b", "cable reseated, DCGM r3 clean")
    assert "suspicion (votes: first to fail in jobs 101 of 1 user(s)) is cleared" in said
    assert suspects.open_flags(history.read_dirs(config)) == {}
    (entry,) = history.resumes(where, "b")
    assert entry.why == "cable reseated, DCGM r3 clean" and entry.resumed is True
    assert (entry.reason or "").startswith("suspect: first to fail")


# ------------------------------------------------------- the failing rank's node (issue 30)


def test_the_failing_node_named_by_a_bundle_is_the_vote_not_the_first_to_notice(tmp_path):
    config = config_for(tmp_path, votes_needed=3)
    # b's time stamps come first, but the batch host's diagnosis names c's rank as the origin.
    named = [*B_FIRST[:2], {**B_FIRST[2], "failing_node": "c"}]
    said = cast(config, "101", summaries=named)
    assert said.startswith("suspect c "), said
    assert [v.node for v in votes(history.read_dirs(config))] == ["c"]


def test_a_failing_node_outside_the_job_or_disputed_falls_back_to_the_time_stamps(tmp_path):
    config = config_for(tmp_path, votes_needed=3)
    stranger = [*B_FIRST[:2], {**B_FIRST[2], "failing_node": "z"}]
    assert cast(config, "101", summaries=stranger).startswith("suspect b ")
    split = [{**B_FIRST[0], "failing_node": "a"}, B_FIRST[1], {**B_FIRST[2], "failing_node": "c"}]
    assert cast(config, "102", summaries=split).startswith("suspect b ")
    only = [{**B_FIRST[2], "failing_node": "c"}]
    assert suspicion.failing_node(failed_job("103"), views(only)) == (
        "c",
        parse_utc("2026-12-01T10:10:01Z"),
    )

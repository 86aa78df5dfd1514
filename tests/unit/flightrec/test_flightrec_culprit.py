"""The culprit: merged records of PyTorch's own dumps name the rank the others waited for."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import paths
import pytest
from factories import views

from gpugate.flightrec.culprit import find_culprit, job_culprit
from gpugate.flightrec.reader import read_dump
from gpugate.store.history import read_dirs

FIX = paths.FIXTURES / "flightrec"


def _records(scenario: str, form: str = "pickle") -> list[dict]:
    recs = []
    for path in sorted((FIX / scenario / form).iterdir()):
        rec = read_dump(path.read_bytes(), path.name)
        recs.append({**rec, "node": f"n{rec['rank'] // 2 + 1}"})  # two ranks per node
    return recs


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_healthy_names_nobody(form: str) -> None:
    assert find_culprit(_records("healthy", form)) is None


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_sleeper_never_entered(form: str) -> None:
    found = find_culprit(_records("not_entered", form))
    assert (found["rank"], found["node"], found["state"]) == (1, "n1", "not_entered")
    assert (found["pg_id"], found["pg_name"], found["op"], found["seq"]) == (
        "0",
        "default_pg",
        "all_reduce",
        4,
    )
    assert found["waiting_ranks"] == [0, 2] and found["ranks_seen"] == 3
    assert found["text"] == (
        "rank 1 on n1 never entered all_reduce #4 of process group 0 (default_pg); ranks 0, 2 waited for it"
    )


def test_rank_without_a_dump_is_gone() -> None:
    found = find_culprit(_records("gone"))
    assert (found["rank"], found["node"], found["state"], found["seq"]) == (2, None, "gone", 4)
    assert found["waiting_ranks"] == [0, 1] and found["ranks_seen"] == 2


def test_gone_hidden_when_gloo_counts_the_timeout_as_completed() -> None:
    # the JSON dump was taken a moment later: gloo had marked #4 completed (with its error) on
    # both ranks, so nothing is provably stuck and nobody is blamed
    assert find_culprit(_records("gone", "json")) is None


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_second_group_victims_are_not_blamed(form: str) -> None:
    # rank 2 waits in the default group for ranks 0 and 1; rank 0 itself waits in group 1 for
    # rank 1, who is in compute: rank 1 is the one
    found = find_culprit(_records("subgroup", form))
    assert (found["rank"], found["state"], found["pg_id"], found["seq"]) == (
        1,
        "not_entered",
        "1",
        2,
    )
    assert found["waiting_ranks"] == [0]


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_mismatched_collective(form: str) -> None:
    found = find_culprit(_records("mismatch", form))
    assert (found["rank"], found["state"], found["seq"], found["op"]) == (
        2,
        "mismatch",
        4,
        "all_reduce",
    )
    assert found["calls"]["2"]["op"] == "all_gather" and found["waiting_ranks"] == [0, 1]
    assert "rank 2 called all_gather" in found["text"]


def test_in_collective() -> None:
    # built from the real not_entered records: rank 1 entered #4 and never finished it, while
    # the others finished (their timeout is counted as completed by gloo)
    recs = _records("not_entered")
    recs[1]["pgs"]["0"]["last_enqueued"] = 4
    found = find_culprit(recs)
    assert (found["rank"], found["state"], found["seq"]) == (1, "in_collective", 4)
    assert "entered but never finished all_reduce #4" in found["text"]


def test_two_groups_blaming_different_ranks_is_ambiguous() -> None:
    recs = _records("not_entered")
    other = copy.deepcopy(recs)
    for r in other:  # the same picture in group 5, but rank 2 is the late one
        r["pgs"] = {"5": {**r["pgs"]["0"], "last_enqueued": 3 if r["rank"] == 2 else 4}}
        r["entries"] = [{**e, "pg_id": "5"} for e in r["entries"]]
    merged = [{**a, "pgs": {**a["pgs"], **b["pgs"]}, "entries": a["entries"] + b["entries"]}
              for a, b in zip(recs, other)]  # fmt: skip
    # rank 1 also waits in group 5 and rank 2 waits in group 0: each is a victim elsewhere
    found = find_culprit(merged)
    assert found["state"] == "ambiguous" and found["rank"] is None
    assert sorted(c["culprits"][0] for c in found["candidates"]) == [1, 2]


def test_records_without_rank_ignored() -> None:
    recs = _records("not_entered")
    recs[1]["rank"] = None
    found = find_culprit(recs)
    assert found is None or found["rank"] != 1


def _bundle(tmp_path: Path, node: str, records: list[dict], errors: list | None = None) -> str:
    d = tmp_path / node
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"node": node}))
    (d / "flightrec.json").write_text(json.dumps({"records": records, "errors": errors or []}))
    return str(d)


def test_job_culprit_merges_nodes(tmp_path: Path) -> None:
    recs = _records("not_entered")
    dirs = [_bundle(tmp_path, "n1", recs[:2]), _bundle(tmp_path, "n2", recs[2:])]
    found = job_culprit(dirs)
    assert found is not None and (found.rank, found.node, found.state) == (1, "n1", "not_entered")
    assert found.errors == []


def test_job_culprit_reports_refused_dumps(tmp_path: Path) -> None:
    err = [
        {"name": "nccl_trace_rank_0", "error": "refused: the pickle names the global builtins.exec"}
    ]
    found = job_culprit([_bundle(tmp_path, "n1", [], err)])
    assert found is not None and found.rank is None and found.errors
    assert found.errors[0]["node"] == "n1" and "builtins.exec" in found.text
    # No culprit, only refusals: the keys of that shape alone.
    assert list(found.to_json()) == ["rank", "node", "state", "text", "errors"]


def test_job_culprit_validates_bundle_content(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    d.mkdir()
    (d / "flightrec.json").write_text("{not json")
    bad = _bundle(tmp_path, "n2", [{"rank": "0", "pgs": {}}, {"rank": 1, "pgs": [], "entries": 3}])
    link = tmp_path / "n3"
    link.mkdir()
    (link / "flightrec.json").symlink_to(d / "flightrec.json")
    found = job_culprit([str(d), bad, str(link), str(tmp_path / "absent")])
    assert found is not None and found.errors is not None
    why = [e["error"] for e in found.errors]
    assert any("not JSON" in w for w in why) and any("symlink" in w for w in why)
    assert sum("without rank or pgs" in w for w in why) == 2


def test_job_culprit_nothing(tmp_path: Path) -> None:
    assert job_culprit([str(tmp_path)]) is None
    assert job_culprit([_bundle(tmp_path, "n1", _records("healthy"))]) is None


# ------------------------------------------------------------------ gpugate evidence JOB


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nevidence_dir: {tmp_path / 'ev'}\n")
    monkeypatch.setenv("GPUGATE_CONFIG", str(cfg))
    return tmp_path


def _written(
    site: Path, job: str, node: str, records: list[dict], errors: list | None = None
) -> str:
    from gpugate.store.evidence import write_bundle

    member = json.dumps({"records": records, "errors": errors or []})
    summary = {"job_id": job, "node": node, "category": "nccl_timeout"}
    return write_bundle(str(site / "ev"), job, node, 0, {"flightrec.json": member}, summary)


def test_evidence_of_a_job_names_the_culprit(site: Path, capsys: pytest.CaptureFixture) -> None:
    from gpugate import cli

    recs = _records("not_entered")
    _written(site, "77", "gpu-01", recs[:1])
    _written(site, "77", "gpu-02", recs[1:])
    assert cli.main(["evidence", "77", "--json"]) == 0
    fr = json.loads(capsys.readouterr().out)["flight_recorder"]
    assert (fr["rank"], fr["node"], fr["state"], fr["seq"]) == (1, "gpu-02", "not_entered", 4)
    assert cli.main(["evidence", "77"]) == 0
    assert (
        "flight recorder: rank 1 on gpu-02 never entered all_reduce #4" in capsys.readouterr().out
    )


def test_evidence_of_a_job_without_dumps(site: Path, capsys: pytest.CaptureFixture) -> None:
    from gpugate import cli
    from gpugate.store.evidence import write_bundle

    write_bundle(
        str(site / "ev"), "78", "gpu-01", 0, {"x.log": "x\n"}, {"job_id": "78", "node": "gpu-01"}
    )
    assert cli.main(["evidence", "78", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["flight_recorder"] is None
    assert cli.main(["evidence", "78"]) == 0
    assert "flight recorder" not in capsys.readouterr().out


# ------------------------------------------------------------------- gpugate diagnose DIRS

WATCHDOG = (
    "[rank{r}]:[E0102 03:04:2{r}.000000 77 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, "
    "Timeout(ms)=3000) ran for 3005 milliseconds before timing out.\n"
)


def _diag_bundle(tmp_path: Path, node: str, ranks: list[int], records: list[dict] | None) -> str:
    d = tmp_path / "4711" / f"{node}-r0"
    (d / "logs").mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"job_id": "4711", "node": node}))
    (d / "kernel.log").write_text("")
    tail = "".join(WATCHDOG.format(r=r) for r in ranks)
    (d / "logs" / "00-slurm-4711.out.tail").write_text("# tail of slurm-4711.out\n" + tail)
    if records is not None:
        (d / "flightrec.json").write_text(json.dumps({"records": records, "errors": []}))
    return str(d)


def test_diagnose_names_the_culprit_of_a_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from gpugate.commands import diagnose

    recs = _records("not_entered")
    a = _diag_bundle(tmp_path, "gpu01", [0, 2], [recs[0], recs[2]])
    b = _diag_bundle(tmp_path, "gpu02", [], [recs[1]])
    assert diagnose.main(["--json", a, b]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["category"] == "nccl_timeout"
    assert (out["flight_recorder"]["rank"], out["flight_recorder"]["node"]) == (1, "gpu02")
    assert "Flight recorder: rank 1 on gpu02 never entered all_reduce #4" in out["summary"]
    diagnose.main([a, b])
    assert "Flight recorder: rank 1 on gpu02 never entered" in capsys.readouterr().out


def test_diagnose_without_flightrec(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from gpugate.commands import diagnose

    a = _diag_bundle(tmp_path, "gpu01", [0, 1], None)
    assert diagnose.main(["--json", a]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["flight_recorder"] is None and "Flight recorder" not in out["summary"]


# -------------------------------------------------- the controller epilog: votes, requeue

C_FIRST = [  # the time stamps say c failed first; the flight recorder says b never entered
    {"node": "a", "first_failure_at": "2026-12-01T10:10:00Z", "category": "nccl_timeout"},
    {"node": "b", "first_failure_at": "2026-12-01T10:10:01Z", "category": "nccl_timeout"},
    {"node": "c", "first_failure_at": "2026-12-01T10:00:00Z", "category": "nccl_timeout"},
]


def _controller_site(tmp_path: Path, job_id: str, users_min: int = 1):
    from factories import default_config

    config = default_config()
    config = config.replace(
        state_dir=str(tmp_path / "state"),
        evidence_dir=str(tmp_path / "ev"),
        admin=config.admin.replace(history_dir=str(tmp_path / "hist")),
        budget=config.budget.replace(settle_s=0, jitter_s=0, min_drains_allowed=3),
        health=config.health.replace(
            suspect_votes=2, suspect_window_h=72, suspect_users_min=users_min
        ),
    )
    _fr_bundles(tmp_path, job_id)
    return config


def _fr_bundles(tmp_path: Path, job_id: str) -> None:
    """Each node's decision record with its flight-recorder digest, as the epilog writes it."""
    from gpugate.store.controller_view import done, write_record

    for rec in _records("not_entered"):  # rank r on node "abc"[r]
        node = "abc"[rec["rank"]]
        s = next(s for s in C_FIRST if s["node"] == node)
        write_record(str(tmp_path / "ev"), job_id, node, 0, done(s, {"records": [rec]}))


def _with_fr(summaries: list[dict]) -> list[dict]:
    """The summaries as the controller reads them: each with its node's digest."""
    from gpugate.store.controller_view import fr_digest

    digests = {"abc"[r["rank"]]: fr_digest({"records": [r]}) for r in _records("not_entered")}
    return [dict(s, flightrec=digests[s["node"]]) for s in summaries]


def _job(job_id: str, uid: int = 1001):
    from gpugate.gate.requeue import JobEnd

    return JobEnd(job_id=job_id, state="FAILED", exit_code2="1:0", nodes=("a", "b", "c"), uid=uid)


def test_the_flight_recorder_culprit_gets_the_vote(tmp_path: Path) -> None:

    from gpugate.gate.suspicion import vote
    from gpugate.store.suspects import votes

    config = _controller_site(tmp_path, "301")
    said = vote(config, _job("301"), views(_with_fr(C_FIRST)), "nccl_timeout", 1_800_000_000.0)
    assert "suspect b" in said
    (v,) = votes(read_dirs(config))
    assert (v.node, v.job, v.first_failure_at) == ("b", "301", "2026-12-01T10:10:01Z")


def test_the_culprit_vote_of_one_user_flags_nothing(tmp_path: Path) -> None:
    from gpugate.gate.suspicion import vote
    from gpugate.store.suspects import open_flags

    config = _controller_site(tmp_path, "302", users_min=2)
    for i, job_id in enumerate(("302", "312", "322")):  # one user's jobs: votes only
        if i:
            _fr_bundles(tmp_path, job_id)
        said = vote(config, _job(job_id), views(_with_fr(C_FIRST)), "nccl_timeout", 1.8e9 + i)
    assert open_flags(read_dirs(config)) == {} and "not flagged" in said


def test_culprit_by_its_own_doing_casts_no_vote(tmp_path: Path) -> None:
    from gpugate.gate.suspicion import vote

    config = _controller_site(tmp_path, "303")
    own = [dict(s, category="cuda_oom") if s["node"] == "b" else s for s in C_FIRST]
    said = vote(config, _job("303"), views(_with_fr(own)), "nccl_timeout", 1.8e9)
    assert said.startswith("no vote: b failed first")


def test_requeue_excludes_the_culprit_only_with_roots_evidence(tmp_path: Path) -> None:
    from gpugate.gate.flightrec_votes import with_culprit
    from gpugate.store.suspects import record_vote

    config = _controller_site(tmp_path, "304")
    job = _job("304")
    assert with_culprit(config, job, views(_with_fr(C_FIRST)), ()) == ()  # the dumps alone: nothing
    hw = [dict(s, hardware_fault=s["node"] == "b") for s in _with_fr(C_FIRST)]
    assert with_culprit(config, job, views(hw), ("c",)) == ("b", "c")  # agrees with its hardware
    record_vote(config.admin.history_dir, "b", "250", "nccl_timeout", None, None, uid=7)
    assert with_culprit(config, job, views(_with_fr(C_FIRST)), ()) == ("b",)  # repeated suspicion


def test_run_requeue_excludes_a_culprit_with_history(tmp_path: Path) -> None:
    from fakes import FakeSlurm

    from gpugate.hooks.epilog_slurmctld import run_requeue
    from gpugate.store.suspects import record_vote

    config = _controller_site(tmp_path, "305")
    job = _job("305").replace(state="NODE_FAIL", comment="gpugate:requeue")
    slurm = FakeSlurm(nodes=("a", "b", "c"))
    decision, _ = run_requeue(config, job, slurm, wait_s=0, dry_run=True)
    assert decision.requeue and decision.suspects == ()
    record_vote(config.admin.history_dir, "b", "250", "nccl_timeout", None, None, uid=7)
    decision, done = run_requeue(config, job, slurm, wait_s=0, dry_run=True)
    assert decision.suspects == ("b",) and any("exclude b" in d for d in done)


def test_a_requeued_job_is_told_which_rank_stopped_first(tmp_path: Path) -> None:
    from fakes import FakeSlurm

    from gpugate.hooks.epilog_slurmctld import run_requeue

    config = _controller_site(tmp_path, "306")
    # No detached start-now child: it would poll a real Slurm for the job (tests/unit/gate/test_requeue.py).
    config = config.replace(requeue=config.requeue.replace(start_now=False))
    job = _job("306").replace(state="NODE_FAIL", comment="gpugate:requeue")
    from gpugate.slurm.records import JobInfo

    held = JobInfo(job_id=306, state="NODE_FAIL", nodes=("a", "b", "c"), requeue=True)
    slurm = FakeSlurm(nodes=("a", "b", "c"), jobs=[held])
    decision, done = run_requeue(config, job, slurm, wait_s=0)
    assert decision.requeue and "flight recorder comment" in done
    comment = slurm.job("306").admin_comment
    assert "gpugate: flight recorder (the job's dumps): rank 1 on b never entered" in comment
    # Told once: a second controller epilog of the same run writes nothing more.
    from gpugate.act.execute import Hands, execute
    from gpugate.act.plans import requeued_notes
    from gpugate.gate.flightrec_votes import culprit_comment

    text = culprit_comment(job, views(_with_fr(C_FIRST)))
    assert text.startswith("flight recorder (the job's dumps): rank 1 on b never entered")
    again = execute(requeued_notes("306", [("flight recorder comment", text)]),
                    Hands(config, slurm)).lines()  # fmt: skip
    assert again == ["flight recorder comment (unchanged: already there, or no room)"]


@pytest.mark.parametrize("scenario", ["healthy", "not_entered", "gone", "subgroup", "mismatch"])
def test_the_controllers_digest_names_the_same_culprit_as_the_dumps(scenario: str) -> None:
    # The decision record carries a digest (no frames, the newest entries): the controller,
    # which reads only that, must reach the verdict the full records reach.
    from gpugate.flightrec.culprit import records_culprit
    from gpugate.store.controller_view import fr_digest

    recs = _records(scenario)
    by_node: dict[str, list[dict]] = {}
    for rec in recs:
        by_node.setdefault(rec["node"], []).append(rec)
    digests = [(n, fr_digest({"records": rs})) for n, rs in by_node.items()]
    full, digest = find_culprit(recs), records_culprit(digests)
    if full is None:
        assert digest is None
    else:
        assert digest is not None and digest.text == full["text"]
        assert {k: v for k, v in digest.to_json().items() if k != "errors"} == full
        assert (digest.rank, digest.node, digest.state) == (
            full["rank"], full["node"], full["state"])  # fmt: skip

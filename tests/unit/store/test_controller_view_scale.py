"""The controller's read of a large job (issue 32): done records read once, the job's digest,
at most requeue.max_records records in full, a byte budget, and what was not read said."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
from factories import default_config

from gpugate.config import ConfigError, load_config
from gpugate.gate.requeue import JobEnd, cause, decide_requeue
from gpugate.store import controller_view as V
from gpugate.store import evidence as E
from gpugate.store.suspects import first_to_fail

pytestmark = pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`

JOB = "9"
MAX = 64


def names(n: int) -> tuple[str, ...]:
    return tuple(f"n{i:04d}" for i in range(1, n + 1))


def at(second: int) -> str:
    return f"2026-11-29T10:{second // 60:02d}:{second % 60:02d}Z"


def timeout(node: str, second: int) -> dict:
    """A rank that timed out waiting for the others: the common record of a failed job."""
    return {"node": node, "category": "nccl_timeout", "confidence": "medium",
            "first_failure_at": at(second)}  # fmt: skip


def hardware(node: str, second: int) -> dict:
    return {"node": node, "hardware_fault": True, "category": "gpu_xid_hardware",
            "category_trusted": True, "first_hardware_error_at": at(second),
            "first_failure_at": at(second)}  # fmt: skip


def build(ev: Path, nodes: tuple[str, ...], special: dict[str, dict] | None = None) -> None:
    """Every node's done record, as the node epilogs write them (the digest with them)."""
    special = special or {}
    for i, node in enumerate(nodes):
        summary = special.get(node) or timeout(node, 600 + i % 100)
        V.write_record(str(ev), JOB, node, 0, V.done(summary))


class Clock:
    """A fake clock that sleep() moves forward."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.polls = 0

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.polls += 1


@pytest.fixture
def opens(monkeypatch):
    """Every os.open of a path below controller-view/, counted by path."""
    counted: dict[str, int] = {}
    real = os.open

    def counting(path, *args, **kwargs):
        if E.VIEW_DIR in str(path):
            counted[str(path)] = counted.get(str(path), 0) + 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    return counted


def read(ev: Path, nodes: tuple[str, ...], clock: Clock | None = None, **kw):
    clock = clock or Clock()
    kw.setdefault("max_records", MAX)
    return V.read_records(str(ev), JOB, nodes, 0, 60, 105, clock.sleep, clock.time, **kw)


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[Path, tuple[str, ...]]:
    """A 1,000-node job: n0900 has the hardware fault, n0700 failed first, the rest timed out."""
    ev = tmp_path_factory.mktemp("big")
    nodes = names(1000)
    build(ev, nodes, {"n0900": hardware("n0900", 500), "n0700": timeout("n0700", 100)})
    return ev, nodes


# ------------------------------------------------------------------------------ files opened


@pytest.mark.parametrize("n", [1, MAX])
def test_a_job_of_at_most_max_records_reads_every_record_once(tmp_path, opens, n):
    nodes = names(n)
    build(tmp_path, nodes)
    opens.clear()  # the writers' opens
    summaries, problems, _, account = read(tmp_path, nodes)
    assert len(summaries) == n and problems == {} and account.not_read == ()
    assert sum(opens.values()) == n and set(opens.values()) == {1}  # no digest opened
    assert account.opens == n and account.read == n and account.digest is None
    # The same records and order as every caller had before (wait_for_records).
    old, _, _ = V.wait_for_records(str(tmp_path), JOB, nodes, 0, 60, 105, Clock().sleep)
    assert summaries == old


def test_a_1000_node_job_opens_its_digest_and_max_records_records(big, opens):
    ev, nodes = big
    summaries, problems, _, account = read(ev, nodes)
    digest = V.digest_path(str(ev), JOB, 0)
    assert opens.pop(digest) == 1 and len(opens) == MAX and set(opens.values()) == {1}
    assert account.opens == MAX + 1 and account.read == MAX and account.records == 1000
    assert len(account.not_read) == 1000 - MAX and problems == {}
    # Every node is in the summaries: the unread ones by their digest line, marked partial.
    assert [s.node for s in summaries] == list(nodes)
    full = {s.node for s in summaries if not s.partial}
    assert len(full) == MAX and full.isdisjoint(account.not_read)


def with_late(ev: Path, nodes: tuple[str, ...], late: tuple[str, ...], opens: dict) -> Clock:
    """Every node done but `late`, still running; the opens counted from here on."""
    build(ev, tuple(n for n in nodes if n not in late))
    for node in late:
        V.write_record(str(ev), JOB, node, 0, V.running(45, now=1000.0))
    opens.clear()  # the writers' opens
    return Clock()


def test_done_records_are_read_once_and_only_the_late_ones_are_polled(tmp_path, opens):
    nodes = names(MAX)
    late = nodes[10:14]
    clock = with_late(tmp_path, nodes, late, opens)

    def sleep(s: float) -> None:
        clock.sleep(s)
        if clock.polls == 5:  # the late epilogs end after 2.5 s
            for node in late:
                V.write_record(str(tmp_path), JOB, node, 0, V.done(timeout(node, 1)))
            for path in [p for p in opens if not p.endswith(".json")]:
                del opens[path]  # the writers' directories and locks

    summaries, _, _, account = V.read_records(str(tmp_path), JOB, nodes, 0, 60, 105, sleep,
                                              clock.time, max_records=MAX)  # fmt: skip
    assert len(summaries) == MAX and clock.polls == 5
    path = {n: V.record_path(str(tmp_path), JOB, n, 0) for n in nodes}
    assert all(opens[path[n]] == 1 for n in nodes if n not in late)
    assert all(opens[path[n]] == 6 for n in late)  # five running, then done once
    assert account.opens == MAX - len(late) + 6 * len(late)


@pytest.mark.parametrize("n", [1, MAX, 1000])
def test_only_the_late_nodes_are_polled_again(tmp_path, opens, n):
    nodes = names(n)
    late = nodes[-2:]  # the job's last nodes (its only one at n=1) end after three polls
    clock = with_late(tmp_path, nodes, late, opens)
    digest = V.digest_path(str(tmp_path), JOB, 0)

    def sleep(s: float) -> None:
        clock.sleep(s)
        if clock.polls == 3:
            for node in late:
                V.write_record(str(tmp_path), JOB, node, 0, V.done(timeout(node, 1)))
            for path in [p for p in opens if not p.endswith(".json") or p == digest]:
                del opens[path]  # the writers' own opens

    summaries, _, _, account = V.read_records(str(tmp_path), JOB, nodes, 0, 60, 105, sleep,
                                              clock.time, max_records=MAX)  # fmt: skip
    path = {p: V.record_path(str(tmp_path), JOB, p, 0) for p in nodes}
    assert clock.polls == 3 and len(summaries) == n == account.records
    assert all(opens.get(path[p], 0) <= 1 for p in nodes if p not in late)  # done: once at most
    assert all(opens[path[p]] in (3, 4) for p in late)  # running thrice, then done (or named)
    assert sum(opens.get(path[p], 0) for p in nodes) <= min(n, MAX) + 3 * len(late)


def test_a_large_job_with_late_nodes_polls_only_those_and_takes_them_from_the_digest(
    tmp_path, opens
):
    nodes = names(200)
    clock = with_late(tmp_path, nodes, ("n0150", "n0151"), opens)

    def sleep(s: float) -> None:
        clock.sleep(s)
        if clock.polls == 3:
            V.write_record(str(tmp_path), JOB, "n0150", 0, V.done(hardware("n0150", 5)))
            V.write_record(str(tmp_path), JOB, "n0151", 0, V.done(timeout("n0151", 9)))
            opens[V.digest_path(str(tmp_path), JOB, 0)] = 0  # the writers' reads

    summaries, _, _, account = V.read_records(str(tmp_path), JOB, nodes, 0, 60, 105, sleep,
                                              clock.time, max_records=MAX)  # fmt: skip
    assert account.read == MAX and account.records == 200
    late_path = V.record_path(str(tmp_path), JOB, "n0150", 0)
    assert opens[late_path] == 4  # three polls running, then read in full (hardware first)
    assert "n0150" not in account.not_read
    assert cause(JobEnd(job_id=JOB, nodes=nodes, state="FAILED"), summaries)[1][0] == "n0150"


# ------------------------------------------------------------------------------ the bound


def test_the_bytes_read_stay_under_the_budget_and_the_rest_is_named(tmp_path):
    nodes = names(MAX)
    build(tmp_path, nodes)
    size = os.path.getsize(V.record_path(str(tmp_path), JOB, nodes[0], 0))
    budget = 10 * size + size // 2  # ten records and a half
    summaries, problems, _, account = read(tmp_path, nodes, budget=budget)
    assert account.bytes_read <= budget and account.read == 10 == len(summaries)
    assert account.not_read == nodes[10:] and problems == {}
    assert "not read: n[0011-0064] (54 nodes)" in account.describe()


def test_a_large_job_reads_a_bounded_number_of_bytes_however_large_its_records(tmp_path):
    nodes = names(300)
    pad = {"records": [{"rank": r, "entries": [{"seq": i, "op": "x" * 60} for i in range(256)]}
                       for r in range(8)]}  # fmt: skip
    for node in nodes:  # every record about 170 KiB of flight recorder: 50 MB in all
        V.write_record(str(tmp_path), JOB, node, 0, V.done(timeout(node, 1), pad))
    size = os.path.getsize(V.record_path(str(tmp_path), JOB, nodes[0], 0))
    _, _, _, account = read(tmp_path, nodes)
    digest = os.path.getsize(V.digest_path(str(tmp_path), JOB, 0))
    assert size > 150_000 and account.read == MAX
    sizes = [os.path.getsize(V.record_path(str(tmp_path), JOB, n, 0))
             for n in nodes if n not in account.not_read]  # fmt: skip
    assert account.bytes_read == sum(sizes) + digest  # each record read and the digest, once
    assert account.bytes_read <= V.READ_BUDGET


# ------------------------------------------------------------------------------ what is found


def test_a_hardware_fault_at_900_of_1000_and_the_first_failure_are_found(big):
    ev, nodes = big
    summaries, _, found, account = read(ev, nodes)
    assert not found["n0900"].partial and not found["n0700"].partial
    assert found["n0900"].hardware_fault is True and "n0900" not in account.not_read
    end = JobEnd(
        job_id=JOB, nodes=nodes, state="FAILED", exit_code2="1:0", comment="gpugate:requeue"
    )
    category, suspects, infra = cause(end, summaries)
    assert (category, suspects[0], infra) == ("gpu_xid_hardware", "n0900", True)
    assert decide_requeue(end, summaries, default_config()).requeue
    # The vote's time stamps: every node has one (the digest's lines), n0700 leads by 500 s.
    assert first_to_fail(summaries, nodes)[0] == "n0700"


def test_the_account_says_what_was_not_read_as_a_hostlist(big):
    ev, nodes = big
    _, _, _, account = read(ev, nodes)
    said = account.describe()
    assert said.startswith("read 64 of 1000 records (the first failures and hardware faults)")
    assert f"({1000 - MAX} nodes)" in said and "n0900" not in V.hostlist(account.not_read)
    assert V.hostlist(("n0065", "n0066", "n0067", "n1000")) == "n[0065-0067,1000]"


def test_the_controller_logs_what_it_did_not_read(big, monkeypatch):
    from fakes import FakeSlurm

    from gpugate.hooks import epilog_slurmctld as H

    ev, nodes = big
    config = default_config().replace(evidence_dir=str(ev))
    config = config.replace(requeue=config.requeue.replace(start_now=False))
    said: list[str] = []
    monkeypatch.setattr(H.log, "say", said.append)
    end = JobEnd(job_id=JOB, nodes=nodes, state="FAILED", exit_code2="1:0")  # not opted in
    accounts: list = []
    H.run_requeue(config, end, FakeSlurm(nodes=nodes[:3]), 0, dry_run=True, accounts=accounts)
    assert accounts and accounts[0].read == MAX
    assert any("read 64 of 1000 records" in s and "not read: n[" in s for s in said)


# ------------------------------------------------------------------------------ a bad digest


def _refused(ev: Path, nodes: tuple[str, ...], opens: dict) -> tuple:
    opens.clear()
    _, _, found, account = read(ev, nodes)
    record_opens = {p: c for p, c in opens.items() if "@digest" not in p}
    # Fallen back to every record (within the budget), the hardware fault still found.
    assert account.read == len(nodes) and account.not_read == () and len(record_opens) == len(nodes)
    assert found["n0090"].hardware_fault is True
    return account.digest, account.describe()


@pytest.fixture
def job100(tmp_path) -> tuple[Path, tuple[str, ...], str]:
    nodes = names(100)
    build(tmp_path, nodes, {"n0090": hardware("n0090", 1)})
    return tmp_path, nodes, V.digest_path(str(tmp_path), JOB, 0)


def test_a_symlinked_digest_is_refused(job100, opens):
    ev, nodes, digest = job100
    os.replace(digest, str(ev / "elsewhere.json"))
    os.symlink(ev / "elsewhere.json", digest)
    why, said = _refused(ev, nodes, opens)
    assert why == "a symlink; not followed" and "digest refused: a symlink" in said


def test_a_torn_digest_is_refused(job100, opens):
    ev, nodes, digest = job100
    data = Path(digest).read_bytes()
    Path(digest).write_bytes(data[: len(data) // 2])
    assert _refused(ev, nodes, opens)[0] == "not JSON (torn or foreign)"


def test_a_digest_others_could_write_is_refused(job100, opens):
    ev, nodes, digest = job100
    os.chmod(digest, 0o666)
    why, _ = _refused(ev, nodes, opens)
    assert why.startswith("not its directory owner's alone") and "mode 0666" in why


def test_another_jobs_digest_is_refused(job100, opens):
    ev, nodes, digest = job100
    doc = json.loads(Path(digest).read_text())
    Path(digest).write_text(json.dumps({**doc, "job_id": "8"}))
    assert _refused(ev, nodes, opens)[0] == "another job's or run's ('8', run 0)"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_digest_not_its_directory_owners_is_refused(job100, opens):
    ev, nodes, digest = job100
    os.chown(digest, 4321, -1)  # a user's file, put there by whoever could
    why, _ = _refused(ev, nodes, opens)
    assert why.startswith("not its directory owner's alone (uid 4321")


def test_a_node_the_digest_does_not_name_is_read_whatever_the_limit(tmp_path):
    nodes = names(100)
    build(tmp_path, nodes, {"n0077": hardware("n0077", 1)})
    digest = V.digest_path(str(tmp_path), JOB, 0)
    doc = json.loads(Path(digest).read_text())
    del doc["nodes"]["n0077"]  # its writer's update lost
    Path(digest).write_text(json.dumps(doc))
    summaries, _, found, account = read(tmp_path, nodes, max_records=4)
    assert found["n0077"].hardware_fault is True and not found["n0077"].partial
    # Peeked at (a small record is read whole) and counted among the four.
    assert account.read == 4 and len(account.not_read) == 96 and account.opens == 1 + 1 + 3
    assert cause(JobEnd(job_id=JOB, nodes=nodes), summaries)[1][0] == "n0077"


def test_a_digest_that_is_not_a_file_is_refused(job100, opens):
    ev, nodes, digest = job100
    os.unlink(digest)
    os.mkfifo(digest)
    assert _refused(ev, nodes, opens)[0] == "not a regular file"


def test_no_digest_at_all_reads_every_record(job100, opens):
    ev, nodes, digest = job100  # nodes of an older release write none
    os.unlink(digest)
    _, _, found, account = read(ev, nodes)
    assert account.read == 100 and account.digest is None and found["n0090"].hardware_fault


def test_a_digest_entry_that_is_not_the_digests_is_not_taken(job100):
    ev, nodes, digest = job100
    doc = json.loads(Path(digest).read_text())
    doc["nodes"]["n0001"] = {"flightrec": {"records": []}}  # no digest field
    Path(digest).write_text(json.dumps(doc))
    got, why = V.read_digest(digest, JOB, 0)
    assert why is None and "n0001" not in got.nodes and "n0002" in got.nodes
    _, _, found, _ = read(ev, nodes)
    assert not found["n0001"].partial  # its own record read instead


# ------------------------------------------------------------------------------ the writers


def _write_many(ev: str, nodes: list[str]) -> None:
    for node in nodes:
        V.write_record(ev, JOB, node, 0, V.done(timeout(node, 1)))


def test_concurrent_node_epilogs_lose_no_node_in_the_digest(tmp_path):
    nodes = names(160)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), list(nodes[i::8])))
             for i in range(8)]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 8
    doc, why = V.read_digest(V.digest_path(str(tmp_path), JOB, 0), JOB, 0)
    assert why is None and sorted(doc.nodes) == list(nodes) and doc.done == 160


def test_the_digest_keeps_the_decision_fields_and_no_flight_recorder(tmp_path):
    fr = {"records": [{"rank": 0, "entries": [{"seq": 1}]}]}
    V.write_record(str(tmp_path), JOB, "n0001", 0, V.done(hardware("n0001", 3), fr))
    doc, _ = V.read_digest(V.digest_path(str(tmp_path), JOB, 0), JOB, 0)
    assert doc.nodes["n0001"].to_json() == {
        k: v for k, v in hardware("n0001", 3).items() if k != "node"
    }
    assert not V.write_record(str(tmp_path), JOB, "n0002", 0, V.running(45)).endswith("@")
    doc, _ = V.read_digest(V.digest_path(str(tmp_path), JOB, 0), JOB, 0)
    assert list(doc.nodes) == ["n0001"]  # a running record is not in the digest


def test_pruning_the_last_record_takes_the_digest_and_its_lock(tmp_path):
    for node in ("n0001", "n0002"):
        V.write_record(str(tmp_path), JOB, node, 0, V.done(timeout(node, 1)))
    job_dir = Path(V.view_dir(str(tmp_path), JOB))
    lock = job_dir / "locks" / "digest-r0.lock"  # no user can open it and hold it
    assert lock.stat().st_mode & 0o777 == 0o600 and lock.parent.stat().st_mode & 0o777 == 0o700
    E.remove_view(str(tmp_path), f"{JOB}/n0001-r0")
    assert Path(V.digest_path(str(tmp_path), JOB, 0)).exists()  # n0002's record is left
    E.remove_view(str(tmp_path), f"{JOB}/n0002-r0")
    assert not job_dir.exists()


# ------------------------------------------------------------------------------ the config


def test_max_records_is_validated(tmp_path):
    site = tmp_path / "site.yaml"
    assert load_config("/dev/null").requeue.max_records == 64
    for bad in ("0", "-1", "5000", "many"):
        site.write_text(f"requeue:\n  max_records: {bad}\n")
        with pytest.raises(ConfigError, match=r"requeue\.max_records"):
            load_config(str(site))
    site.write_text("requeue:\n  max_records: 8\n")
    assert load_config(str(site)).requeue.max_records == 8

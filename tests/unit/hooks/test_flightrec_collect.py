"""The epilog's flight-recorder collection: found, capped, read as the user, refused safely."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import sys
import time
import types

import paths
import pytest
from factories import default_config

from gpugate.hooks import flightrec_collect as FC
from gpugate.slurm.hookenv import HookEnv
from gpugate.store.summary import SummaryJob

FIXTURES = os.path.join(paths.FIXTURES, "flightrec")


class FakeDumpError(ValueError):
    pass


@pytest.fixture
def fake_reader(monkeypatch):
    """A stand-in for gpugate.flightrec.reader that accepts b'ok<rank>' and refuses the rest.

    The collection's own rules (where, whose, how many, how big) are tested apart from the
    restricted unpickler, which tests/unit/flightrec/test_flightrec_reader.py covers; the real one reads the
    real dumps below.
    """
    module = types.ModuleType("gpugate.flightrec.reader")

    def read_dump_kept(data: bytes, name: str) -> tuple[dict, dict]:
        if not data.startswith(b"ok"):
            raise FakeDumpError("not a flight-recorder dump")
        rank = int(data[2:] or -1)
        return {"name": name, "rank": rank}, {"entries": [], "rank": rank}

    module.DumpError = FakeDumpError
    module.read_dump_kept = read_dump_kept
    monkeypatch.setitem(sys.modules, "gpugate.flightrec.reader", module)
    return module


def _places(tmp_path):
    job = tmp_path / "nccl" / "42"
    default = tmp_path / "tmp"
    job.mkdir(parents=True)
    default.mkdir()
    return job, default, [[str(job), "fr_rank_"], [str(default), "nccl_trace_rank_"]]


def test_dumps_from_the_job_directory_and_the_default_place_are_read(tmp_path, fake_reader):
    job, default, places = _places(tmp_path)
    (job / "fr_rank_0").write_bytes(b"ok0")
    (default / "nccl_trace_rank_1").write_bytes(b"ok1")
    (job / "nccl.n1.77.log").write_text("NCCL INFO ...")  # not a dump
    out = FC.read_dumps(places, since=None, max_dumps=8, max_bytes=1024)
    assert sorted(r["rank"] for r in out["records"]) == [0, 1]
    assert sorted(out["kept"]) == ["fr_rank_0", "nccl_trace_rank_1"]
    assert out["kept"]["fr_rank_0"] == {"entries": [], "rank": 0}  # plain data, not bytes
    assert out["records"][0]["sha256"] == hashlib.sha256(b"ok0").hexdigest()
    assert out["errors"] == [] and out["truncated"] is False


def test_a_refused_dump_is_an_error_entry_the_others_still_read(tmp_path, fake_reader):
    job, _, places = _places(tmp_path)
    (job / "fr_rank_0").write_bytes(b"ok0")
    (job / "fr_rank_1").write_bytes(b"\x80\x04evil")
    out = FC.read_dumps(places, since=None, max_dumps=8, max_bytes=1024)
    assert [r["rank"] for r in out["records"]] == [0]
    digest = hashlib.sha256(b"\x80\x04evil").hexdigest()
    assert out["errors"] == [{"name": "fr_rank_1", "error": "not a flight-recorder dump",
                              "bytes": 6, "sha256": digest}]  # fmt: skip
    assert list(out["kept"]) == ["fr_rank_0"]  # the refused dump's bytes are not kept
    assert "evil" not in json.dumps(out)


def test_a_symlink_or_fifo_is_never_followed(tmp_path, fake_reader):
    job, _, places = _places(tmp_path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"ok9")
    (job / "fr_rank_0").symlink_to(secret)
    os.mkfifo(job / "fr_rank_1")
    out = FC.read_dumps(places, since=None, max_dumps=8, max_bytes=1024)
    assert out["records"] == [] and out["kept"] == {}
    why = {e["name"]: e["error"] for e in out["errors"]}
    assert "symlink" in why["fr_rank_0"] and "not a regular file" in why["fr_rank_1"]


def test_an_earlier_jobs_dump_is_skipped(tmp_path, fake_reader):
    _, default, places = _places(tmp_path)
    old = default / "nccl_trace_rank_0"
    old.write_bytes(b"ok0")
    os.utime(old, (time.time() - 3600,) * 2)
    out = FC.read_dumps(places, since=time.time() - 60, max_dumps=8, max_bytes=1024)
    assert out["records"] == [] and out["errors"] == []
    assert old.exists()  # not this job's: left alone


def test_another_users_dump_at_the_default_place_is_skipped(tmp_path, fake_reader, monkeypatch):
    _, default, places = _places(tmp_path)
    (default / "nccl_trace_rank_0").write_bytes(b"ok0")
    monkeypatch.setattr(os, "getuid", lambda: os.geteuid() + 1)  # the child runs as another uid
    out = FC.read_dumps(places, since=None, max_dumps=8, max_bytes=1024)
    assert out["records"] == [] and out["errors"] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to other owners")
def test_other_users_files_at_the_default_place_do_not_use_up_the_cap(
    tmp_path, fake_reader, monkeypatch
):
    """Red team (issue 41, R7): sixteen unreadable `nccl_trace_rank_!NN` of another user sort
    first and used up fr_max_dumps: the job's own dump at PyTorch's default was never read."""
    _, default, places = _places(tmp_path)
    user = 54321  # the job's user; the child runs as it
    for n in range(16):
        for name in (f"nccl_trace_rank_!{n:02d}", f"nccl_trace_rank_{n + 100}"):
            (default / name).write_bytes(b"ok7")
            os.chown(default / name, 65534, 65534)
            (default / name).chmod(0o600)
    (default / "nccl_trace_rank_3").write_bytes(b"ok3")
    os.chown(default / "nccl_trace_rank_3", user, user)
    opened = []

    def as_the_user(path):  # what open() does for the job's user: others' 0600 files refused
        opened.append(os.path.basename(path))
        st = os.stat(path)
        if st.st_uid != user and not st.st_mode & 0o004:
            raise FC.UserFileError(f"{path}: Permission denied")
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)

    monkeypatch.setattr(os, "getuid", lambda: user)
    monkeypatch.setattr(FC, "open_regular", as_the_user)
    out = FC.read_dumps(places, since=None, max_dumps=16, max_bytes=1024,
                        remove_from=str(default))  # fmt: skip
    assert [r["rank"] for r in out["records"]] == [3] and out["truncated"] is False
    assert out["errors"] == [] and opened == ["nccl_trace_rank_3"]  # no other user's opened


def test_the_listing_of_a_directory_is_bounded(tmp_path, fake_reader, monkeypatch):
    """Red team (issue 41, R7): millions of files in /tmp; the listing stops at SCAN_MAX
    entries, says so, and what it found is still read (root's look for candidates too)."""
    job, default, places = _places(tmp_path)
    (job / "fr_rank_0").write_bytes(b"ok0")
    for n in range(50):
        (default / f"junk-{n}").write_bytes(b"")
    monkeypatch.setattr(FC, "SCAN_MAX", 20)
    out = FC.read_dumps(places, since=None, max_dumps=16, max_bytes=1024,
                        remove_from=str(default))  # fmt: skip
    assert [r["rank"] for r in out["records"]] == [0] and out["truncated"] is True
    assert out["errors"] == [{"name": "nccl_trace_rank_*",
                              "error": "more than 20 entries in the directory: the rest not "
                              "looked at"}]  # fmt: skip
    assert FC.dump_names(str(default), "nccl_trace_rank_") == ([], True)
    assert FC._candidates([[str(default), "nccl_trace_rank_"]]) is False


def test_count_and_size_caps(tmp_path, fake_reader):
    job, _, places = _places(tmp_path)
    for rank in range(5):
        (job / f"fr_rank_{rank}").write_bytes(b"ok%d" % rank)
    (job / "fr_rank_0").write_bytes(b"ok0" + b" " * 2000)
    out = FC.read_dumps(places, since=None, max_dumps=3, max_bytes=1024)
    assert out["truncated"] is True
    assert [r["rank"] for r in out["records"]] == [1, 2]  # 0 was over the size cap, 3 and 4 left
    assert "over the cap of 1024 bytes" in out["errors"][0]["error"]


def test_dumps_beyond_the_kept_total_are_parsed_but_not_kept(tmp_path, fake_reader):
    job, _, places = _places(tmp_path)
    for rank in range(3):
        (job / f"fr_rank_{rank}").write_bytes(b"ok%d" % rank)
    size = len(json.dumps({"entries": [], "rank": 0}))
    out = FC.read_dumps(places, since=None, max_dumps=8, max_bytes=1024, kept_total=2 * size)
    assert len(out["records"]) == 3 and sorted(out["kept"]) == ["fr_rank_0", "fr_rank_1"]
    assert out["truncated"] is True


def test_default_place_dumps_are_removed_once_collected_the_job_directory_is_not(
    tmp_path, fake_reader
):
    job, default, places = _places(tmp_path)
    (job / "fr_rank_0").write_bytes(b"ok0")
    (default / "nccl_trace_rank_1").write_bytes(b"ok1")
    FC.read_dumps(places, since=None, max_dumps=8, max_bytes=1024, remove_from=str(default))
    assert not (default / "nccl_trace_rank_1").exists()
    assert (job / "fr_rank_0").exists()  # removed with the whole directory by the cleanup


def test_a_refused_dump_at_the_default_place_is_removed_too(tmp_path, fake_reader):
    """The job's user's own file, read: left there it would block the next user's rank."""
    _, default, places = _places(tmp_path)
    (default / "nccl_trace_rank_1").write_bytes(b"\x80\x04evil")
    out = FC.read_dumps(places, since=None, max_dumps=8, max_bytes=1024, remove_from=str(default))
    assert [e["name"] for e in out["errors"]] == ["nccl_trace_rank_1"]
    assert not (default / "nccl_trace_rank_1").exists()


def test_the_places_are_the_job_directory_and_pytorchs_default(tmp_path):
    config = default_config()
    places = FC.search_places(config, "42")
    assert places == [
        [os.path.join(config.task_prolog.nccl_debug_dir, "42"), "fr_rank_"],
        ["/tmp", "nccl_trace_rank_"],
    ]
    assert FC.search_places(config, "../x") == [["/tmp", "nccl_trace_rank_"]]


def test_collect_runs_the_child_as_the_jobs_user_and_tags_the_node(
    tmp_path, fake_reader, monkeypatch
):
    import gpugate.userfiles as U

    seen = {}

    def fake_as_user(uid, gid, task, kwargs, timeout):
        seen.update(uid=uid, task=task, kwargs=kwargs)
        return {"records": [{"rank": 1}], "errors": [], "truncated": False,
                "kept": {"../fr_rank_1": {"entries": [1]}, "fr_rank_2": "\x80\x04."}}  # fmt: skip

    monkeypatch.setattr(U, "as_user", fake_as_user)
    config = default_config().replace(state_dir=str(tmp_path / "state"))
    tp = config.task_prolog.replace(nccl_debug_dir=str(tmp_path / "nccl"))
    config = config.replace(task_prolog=tp)
    env = HookEnv(job_id="42", node="n2", uid=1234, gid=1234, start_time=1700000000)
    job_dir = tmp_path / "nccl" / "42"
    job_dir.mkdir(parents=True)
    monkeypatch.setattr(FC, "FR_DEFAULT_PREFIX", str(tmp_path / "nccl_trace_rank_"))  # not /tmp
    assert (
        FC.collect_dumps(config, env, SummaryJob(), 5.0)["records"] == [] and not seen
    )  # no child
    (job_dir / "fr_rank_1").write_bytes(b"x")
    got = FC.collect_dumps(config, env, SummaryJob(), 5.0)
    assert seen["uid"] == 1234 and seen["task"] == FC.TASK
    assert seen["kwargs"]["since"] == 1700000000.0
    assert seen["kwargs"]["max_bytes"] == config.epilog.fr_max_dump_mib * 1024 * 1024
    assert got["records"] == [{"rank": 1, "node": "n2"}]
    # A name from the user's side is made safe; the text is root's own JSON of plain data,
    # and what is not an object (bytes smuggled as a string) is refused, not written.
    assert got["kept"] == {"_fr_rank_1.json": '{"entries":[1]}'}
    assert [e["name"] for e in got["errors"]] == ["fr_rank_2"]
    from gpugate.child import TASKS

    assert FC.TASK in TASKS


def test_collect_says_why_when_the_user_cannot_be_read_as(tmp_path):
    config = default_config()
    tp = config.task_prolog.replace(nccl_debug_dir=str(tmp_path / "nccl"))
    config = config.replace(task_prolog=tp)
    (tmp_path / "nccl" / "42").mkdir(parents=True)
    (tmp_path / "nccl" / "42" / "fr_rank_0").write_bytes(b"x")
    env = HookEnv(job_id="42", node="n2", uid=None)
    got = FC.collect_dumps(config, env, SummaryJob(), 5.0)
    assert got["records"] == [] and "not reading its files as root" in got["errors"][0]["error"]


def test_bundle_members_and_decisive_lines():
    flightrec = {
        "records": [{"rank": 0, "node": "n1"}],
        "errors": [{"name": "fr_rank_1", "error": "REDUCE\x1b[31m not allowed"}],
        "searched": ["/x/fr_rank_*"],
        "truncated": False,
        "kept": {"fr_rank_0.json": '{"entries":[]}'},
    }
    files = FC.bundle_files(flightrec)
    assert set(files) == {"flightrec/fr_rank_0.json", "flightrec.json"}  # no PyTorch dump name
    doc = json.loads(files["flightrec.json"])
    assert {k: doc[k] for k in ("records", "errors", "searched", "truncated")} == {
        k: flightrec[k] for k in ("records", "errors", "searched", "truncated")
    }
    assert doc["kept"] == ["flightrec/fr_rank_0.json"]
    assert "never unpickle" in doc["note"].lower()
    (line,) = FC.decisive_lines(flightrec)
    assert line.startswith("gpugate: flight-recorder dump fr_rank_1 refused: REDUCE")
    assert "\x1b" not in line
    assert FC.bundle_files({"records": [], "errors": [], "kept": {}}) == {}


def test_the_job_start_falls_back_to_the_prologs_baseline(tmp_path):
    from gpugate.store.state import job_dir

    config = default_config().replace(state_dir=str(tmp_path / "state"))
    d = job_dir(config.state_dir, "42")
    os.makedirs(d)
    with open(os.path.join(d, "baseline.json"), "w") as fh:
        fh.write("{}")
    os.utime(os.path.join(d, "baseline.json"), (1700000000, 1700000000))
    assert FC.job_started(config, HookEnv(job_id="42")) == 1700000000
    assert FC.job_started(config, HookEnv(job_id="43")) is None
    assert FC.job_started(config, HookEnv(job_id="42", start_time=5)) == 5


def test_the_nccl_log_listing_leaves_the_dumps_out(tmp_path):
    from gpugate.hooks.collect import _read_and_diagnose

    (tmp_path / "fr_rank_0").write_bytes(pickle.dumps({"version": "2.10"}))
    (tmp_path / "nccl.n1.1.log").write_text("NCCL WARN x\n")
    out = _read_and_diagnose([str(tmp_path) + "/"], "", 4096, 32)
    assert list(out["tails"]) == [str(tmp_path / "nccl.n1.1.log")]


# ---- with the real restricted reader and dumps PyTorch wrote ---------------------------------


def _fixture(*parts):
    path = os.path.join(FIXTURES, *parts)
    if not os.path.exists(path):
        pytest.skip(f"{path}: not generated (tests/fixtures/flightrec/make_dumps.py)")
    with open(path, "rb") as fh:
        return fh.read()


def test_real_dumps_are_read_and_a_hostile_one_refused_without_running(tmp_path):
    pytest.importorskip("gpugate.flightrec.reader")
    job, _, places = _places(tmp_path)
    (job / "fr_rank_0").write_bytes(_fixture("not_entered", "pickle", "nccl_trace_rank_0"))
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('ran')"

    class Exec:
        def __reduce__(self):
            return (exec, (code,))

    (job / "fr_rank_1").write_bytes(pickle.dumps({"version": "2.10", "entries": [Exec()]}))
    out = FC.read_dumps(places, since=None, max_dumps=8, max_bytes=4 << 20)
    assert len(out["records"]) == 1
    assert [e["name"] for e in out["errors"]] == ["fr_rank_1"]
    assert not marker.exists()


def test_diagnose_over_bundles_counts_a_bundle_with_dumps_and_no_log(tmp_path, capsys):
    """The non-batch node's bundle may hold only the dumps: it still names the culprit."""
    pytest.importorskip("gpugate.flightrec.reader")
    from gpugate.cli import main

    dirs = []
    for node, ranks, log in (("n1", (0, 2), "Watchdog caught collective operation timeout\n"),
                             ("n2", (1,), None)):  # fmt: skip
        job, _, places = _places(tmp_path / node)
        for r in ranks:
            data = _fixture("not_entered", "pickle", f"nccl_trace_rank_{r}")
            (job / f"fr_rank_{r}").write_bytes(data)
        got = FC.read_dumps(places[:1], since=None, max_dumps=8, max_bytes=4 << 20)
        got["records"] = [dict(r, node=node) for r in got["records"]]
        bundle = tmp_path / f"{node}-r0"
        (bundle / "logs").mkdir(parents=True)
        (bundle / "summary.json").write_text(json.dumps({"node": node}))
        (bundle / "flightrec.json").write_text(
            FC.bundle_files({**got, "kept": {}})["flightrec.json"]
        )
        if log:
            (bundle / "logs" / "00-out.tail").write_text(log)
        dirs.append(str(bundle))
    assert main(["diagnose", "--json", *dirs]) == 0
    fr = json.loads(capsys.readouterr().out)["flight_recorder"]
    assert (fr["rank"], fr["node"], fr["state"]) == (1, "n2", "not_entered")


class _System:
    """A dump a user could write: unpickling it runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _bundle_bytes(files: dict) -> list[bytes]:
    return [v.encode() if isinstance(v, str) else v for v in files.values()]


def test_a_malicious_dump_leaves_no_pickle_in_the_bundle_only_its_hash_and_error(tmp_path):
    pytest.importorskip("gpugate.flightrec.reader")
    job, _, places = _places(tmp_path)
    marker = tmp_path / "ran"
    evil = pickle.dumps({"version": "2.10", "entries": [_System(f"touch {marker}")]}, protocol=4)
    (job / "fr_rank_1").write_bytes(evil)
    (job / "fr_rank_0").write_bytes(_fixture("not_entered", "pickle", "nccl_trace_rank_0"))
    got = FC.read_dumps(places, since=None, max_dumps=8, max_bytes=4 << 20)
    flightrec = {**got, "kept": FC._rewrite(got["kept"], got["errors"]), "searched": []}
    files = FC.bundle_files(flightrec)
    assert not marker.exists()
    assert set(files) == {"flightrec.json", "flightrec/fr_rank_0.json"}
    for data in _bundle_bytes(files):
        assert data.isascii() and data[:1] == b"{"  # JSON text: no pickle opcode byte at all
        with pytest.raises(pickle.UnpicklingError):
            pickle.loads(data)
        assert b"touch " not in data  # not even the command's text
    doc = json.loads(files["flightrec.json"])
    (error,) = doc["errors"]
    assert error["name"] == "fr_rank_1" and "refused" in error["error"]
    assert error["sha256"] == hashlib.sha256(evil).hexdigest() and error["bytes"] == len(evil)


def test_an_accepted_dump_is_kept_as_json_that_round_trips(tmp_path):
    pytest.importorskip("gpugate.flightrec.reader")
    from gpugate.flightrec.reader import read_dump

    job, _, places = _places(tmp_path)
    data = _fixture("not_entered", "pickle", "nccl_trace_rank_0")
    (job / "fr_rank_0").write_bytes(data)
    got = FC.read_dumps(places, since=None, max_dumps=8, max_bytes=4 << 20)
    files = FC.bundle_files({**got, "kept": FC._rewrite(got["kept"], got["errors"])})
    text = files["flightrec/fr_rank_0.json"]
    assert isinstance(text, str) and text.startswith("{")
    (record,) = json.loads(files["flightrec.json"])["records"]
    assert record["sha256"] == hashlib.sha256(data).hexdigest()
    again = read_dump(text.encode(), "fr_rank_0")  # gpugate's reader takes the kept JSON
    assert again == {k: v for k, v in record.items() if k != "sha256"}
    assert json.loads(text) == json.loads(json.dumps(got["kept"]["fr_rank_0"]))


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ({"records": {"rank": 1}, "errors": []}, "key 'records': expected list"),
        ({"records": [], "errors": [{"name": "x"}]}, r"key 'errors'\[0\]: missing key 'error'"),
        ({"errors": []}, "missing key 'records'"),
        ("not an object", "not a JSON object"),
    ],
)
def test_a_malformed_answer_of_the_child_is_a_refusal_of_the_whole_collection(
    tmp_path, monkeypatch, answer, why
):
    import gpugate.userfiles as U

    monkeypatch.setattr(U, "as_user", lambda *args: answer)
    config = default_config()
    tp = config.task_prolog.replace(nccl_debug_dir=str(tmp_path / "nccl"))
    config = config.replace(task_prolog=tp)
    (tmp_path / "nccl" / "42").mkdir(parents=True)
    (tmp_path / "nccl" / "42" / "fr_rank_0").write_bytes(b"x")
    got = FC.collect_dumps(
        config, HookEnv(job_id="42", node="n2", uid=1234, gid=1234), SummaryJob(), 5.0
    )
    assert got["records"] == [] and got["kept"] == {}
    (error,) = got["errors"]
    assert error["name"] == "*" and re.search(f"the reader's answer: .*{why}", error["error"])


def test_the_bundles_flightrec_json_is_a_flightrec_file_that_reads_back():
    from gpugate.flightrec.records import FlightrecFile

    flightrec = {"records": [{"rank": 0, "node": "n1"}], "searched": ["/x/fr_rank_*"],
                 "errors": [{"name": "fr_rank_1", "error": "refused", "bytes": 6, "sha256": "ab"}],
                 "truncated": True, "kept": {"fr_rank_0.json": "{}"}}  # fmt: skip
    text = FC.bundle_files(flightrec)["flightrec.json"]
    doc = json.loads(text)
    assert list(doc) == ["records", "errors", "searched", "truncated", "kept", "note"]
    member = FlightrecFile.from_json(doc, "flightrec.json")
    assert member.errors[0].sha256 == "ab" and member.truncated is True
    assert member.to_json() == doc

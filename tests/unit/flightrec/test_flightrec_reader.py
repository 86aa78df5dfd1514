"""The flight-recorder reader: PyTorch's own dumps (tests/fixtures/flightrec), hostile pickles refused."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import paths
import pytest

from gpugate.flightrec import reader
from gpugate.flightrec.reader import DumpError, load_dump, rank_from_name, read_dump, summarize

FIX = paths.FIXTURES / "flightrec"


def _read(scenario: str, form: str, rank: int) -> dict:
    path = FIX / scenario / form / f"nccl_trace_rank_{rank}"
    return read_dump(path.read_bytes(), path.name)


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_real_dump_summarized(form: str) -> None:
    rec = _read("not_entered", form, 0)
    assert rec["rank"] == 0 and rec["version"] == "2.10"
    assert rec["pgs"]["0"]["name"] == "0" and rec["pgs"]["0"]["desc"] == "default_pg"
    assert rec["pgs"]["0"]["ranks"] == [0, 1, 2]
    assert rec["pgs"]["0"]["last_enqueued"] == 4
    assert rec["pgs"]["0"]["last_started"] is None  # gloo writes -1: none recorded
    last = rec["entries"][-1]
    assert (last["pg_id"], last["seq"], last["op"], last["backend"]) == (
        "0",
        4,
        "all_reduce",
        "gloo",
    )
    assert last["sizes"] == [[8]] and last["timeout_ms"] == 3000 and last["is_p2p"] is False
    json.dumps(rec)  # the record is JSON-able


def test_the_dumps_name_no_path_of_the_machine_that_made_them() -> None:
    """make_dumps.py writes the checkout as /src/gpugate in the frames; the rest as torch wrote
    it (the rewrite keeps every other opcode: a string's length prefix is the only change)."""
    sys.path.insert(0, str(FIX))
    try:
        from make_dumps import neutral
    finally:
        sys.path.remove(str(FIX))
    root = str(paths.ROOT)
    for path in sorted(FIX.glob("*/pickle/nccl_trace_rank_*")):
        text = repr(pickle.loads(path.read_bytes()))
        assert root not in text and "/src/gpugate/" in text, path
    made = pickle.dumps({"frames": ["/old/x.py:3 f", "/elsewhere/y.py:4 g"], "n": 7}, protocol=2)
    back = pickle.loads(neutral(made, "/old", "/src/gpugate"))
    assert back == {"frames": ["/src/gpugate/x.py:3 f", "/elsewhere/y.py:4 g"], "n": 7}


def test_sleeper_dump_stops_before_the_collective() -> None:
    rec = _read("not_entered", "pickle", 1)
    assert rec["pgs"]["0"]["last_enqueued"] == 3
    assert [e["seq"] for e in rec["entries"]] == [1, 2, 3]


def test_frame_is_the_first_outside_torch() -> None:
    last = _read("not_entered", "pickle", 0)["entries"][-1]
    assert last["frame"].endswith(" _guarded") and "make_dumps.py:" in last["frame"]
    assert _read("not_entered", "json", 0)["entries"][-1]["frame"] is None  # JSON has no frames


def test_subgroup_ranks_not_guessed() -> None:
    # gloo registers both groups under the name "" in pg_config: which is which is unknown
    rec = _read("subgroup", "pickle", 0)
    assert set(rec["pgs"]) == {"0", "1"}
    assert rec["pgs"]["1"]["ranks"] == [] and rec["pgs"]["1"]["last_enqueued"] == 2
    assert any("ranks are not in pg_config" in n for n in rec["notes"])


def test_keeps_the_last_entries_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "KEEP_PER_PG", 2)
    rec = _read("subgroup", "pickle", 0)
    assert [(e["pg_id"], e["seq"]) for e in rec["entries"]] == [
        ("0", 2),
        ("0", 3),
        ("1", 1),
        ("1", 2),
    ]


@pytest.mark.parametrize(
    ("name", "rank"),
    [("nccl_trace_rank_3", 3), ("/d/x_12", 12), ("trace", None), ("r7.json", None)],
)
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_hostile_fixture_would_run_code(tmp_path: Path) -> None:
    """The fixture is really hostile: a general unpickler (in a child) writes the marker."""
    marker = tmp_path / "ran"
    code = "import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read())"
    env = dict(os.environ, GPUGATE_FR_MARKER=str(marker))
    subprocess.run(
        [sys.executable, "-c", code, str(FIX / "hostile.pkl")], env=env, timeout=60, check=False
    )
    assert marker.exists()


def test_hostile_pickle_refused_and_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    monkeypatch.setenv("GPUGATE_FR_MARKER", str(marker))
    with pytest.raises(DumpError, match=r"refused: the pickle names the global builtins\.exec"):
        load_dump((FIX / "hostile.pkl").read_bytes())
    assert not marker.exists()


class _System:
    def __reduce__(self) -> tuple:
        return (os.system, ("true",))


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_protocol_refuses_globals(protocol: int) -> None:
    with pytest.raises(DumpError, match="refused: the pickle names the global"):
        load_dump(pickle.dumps({"entries": [_System()]}, protocol=protocol))


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (pickle.dumps({"entries": [{1, 2}]}, protocol=4), "refused: the pickle holds a set"),
        (pickle.dumps({"version": "2.10"}, protocol=4), "no 'entries'"),
        (pickle.dumps([1], protocol=4), "the top level is not a dict"),
        (pickle.dumps({"entries": {}}, protocol=4), "'entries' is not a list"),
        (b"\x80\x04truncated", "not a flight-recorder dump"),
        (b"hello", "neither a pickle"),
        (b'{"entries": [', "not a flight-recorder dump"),
        (b"[" * 100 + b"]" * 100, "nested deeper than 32"),
        (pickle.dumps({"entries": bytearray(b"x")}, protocol=5), "holds a bytearray"),
    ],
)
def test_bad_dumps_named(data: bytes, why: str) -> None:
    with pytest.raises(DumpError, match=why):
        load_dump(data)


def test_size_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "MAX_BYTES", 100)
    with pytest.raises(DumpError, match="over 0 MiB"):
        load_dump(b"{" + b" " * 200 + b"}")


def test_expanding_pickle_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "MAX_NODES", 1000)
    level: list = ["x"]
    for _ in range(20):  # memo references: 2**20 values from a few hundred bytes
        level = [level, level]
    data = pickle.dumps({"entries": level}, protocol=4)
    assert len(data) < 1000
    with pytest.raises(DumpError, match="more than 1000 values"):
        load_dump(data)


def test_wrong_types_dropped_with_a_note() -> None:
    dump = {
        "version": 7,
        "pg_status": {"0": {"last_enqueued_collective": "x", "last_completed_collective": 2}},
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "os.system('x')"}},
        "entries": [
            "junk",
            {"pg_id": 0, "collective_seq_id": "1"},
            {"pg_id": 0, "collective_seq_id": 2, "profiling_name": 5, "input_sizes": [["a"]],
             "frames": "no", "state": None, "process_group": ["0", "default_pg"]},
        ],
    }  # fmt: skip
    rec = summarize(dump, "trace_0")
    assert rec["version"] == "" and "no version string" in rec["notes"]
    assert "2 entries without a process group or sequence number dropped" in rec["notes"]
    (e,) = rec["entries"]
    assert (e["seq"], e["op"], e["sizes"], e["frame"], e["state"]) == (2, None, None, None, None)
    pg = rec["pgs"]["0"]
    assert (pg["ranks"], pg["last_enqueued"], pg["last_completed"]) == ([], None, 2)


def test_reader_agrees_with_the_installed_torch(tmp_path: Path) -> None:
    """Regenerate one scenario with today's torch: the reader reads it the same way."""
    from torchenv import torch_python_or_skip

    py = torch_python_or_skip()
    make = FIX / "make_dumps.py"
    subprocess.run([py, str(make), str(tmp_path), "--only", "not_entered"], timeout=300, check=True,
                   capture_output=True)  # fmt: skip
    for form in ("pickle", "json"):
        recs = [read_dump((tmp_path / "not_entered" / form / f"nccl_trace_rank_{r}").read_bytes(),
                          f"nccl_trace_rank_{r}") for r in range(3)]  # fmt: skip
        assert [r["pgs"]["0"]["last_enqueued"] for r in recs] == [4, 3, 4]
        assert recs[0]["entries"][-1]["op"] == "all_reduce"


@pytest.mark.parametrize("scenario", ["not_entered", "mismatch", "subgroup", "gone", "healthy"])
def test_a_dump_kept_as_json_reads_back_to_the_same_record(scenario: str) -> None:
    """What the bundle keeps of a real pickle dump is JSON whose own record is the pickle's."""
    path = FIX / scenario / "pickle" / "nccl_trace_rank_0"
    record, plain = reader.read_dump_kept(path.read_bytes(), path.name)
    text = json.dumps(plain)
    assert read_dump(text.encode(), path.name) == record
    assert json.loads(text) == plain  # plain JSON values: it round-trips
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(text.encode())  # and no unpickler takes it for a pickle


def test_as_json_drops_bytes_and_makes_keys_strings() -> None:
    dump = {"entries": [(1, b"\x80\x04evil")], 3: {None: "x"}, b"k": True}
    assert reader.as_json(dump) == {
        "entries": [[1, {"dropped_bytes": 6}]],
        "3": {"null": "x"},
        "k": True,
    }

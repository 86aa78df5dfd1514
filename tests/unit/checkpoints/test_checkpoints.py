"""Checkpoint discovery: every layout complete, cut short and in progress; safety; the CLI.

The checkpoints are built here, small and real in their structure: torch-like ZIPs made with
`zipfile` (`archive/data.pkl`, `archive/data/0`, `archive/version`), legacy torch pickles,
DCP directories, DeepSpeed and Megatron trees with their tracker files, HF Trainer folders.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest
from checkpoint_files import set_age, torch_zip

from gpugate.checkpoints import discover as C
from gpugate.checkpoints.discover import find_checkpoints, latest_complete, scan
from gpugate.cli import main

# --- builders ------------------------------------------------------------------------------


def cut(path: Path, keep: float = 0.6) -> Path:
    """Truncate a file as a job killed mid-write leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def touch_tree(path: Path) -> None:
    """Mark a checkpoint (file or directory) as just written."""
    items = [path] + (list(path.rglob("*")) if path.is_dir() else [])
    for item in items:
        os.utime(item, follow_symlinks=False)


def build_torch(root: Path, step: int, state: str = "complete") -> Path:
    if state == "in_progress":  # written to a temporary name, not renamed yet
        return torch_zip(root / f"ckpt_{step}.pt.tmp")
    path = torch_zip(root / f"ckpt_{step}.pt", {"step": step})
    return cut(path) if state == "truncated" else path


def build_dcp(root: Path, step: int, state: str = "complete") -> Path:
    d = root / f"step_{step}"
    d.mkdir(parents=True)
    for rank in range(2):
        (d / f"__{rank}_0.distcp").write_bytes(b"\x02" * 512)
    meta = pickle.dumps({"state_dict_metadata": {"w": [0, 1, 2, 3] * 10}, "x": 1.5})
    if state == "in_progress":
        (d / ".metadata.tmp").write_bytes(meta[:40])
    elif state == "truncated":
        assert meta[39:40] != b"."
        (d / ".metadata").write_bytes(meta[:40])
    else:
        (d / ".metadata").write_bytes(meta)
    return d


def build_deepspeed(root: Path, step: int, state: str = "complete", dp: int = 2) -> Path:
    d = root / f"global_step{step}"
    states = {"module": {"w": 1}, "global_steps": step, "dp_world_size": dp, "mp_world_size": 1}
    torch_zip(d / "mp_rank_00_model_states.pt", states)
    for rank in range(dp):
        torch_zip(d / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    if state == "truncated":
        cut(d / f"zero_pp_rank_{dp - 1}_mp_rank_00_optim_states.pt")
    if state != "in_progress":  # DeepSpeed writes `latest` after every rank's files
        (root / "latest").write_text(f"global_step{step}")
    return d


def build_megatron(root: Path, step: int, state: str = "complete", tp: int = 2) -> Path:
    name = f"iter_{step:07d}" + ("_tmp" if state == "in_progress" else "")
    d = root / name
    args = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": 1}
    for rank in range(tp):
        torch_zip(
            d / f"mp_rank_{rank:02d}" / "model_optim_rng.pt", {"args": args, "iteration": step}
        )
    if state == "truncated":
        cut(d / f"mp_rank_{tp - 1:02d}" / "model_optim_rng.pt")
    if state != "in_progress":
        (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return d


def build_huggingface(root: Path, step: int, state: str = "complete") -> Path:
    d = root / (f"tmp-checkpoint-{step}" if state == "in_progress" else f"checkpoint-{step}")
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"\x03" * 1024)
    torch_zip(d / "optimizer.pt")
    torch_zip(d / "rng_state.pth")
    text = json.dumps({"global_step": step, "log_history": [{"loss": 1.0, "step": step}]})
    (d / "trainer_state.json").write_text(text[:30] if state == "truncated" else text)
    return d


def build_lightning(root: Path, step: int, state: str = "complete") -> Path:
    path = torch_zip(
        root / f"epoch={step // 10}-step={step}.ckpt", {"epoch": 0, "global_step": step}
    )
    if state == "in_progress":
        torch_zip(root / f"epoch={step // 10}-step={step}.ckpt.partial")
    return cut(path) if state == "truncated" else path


# layout -> (builder, reason when cut short, reason when in progress)
LAYOUTS = {
    "torch": (build_torch, "end-of-central-directory", "never finished"),
    "dcp": (build_dcp, "STOP", ".metadata.tmp"),
    "deepspeed": (build_deepspeed, "zero_pp_rank_1_mp_rank_00_optim_states.pt: truncated", "newer than"),
    "megatron": (build_megatron, "mp_rank_01/model_optim_rng.pt: truncated", "staging"),
    "huggingface": (build_huggingface, "not valid JSON", "staging"),
    "lightning": (build_lightning, "end-of-central-directory", "exists: a save is in progress"),
}  # fmt: skip


def by_step(found: list, step: int) -> C.Checkpoint:
    return next(cp for cp in found if cp.step == step)


def two_saves(root: Path, layout: str, newer: str = "complete") -> tuple[Path, Path]:
    """A complete save at step 10 and one at step 20 in state `newer`, both an hour old."""
    build = LAYOUTS[layout][0]
    older = build(root, 10)
    newest = build(root, 20, newer)
    set_age(root)
    return older, newest


# --- every layout: complete, cut short, in progress, just written ---------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_newest_complete_is_chosen(tmp_path, layout):
    _, newest = two_saves(tmp_path, layout)
    best = latest_complete(str(tmp_path))
    assert best is not None and best.complete
    assert (best.layout, best.step, best.path) == (layout, 20, str(newest))
    assert [cp.step for cp in find_checkpoints(str(tmp_path))] == [20, 10]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cut_short_falls_back_to_the_older_one(tmp_path, layout):
    why_cut = LAYOUTS[layout][1]
    older, _ = two_saves(tmp_path, layout, "truncated")
    best = latest_complete(str(tmp_path))
    assert best is not None and (best.step, best.path) == (10, str(older))
    skipped = by_step(find_checkpoints(str(tmp_path)), 20)
    assert not skipped.complete and why_cut in skipped.why


@pytest.mark.parametrize("layout", LAYOUTS)
def test_in_progress_falls_back_to_the_older_one(tmp_path, layout):
    why_busy = LAYOUTS[layout][2]
    older, _ = two_saves(tmp_path, layout, "in_progress")
    assert latest_complete(str(tmp_path)).path == str(older)
    skipped = by_step(find_checkpoints(str(tmp_path)), 20)
    assert not skipped.complete and why_busy in skipped.why


@pytest.mark.parametrize("layout", LAYOUTS)
def test_just_written_and_proven_by_its_format_is_taken_at_once(tmp_path, layout):
    # Each layout's commit artefact (ZIP end record, .metadata, latest, tracker,
    # trainer_state.json) is written after the data: no settle time needed.
    _, newest = two_saves(tmp_path, layout)
    touch_tree(newest)
    best = latest_complete(str(tmp_path))  # the default settle time
    assert best is not None and (best.step, best.path) == (20, str(newest))
    assert "may still be being written" not in best.why


def test_a_complete_torch_file_written_a_minute_ago_is_the_latest(tmp_path, capsys):
    # The example: `ckpt_200.pt` complete, written under a minute ago.
    build_torch(tmp_path, 100)
    set_age(tmp_path)
    newest = build_torch(tmp_path, 200)
    when = time.time() - 50
    os.utime(newest, (when, when))
    assert main(["checkpoint", "latest", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{newest}\n"


def test_just_written_plain_pickle_still_waits_for_the_settle_time(tmp_path):
    # A plain pickle is judged by its last byte only (a heuristic): that proves nothing.
    (tmp_path / "ckpt_10.pt").write_bytes(pickle.dumps({"w": [1] * 50}, protocol=2))
    set_age(tmp_path)
    (tmp_path / "ckpt_20.pt").write_bytes(pickle.dumps({"w": [2] * 50}, protocol=2))
    assert latest_complete(str(tmp_path)).step == 10
    assert "may still be being written" in by_step(find_checkpoints(str(tmp_path)), 20).why
    assert latest_complete(str(tmp_path), settle_s=0).step == 20


def test_just_written_legacy_torch_file_is_proven_by_its_sizes(tmp_path, monkeypatch):
    legacy_torch(tmp_path / "old_5.pt", monkeypatch, [("FloatStorage", 50)], 5)
    assert latest_complete(str(tmp_path)).step == 5  # just written, default settle time


def test_just_written_tmp_sibling_still_means_in_progress(tmp_path):
    build_torch(tmp_path, 10)
    set_age(tmp_path)
    build_torch(tmp_path, 20)
    torch_zip(tmp_path / "ckpt_20.pt.tmp")
    assert latest_complete(str(tmp_path)).step == 10


def test_deepspeed_dir_not_named_in_latest_is_proven_only_with_dp_world_size(tmp_path):
    older = build_deepspeed(tmp_path, 10)
    build_deepspeed(tmp_path, 20)  # `latest` names global_step20
    set_age(tmp_path)
    (tmp_path / "global_step20" / "mp_rank_00_model_states.pt").unlink()  # 20 incomplete
    touch_tree(older)
    cp = latest_complete(str(tmp_path))  # dp_world_size 2 read: both shards there, proven
    assert cp is not None and cp.step == 10
    torch_zip(older / "mp_rank_00_model_states.pt", {"module": {"w": 1}})  # ranks only counted
    found = by_step(find_checkpoints(str(tmp_path)), 10)
    assert not found.complete and "may still be being written" in found.why


def test_huggingface_rng_state_cut_short_is_incomplete(tmp_path):
    # Trainers before 4.36 wrote rng_state*.pth after trainer_state.json.
    build_huggingface(tmp_path, 10)
    d = build_huggingface(tmp_path, 20)
    torch_zip(d / "rng_state_1.pth")
    cut(d / "rng_state_1.pth")
    set_age(tmp_path)
    assert latest_complete(str(tmp_path)).step == 10
    assert "rng_state_1.pth: truncated" in by_step(find_checkpoints(str(tmp_path)), 20).why


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nothing_complete_is_none(tmp_path, layout):
    LAYOUTS[layout][0](tmp_path, 20, "truncated")
    set_age(tmp_path)
    assert latest_complete(str(tmp_path)) is None
    assert len(find_checkpoints(str(tmp_path))) == 1


# --- plain torch.save files -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "step"),
    [("ckpt_1200.pt", 1200), ("model_35.pth", 35), ("step-123.pt", 123),
     ("resnet50_epoch7_step900.pth.tar", 900), ("checkpoint.pt", 42)],
)  # fmt: skip
def test_step_is_the_last_number_in_the_name_or_in_the_pickle(tmp_path, name, step):
    torch_zip(tmp_path / name, {"global_step": 42})
    assert latest_complete(str(tmp_path), settle_s=0).step == step


def test_highest_step_wins_then_mtime(tmp_path):
    for step in (2, 10, 9):
        torch_zip(tmp_path / f"ckpt_{step}.pt")
    torch_zip(tmp_path / "model_10.pth")
    set_age(tmp_path)
    os.utime(tmp_path / "model_10.pth", (time.time() - 100,) * 2)
    found = find_checkpoints(str(tmp_path))
    assert [Path(cp.path).name for cp in found] == ["model_10.pth", "ckpt_10.pt", "ckpt_9.pt", "ckpt_2.pt"]  # fmt: skip


def test_tmp_sibling_means_a_save_in_progress(tmp_path):
    torch_zip(tmp_path / "ckpt_1.pt")
    torch_zip(tmp_path / "ckpt_2.pt")
    (tmp_path / "ckpt_2.pt.tmp").write_bytes(b"PK\x03\x04")
    set_age(tmp_path)
    assert latest_complete(str(tmp_path)).step == 1
    assert "ckpt_2.pt.tmp exists" in by_step(find_checkpoints(str(tmp_path)), 2).why


def test_zip_without_data_pkl_is_not_a_torch_file(tmp_path):
    with zipfile.ZipFile(tmp_path / "ckpt_5.pt", "w") as z:
        z.writestr("something/else.txt", b"hi")
    assert "data.pkl" in find_checkpoints(str(tmp_path), settle_s=0)[0].why


def test_zip_comment_and_zip64_records_are_understood(tmp_path, monkeypatch):
    with_comment = torch_zip(tmp_path / "ckpt_1.pt")
    with zipfile.ZipFile(with_comment, "a") as z:
        z.comment = b"x" * 10_000  # past the first 4 KiB read: the second, longer one finds it
    # Python writes ZIP64 records past ZIP64_LIMIT (2 GiB); lowered here to get them small.
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 100)
    big = torch_zip(tmp_path / "ckpt_2.pt", {"filler": "y" * 300, "global_step": 2})
    monkeypatch.undo()
    assert b"PK\x06\x06" in big.read_bytes() and zipfile.ZipFile(big).testzip() is None
    found = find_checkpoints(str(tmp_path), settle_s=0)
    assert [(cp.step, cp.complete) for cp in found] == [(2, True), (1, True)]
    cut(big, 0.95)
    assert not find_checkpoints(str(tmp_path), settle_s=0)[0].complete


def test_empty_and_garbage_files_are_skipped(tmp_path):
    (tmp_path / "ckpt_1.pt").write_bytes(b"")
    (tmp_path / "ckpt_2.pt").write_bytes(b"hello world")
    whys = [cp.why for cp in find_checkpoints(str(tmp_path), settle_s=0)]
    assert whys == ["neither a torch ZIP nor a pickle", "empty file"]


def test_plain_pickle_accepted_only_when_it_ends_with_stop(tmp_path):
    data = pickle.dumps({"weights": list(range(100))}, protocol=2)
    (tmp_path / "ckpt_1.pt").write_bytes(data)
    assert data[-30:-29] != b"."
    (tmp_path / "ckpt_2.pt").write_bytes(data[:-30])
    found = find_checkpoints(str(tmp_path), settle_s=0)
    assert [cp.complete for cp in found] == [False, True]
    assert "STOP" in found[0].why and "heuristic" in found[1].why


class _FakeStorage:
    def __init__(self, kind: type, key: str, numel: int, size: int):
        self.kind, self.key, self.numel, self.size = kind, key, numel, size


def legacy_torch(path: Path, monkeypatch, storages: list[tuple[str, int]], step: int) -> Path:
    """A pre-1.6 torch.save file: 5 pickles, then each storage as int64 count + raw bytes."""
    fake = types.ModuleType("torch")
    for kind in ("FloatStorage", "HalfStorage"):
        setattr(fake, kind, type(kind, (), {"__module__": "torch"}))
    monkeypatch.setitem(sys.modules, "torch", fake)
    sizes = {"FloatStorage": 4, "HalfStorage": 2}
    objs = [_FakeStorage(getattr(fake, k), str(1000 + i), n, sizes[k]) for i, (k, n) in enumerate(storages)]  # fmt: skip

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            if isinstance(obj, _FakeStorage):
                return ("storage", obj.kind, obj.key, "cpu", obj.numel, None)
            return None

    with open(path, "wb") as f:
        magic = 0x1950A86A20F9469CFC6C
        for head in (magic, 1001, {"protocol_version": 1001, "little_endian": True}):
            pickle.dump(head, f, protocol=2)
        state = {"step": step, "model": {f"layer{i}": s for i, s in enumerate(objs)}}
        state["again"] = objs[0]  # a storage shared by two tensors is stored once
        Pickler(f, protocol=2).dump(state)
        pickle.dump(sorted(o.key for o in objs), f, protocol=2)
        for o in sorted(objs, key=lambda o: o.key):
            f.write(struct.pack("<q", o.numel) + b"\x07" * (o.numel * o.size))
    return path


def test_legacy_torch_file_is_checked_by_its_storage_sizes(tmp_path, monkeypatch):
    good = legacy_torch(tmp_path / "old_5.pt", monkeypatch, [("FloatStorage", 50), ("HalfStorage", 7)], 5)  # fmt: skip
    assert good.read_bytes()[-1:] != b"."  # the STOP heuristic would refuse it: tensor data ends it
    cp = latest_complete(str(tmp_path), settle_s=0)
    assert cp.step == 5 and "2 storages" in cp.why
    legacy_torch(tmp_path / "old_6.pt", monkeypatch, [("FloatStorage", 50)], 6)
    cut(tmp_path / "old_6.pt", 0.9)
    assert latest_complete(str(tmp_path), settle_s=0).step == 5
    assert "storages need" in by_step(find_checkpoints(str(tmp_path), settle_s=0), 6).why


def test_reads_only_the_end_of_a_large_file(tmp_path, monkeypatch):
    torch_zip(tmp_path / "ckpt_1.pt", payload=os.urandom(1 << 20) * 24)
    read = []
    real_pread, real_read = os.pread, os.read
    monkeypatch.setattr(os, "pread", lambda fd, n, off: read.append(n) or real_pread(fd, n, off))
    monkeypatch.setattr(os, "read", lambda fd, n: read.append(n) or real_read(fd, n))
    assert latest_complete(str(tmp_path), settle_s=0).complete
    assert sum(read) < 100_000


# --- DCP --------------------------------------------------------------------------------------


def test_dcp_directory_without_metadata_is_an_unfinished_save(tmp_path):
    d = build_dcp(tmp_path, 5)
    (d / ".metadata").unlink()
    assert "no .metadata" in find_checkpoints(str(tmp_path), settle_s=0)[0].why


def test_dcp_metadata_tmp_next_to_metadata_is_in_progress(tmp_path):
    d = build_dcp(tmp_path, 5)
    (d / ".metadata.tmp").write_bytes(b"x")
    assert ".metadata.tmp" in find_checkpoints(str(tmp_path), settle_s=0)[0].why


def test_directories_that_are_not_checkpoints_are_ignored(tmp_path):
    (tmp_path / "runs" / "tb").mkdir(parents=True)
    (tmp_path / "config.yaml").write_text("a: 1")
    (tmp_path / "notes.txt").write_text("hi")
    assert find_checkpoints(str(tmp_path), settle_s=0) == []


# --- DeepSpeed --------------------------------------------------------------------------------


def test_deepspeed_missing_shard_is_found_from_dp_world_size(tmp_path):
    build_deepspeed(tmp_path, 10)
    d = build_deepspeed(tmp_path, 20, dp=4)
    (d / "zero_pp_rank_3_mp_rank_00_optim_states.pt").unlink()  # the highest rank: not a gap
    found = find_checkpoints(str(tmp_path), settle_s=0)
    assert latest_complete(str(tmp_path), settle_s=0).step == 10
    assert "dp 3 mp 00 optim" in by_step(found, 20).why
    assert "named in latest" in by_step(found, 20).why
    assert "older than global_step20" in by_step(found, 10).why


def test_deepspeed_latest_naming_nothing_is_skipped(tmp_path):
    build_deepspeed(tmp_path, 10)
    (tmp_path / "latest").write_text("global_step30\n")
    found = find_checkpoints(str(tmp_path), settle_s=0)
    assert [(Path(cp.path).name, cp.step, cp.complete) for cp in found] == [
        ("latest", 30, False),
        ("global_step10", 10, True),
    ]
    assert "names global_step30, which does not exist" in found[0].why


@pytest.mark.parametrize("content", ["../../etc", "", "/abs/path"])
def test_deepspeed_latest_with_a_path_is_refused(tmp_path, content):
    build_deepspeed(tmp_path, 10)
    (tmp_path / "latest").write_text(content)
    assert latest_complete(str(tmp_path), settle_s=0) is None


def test_deepspeed_without_latest_is_not_trusted(tmp_path):
    build_deepspeed(tmp_path, 10, "in_progress")
    cp = find_checkpoints(str(tmp_path), settle_s=0)[0]
    assert not cp.complete and "no latest names it" in cp.why


def test_deepspeed_zero3_and_bf16_names(tmp_path):
    d = tmp_path / "global_step7"
    for rank in range(2):
        torch_zip(d / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt", {"dp_world_size": 2})
        torch_zip(d / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    (tmp_path / "latest").write_text("global_step7")
    cp = latest_complete(str(tmp_path), settle_s=0)
    assert cp.step == 7 and "4 ZeRO shards" in cp.why
    (d / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    assert "dp 1 mp 00 model" in find_checkpoints(str(tmp_path), settle_s=0)[0].why


def test_deepspeed_without_model_states_is_incomplete(tmp_path):
    d = build_deepspeed(tmp_path, 10)
    (d / "mp_rank_00_model_states.pt").unlink()
    assert "model_states" in find_checkpoints(str(tmp_path), settle_s=0)[0].why


# --- Megatron ---------------------------------------------------------------------------------


def test_megatron_missing_tensor_parallel_rank(tmp_path):
    build_megatron(tmp_path, 100)
    d = build_megatron(tmp_path, 200, tp=4)
    for rank in (2, 3):
        (d / f"mp_rank_{rank:02d}" / "model_optim_rng.pt").unlink()
        (d / f"mp_rank_{rank:02d}").rmdir()
    found = find_checkpoints(str(tmp_path), settle_s=0)
    assert "2 of 4 rank files missing: mp_rank_02, mp_rank_03" in by_step(found, 200).why
    assert latest_complete(str(tmp_path), settle_s=0).step == 100


def test_megatron_pipeline_grid_and_distributed_optimizer(tmp_path):
    d = tmp_path / "iter_0000050"
    for tp in range(2):
        for pp in range(2):
            rank = d / f"mp_rank_{tp:02d}_{pp:03d}"
            torch_zip(rank / "model_optim_rng.pt", {"args": {"tensor_model_parallel_size": 2}})
            torch_zip(rank / "distrib_optim.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("50")
    assert latest_complete(str(tmp_path), settle_s=0).step == 50
    cut(d / "mp_rank_01_001" / "distrib_optim.pt")
    assert "mp_rank_01_001/distrib_optim.pt: truncated" in find_checkpoints(str(tmp_path), settle_s=0)[0].why  # fmt: skip
    for f in (d / "mp_rank_01_001").iterdir():
        f.unlink()
    (d / "mp_rank_01_001").rmdir()
    assert "mp_rank_01_001" in find_checkpoints(str(tmp_path), settle_s=0)[0].why


def test_megatron_torch_dist_and_release(tmp_path):
    d = build_dcp(tmp_path, 0)
    d.rename(tmp_path / "iter_0000300")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("300")
    cp = latest_complete(str(tmp_path), settle_s=0)
    assert (cp.layout, cp.step) == ("megatron", 300) and ".metadata" in cp.why
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release")
    build_megatron(tmp_path / "x", 1)
    (tmp_path / "x" / "iter_0000001").rename(tmp_path / "release")
    found = find_checkpoints(str(tmp_path), settle_s=0)
    release = next(cp for cp in found if cp.path.endswith("release"))
    assert release.complete and release.step is None


def test_megatron_newer_iteration_than_the_tracker_is_unfinished(tmp_path):
    build_megatron(tmp_path, 100)
    build_megatron(tmp_path, 200)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("100")
    assert "newer than iter_0000100" in by_step(find_checkpoints(str(tmp_path), settle_s=0), 200).why  # fmt: skip


def test_megatron_tracker_garbage(tmp_path):
    build_megatron(tmp_path, 100)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("soon")
    found = find_checkpoints(str(tmp_path), settle_s=0)
    assert not any(cp.complete for cp in found)
    assert any("not an iteration" in cp.why for cp in found)


# --- Hugging Face Trainer -------------------------------------------------------------------


def test_huggingface_without_trainer_state_or_with_a_wrong_step(tmp_path):
    build_huggingface(tmp_path, 10)
    (build_huggingface(tmp_path, 20) / "trainer_state.json").unlink()
    d = build_huggingface(tmp_path, 30)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 25}))
    found = find_checkpoints(str(tmp_path), settle_s=0)
    assert "global_step 25, not 30" in by_step(found, 30).why
    assert "no trainer_state.json" in by_step(found, 20).why
    assert latest_complete(str(tmp_path), settle_s=0).step == 10


# --- Lightning --------------------------------------------------------------------------------


def test_lightning_last_ckpt_symlink_is_its_target(tmp_path):
    target = build_lightning(tmp_path, 400)
    build_lightning(tmp_path, 300)
    (tmp_path / "last.ckpt").symlink_to(target.name)
    set_age(tmp_path)
    found = find_checkpoints(str(tmp_path))
    assert [cp.step for cp in found] == [400, 300]
    assert latest_complete(str(tmp_path)).path == str(target)


def test_lightning_last_ckpt_file_takes_its_step_from_the_pickle(tmp_path):
    build_lightning(tmp_path, 300)
    torch_zip(tmp_path / "last.ckpt", {"epoch": 9, "global_step": 950})
    torch_zip(tmp_path / "epoch=3-val_loss=0.25.ckpt", {"epoch": 3, "global_step": 310})
    found = find_checkpoints(str(tmp_path), settle_s=0)
    assert [(Path(cp.path).name, cp.step) for cp in found] == [
        ("last.ckpt", 950),
        ("epoch=3-val_loss=0.25.ckpt", 310),
        ("epoch=30-step=300.ckpt", 300),
    ]


def test_lightning_directories_in_dcp_and_deepspeed_layout(tmp_path):
    build_dcp(tmp_path, 0).rename(tmp_path / "epoch=1-step=100.ckpt")
    ds = tmp_path / "epoch=2-step=200.ckpt"
    ds.mkdir()
    torch_zip(ds / "checkpoint" / "mp_rank_00_model_states.pt", {"dp_world_size": 1})
    torch_zip(ds / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (ds / "latest").write_text("checkpoint")
    found = find_checkpoints(str(tmp_path), settle_s=0)
    assert [(cp.step, cp.layout, cp.complete) for cp in found] == [
        (200, "lightning", True),
        (100, "lightning", True),
    ]
    assert "DeepSpeed directory" in found[0].why and ".metadata" in found[1].why
    (ds / "latest").write_text("elsewhere")
    assert "not a directory here" in find_checkpoints(str(tmp_path), settle_s=0)[0].why


# --- safety -----------------------------------------------------------------------------------


def test_symlink_leaving_dir_is_refused(tmp_path):
    outside = torch_zip(tmp_path / "outside" / "secret.pt")
    d = tmp_path / "ckpts"
    torch_zip(d / "ckpt_1.pt")
    (d / "ckpt_99.pt").symlink_to(outside)
    (d / "last.ckpt").symlink_to("../outside/secret.pt")
    (d / "global_step5").symlink_to(outside.parent)
    (d / "latest").write_text("global_step5")
    found = find_checkpoints(str(d), settle_s=0)
    refused = [cp for cp in found if "leaves" in cp.why]
    assert len(refused) == 3 and not any(cp.complete for cp in refused)
    assert latest_complete(str(d), settle_s=0).path == str(d / "ckpt_1.pt")


def test_symlink_inside_dir_is_followed_and_reported_as_its_target(tmp_path):
    torch_zip(tmp_path / "store" / "real_7.pt")
    (tmp_path / "ckpt_7.pt").symlink_to("store/real_7.pt")
    cp = latest_complete(str(tmp_path), settle_s=0)
    assert cp.path == str(tmp_path / "store" / "real_7.pt") and cp.step == 7


def test_symlinks_inside_a_checkpoint_are_not_followed(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"global_step": 5}')
    d = tmp_path / "ckpts"
    build_huggingface(d, 5)
    (d / "checkpoint-5" / "trainer_state.json").unlink()
    (d / "checkpoint-5" / "trainer_state.json").symlink_to(secret)
    build_megatron(d, 9, tp=1)
    rank = d / "iter_0000009" / "mp_rank_00"
    torch_zip(tmp_path / "elsewhere" / "model_optim_rng.pt")
    (rank / "model_optim_rng.pt").unlink()
    rank.rmdir()
    rank.symlink_to(tmp_path / "elsewhere")
    found = find_checkpoints(str(d), settle_s=0)
    assert "symlink" in by_step(found, 5).why and "symlink" in by_step(found, 9).why
    assert latest_complete(str(d), settle_s=0) is None


def test_fifo_named_like_a_checkpoint_does_not_hang(tmp_path):
    torch_zip(tmp_path / "ckpt_1.pt")
    os.mkfifo(tmp_path / "ckpt_9.pt")
    (tmp_path / "checkpoint-3").mkdir()
    os.mkfifo(tmp_path / "checkpoint-3" / "trainer_state.json")
    signal.signal(signal.SIGALRM, lambda *a: pytest.fail("blocked on a FIFO"))
    signal.alarm(5)
    try:
        found = find_checkpoints(str(tmp_path), settle_s=0)
    finally:
        signal.alarm(0)
    assert "not a regular file" in by_step(found, 9).why
    assert "not a regular file" in by_step(found, 3).why
    assert latest_complete(str(tmp_path), settle_s=0).step == 1


def test_listing_is_capped(tmp_path):
    for i in range(30):
        (tmp_path / f"junk{i}").write_text("")
    result = scan(str(tmp_path), settle_s=0, max_entries=10)
    assert "more than 10 entries" in result.notes[0]


def test_pointing_at_one_checkpoint_itself_says_so(tmp_path):
    d = build_dcp(tmp_path, 5)
    result = scan(str(d), settle_s=0)
    assert result.checkpoints == () and "pass the directory above it" in result.notes[0]


def test_bad_directory_raises(tmp_path):
    with pytest.raises(C.CheckpointDirError, match="no such directory"):
        scan(str(tmp_path / "nope"))
    (tmp_path / "f").write_text("")
    with pytest.raises(C.CheckpointDirError, match="not a directory"):
        scan(str(tmp_path / "f"))


def test_results_are_plain_data(tmp_path):
    build_deepspeed(tmp_path, 3)
    found = find_checkpoints(str(tmp_path), settle_s=0)
    assert json.loads(json.dumps([cp.to_dict() for cp in found]))[0]["layout"] == "deepspeed"


# --- the CLI ----------------------------------------------------------------------------------


def test_cli_latest_prints_the_path(tmp_path, capsys):
    build_torch(tmp_path, 1)
    newest = build_torch(tmp_path, 2)
    build_torch(tmp_path, 3, "truncated")
    set_age(tmp_path)
    assert main(["checkpoint", "latest", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{newest}\n"
    assert "skipped" in err and "ckpt_3.pt" in err


def test_cli_latest_json(tmp_path, capsys):
    build_torch(tmp_path, 1)
    build_torch(tmp_path, 3, "truncated")
    assert main(["checkpoint", "latest", str(tmp_path), "--json", "--settle-s", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["step"], out["layout"], Path(out["path"]).name) == (1, "torch", "ckpt_1.pt")
    assert out["why"] and [s["step"] for s in out["skipped"]] == [3]
    assert "end-of-central-directory" in out["skipped"][0]["why"]


def test_cli_latest_none_complete_is_exit_1_naming_dir_and_reasons(tmp_path, capsys):
    build_torch(tmp_path, 3, "truncated")
    assert main(["checkpoint", "latest", str(tmp_path), "--settle-s", "0"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"no complete checkpoint under {tmp_path}" in err
    assert "ckpt_3.pt: truncated" in err
    assert main(["checkpoint", "latest", str(tmp_path), "--json", "--settle-s", "0"]) == 1
    assert json.loads(capsys.readouterr().out)["path"] is None


def test_cli_latest_empty_dir_is_exit_1(tmp_path, capsys):
    assert main(["checkpoint", "latest", str(tmp_path)]) == 1
    assert "nothing there looks like a checkpoint" in capsys.readouterr().err


def test_cli_bad_dir_is_exit_2(tmp_path, capsys):
    assert main(["checkpoint", "latest", str(tmp_path / "missing")]) == 2
    assert f"{tmp_path / 'missing'}: no such directory" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["checkpoint", "list", str(tmp_path / "file")]) == 2
    assert main(["checkpoint", "latest", str(tmp_path), "--settle-s", "-1"]) == 2


def test_cli_list_shows_every_candidate(tmp_path, capsys):
    build_huggingface(tmp_path, 10)
    build_huggingface(tmp_path, 20, "truncated")
    build_huggingface(tmp_path, 30, "in_progress")
    set_age(tmp_path)
    assert main(["checkpoint", "list", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines[::2]] == [
        ["SKIPPED", "huggingface", "30"],
        ["SKIPPED", "huggingface", "20"],
        ["OK", "huggingface", "10"],
    ]
    assert "not valid JSON" in lines[3]
    assert main(["checkpoint", "list", str(tmp_path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["checkpoints"]) == 3


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["checkpoint", "latest", "--help"])
    assert exc.value.code == 0 and "--settle-s" in capsys.readouterr().out

"""`gpugate report`'s numbers: bundles of the window, requeue decisions, GPU-hours lost by
cause (admin/losses.py), and the SVG charts' structure and escaping (admin/charts.py)."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pytest
from factories import make_bundle, make_decision

from gpugate.admin import charts as C
from gpugate.admin import losses as L
from gpugate.clock import utc
from gpugate.log import Event
from gpugate.store.evidence import write_bundle

HOUR = 3600.0
T0 = 1_790_000_000.0  # a run's start
SCRIPT = "<script>alert(1)</script>"


def summary(node: str, restart: int, category: str | None, gpus: list | None, start: float,
            failed: float, **extra: object) -> dict:  # fmt: skip
    return {"node": node, "restart": restart, "category": category, "gpus": gpus,
            "node_gpus": 8, "job_start": utc(start), "job_end": utc(failed + 60),
            "first_failure_at": utc(failed), **extra}  # fmt: skip


def bundle(ev, job: str, s: dict, at: float) -> str:
    return write_bundle(str(ev), job, s["node"], s["restart"], {}, s, now=at)


def events(state, *lines: dict) -> None:
    os.makedirs(state, exist_ok=True)
    with open(os.path.join(state, L.EVENTS), "a") as fh:
        for e in lines:
            fh.write(json.dumps({"hook": L.REQUEUE_HOOK, **e}) + "\n")


@pytest.fixture
def site(tmp_path):
    ev, state = tmp_path / "ev", tmp_path / "state"
    # Job 100, run 0: 4 GPUs on each of two nodes, NCCL timeout 3 h after start; the requeue
    # found a checkpoint written 2 h in: 1 h lost on 8 GPUs = 8 GPU-hours.
    ckpt = tmp_path / "ckpt" / "step-200"
    ckpt.mkdir(parents=True)
    os.utime(ckpt, (T0 + 2 * HOUR, T0 + 2 * HOUR))
    for node in ("gpu-01", "gpu-02"):
        bundle(ev, "100", summary(node, 0, "nccl_timeout", [0, 1, 2, 3], T0, T0 + 3 * HOUR),
               T0 + 3 * HOUR)  # fmt: skip
    # Job 100, run 1: resumed from that checkpoint at 4 h, died of Xid at 4.5 h before any new
    # checkpoint: lost from the run's start (the checkpoint is older): 0.5 h x 2 GPUs = 1.
    bundle(ev, "100", summary("gpu-03", 1, "gpu_xid_hardware", [0, 1], T0 + 4 * HOUR,
                              T0 + 4.5 * HOUR), T0 + 4.5 * HOUR)  # fmt: skip
    # Job 200: no checkpoint, GPUs unknown (the node's 8), cuda_oom 30 min after start: 4.
    bundle(ev, "200", summary("gpu-04", 0, "cuda_oom", None, T0, T0 + 0.5 * HOUR), T0 + HOUR)
    # Job 300: undiagnosed (no category), one GPU, 1 h after start: 1.
    bundle(ev, "300", summary("gpu-05", 0, None, [0], T0, T0 + HOUR), T0 + HOUR)
    events(state,
           {"time": utc(T0 + 3 * HOUR + 30), "job": "100", "restarts": 0, "requeue": True,
            "why": "infrastructure failure (nccl_timeout)", "checkpoint": str(ckpt)},
           {"time": utc(T0 + 4.5 * HOUR + 30), "job": "100", "restarts": 1, "requeue": False,
            "why": "no restarts left", "checkpoint": None},
           {"time": utc(T0 - 90 * 86400), "job": "1", "restarts": 0, "requeue": True})  # fmt: skip
    return ev, state


def test_read_failures_from_bundles(site):
    ev, _ = site
    got = L.read_failures(str(ev), T0 - 86400)
    assert [(f.path, f.category, f.gpus) for f in got] == [
        ("200/gpu-04-r0", "cuda_oom", 8),
        ("300/gpu-05-r0", L.UNDIAGNOSED, 1),
        ("100/gpu-01-r0", "nccl_timeout", 4),
        ("100/gpu-02-r0", "nccl_timeout", 4),
        ("100/gpu-03-r1", "gpu_xid_hardware", 2),
    ]
    assert got[0].failed == T0 + 0.5 * HOUR and got[0].start == T0
    assert L.read_failures(str(ev), T0 + 4 * HOUR) == got[-1:]  # the window's bundles only
    assert L.read_failures(str(ev / "none"), 0) == []


def test_gpu_hours_lost_by_cause(site):
    ev, state = site
    since = T0 - 86400
    costs = L.costed(L.read_failures(str(ev), since), L.requeue_events(str(state), since))
    by = {c.path: c for c in costs}
    assert by["100/gpu-01-r0"].gpu_hours == pytest.approx(4.0)
    assert by["100/gpu-01-r0"].lost_from == pytest.approx(T0 + 2 * HOUR)  # the checkpoint
    assert by["100/gpu-01-r0"].requeued is True and by["100/gpu-01-r0"].from_checkpoint
    assert not by["100/gpu-03-r1"].from_checkpoint
    assert by["100/gpu-03-r1"].gpu_hours == pytest.approx(1.0)
    assert by["100/gpu-03-r1"].lost_from == T0 + 4 * HOUR  # the run's start, not the old ckpt
    assert by["100/gpu-03-r1"].requeued is False
    assert by["200/gpu-04-r0"].gpu_hours == pytest.approx(4.0)  # 8 GPUs x 0.5 h
    assert L.by_category(costs) == [
        ("nccl_timeout", 2, pytest.approx(8.0)),
        ("cuda_oom", 1, pytest.approx(4.0)),
        ("gpu_xid_hardware", 1, pytest.approx(1.0)),  # a tie: by name
        (L.UNDIAGNOSED, 1, pytest.approx(1.0)),
    ]


def test_lost_time_edges():
    f = make_bundle(start=T0, failed=T0 + HOUR, gpus=8)
    assert L.lost_gpu_hours(f, None) == (8.0, T0)
    assert L.lost_gpu_hours(f, T0 + 2 * HOUR) == (0.0, T0 + 2 * HOUR)  # never negative
    assert L.lost_gpu_hours(f.replace(gpus=None), None) == (None, None)
    assert L.lost_gpu_hours(f.replace(start=None), None) == (None, None)
    assert L.lost_gpu_hours(f.replace(start=None), T0 + 0.5 * HOUR)[0] == 4.0
    assert L.checkpoint_time("(not visible here: no such dir)") is None
    assert L.checkpoint_time("/nonexistent/ckpt") is None


def test_requeue_match_without_run_number():
    events = [make_decision(T0 - 86400, job="7"), make_decision(T0 + 10, job="7", checkpoint="/c")]
    f = make_bundle("7", restart=0, failed=T0)
    assert L.match_requeue(f, events).checkpoint == "/c"  # the decision after the failure
    assert L.match_requeue(f.replace(job="8"), events) is None


def test_a_decision_reads_its_keys_typed_and_writes_its_line_again():
    d = make_decision(T0, job="7", restarts=2, requeue=True, suspects=["n1", 3], checkpoint=5,
                said="requeued")  # fmt: skip
    assert (d.restarts, d.requeue, d.suspects, d.checkpoint) == (2, True, ("n1", "3"), None)
    assert d.to_json() == {"time": utc(T0), "hook": L.REQUEUE_HOOK, "job": "7", "restarts": 2,
                           "requeue": True, "suspects": ["n1", 3], "checkpoint": 5,
                           "said": "requeued", "when": T0}  # fmt: skip
    assert make_decision(T0, job="7", restarts=True).restarts is None  # a bool is no run number
    assert L.decision(Event(time="never", hook=L.REQUEUE_HOOK, extra={"job": "7"})) is None
    assert L.decision(Event(time=utc(T0), hook=L.REQUEUE_HOOK, extra={"job": 7})) is None


def test_bad_summaries_and_event_lines_are_skipped(tmp_path):
    ev = tmp_path / "ev"
    path = bundle(ev, "5", summary("n1", 0, None, None, T0, T0 + HOUR), T0)
    got = L.read_failures(str(ev), 0)
    assert got[0].category == L.UNDIAGNOSED and got[0].gpus == 8
    # A summary whose field has the wrong type is not a summary (EvidenceSummary.from_json).
    bad = dict(summary("n1", 0, ["not", "a", "category"], "x", T0, T0 + HOUR), job_id="5")
    for text in (json.dumps(bad), "[[["):
        with open(os.path.join(path, "summary.json"), "w") as fh:
            fh.write(text)
        assert L.read_failures(str(ev), 0) == []
    state = tmp_path / "state"
    state.mkdir()
    (state / L.EVENTS).write_text('not json\n{"hook": "epilog-slurmctld", "job": 5}\n'
                                  '{"hook": "prolog", "job": "5", "time": "2026-01-01T00:00:00Z"}\n')  # fmt: skip
    assert L.requeue_events(str(state), 0) == []


# --------------------------------------------------------------------------------- charts


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # well-formed XML, or this raises
    assert root.tag == "svg" and root.get("role") == "img"
    return root


def test_hbars_structure_and_scale():
    root = parse(C.hbars("Failures by cause", [("nccl_timeout", 4), ("cuda_oom", 2)]))
    bars = list(root.iter("rect"))
    assert len(bars) == 2
    assert float(bars[0].get("width")) == pytest.approx(2 * float(bars[1].get("width")))
    assert root.find("title").text == "Failures by cause"
    texts = [t.text for t in root.iter("text")]
    assert texts[0] == "Failures by cause"  # the caption a person sees
    assert texts[1::2] == ["nccl_timeout", "cuda_oom"] and texts[2::2] == ["4", "2"]


def test_long_labels_are_cut_with_the_whole_in_the_tooltip():
    name = "x" * 40
    root = parse(C.hbars("t", [(name, 1.5)], unit=" GPU-h"))
    assert [t.text for t in root.iter("text")][1] == "x" * 23 + "\u2026"
    assert next(root.iter("rect")).find("title").text == f"{name}: 1.5 GPU-h"


def test_vbars_and_stacked_structure():
    root = parse(C.vbars("Nodes by repeat count", [("1", 5.0), ("2", 0.0), ("3", 1.0)]))
    heights = [float(r.get("height")) for r in root.iter("rect")]
    assert heights[1] == 0 and heights[0] == pytest.approx(5 * heights[2])
    root = parse(C.stacked_bars("Drains per day", ["11-01", "11-02"],
                                {"gpu.ecc": [1, 0], "ib.ports": [2, 3]}))  # fmt: skip
    segs = [r for r in root.iter("rect") if r.get("class") == "seg"]
    assert len(segs) == 3  # a zero is no segment
    assert {s.get("fill") for s in segs} == {C.colour(0), C.colour(1)}
    legend = [t.text for t in root.iter("text")]
    assert "gpu.ecc" in legend and "ib.ports" in legend and "11-02" in legend


def test_empty_charts_are_valid():
    for svg in (C.hbars("t", []), C.vbars("t", []), C.stacked_bars("t", [], {})):
        parse(svg)


def test_chart_labels_are_escaped():
    hostile = f'{SCRIPT}"\u202e'
    for svg in (C.hbars(hostile, [(hostile, 1)]), C.vbars(hostile, [(hostile, 1)]),
                C.stacked_bars(hostile, [hostile], {hostile: [1]})):  # fmt: skip
        assert "<script" not in svg and "\u202e" not in svg
        root = parse(svg)
        assert root.find("title").text.startswith(SCRIPT)  # shown as text
        assert not list(root.iter("script"))


# ------------------------------------------------------------------ from the real epilog


def test_the_epilog_s_bundle_carries_the_job_s_gpus(tmp_path):
    from epilog_setup import NCCL_TIMEOUT, job_run

    config = job_run(tmp_path, "step 10\n" + NCCL_TIMEOUT, gpus=(2, 3))[2]
    got = L.read_failures(config.evidence_dir, 0)
    assert [(f.category, f.gpus) for f in got] == [("nccl_timeout", 2)]
    (tmp_path / "b").mkdir()
    whole = job_run(tmp_path / "b", "step 10\n" + NCCL_TIMEOUT)[2]  # no SLURM_JOB_GPUS
    assert L.read_failures(whole.evidence_dir, 0)[0].gpus == 8  # the node's GPUs

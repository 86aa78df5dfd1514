"""Confidence and alternatives of a diagnosis (gpugate/diagnosis/confidence.py) and who acts on it."""

from __future__ import annotations

import pytest
from factories import view, views

from gpugate.commands.diagnose import render
from gpugate.diagnosis import confidence as C
from gpugate.diagnosis import signatures as S
from gpugate.diagnosis.engine import diagnose_bytes
from gpugate.diagnosis.rank import TIERS, Signal
from gpugate.diagnosis.verdict import JOB_FILE, KERNEL_LOG, LOG_FILE
from gpugate.gate.requeue import JobEnd, cause, sure_infrastructure
from gpugate.store import metrics as M


def sig(category: str, line: int, spec: int = 90, strength: str = S.FATAL, file: int = 0,
        rank: int | None = None, xid: int | None = None, text: str = "") -> Signal:  # fmt: skip
    """A live signal as the ranking sees it (the signature table is not involved)."""
    m = S.Match(signature=f"test.{category}", category=category, strength=strength,
                specificity=spec, text=text or f"{category} at line {line}", rank=rank, xid=xid)  # fmt: skip
    return Signal(file=file, line=line, match=m)


def judge(
    live: list[Signal], rank: int | None = None, sources: tuple = (LOG_FILE,)
) -> C.Assessment:
    """Assess `live` the way rank._rank does: the top tier's lines of the first category win."""
    top = max(s.tier for s in live)
    first = sorted((s for s in live if s.tier == top), key=lambda s: (s.file, s.line))[0]
    winners = [s for s in live if s.tier == top and s.match.category == first.match.category]
    return C.assess(live, winners, top, rank, ["a.log", "b.log"], list(sources) * 2)


def test_a_specific_fatal_line_alone_is_high() -> None:
    a = judge([sig("cuda_oom", 5, spec=90)])
    assert (a.level, a.alternatives, C.note(a)) == (C.HIGH, (), "")


def test_only_minor_lines_are_low() -> None:
    a = judge([sig("slurm_cancelled", 3, spec=30, strength=S.MINOR)])
    assert a.level == C.LOW and "minor" in a.why


def test_a_generic_line_or_category_other_is_medium() -> None:
    assert judge([sig("other", 4, spec=80)]).level == C.MEDIUM
    assert judge([sig("nccl_timeout", 4, spec=20)]).level == C.MEDIUM
    # The table's default specificity: no generic line, but naming no kind of failure either.
    assert judge([sig("nccl_error", 4, spec=C.GENERIC)]).level == C.MEDIUM
    assert judge([sig("nccl_error", 4, spec=C.SPECIFIC)]).level == C.HIGH


def test_an_unexplained_sigkill_is_low_and_a_named_oom_is_not() -> None:
    """A SIGKILL's end line alone (an END_ONLY signature, category other) says how the run
    ended, not why: low. A line that names the RAM is host_oom at its own strength."""
    s = sig("other", 4, spec=65)
    killed = s.replace(match=s.match.replace(signature="torchrun.exitcode_field",
                                             fields={"inferred": "sigkill"}))  # fmt: skip
    assert judge([killed]).level == C.LOW
    assert judge([sig("host_oom", 4, spec=65)]).level == C.HIGH


def test_precursor_lines_alone_are_medium() -> None:
    a = judge([sig("nccl_error", 2, spec=50, strength=S.PRECURSOR)])
    assert a.level == C.MEDIUM and "precursor" in a.why


def test_a_fatal_rival_one_tier_below_is_medium_and_the_summary_says_it(monkeypatch) -> None:
    # The pair's tiers are set here: the table's order is the ranking's business.
    monkeypatch.setitem(TIERS, "nccl_error", 40)
    monkeypatch.setitem(TIERS, "nccl_timeout", 30)
    assert not [t for t in TIERS.values() if 30 < t < 40]  # one step apart
    a = judge([sig("nccl_timeout", 1), sig("nccl_error", 9, spec=80)])
    assert a.level == C.MEDIUM and a.undecided == ("nccl_error", "nccl_timeout")
    assert C.note(a) == " The text cannot decide between nccl_error and nccl_timeout."


def test_a_rival_further_below_or_a_generic_one_leaves_it_high() -> None:
    assert judge([sig("cuda_oom", 9), sig("nccl_timeout", 12)]).level == C.HIGH
    assert judge([sig("slurm_time_limit", 9), sig("other", 3, spec=25)]).level == C.HIGH


def test_two_infrastructure_causes_one_tier_apart_agree() -> None:
    live = [sig("gpu_xid_hardware", 4, xid=79), sig("slurm_node_failure", 8)]
    assert judge(live).level == C.HIGH


def test_two_categories_of_one_tier_and_different_kinds_are_low(monkeypatch) -> None:
    # No two kinds share a tier in today's table: give one, as a site's table could.
    monkeypatch.setitem(TIERS, "slurm_node_failure", TIERS["host_oom"])
    a = judge([sig("host_oom", 3), sig("slurm_node_failure", 7)])
    assert a.level == C.LOW and a.undecided == ("host_oom", "slurm_node_failure")


def test_hardware_categories_sharing_their_tier_do_not_disagree() -> None:
    live = [sig("gpu_xid_hardware", 2, xid=79), sig("nvlink_error", 5)]
    assert judge(live).level == C.HIGH


APP_XID = "NVRM: Xid (PCI:0000:3b:00): 13, pid=77, name=python, Graphics SM Warp Exception"
HW_XID = "NVRM: Xid (PCI:{}): 109, pid=77, name=python, Ch 00000008, errorString CTX SWITCH TIMEOUT"


@pytest.mark.parametrize(("gpu", "level"), [("0000:3b:00", C.MEDIUM), ("0000:5e:00", C.HIGH)])
def test_an_application_xid_first_on_the_same_gpu_makes_a_hardware_xid_medium(gpu, level) -> None:
    live = [sig("gpu_xid_user_app", 2, xid=13, text=APP_XID),
            sig("gpu_xid_hardware", 6, xid=109, text=HW_XID.format(gpu))]  # fmt: skip
    assert judge(live).level == level


def test_several_ranks_for_a_one_rank_fault_are_medium() -> None:
    live = [sig("cuda_oom", 3, rank=1), sig("cuda_oom", 4, rank=6)]
    assert judge(live, rank=None).level == C.MEDIUM
    # Every rank printing the same timeout is no doubt about the category.
    live = [sig("nccl_timeout", 3, rank=1), sig("nccl_timeout", 4, rank=6)]
    assert judge(live, rank=None).level == C.HIGH


def test_a_hardware_line_root_read_is_high_even_when_its_signature_is_loose() -> None:
    live = [sig("gpu_xid_hardware", 3, spec=45, xid=79)]
    assert judge(live, sources=(KERNEL_LOG,)).level == C.HIGH
    assert judge(live, sources=(LOG_FILE,)).level == C.MEDIUM


def test_alternatives_are_ordered_by_tier_then_line_with_three_lines_each() -> None:
    live = [sig("gpu_xid_hardware", 50, xid=79)]
    live += [sig("nccl_timeout", n) for n in (10, 11, 12, 13)]
    live += [sig("cuda_oom", 30), sig("other", 1, spec=10), sig("slurm_cancelled", 60)]
    a = judge(live)
    assert [x["category"] for x in a.alternatives] == [
        "cuda_oom",
        "nccl_timeout",
        "slurm_cancelled",
    ]
    timeout = a.alternatives[1]
    assert timeout["tier"] == TIERS["nccl_timeout"]
    assert [e["line"] for e in timeout["evidence"]] == [10, 11, 12]
    assert timeout["evidence"][0] == {
        "file": "a.log",
        "line": 10,
        "text": "nccl_timeout at line 10",
    }


OOM_THEN_TIMEOUTS = b"""step 10 loss 2.1
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 1 has a total capacity of 79 GiB
[rank0]:[E ProcessGroupNCCL.cpp:455] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.
"""


def test_the_json_has_confidence_and_alternatives_and_keeps_its_keys() -> None:
    d = diagnose_bytes(OOM_THEN_TIMEOUTS)
    j = d.to_json()
    assert (j["category"], j["confidence"]) == ("cuda_oom", C.HIGH)
    assert [a["category"] for a in j["alternatives"]] == ["nccl_timeout"]
    assert j["alternatives"][0]["evidence"][0]["line"] == 3
    for key in ("category", "xid", "failing_rank", "summary", "evidence", "trusted", "signals"):
        assert key in j


def test_a_clean_log_is_a_sure_no_failure_without_alternatives() -> None:
    j = diagnose_bytes(b"step 1 loss 2.0\nstep 2 loss 1.9\n{'train_runtime': 81.2}\n").to_json()
    assert (j["category"], j["confidence"], j["alternatives"]) == ("no_failure", C.HIGH, [])


def test_a_log_without_an_end_is_a_low_unknown() -> None:
    j = diagnose_bytes(b"step 1 loss 2.0\nstep 2 loss 1.9\n").to_json()
    assert (j["category"], j["confidence"], j["evidence"]) == ("unknown", C.LOW, [])


def test_an_other_on_end_lines_only_is_low_and_a_named_exception_medium() -> None:
    launcher = b"=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
    assert diagnose_bytes(launcher).to_json()["confidence"] == C.LOW
    named = b"ValueError: shapes do not match\n" + launcher
    assert diagnose_bytes(named).to_json()["confidence"] == C.MEDIUM


def test_the_report_shows_confidence_and_alternatives_on_one_line() -> None:
    text = render(diagnose_bytes(OOM_THEN_TIMEOUTS))
    line = next(x for x in text.splitlines() if "confidence:" in x)
    assert line.split() == ["confidence:", "high", "else:", "nccl_timeout", "(<memory>:3)"]


@pytest.mark.parametrize(("confidence", "counted"), [
    ("high", "ecc_error"), ("medium", M.UNCERTAIN), ("low", M.UNCERTAIN), (None, "ecc_error")])  # fmt: skip
def test_metrics_count_only_a_high_verdict_under_its_category(confidence, counted) -> None:
    out = M.apply_run({}, "n1", "epilog", category="ecc_error", confidence=confidence, now=1.0)
    diag = {dict(k[1])["category"]: v for k, v in out.items() if k[0] == "gpugate_diagnoses_total"}
    assert diag == {counted: 1}


def bundle(confidence: str | None, trusted: bool = True) -> dict:
    """A node's summary.json with a hardware category the diagnosis decided (not its checks)."""
    out = {"node": "n1", "category": "ecc_error", "category_trusted": trusted,
           "category_source": KERNEL_LOG if trusted else JOB_FILE, "hardware_fault": False}  # fmt: skip
    if confidence is not None:
        out["confidence"] = confidence
    return out


@pytest.mark.parametrize(("confidence", "infra"), [
    ("high", True), ("medium", False), ("low", False), (None, True)])  # fmt: skip
def test_the_requeue_takes_an_infrastructure_cause_only_when_sure(confidence, infra) -> None:
    category, _, is_infra = cause(JobEnd(job_id="7", state="FAILED"), views([bundle(confidence)]))
    assert is_infra is infra
    assert category == ("ecc_error" if infra else None)
    assert sure_infrastructure(view(bundle(confidence))) is infra
    assert sure_infrastructure(view(bundle(confidence, trusted=False))) is False


@pytest.mark.parametrize("confidence", ["high", "low"])
def test_the_epilog_hands_its_confidence_to_the_metrics(confidence) -> None:
    from gpugate.hooks.epilog import EpilogResult, note_metrics

    r = EpilogResult(abnormal=True, why="exit code 1", category="ecc_error", confidence=confidence)
    # The metrics step the epilog plans (gpugate/act/execute.py hands `run` to metrics.note_run).
    step = note_metrics(None, type("Env", (), {"node": "n1"})(), r)  # type: ignore[arg-type]
    assert (step.run["category"], step.run["confidence"]) == ("ecc_error", confidence)

"""Issue 28, Deliver 4: jobs, qualifications and drills are their own kind.

A bundle carries its kind; the report lists only a job's bundle as a failed run, a
qualification as passed / failed (with its reason) / not qualified, a drill as a drill; a
drill's drain is never a false drain; metrics count drills and qualifications apart; the
controller marks a drill's AdminComment `DRILL <id>`, as the node's drain reason is.
"""

from __future__ import annotations

import json
import time

import pytest
from factories import default_config
from fakes import FakeSlurm
from report_page import site  # noqa: F401  (site: a fixture: config, sinfo.json, drains on vm)

from gpugate import cli
from gpugate.admin import losses as L
from gpugate.clock import utc
from gpugate.gate.requeue import JobEnd
from gpugate.hooks.epilog_slurmctld import run_requeue
from gpugate.qualify.settle import fault_kind, outcome
from gpugate.slurm import reasons
from gpugate.slurm.records import JobInfo
from gpugate.store import history as H
from gpugate.store.entries import AuditEntry, DrainEntry
from gpugate.store.evidence import bundle_kind, read_index, write_bundle
from gpugate.store.metrics import apply_qualification, apply_run, render
from gpugate.store.outcomes import check_record, drill_drains, note_lift
from gpugate.store.qualify import QualifyEntry, QualifyTestResult

NOW = 1_790_000_000.0
DAY = 86400.0
DRILL_ID = "20261203-101500"


@pytest.fixture(autouse=True)
def unmarked():
    # The drill mark is the process's: no test leaves it set for the next.
    reasons.mark_drill(None)
    yield
    reasons.mark_drill(None)


# ------------------------------------------------------------------- the bundles' kinds

DCGM_HW = {"test": "dcgm", "ok": False, "nodes": ["vm"], "job_id": "501", "value_gbps": None,
           "detail": "dcgm level 2: failed: memory: GPU 3: DBE (DCGM error id 58)",
           "findings": [{"test": "memory", "gpu": 3, "status": "Fail", "message": "DBE",
                         "kind": "hardware", "cause": ""}]}  # fmt: skip
DCGM_FM = {"test": "dcgm", "ok": False, "nodes": ["vm"], "job_id": "502", "value_gbps": None,
           "detail": "dcgm level 2: failed: memory: fabric manager: cuInit: system not yet "
           "initialized [not the GPU: a node problem]",
           "findings": [{"test": "memory", "gpu": None, "status": "Fail", "message": "cuInit",
                         "kind": "software", "cause": "fabric manager"}]}  # fmt: skip
SLOW = {"test": "allreduce", "ok": False, "nodes": ["vm"], "value_gbps": 3.2, "floor_gbps": 9.0,
        "detail": "allreduce: 3.20 GB/s below the bar 9.00 GB/s"}  # fmt: skip
PAYLOAD_ERROR = {"test": "allreduce", "ok": False, "nodes": ["vm"], "value_gbps": None,
                 "detail": "allreduce: failed: RuntimeError: no NCCL"}  # fmt: skip
PASS = {"test": "dcgm", "ok": True, "nodes": ["vm"], "detail": "dcgm level 2: passed"}
UNTESTED = {"test": "dcgm", "ok": None, "nodes": ["vm"], "not_tested": True,
            "detail": "dcgm level 2: not judged; DCGM could not test (not a node fault): pcie"}  # fmt: skip
# The TEST RESULTs as the judge builds them (QualifyTestResult: the JSON above, read).
DCGM_HW, DCGM_FM, SLOW, PAYLOAD_ERROR, PASS, UNTESTED = (
    QualifyTestResult.from_json(t) for t in (DCGM_HW, DCGM_FM, SLOW, PAYLOAD_ERROR, PASS, UNTESTED)
)


def verdict(*tests: QualifyTestResult) -> dict:
    failed = any(t.ok is False for t in tests)
    passed = all(t.ok is True for t in tests)
    return {"passed": passed, "failed": failed, "tests": list(tests), "why": "w"}


def qualify_summary(node: str, job: str, *tests: QualifyTestResult) -> dict:
    """A qualification bundle's summary as settle.bundle writes it."""
    v = verdict(*tests)
    return {"job": job, "node": node, "kind": "qualify", "run_id": "q1", "level": 2,
            "tests_run": ["dcgm"], "passed": v["passed"], "why": v["why"],
            "tests": [t.to_json() for t in v["tests"]],
            "job_ids": [job], "user": "root", "when": time.time(), **outcome(v)}  # fmt: skip


@pytest.mark.parametrize(
    ("summary", "kind"),
    [
        ({"kind": "qualify"}, "qualify"),
        ({"kind": "drill", "drill": DRILL_ID}, "drill"),
        ({"category": "nccl_timeout"}, "job"),  # written before kinds: a job's
        ({"run_id": "q1", "tests_run": ["dcgm"], "passed": True}, "qualify"),  # an older qualify
        ({"kind": "bogus", "category": None}, "job"),
    ],
)
def test_bundle_kind(summary, kind):
    assert bundle_kind(summary) == kind


def test_the_index_line_carries_the_kind(tmp_path):
    write_bundle(str(tmp_path), "7", "vm", 0, {}, {"kind": "drill", "drill": DRILL_ID})
    [entry] = read_index(str(tmp_path), "vm").entries
    assert entry.kind == "drill"


# --------------------------------------------------- a failed qualification's hardware fault


@pytest.mark.parametrize(
    ("tests", "hardware", "kind", "result"),
    [
        ((DCGM_HW,), True, "hardware", "failed"),
        ((DCGM_FM,), False, "software", "failed"),  # the fabric manager is not the GPU
        ((SLOW,), True, "hardware", "failed"),  # measured below the bar
        ((PAYLOAD_ERROR,), False, "error", "failed"),  # nothing measured: the setup
        ((DCGM_FM, SLOW), True, "hardware", "failed"),  # any hardware evidence
        ((PASS,), False, None, "passed"),
        ((PASS, UNTESTED), False, None, "not_qualified"),
    ],
)
def test_hardware_fault_only_for_hardware_evidence(tests, hardware, kind, result):
    got = outcome(verdict(*tests))
    assert (got["hardware_fault"], got["fault_kind"], got["outcome"]) == (hardware, kind, result)
    if result == "failed":
        first = next(t for t in tests if fault_kind(t) == kind)
        assert got["failure"] == f"{first.test}: {first.detail}"


# ------------------------------------------------------------------------------ the report


def store_of_every_kind(ev) -> None:
    """A job's failed run, a passed, a failed and a not-qualified qualification, a drill."""
    now = time.time()
    job = {"node": "vm", "restart": 0, "category": "nccl_timeout", "gpus": [0],
           "job_start": utc(now - 3600), "first_failure_at": utc(now - 60), "kind": "job"}  # fmt: skip
    write_bundle(str(ev), "400", "vm", 0, {}, job)
    write_bundle(str(ev), "501", "vm", 0, {}, qualify_summary("vm", "501", PASS))
    write_bundle(str(ev), "502", "vm", 0, {}, qualify_summary("vm", "502", DCGM_FM))
    write_bundle(str(ev), "503", "vm", 0, {}, qualify_summary("vm", "503", PASS, UNTESTED))
    # An older qualification bundle: no kind, no category (once listed "undiagnosed").
    old = qualify_summary("vm", "504", PASS)
    for key in ("kind", "outcome", "failure", "fault_kind"):
        old.pop(key)
    write_bundle(str(ev), "504", "vm", 0, {}, old)
    drill = {"node": "vm", "restart": 0, "category": "gpu_xid_hardware", "kind": "drill",
             "drill": DRILL_ID, "hardware_fault": True, "job_start": utc(now - 600),
             "first_failure_at": utc(now - 30),
             "hardware_findings": ["kernel.xid: Xid 79 on GPU0"]}  # fmt: skip
    write_bundle(str(ev), "600", "vm", 0, {}, drill)


def test_read_bundles_keeps_the_kinds_apart(tmp_path):
    store_of_every_kind(tmp_path)
    got = {b.job: b for b in L.read_bundles(str(tmp_path), 0)}
    assert {j: b.kind for j, b in got.items()} == {
        "400": "job", "501": "qualify", "502": "qualify", "503": "qualify", "504": "qualify",
        "600": "drill"}  # fmt: skip
    assert [f.job for f in L.read_failures(str(tmp_path), 0)] == ["400"]
    assert got["501"].qualification.label == "passed qualification"
    assert got["502"].qualification.label == "qualification failure"
    assert (
        "fabric manager" in got["502"].qualification.why
        and got["502"].qualification.hardware_fault is False
    )
    assert got["503"].qualification.label == "not qualified"
    assert got["504"].qualification.label == "passed qualification"
    assert got["600"].drill == DRILL_ID


def test_report_json_lists_runs_qualifications_and_drills_apart(site, capsys):  # noqa: F811
    store_of_every_kind(site / "ev")
    argv = ["report", "--json", "--sinfo-json", str(site / "sinfo.json")]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["job"] for r in doc["failed_runs"]] == ["400"]
    assert all(r["category"] != L.UNDIAGNOSED for r in doc["failed_runs"])
    quals = {q["job"]: q["label"] for q in doc["qualifications"]}
    assert quals == {"501": "passed qualification", "502": "qualification failure",
                     "503": "not qualified", "504": "passed qualification"}  # fmt: skip
    [drill] = doc["drills"]
    assert (drill["job"], drill["drill"], drill["kind"]) == ("600", DRILL_ID, "drill")


def test_report_html_lists_runs_qualifications_and_drills_apart(site, capsys):  # noqa: F811
    from report_page import Page, section

    store_of_every_kind(site / "ev")
    out = site / "report.html"
    assert cli.main(["report", "--html", str(out), "--sinfo-json", str(site / "sinfo.json")]) == 0
    said = capsys.readouterr().out
    assert (
        "1 failed run(s), 4 qualification(s) (2 passed, 1 failed, 1 not qualified), 1 drill" in said
    )
    html = out.read_text()
    runs = Page(section(html, "runs")).all_text
    assert "400" in runs and not any(j in runs for j in ("501", "502", "503", "504", "600"))
    assert L.UNDIAGNOSED not in Page(section(html, "failures")).all_text
    kinds = Page(section(html, "kinds")).all_text
    assert "passed qualification" in kinds and "qualification failure" in kinds
    assert "not qualified" in kinds and f"drill {DRILL_ID}" in kinds
    assert "fabric manager" in kinds and "Xid 79" in kinds


def test_report_needs_html_or_json(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["report"])
    assert exc.value.code == 2


# ----------------------------------------------------------- false drains exclude drills


def drain(node: str, days_ago: float, reason: str, **extra) -> DrainEntry:
    return DrainEntry.from_json({"node": node, "when": NOW - days_ago * DAY, "check": "kernel.xid",
                                 "reason": reason, "boot_id": "b1", **extra})  # fmt: skip


def lift(node: str, days_ago: float) -> AuditEntry:
    return AuditEntry(node=node, when=NOW - days_ago * DAY, who="gpugate drill", why="x",
                      resumed=True, boot_id="b1")  # fmt: skip


def test_a_drills_drain_lifted_is_not_a_false_drain():
    real = drain("n1", 5, "gpugate: kernel.xid: Xid 79")
    drilled = drain("n2", 3, f"gpugate: DRILL {DRILL_ID}: kernel.xid: Xid 79")
    by_id = drain("n3", 2, "gpugate: kernel.xid: Xid 79", drill=DRILL_ID)
    record = check_record([real, drilled, by_id], [lift("n1", 4), lift("n2", 2.9), lift("n3", 1.9)],
                          NOW - 30 * DAY)  # fmt: skip
    assert record == {"kernel.xid": {"drains": 1, "lifted_repaired": 0, "lifted_unrepaired": 1,
                                     "still_drained": 0, "lifted_unaudited": 0}}  # fmt: skip
    assert [d.node for d in drill_drains([real, drilled, by_id], NOW - 30 * DAY)] == ["n2", "n3"]


def test_record_drain_keeps_the_drill_and_note_lift_counts_no_false_drain(tmp_path):
    config = default_config().replace(state_dir=str(tmp_path))
    entry = H.record_drain(str(tmp_path), "n1", f"gpugate: DRILL {DRILL_ID}: kernel.xid: x",
                           when=NOW)  # fmt: skip
    assert entry.drill == DRILL_ID and H.drill_of(entry) == DRILL_ID
    assert note_lift(config, "n1", lift("n1", -1)) is False
    H.record_drain(str(tmp_path), "n1", "gpugate: kernel.xid: x", when=NOW + 10)
    assert H.drill_of(H.drains(str(tmp_path), "n1")[-1]) is None
    assert note_lift(config, "n1", lift("n1", -1)) is True


def test_note_drain_under_the_mark_records_the_drill(tmp_path):
    config = default_config().replace(state_dir=str(tmp_path))
    reasons.mark_drill(DRILL_ID)
    reason = reasons.drain_reason("kernel.xid", "Xid 79")
    assert reason.startswith(f"gpugate: DRILL {DRILL_ID}: kernel.xid")
    H.note_drain(config, "n1", reason)
    assert H.drains(str(tmp_path), "n1")[-1].drill == DRILL_ID


# ------------------------------------------------------------------------------ metrics


def test_a_drill_run_counts_as_the_drills_not_as_a_drain_or_failure():
    samples = apply_run({}, "n1", "epilog", drained_check="kernel.xid", category="gpu_xid_hardware",
                        confidence="high", job_end="failed", drill=DRILL_ID, now=NOW)  # fmt: skip
    text = render(samples)
    assert 'gpugate_drill_drains_total{node="n1",check="kernel.xid"} 1' in text
    assert 'gpugate_job_ends_total{node="n1",result="drill"} 1' in text
    assert "gpugate_drains_total{" not in text and "gpugate_diagnoses_total{" not in text
    assert 'result="failed"' not in text
    real = render(apply_run({}, "n1", "epilog", drained_check="kernel.xid", job_end="failed"))
    assert 'gpugate_drains_total{node="n1",check="kernel.xid"} 1' in real
    assert "gpugate_drill_drains_total{" not in real


def test_a_drill_run_marks_the_node_until_a_run_without_one():
    """gpugate_drill_active: 1 under a drill, 0 after it, absent where no drill ever ran (the
    alert rules skip a marked node: tests/unit/store/test_alert_rules.py)."""
    key = ("gpugate_drill_active", (("node", "n1"),))
    drilled = apply_run({}, "n1", "prolog", {"kernel.xid": "fail"}, drained_check="kernel.xid",
                        drill=DRILL_ID, now=NOW)  # fmt: skip
    assert drilled[key] == 1 and drilled[("gpugate_node_healthy", key[1])] == 0
    after = apply_run(drilled, "n1", "health", {"kernel.xid": "ok"}, now=NOW + 600)
    assert after[key] == 0 and after[("gpugate_node_healthy", key[1])] == 1
    assert key not in apply_run({}, "n1", "prolog", {"kernel.xid": "fail"}, now=NOW)


def test_qualification_runs_are_counted_passed_failed_or_not_qualified():
    base = {"node": "n1", "when": NOW, "run_id": "q", "level": 1, "job_ids": [], "why": "",
            "by": "root"}  # fmt: skip
    entries = [QualifyEntry(**base, passed=True, tests=[PASS]),
               QualifyEntry(**base, passed=False, tests=[DCGM_HW]),
               QualifyEntry(**base, passed=False, tests=[PASS, UNTESTED])]  # fmt: skip
    text = render(apply_qualification({}, entries))
    for result in ("passed", "failed", "not_qualified"):
        assert f'gpugate_qualify_runs_total{{node="n1",result="{result}"}} 1' in text


# -------------------------------------------------------- the drill's mark at the controller


def test_the_controller_marks_a_drills_admin_comment(tmp_path):
    from gpugate.store.controller_view import done, write_record

    config = default_config().replace(evidence_dir=str(tmp_path / "ev"), state_dir=str(tmp_path))
    config = config.replace(requeue=config.requeue.replace(start_now=False))
    hw = {"node": "n1", "hardware_fault": True, "category": "gpu_xid_hardware",
          "category_trusted": True, "kind": "drill", "drill": DRILL_ID}  # fmt: skip
    write_record(config.evidence_dir, "5", "n1", 0, done(hw))
    slurm = FakeSlurm(nodes=(), jobs=[JobInfo(job_id=5)])
    end = JobEnd(job_id="5", comment="gpugate:requeue", restarts=0, state="FAILED", nodes=("n1",))
    decision, _ = run_requeue(config, end, slurm, wait_s=0)
    assert decision.requeue
    [comment] = [c[2] for c in slurm.calls if c[0] == "comment"]
    assert comment.startswith(f"gpugate: DRILL {DRILL_ID}: ")
    assert reasons.reason_drill(comment) == DRILL_ID


def test_a_real_faults_admin_comment_has_no_drill_mark(tmp_path):
    from gpugate.store.controller_view import done, write_record

    config = default_config().replace(evidence_dir=str(tmp_path / "ev"), state_dir=str(tmp_path))
    config = config.replace(requeue=config.requeue.replace(start_now=False))
    reasons.mark_drill("stale")  # a mark left over must not reach a real fault's comment
    hw = {"node": "n1", "hardware_fault": True, "category": "gpu_xid_hardware",
          "category_trusted": True, "kind": "job"}  # fmt: skip
    write_record(config.evidence_dir, "5", "n1", 0, done(hw))
    slurm = FakeSlurm(nodes=(), jobs=[JobInfo(job_id=5)])
    end = JobEnd(job_id="5", comment="gpugate:requeue", restarts=0, state="FAILED", nodes=("n1",))
    run_requeue(config, end, slurm, wait_s=0)
    [comment] = [c[2] for c in slurm.calls if c[0] == "comment"]
    assert "DRILL" not in comment


def test_the_decision_record_carries_the_drill():
    from gpugate.store.controller_view import done

    record = done({"kind": "drill", "drill": DRILL_ID, "category": "gpu_xid_hardware"})
    assert (record.kind, record.drill) == ("drill", DRILL_ID)


# ------------------------------------------------------------ the epilog under a drill


def test_an_epilog_under_a_drill_writes_a_drill_bundle_and_marks_everything(tmp_path):
    from epilog_setup import NCCL_TIMEOUT, env, setup, slurm_with_job, snapshot
    from factories import make_facts

    from gpugate.drill import start_drill
    from gpugate.hooks.epilog import run_epilog
    from gpugate.hooks.prolog import run_prolog
    from gpugate.store.controller_view import record_path

    config = setup(tmp_path)
    snapshot(tmp_path, make_facts())
    assert run_prolog(config, env(), slurm_with_job("")).exit_code == 0
    out = tmp_path / "job.out"
    out.write_text(NCCL_TIMEOUT)
    d = start_drill(config, "gpu-node-01", "xid79", 1)
    slurm = slurm_with_job(str(out))
    result = run_epilog(config, env(exit_code=9, exit_code2="0:9"), slurm)
    with open(f"{result.bundle}/summary.json") as fh:
        s = json.load(fh)
    assert (s["kind"], s["drill"]) == ("drill", d.id)
    [(_, reason)] = slurm.drains
    assert reason.startswith(f"gpugate: DRILL {d.id}: kernel.xid")
    H.note_drain(config, "gpu-node-01", reason, hook="epilog")  # as commands/epilog.py does
    assert H.drains(H.history_dir(config), "gpu-node-01")[-1].drill == d.id
    with open(record_path(config.evidence_dir, "77", "gpu-node-01", 0)) as fh:
        view = json.load(fh)
    assert (view["kind"], view["drill"]) == ("drill", d.id)
    assert L.read_failures(config.evidence_dir, 0) == []  # a drill, not a failed run


def test_gpugate_evidence_says_what_a_bundle_is(tmp_path):
    from gpugate.commands.evidence import describe, render

    store_of_every_kind(tmp_path)
    drill = describe(str(tmp_path / "600" / "vm-r0"))
    qual = describe(str(tmp_path / "502" / "vm-r0"))
    job = describe(str(tmp_path / "400" / "vm-r0"))
    assert (drill["bundle_kind"], drill["drill"]) == ("drill", DRILL_ID)
    assert (qual["bundle_kind"], qual["job_id"]) == ("qualify", "502")
    text = render("vm", [drill, qual, job])
    assert f"[DRILL {DRILL_ID}: a simulated fault]" in text
    assert "job 502 on vm (run 0), collected ? [qualification]" in text
    assert text.count("[") == 2  # the job's own bundle is not labelled


def test_a_drills_drains_make_no_repeat_offender_and_no_rma(tmp_path):
    from gpugate.admin.report import repeat_offenders

    marked = f"gpugate: DRILL {DRILL_ID}: kernel.xid: Xid 79"
    for days in (3, 2, 1):
        H.record_drain(str(tmp_path), "n1", marked, when=NOW - days * DAY)
    H.record_drain(str(tmp_path), "n2", "gpugate: kernel.xid: Xid 79", when=NOW - DAY)
    H.record_drain(str(tmp_path), "n2", "gpugate: kernel.xid: Xid 79", when=NOW)
    assert H.count_drains(str(tmp_path), "n1", 30, NOW, "kernel.xid") == 0
    assert H.count_drains(str(tmp_path), "n2", 30, NOW, "kernel.xid") == 2
    offenders = repeat_offenders(H.drains(str(tmp_path)), NOW - 30 * DAY)
    assert [o.node for o in offenders] == ["n2"]


def test_report_html_and_json_together_keep_stdout_json(site, capsys):  # noqa: F811
    store_of_every_kind(site / "ev")
    out = site / "report.html"
    argv = ["report", "--json", "--html", str(out), "--sinfo-json", str(site / "sinfo.json")]
    assert cli.main(argv) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["drills"] and "wrote" in got.err and out.exists()


def test_a_drilled_runs_other_nodes_are_the_drills_too(tmp_path):
    store_of_every_kind(tmp_path)  # job 600 run 0 on vm: the drill's
    timeout = {"node": "vm2", "restart": 0, "category": "nccl_timeout", "kind": "job"}
    write_bundle(str(tmp_path), "600", "vm2", 0, {}, timeout)
    write_bundle(str(tmp_path), "600", "vm2", 1, {}, dict(timeout, restart=1))  # the rerun
    got = {(b.node, b.restart): b for b in L.read_bundles(str(tmp_path), 0) if b.job == "600"}
    assert got["vm2", 0].kind == "drill" and got["vm2", 0].drill == DRILL_ID
    assert got["vm2", 1].kind == "job"  # a later run of the job is its own
    assert [f.job for f in L.read_failures(str(tmp_path), 0)] == ["400", "600"]

"""The repair ledger's lines written at the history's choke points (issue 45): a drain, a held
drain, a resume, a refused resume, a GPU reset, an admin's act, a qualification's verdict. Each
step is one line with its fields; a ledger that cannot be written never undoes the step."""

from __future__ import annotations

from factories import make_facts
from fakes import NODE, FakeSlurm, idle
from health_setup import ECC, cluster, setup
from qualify_ops import FAST, NODES, SLOW, FakeOps, config_with, go

from gpugate.hooks.health import run_health
from gpugate.hooks.outside_resume import OUTSIDE_WHO
from gpugate.store import held as held_store
from gpugate.store import history as H
from gpugate.store import ledger as L

T0 = 1_790_000_000.0
REASON = "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100"


def lines(directory, node=None):
    return L.entries(str(directory), node)


def test_a_drain_is_one_drain_line_with_its_fields(tmp_path):
    entry = H.record_drain(str(tmp_path), "n1", REASON, bundle="4242/n1-r0", when=T0,
                           hook="prolog", gpu="1650924060795")  # fmt: skip
    [line] = lines(tmp_path)
    assert (line.node, line.when, line.step, line.who, line.why, line.outcome) == (
        "n1", entry.when, L.DRAIN, "gpugate prolog", REASON, "drained")  # fmt: skip
    assert (line.evidence, line.check, line.gpu, line.reason) == (
        "4242/n1-r0", "gpu.ecc", "1650924060795", REASON)  # fmt: skip


def test_a_repeat_the_history_skips_writes_no_line(tmp_path):
    H.record_drain(str(tmp_path), "n1", REASON, when=T0)
    assert H.record_drain(str(tmp_path), "n1", REASON, when=T0 + 60) is None
    [line] = lines(tmp_path)
    assert line.who == "gpugate"  # no hook named


def test_a_drills_drain_is_a_step_naming_the_drill(tmp_path):
    H.record_drain(str(tmp_path), "n1", REASON, when=T0, hook="prolog", drill="d-7")
    [line] = lines(tmp_path)
    assert line.step == L.DRAIN and line.why == f"drill d-7: {REASON}"


def _broken_ledger(directory):
    """A ledger that cannot be written: a directory where its file goes (open fails)."""
    (directory / L.LEDGER).mkdir()


def test_a_failing_ledger_leaves_the_drain_recorded(tmp_path, capsys):
    _broken_ledger(tmp_path)
    entry = H.record_drain(str(tmp_path), "n1", REASON, when=T0, hook="prolog")
    assert entry is not None and H.drains(str(tmp_path)) == [entry]
    assert "could not write the ledger line of n1 (drain)" in capsys.readouterr().err
    assert lines(tmp_path) == []


def test_a_failing_ledger_leaves_the_resume_audited(tmp_path, capsys):
    _broken_ledger(tmp_path)
    entry = H.record_resume(str(tmp_path), "n1", who="alice", why="swapped", when=T0)
    assert H.resumes(str(tmp_path)) == [entry]
    assert "could not write the ledger line of n1 (resume)" in capsys.readouterr().err


def test_a_resume_is_one_resume_line_with_the_qualification_as_evidence(tmp_path):
    proof = {"passed": True, "level": 2, "run_id": "q-20261207", "job_ids": ["11", "12"]}
    H.record_resume(str(tmp_path), "n1", who="alice", why="GPU3 swapped",
                    result="ok (this node); qualification level 2 passed (job 11, 12)",
                    reason=REASON, qualification=proof, when=T0)  # fmt: skip
    [line] = lines(tmp_path)
    assert (line.step, line.who, line.why, line.outcome, line.evidence, line.reason) == (
        L.RESUME, "alice", "GPU3 swapped", "ok (this node)", "qualify q-20261207 (job 11, 12)",
        REASON)  # fmt: skip


def test_a_refused_resume_is_a_refused_line(tmp_path):
    H.record_resume(str(tmp_path), "n1", who="bob", why="try", resumed=False,
                    result="refused: gpu.ecc still fails; checks fail (this node)")  # fmt: skip
    [line] = lines(tmp_path)
    assert (line.step, line.outcome, line.evidence) == (
        L.REFUSED, "refused: gpu.ecc still fails", None)  # fmt: skip


def test_a_long_result_is_cut_in_the_outcome(tmp_path):
    H.record_resume(str(tmp_path), "n1", who="bob", resumed=False, result="refused: " + "x" * 500)
    [line] = lines(tmp_path)
    assert len(line.outcome) == 160 and line.outcome.endswith("...")


def test_a_gpu_reset_is_a_reset_line(tmp_path):
    H.record_repair(str(tmp_path), "n1", H.GPU_RESET, why="GPU3 Xid 79", who="gpugate health")
    [line] = lines(tmp_path)
    assert (line.step, line.why, line.outcome) == (L.RESET, "GPU3 Xid 79", "repair: gpu reset")
    assert line.who == "gpugate health"


def test_a_settled_qualifications_resume_names_its_run(tmp_path):
    H.record_resume(str(tmp_path), "n1", who="root", result={"qualify": "q-1", "job_ids": ["5"]})
    [line] = lines(tmp_path)
    assert (line.step, line.outcome, line.evidence) == (L.RESUME, "resumed", "qualify q-1 (job 5)")


def test_a_held_drain_is_one_held_line_with_the_budgets_why(tmp_path):
    why = "budget exceeded: 3 of 8 nodes drained (max 25%)"
    held_store.record_held(str(tmp_path), "n1", REASON, why, when=T0, hook="epilog")
    assert held_store.record_held(str(tmp_path), "n1", REASON, why, when=T0 + 1) is None  # repeat
    [line] = lines(tmp_path)
    assert (line.step, line.who, line.why, line.outcome, line.check, line.reason) == (
        L.HELD, "gpugate epilog", why, "held back", "gpu.ecc", REASON)  # fmt: skip


def test_a_manual_resume_of_gpugates_drain_is_the_admins_line(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    assert run_health(config, NODE, slurm).drained
    slurm.infos[NODE] = idle(NODE)  # `scontrol update nodename=... state=resume` by a person
    run_health(config, NODE, slurm)  # still failing: gpugate drains it again
    found = L.entries(config, NODE)
    [admin] = [e for e in found if e.step == L.ADMIN]
    assert admin.who == OUTSIDE_WHO and admin.outcome.startswith("resumed outside gpugate")
    assert admin.reason == "gpugate: gpu.ecc"
    assert [e.step for e in found if e.step in (L.DRAIN, L.ADMIN, L.RESUME)] == [
        L.DRAIN, L.ADMIN, L.DRAIN]  # fmt: skip
    assert all(e.who == "gpugate health" for e in found if e.step == L.DRAIN)


def test_a_qualification_writes_one_verdict_line_per_node_and_one_drain(tmp_path):
    qualify_config = config_with(tmp_path)
    slurm = FakeSlurm(NODES)
    result = go(qualify_config, slurm, FakeOps(slurm, {"n1": FAST, "n2": SLOW, "n3": FAST}))
    by = {n: L.entries(qualify_config, n) for n in NODES}
    assert [e.step for e in by["n1"]] == [L.QUALIFY] and by["n1"][0].outcome == "passed"
    verdict, drain = by["n2"]  # the verdict, then its drain (record_drain's line, once)
    jobs = ", ".join(result.verdicts["n2"]["job_ids"])
    assert (verdict.step, verdict.outcome, verdict.evidence) == (
        L.QUALIFY, "failed", f"qualify {result.run_id} (job {jobs})")  # fmt: skip
    assert verdict.why.startswith("allreduce: ")
    assert (drain.step, drain.who, drain.reason) == (
        L.DRAIN, "gpugate qualify", slurm.infos["n2"].reason)  # fmt: skip

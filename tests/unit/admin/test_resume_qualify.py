"""Resume only after proof: `admin.resume_qualify`, `gpugate resume --qualify`, health's lifts."""

from __future__ import annotations

import time
import types

import pytest
from factories import make_facts
from fakes import NODE, FakeSlurm
from prolog_setup import setup

from gpugate.admin import resume as R
from gpugate.health.heal import KEEP, LIFT, HealVerdict, proof_gate
from gpugate.slurm.records import NodeInfo
from gpugate.store import history as H
from gpugate.store.healing import Healing
from gpugate.store.qualify import QualifyEntry, QualifyTestResult, record_qualification

ECC = "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100"  # a hardware check
HOT = "gpugate: gpu.temperature: GPU1 at 95 C"  # a transient one


class Site:
    """A config with levels per class, a drained node, and a stand-in for Q3's qualify_nodes
    (passed to the resume); its passes in the real qualification store."""

    def __init__(self, tmp_path, reason: str = ECC, hardware: int = 2) -> None:
        config = setup(tmp_path, make_facts())
        levels = config.admin.resume_qualify.replace(hardware=hardware, transient=0)
        self.config = config.replace(admin=config.admin.replace(resume_qualify=levels))
        self.drained_at = time.time() - 600
        self.info = NodeInfo(name=NODE, state="IDLE", flags=("DRAIN",), reason=reason,
                             reason_time=int(self.drained_at))  # fmt: skip
        self.slurm = FakeSlurm(nodes=[self.info])
        self.calls: list[tuple] = []
        self.outcome = {"passed": True, "tests": [], "job_ids": ["4711"], "why": ""}
        self.qualify = self.qualify_nodes  # what the resume runs

    def qualify_nodes(self, config, slurm, nodes, level, tests, *, resume_passed=False,
                      requested_by="", wait_s=None):  # fmt: skip
        """As run.py does: a failure drained `gpugate: qualify: ...`, a pass drained as before."""
        self.calls.append((tuple(nodes), level, tuple(tests), resume_passed))
        verdict = dict(self.outcome)
        if resume_passed and verdict["passed"]:
            slurm.resume(nodes[0])
        elif not verdict["passed"]:
            slurm.drain(nodes[0], f"gpugate: qualify: {verdict['why']} (job 4712)")
        return types.SimpleNamespace(run_id="q-1", nodes=list(nodes), verdicts={nodes[0]: verdict})

    def recorded(self, when: float, level: int, run_id: str, job_ids: list[str],
                 passed: bool = True) -> None:  # fmt: skip
        """A qualification of the node in the store beside the drain history, as run.py writes it."""
        entry = QualifyEntry(node=NODE, when=when, run_id=run_id, level=level, passed=passed,
                             tests=[], job_ids=job_ids, why="" if passed else "x", by="root")  # fmt: skip
        record_qualification(H.history_dir(self.config), entry)

    def resume(self, **request) -> R.Attempt:
        return R.check_then_resume(
            self.config, self.slurm, self.info, R.Request(node=NODE, **request), self.qualify
        )

    def audit(self) -> list[dict]:
        return H.resumes(self.config.state_dir, NODE)


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)


def test_the_level_follows_the_drains_fault_class(site):
    assert R.qualify_level(site.config, ECC) == 2
    assert R.qualify_level(site.config, HOT) == 0
    # A drain a failed qualification set names no registered check: hardware, like any unknown.
    assert R.qualify_level(site.config, "gpugate: qualify: dcgm: Memory failed (job 9)") == 2


def test_a_plain_resume_refuses_and_names_the_command(site):
    attempt = site.resume(why="GPU3 replaced")
    assert not attempt.resumed and site.slurm.resumed == [] and site.calls == []
    assert f"gpugate resume {NODE} --qualify" in attempt.why and "level-2" in attempt.why
    [entry] = site.audit()
    assert entry.resumed is False and "--qualify" in entry.result


def test_force_resumes_without_a_qualification(site):
    attempt = site.resume(force=True)
    assert attempt.resumed and site.slurm.resumed == [NODE] and site.calls == []


def test_resume_qualify_runs_the_drains_level_and_audits_its_jobs(site):
    attempt = site.resume(qualify=True, why="GPU3 replaced")
    assert attempt.resumed, attempt
    [(nodes, level, tests, resume_passed)] = site.calls
    assert nodes == (NODE,) and level == 2 and tests
    # The run leaves it drained; this resume lifts it: one lift, one audit entry.
    assert resume_passed is False and site.slurm.resumed == [NODE]
    [entry] = site.audit()
    assert entry.resumed is True
    assert entry.qualification["job_ids"] == ["4711"] and entry.qualification["level"] == 2
    assert "qualification level 2 passed (job 4711)" in entry.result
    assert site.slurm.node(NODE).drained is False


def test_a_failed_qualification_keeps_the_node_drained_naming_test_and_job(site):
    site.outcome = {"passed": False, "job_ids": ["4712"], "why": "allreduce slow",
                    "tests": [QualifyTestResult(test="dcgm", nodes=[NODE], ok=True, job_id="4712",
                                                detail="Pass"),
                              QualifyTestResult(test="allreduce", nodes=[NODE], ok=False,
                                                job_id="4712", detail="busbw 3.1 GB/s < floor 9.0")]}  # fmt: skip
    attempt = site.resume(qualify=True)
    assert not attempt.resumed
    assert "allreduce: busbw 3.1 GB/s < floor 9.0 (job 4712)" in attempt.why
    node = site.slurm.node(NODE)
    assert node.drained and "job 4712" in node.reason
    [entry] = site.audit()
    assert entry.resumed is False and entry.qualification["passed"] is False
    assert entry.qualification["job_ids"] == ["4712"]


def test_a_failure_the_runner_left_schedulable_is_drained_again(site):
    def leaves_it_up(config, slurm, nodes, level, tests, **kw):
        slurm.resume(nodes[0])  # a runner bug: the failed node is back in service
        verdict = {"passed": False, "job_ids": ["77"], "tests": [], "why": "h2d: GPU0 slow"}
        return types.SimpleNamespace(run_id="q-2", verdicts={nodes[0]: verdict})

    site.qualify = leaves_it_up
    attempt = site.resume(qualify=True)
    assert not attempt.resumed
    node = site.slurm.node(NODE)
    assert node.drained and node.reason == "gpugate: qualify: h2d: GPU0 slow (job 77)"


def test_a_runner_error_refuses_and_keeps_the_node_drained(site):
    def breaks(*args, **kw):
        raise RuntimeError("sbatch: error: invalid partition")

    site.qualify = breaks
    attempt = site.resume(qualify=True)
    assert not attempt.resumed and "invalid partition" in attempt.why
    assert site.slurm.node(NODE).drained


def test_a_pass_since_the_drain_began_counts_an_older_one_does_not(site):
    site.recorded(site.drained_at - 60, level=3, run_id="old", job_ids=["1"])
    assert not site.resume().resumed  # before the fault: proves nothing
    site.recorded(site.drained_at + 60, level=2, run_id="q-9", job_ids=["12", "13"])
    attempt = site.resume()
    assert attempt.resumed and site.calls == []  # not run twice
    entry = site.audit()[-1]
    assert entry.qualification["reused"] is True and entry.qualification["job_ids"] == [
        "12",
        "13",
    ]
    assert "qualification level 2 passed (job 12, 13), recorded earlier" in entry.result


def test_the_drain_began_at_its_first_recorded_drain_since_the_last_lift(site):
    state = site.config.state_dir
    H.record_drain(state, NODE, ECC, when=site.drained_at - 7200)  # an earlier episode
    H.record_resume(state, NODE, why="fixed", when=site.drained_at - 3600)
    H.record_drain(state, NODE, ECC, when=site.drained_at - 1800)
    info = site.info.replace(reason_time=int(site.drained_at))  # a restored reason moved it
    assert R.drain_began(site.config, info) == pytest.approx(site.drained_at - 1800, abs=1)


def test_a_lower_level_than_the_drain_asks_is_refused_unless_forced(site):
    attempt = site.resume(qualify=True, level=1)
    assert not attempt.resumed and "level-2" in attempt.why and site.calls == []
    assert site.resume(qualify=True, level=1, force=True).resumed
    assert site.calls[0][1] == 1


def test_a_transient_drain_needs_no_qualification(tmp_path):
    site = Site(tmp_path, reason=HOT)
    assert site.resume().resumed and site.calls == []


def test_health_keeps_a_repaired_drain_without_a_pass():
    entry = Healing(node=NODE, check="gpu.ecc", fault="hardware", since=1.0, boot_id="b1")
    lift = HealVerdict(action=LIFT, entry=entry, why="repaired: rebooted")
    kept = proof_gate(lift, 2, qualified=False)
    assert kept.action == KEEP and "level-2 qualification" in kept.why and "--qualify" in kept.why
    assert proof_gate(lift, 2, qualified=True).action == LIFT
    assert proof_gate(lift, 0, qualified=False).action == LIFT


def test_health_reads_the_record_through_resumes_rule(site):
    from gpugate.hooks.health import qualified_for_lift

    assert qualified_for_lift(site.config, site.info) == (2, False)
    site.recorded(time.time(), level=2, run_id="q", job_ids=["5"])
    assert qualified_for_lift(site.config, site.info) == (2, True)
    assert qualified_for_lift(site.config, site.info.replace(reason=HOT)) == (0, True)


def test_health_does_not_lift_a_rebooted_hardware_drain_until_a_pass_is_recorded(tmp_path):
    import health_setup as T

    from gpugate.hooks.health import run_health

    site = Site(tmp_path)
    config = T.setup(tmp_path, make_facts(gpus=T.ECC))
    config = config.replace(
        admin=config.admin.replace(resume_qualify=site.config.admin.resume_qualify)
    )
    slurm = T.cluster()
    assert run_health(config, NODE, slurm).drained
    T.write_boot(tmp_path, "boot-2")
    T.swap(tmp_path, make_facts())
    result = run_health(config, NODE, slurm)
    assert result.action == "keep" and "level-2 qualification" in result.message
    assert slurm.resumed == [] and not (tmp_path / "state" / "audit.jsonl").exists()
    record_qualification(H.history_dir(config), QualifyEntry(
        node=NODE, when=time.time(), run_id="q-3", level=2, passed=True, tests=[],
        job_ids=["31"], why="", by="root"))  # fmt: skip
    result = run_health(config, NODE, slurm)
    assert (result.action, slurm.resumed) == ("lift", [NODE])
    [entry] = T.audit(config)
    assert entry["who"] == "gpugate health" and entry["qualification"]["job_ids"] == ["31"]


def test_a_pass_in_the_qualification_store_beside_the_history_counts(tmp_path):
    site = Site(tmp_path)
    site.recorded(time.time(), level=2, run_id="q-5", job_ids=["55"])
    attempt = site.resume()
    assert attempt.resumed and site.calls == [] and "job 55" in attempt.result
    # A failure recorded after it voids the pass (latest_pass): refused again.
    site.slurm.drain(NODE, ECC)
    site.recorded(time.time(), level=2, run_id="q-6", job_ids=["56"], passed=False)
    assert not site.resume().resumed


@pytest.mark.parametrize("bad", ["0", "5", "two"])
def test_the_cli_refuses_a_level_dcgm_does_not_have(bad, capsys):
    from gpugate import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["resume", NODE, "--qualify", "--level", bad])
    assert exc.value.code == 2 and "--level" in capsys.readouterr().err


def test_a_node_that_is_not_this_host_names_slurmd_nodename(tmp_path, monkeypatch):
    # Slurm's NodeName is not the host name: on the node itself, resume must say how to tell.
    from factories import site

    monkeypatch.setenv("SLURMD_NODENAME", "vm-7")
    config = site(tmp_path, f"state_dir: {tmp_path / 'state'}\n")
    facts, why = R.node_facts(config, "gpu-07", None)
    assert facts is None and "run `gpugate resume` on gpu-07 itself" in why
    assert "gpu-07 is not this host's Slurm name (vm-7" in why
    assert "set SLURMD_NODENAME=gpu-07" in why

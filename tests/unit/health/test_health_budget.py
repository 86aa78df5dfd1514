"""Issue 45: a tripped drain budget holds new drains only. Healing, the resume after proof and
the records go on; a held drain is re-judged on the next run's own facts, never replayed."""

from __future__ import annotations

import time

import pytest
from factories import make_facts
from fakes import NODE, drained
from health_setup import ECC, OTHERS, audit, cluster, setup, swap, write_boot

from gpugate.gate.budget import check_budget
from gpugate.hooks import health as H
from gpugate.hooks.health import run_health
from gpugate.slurm.control import SlurmError
from gpugate.store import healing
from gpugate.store.held import held_entries
from gpugate.store.history import history_dir, resumes
from gpugate.store.qualify import QualifyEntry, record_qualification

LOST = "gpugate: gpu.lost: GPU1 lost"
HOT = {3: {"temperature_c": 95.0}}


def tripped(config, slurm, check: str) -> bool:
    """Whether a new drain of `check` on the last healthy node would be held back now."""
    return not check_budget(slurm.nodes(), OTHERS[2], config.budget, time.time(), check).allowed


@pytest.mark.parametrize(
    "reason, check, repaired",
    [
        ("gpugate: gpu.temperature: GPU3 95 C", "gpu.temperature", False),  # transient
        ("gpugate: gpu.ecc: GPU3 120 uncorrected", "gpu.ecc", True),  # hardware: a reboot
    ],
)
def test_a_healed_node_is_resumed_with_the_budget_tripped(tmp_path, reason, check, repaired):
    config = setup(tmp_path, make_facts(), passes=2)
    now = time.time()
    # Two other nodes gpugate drained for a GPU off the bus, minutes ago: with NODE's own
    # drain, the partition's budget is spent for transient and hardware drains alike.
    slurm = cluster(drained(NODE, reason, when=now - 600),
                    *(drained(n, LOST, when=now - 60) for n in OTHERS[:2]))  # fmt: skip
    assert tripped(config, slurm, check)
    first = run_health(config, NODE, slurm)
    if repaired:
        write_boot(tmp_path, "boot-2")  # the reboot a hardware drain waits for
    assert tripped(config, slurm, check)  # still spent when the heal comes
    result = run_health(config, NODE, slurm)
    assert (first.action, result.action, result.resumed) == ("keep", "lift", True)
    assert slurm.resumed == [NODE] and result.blocked_by is None
    # The ledger: the audit, the history's resume, the healing entry closed.
    (entry,) = audit(config)
    assert (entry["who"], entry["resumed"]) == ("gpugate health", True)
    assert [r.node for r in resumes(history_dir(config))] == [NODE]
    assert NODE not in healing.load(config.state_dir)


def test_a_new_drain_is_still_held_while_a_drained_node_heals(tmp_path):
    """The budget keeps doing its own work: the heal spends nothing, the new drain waits."""
    config = setup(tmp_path, make_facts(gpus=HOT), passes=1)
    now = time.time()
    slurm = cluster(*(drained(n, LOST, when=now - 60) for n in OTHERS[:2]))
    result = run_health(config, NODE, slurm)
    assert (result.drained, result.blocked_by) == (False, "budget")
    assert [e.node for e in held_entries(history_dir(config))] == [NODE]


def test_a_held_drain_moves_the_kernel_log_position_on(tmp_path, monkeypatch):
    """Held back by the budget, the run still moves past the kernel-log lines it judged (as
    the prolog does): an old Xid is not read again, and drains nothing, once the window
    empties. Only a drain that failed (slurmctld down) leaves them for the next run."""
    moved: list[str] = []
    monkeypatch.setattr(H, "remember_kernel_pos", lambda config, facts: moved.append("moved"))
    config = setup(tmp_path, make_facts(gpus=ECC))
    now = time.time()
    slurm = cluster(*(drained(n, LOST, when=now - 60) for n in OTHERS[:2]))
    held = run_health(config, NODE, slurm)
    assert (held.blocked_by, moved) == ("budget", ["moved"])
    down = cluster()
    down.errors["drain"] = SlurmError("slurmctld down")
    failed = run_health(config, NODE, down)
    assert (failed.blocked_by, moved) == ("error", ["moved"])  # not moved for the failed drain


def test_once_the_window_empties_a_held_fault_that_passed_drains_nothing(tmp_path):
    """The held entry is a record, not a verdict to carry out: the next run judges the node's
    facts as they are now."""
    config = setup(tmp_path, make_facts(gpus=HOT))
    now = time.time()
    spent = cluster(*(drained(n, LOST, when=now - 60) for n in OTHERS[:2]))
    assert run_health(config, NODE, spent).blocked_by == "budget"
    assert held_entries(history_dir(config))  # held, and recorded as held
    swap(tmp_path, make_facts())  # cooled down
    empty = cluster()  # the other drains resumed: the window is empty
    for _ in range(2):
        result = run_health(config, NODE, empty)
        assert (result.action, result.drained) == ("allow", False)
    assert empty.drains == []
    # And a fault still there is drained on those fresh facts, now that there is room.
    swap(tmp_path, make_facts(gpus=HOT))
    assert run_health(config, NODE, empty).drained


def test_a_resume_after_proof_goes_through_with_the_budget_tripped(tmp_path):
    """A hardware drain that waits for a level-2 qualification: the pass, not the budget,
    decides the lift."""
    config = setup(tmp_path, make_facts(), passes=1)
    levels = config.admin.resume_qualify.replace(hardware=2)
    config = config.replace(admin=config.admin.replace(resume_qualify=levels))
    now = time.time()
    slurm = cluster(drained(NODE, "gpugate: gpu.ecc: GPU3 120 uncorrected", when=now - 600),
                    *(drained(n, LOST, when=now - 60) for n in OTHERS[:2]))  # fmt: skip
    run_health(config, NODE, slurm)  # the drain seen at this boot
    write_boot(tmp_path, "boot-2")  # repaired: rebooted
    waits = run_health(config, NODE, slurm)
    assert (waits.action, slurm.resumed) == ("keep", [])  # no proof yet
    assert "qualification" in waits.message, waits.message
    passed = QualifyEntry(node=NODE, when=time.time(), run_id="q-1", level=2, passed=True,
                          tests=[], job_ids=["4711"], why="", by="root")  # fmt: skip
    record_qualification(history_dir(config), passed)
    assert tripped(config, slurm, "gpu.ecc")
    result = run_health(config, NODE, slurm)
    assert (result.action, slurm.resumed) == ("lift", [NODE])
    lift = [e for e in audit(config) if e["resumed"]]
    assert lift and lift[-1]["qualification"]["run_id"] == "q-1"

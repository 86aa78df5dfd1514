"""Ownership (issue 45): with an admin's drain in place, no gpugate path resumes, re-reasons,
comments or reboots the node; a person's resume of gpugate's drain is audited as theirs."""

from __future__ import annotations

import pytest
from factories import make_facts
from fakes import NODE, drained, idle
from health_setup import ECC, audit, cluster, setup, write_boot

from gpugate.admin.resume import Request, check_then_resume
from gpugate.gate import repair
from gpugate.gate.drain import drain_counted, tell_held
from gpugate.hooks.health import run_health
from gpugate.hooks.outside_resume import OUTSIDE_WHO
from gpugate.slurm.control import NotOurComment, NotOurDrain
from gpugate.slurm.reasons import drain_reason

ADMIN_REASON = "PSU swap, ticket 7"
XID79 = "gpugate: kernel.xid: GPU2 Xid 79 GPU has fallen off the bus"


def _drain(config, slurm):
    with pytest.raises(NotOurDrain):
        slurm.drain(NODE, drain_reason("gpu.ecc", "GPU3 uncorrectable"))


def _resume(config, slurm):
    with pytest.raises(NotOurDrain):
        slurm.resume(NODE)


def _reboot(config, slurm):
    with pytest.raises(NotOurDrain):
        slurm.reboot_asap(NODE, XID79)


def _comment(config, slurm):
    with pytest.raises(NotOurComment, match="drained by alice"):
        slurm.set_node_comment(NODE, "would drain")


def _drain_step(config, slurm):
    # The prolog's, epilog's and health's Drain step; the budget is never counted for it.
    out = drain_counted(slurm, NODE, drain_reason("gpu.ecc", "GPU3"), config, "gpu.ecc")
    assert (out.drained, out.blocked_by, out.held) == (False, "admin", False)
    assert "alice" in out.why


def _held_notice(config, slurm):
    tell_held(slurm, NODE, drain_reason("gpu.ecc", "GPU3"), "budget exceeded", config)


def _health_failing(config, slurm):
    result = run_health(config, NODE, slurm)
    assert (result.action, result.blocked_by) == ("none", "admin")


def _gpugate_resume(config, slurm):
    attempt = check_then_resume(config, slurm, slurm.node(NODE), Request(node=NODE, why="ok"))
    assert not attempt.resumed and "someone else" in attempt.why


def _repair_reboot(config, slurm):
    config = config.replace(health=config.health.replace(reboot=True))
    assert repair.request_reboot(slurm, NODE, XID79, config) is None


PATHS = {
    "SlurmControl.drain": _drain,
    "SlurmControl.resume": _resume,
    "SlurmControl.reboot_asap": _reboot,
    "SlurmControl.set_node_comment": _comment,
    "gate.drain.drain_counted": _drain_step,
    "gate.drain.tell_held": _held_notice,
    "hooks.health.run_health (failing)": _health_failing,
    "admin.resume.check_then_resume": _gpugate_resume,
    "gate.repair.request_reboot": _repair_reboot,
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_an_admins_drain_survives_every_path(tmp_path, path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster(drained(NODE, ADMIN_REASON, when=1000, user="alice"))
    PATHS[path](config, slurm)
    after = slurm.node(NODE)
    assert (after.drained, after.reason, after.reason_user) == (True, ADMIN_REASON, "alice")
    assert (slurm.drains, slurm.resumed, slurm.reboots, slurm.node_comments) == ([], [], [], [])


def test_an_admins_drain_survives_a_passing_health_run(tmp_path):
    config = setup(tmp_path, make_facts())
    slurm = cluster(drained(NODE, ADMIN_REASON, when=1000, user="alice"))
    assert run_health(config, NODE, slurm).blocked_by == "admin"
    assert slurm.node(NODE).reason == ADMIN_REASON and slurm.resumed == []


def test_an_admins_node_comment_is_never_overwritten_nor_cleared(tmp_path):
    slurm = cluster(idle(NODE).replace(comment="rack 3, new PSU"))
    with pytest.raises(NotOurComment, match="not gpugate's"):
        slurm.set_node_comment(NODE, "would drain")
    assert slurm.clear_node_comment(NODE) is False
    assert slurm.node_comments == []


def test_gpugate_own_comment_is_replaced_and_cleared(tmp_path):
    slurm = cluster(idle(NODE).replace(comment="gpugate: would drain (budget exceeded)"))
    slurm.set_node_comment(NODE, "would drain again")
    assert slurm.clear_node_comment(NODE) is True
    assert slurm.node_comments == [(NODE, "gpugate: would drain again"), (NODE, "")]


def test_a_manual_resume_of_gpugates_drain_is_audited_as_the_admins(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    assert run_health(config, NODE, slurm).drained
    slurm.infos[NODE] = idle(NODE)  # `scontrol update nodename=... state=resume` by a person
    result = run_health(config, NODE, slurm)  # still failing: gpugate drains it again
    (entry,) = audit(config)
    assert (entry["who"], entry["resumed"], entry["reason"]) == (
        OUTSIDE_WHO,
        True,
        "gpugate: gpu.ecc",
    )
    assert "outside" in result.message
    # The next drain is gpugate's own, with its normal reason, and audited no second time.
    after = slurm.node(NODE)
    assert after.gpugate_owned and after.reason.startswith("gpugate: gpu.ecc: ")
    assert len(slurm.drains) == 2
    slurm.infos[NODE] = idle(NODE)
    run_health(config, NODE, slurm)
    assert [e["who"] for e in audit(config)] == [OUTSIDE_WHO, OUTSIDE_WHO]
    run_health(config, NODE, slurm)
    assert len(audit(config)) == 2


def test_gpugates_own_lifts_are_not_taken_for_an_admins(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    run_health(config, NODE, slurm)
    write_boot(tmp_path, "boot-2")  # a reboot (the repair's nextstate=RESUME) brought it back
    slurm.infos[NODE] = idle(NODE)
    run_health(config, NODE, slurm)
    with pytest.raises(FileNotFoundError):
        audit(config)


def test_a_node_in_a_reservation_is_not_taken_for_an_admins_resume(tmp_path):
    # `gpugate qualify` resumes gpugate's drain inside its MAINT reservation, audited later.
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    run_health(config, NODE, slurm)
    slurm.infos[NODE] = idle(NODE).replace(flags=("MAINT", "RESERVED"))
    run_health(config, NODE, slurm)
    with pytest.raises(FileNotFoundError):
        audit(config)

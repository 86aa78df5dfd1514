"""The repair ladder (gpugate/gate/ladder.py) as `gpugate health` climbs it, with FakeSlurm and
replayed snapshots: drain -> reboot ASAP nextstate=DOWN -> the check after the reboot -> the
qualification -> resume; job-safe waits; the same GPU failing again goes to the RMA list."""

from __future__ import annotations

import time

from factories import make_facts
from fakes import NODE, drained
from health_setup import cluster, setup, swap, write_boot

from gpugate.gate import ladder as LD
from gpugate.hooks.health import run_health
from gpugate.store import history, ledger
from gpugate.store.history import history_dir, record_drain

XID79 = ("[Sun Nov 29 09:59:01 2026] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', "
         "name=<unknown>, GPU has fallen off the bus.")  # fmt: skip
REASON = "gpugate: kernel.xid: GPU0 (serial 1652123000000, 0000:18:00) Xid 79 fallen off the bus"
SERIAL = "1652123000000"


def site(tmp_path, facts=None, level: int = 0, qualify: bool = False):
    config = setup(tmp_path, facts or make_facts(kernel_log=(XID79,)), passes=1)
    config = config.replace(health=config.health.replace(reboot=True, gpu_reset=True))
    if level:
        levels = config.admin.resume_qualify.replace(hardware=level)
        config = config.replace(admin=config.admin.replace(resume_qualify=levels))
    if qualify:
        from gpugate.config import load_config

        (tmp_path / "q.yaml").write_text("qualify:\n  tests: [dcgm, allreduce, h2d, pairs]\n")
        config = config.replace(qualify=load_config(str(tmp_path / "q.yaml")).qualify)
    return config


def steps(config) -> list[tuple[str, str]]:
    return [(e.step, e.outcome) for e in ledger.entries(config, NODE)]


def come_back_down(slurm) -> None:
    """What Slurm makes of the node after the RebootProgram (nextstate=DOWN): DOWN, the
    reason kept, no pending-reboot flag."""
    info = slurm.infos[NODE]
    slurm.infos[NODE] = info.replace(state="DOWN", flags=())


class Starts:
    """A recorder in place of gpugate.child.detach: the tasks a run starts apart from itself."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, dict]] = []

    def __call__(self, task: str, kwargs: dict, timeout: float) -> int:
        self.tasks.append((task, kwargs))
        return 4242


def test_an_xid79_node_is_rebooted_down_checked_after_the_reboot_and_resumed(tmp_path):
    config = site(tmp_path)
    slurm = cluster()
    first = run_health(config, NODE, slurm)  # drains, and hands the reboot to Slurm
    assert first.drained and [s for _, _, s in slurm.reboots] == ["DOWN"]
    assert ("reboot", "requested") in steps(config)
    swap(tmp_path, make_facts())  # the GPU is back after the reboot
    again = run_health(config, NODE, slurm)  # not rebooted yet: waits, asks nothing more
    assert again.action == "keep" and len(slurm.reboots) == 1
    assert "waits for it" in again.message, again.message
    write_boot(tmp_path, "boot-2")
    come_back_down(slurm)
    result = run_health(config, NODE, slurm)
    assert (result.action, slurm.resumed) == ("lift", [NODE]), result.message
    assert ("recheck", "passed") in steps(config)
    [recheck] = [e for e in ledger.entries(config, NODE) if e.step == "recheck"]
    assert recheck.evidence == "boot boot-2" and recheck.check == "kernel.xid"


def test_a_qualification_is_started_once_after_the_reboot_and_the_node_stays_down(tmp_path):
    config = site(tmp_path, level=2, qualify=True)
    slurm, starts = cluster(), Starts()
    run_health(config, NODE, slurm, detach=starts)
    swap(tmp_path, make_facts())
    write_boot(tmp_path, "boot-2")
    come_back_down(slurm)
    result = run_health(config, NODE, slurm, detach=starts)
    assert (result.action, slurm.resumed) == ("keep", [])
    assert "level-2 qualification started (pid 4242)" in result.message, result.message
    [(task, kwargs)] = starts.tasks
    assert task == "gpugate.qualify.launch:qualify_repaired"
    assert (kwargs["node"], kwargs["level"]) == (NODE, 2)
    assert ("qualify", "started") in steps(config)
    later = run_health(config, NODE, slurm, detach=starts)  # never a second one for the drain
    assert len(starts.tasks) == 1 and "qualification started at" in later.message


def test_no_reboot_while_a_job_runs_the_wait_is_said_once_then_the_reboot(tmp_path):
    config = site(tmp_path, make_facts())
    now = time.time()
    slurm = cluster(drained(NODE, REASON, when=now - 60).replace(state="MIXED"))
    for _ in range(3):
        result = run_health(config, NODE, slurm)
        assert slurm.reboots == [] and result.action == "keep"
    assert steps(config) == [("wait", "waiting")]
    assert "waits for the node's jobs to end (MIXED" in result.message
    slurm.infos[NODE] = slurm.infos[NODE].replace(state="IDLE", flags=("DRAIN", "COMPLETING"))
    run_health(config, NODE, slurm)
    assert slurm.reboots == []  # still completing: not yet
    slurm.infos[NODE] = slurm.infos[NODE].replace(flags=("DRAIN",))
    run_health(config, NODE, slurm)
    assert [n for n, _, _ in slurm.reboots] == [NODE]


def test_the_wait_is_bounded_then_left_to_a_person(tmp_path):
    config = site(tmp_path, make_facts())
    config = config.replace(health=config.health.replace(repair_wait_h=1))
    slurm = cluster(drained(NODE, REASON, when=time.time() - 7200).replace(state="ALLOCATED"))
    result = run_health(config, NODE, slurm)
    assert slurm.reboots == [] and "a person decides" in result.message
    assert steps(config) == [("wait", "gave up")]


def test_the_same_gpu_drained_again_goes_to_the_rma_list_and_is_never_rebooted(tmp_path):
    config = site(tmp_path, make_facts())
    now = time.time()
    for node, hours in (("gpu-node-09", 50), (NODE, 20)):  # the part moved nodes in between
        record_drain(history_dir(config), node, REASON, hook="prolog", when=now - hours * 3600,
                     gpu=SERIAL)  # fmt: skip
    record_drain(history_dir(config), NODE, REASON, hook="prolog", when=now - 60, gpu=SERIAL)
    slurm = cluster(drained(NODE, REASON, when=now - 60))
    for _ in range(2):
        result = run_health(config, NODE, slurm)
        assert result.action == "keep" and result.message.startswith("RMA candidate: GPU "
                                                                      + SERIAL)  # fmt: skip
    assert slurm.reboots == [] and slurm.resumed == []
    [rma] = [e for e in ledger.entries(config, NODE) if e.step == "rma"]  # once, not per run
    assert (rma.gpu, rma.outcome) == (SERIAL, "replace the part")


def test_a_reboot_that_did_not_repair_the_fault_is_the_last_rung(tmp_path):
    config = site(tmp_path)
    slurm = cluster()
    run_health(config, NODE, slurm)
    swap(tmp_path, make_facts(gpus=[]))  # rebooted, and the GPUs are gone: gpu.count fails
    write_boot(tmp_path, "boot-2")
    come_back_down(slurm)
    result = run_health(config, NODE, slurm)
    assert result.action == "keep" and "the reboot did not repair it" in result.message
    assert slurm.resumed == [] and len(slurm.reboots) == 1
    assert [s for s, _ in steps(config)][-2:] == ["recheck", "rma"]


def test_the_ladder_counts_a_drill_never_and_other_gpus_apart(tmp_path):
    config = site(tmp_path, make_facts())
    now = time.time()
    record_drain(history_dir(config), NODE, REASON, when=now - 7200, gpu="other-serial")
    record_drain(history_dir(config), NODE, "gpugate: DRILL d1: " + REASON[9:], when=now - 3600,
                 gpu=SERIAL)  # fmt: skip
    drain = record_drain(history_dir(config), NODE, REASON, when=now - 60, gpu=SERIAL)
    record_drain(history_dir(config), NODE, REASON, when=now - 40 * 86400, gpu=SERIAL)  # old
    found = history.drains(history_dir(config))
    window = history.window_start(config.admin.history_window_days)
    assert LD.same_part_drains(found, window, NODE, "kernel.xid", drain.gpu) == 2  # by check
    assert LD.same_part_drains(found, window, "gpu-node-02", "kernel.xid", drain.gpu) == 1  # GPU


NVLINK_DOWN = {2: {"nvlink_active": (True,) * 17 + (False,)}}
XID48 = ("[Sun Nov 29 09:59:01 2026] NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', "
         "name=<unknown>, An uncorrectable double bit error (DBE) has been detected.")  # fmt: skip


def test_the_sites_ladder_reboots_a_check_the_catalog_would_leave_to_a_person(tmp_path):
    config = site(tmp_path, make_facts(gpus=NVLINK_DOWN))
    config = config.replace(health=config.health.replace(ladder={"nvlink.links": ["reboot"]}))
    slurm = cluster()
    assert run_health(config, NODE, slurm).drained  # the health run's own drain
    assert slurm.reboots == []  # the catalog names no repair for a link: nothing yet
    run_health(config, NODE, slurm)  # the next run climbs the site's ladder
    assert [n for n, _, _ in slurm.reboots] == [NODE]
    [reboot] = [e for e in ledger.entries(config, NODE) if e.step == "reboot"]
    assert reboot.why.startswith("health.ladder nvlink.links; scontrol reboot ASAP")


def test_an_empty_site_ladder_never_repairs(tmp_path):
    config = site(tmp_path)
    config = config.replace(health=config.health.replace(ladder={"kernel.xid": []}))
    slurm = cluster(drained(NODE, REASON, when=time.time() - 60))
    for _ in range(2):
        assert run_health(config, NODE, slurm).action == "keep"
    assert slurm.reboots == [] and steps(config) == []


def test_a_reset_that_did_not_repair_the_gpu_is_followed_by_a_reboot(tmp_path):
    from gpugate.gate import repair
    from gpugate.runner import CommandResult

    config = site(tmp_path, make_facts(kernel_log=(XID48,)))
    slurm = cluster()
    result = run_health(config, NODE, slurm)
    assert result.drained and slurm.reboots == []  # a reset-class fault: no reboot first
    worked = lambda argv, timeout: CommandResult(argv=tuple(argv), status="ok", returncode=0)  # noqa: E731
    assert repair.reset_gpus([0], config, runner=worked, node=NODE)  # the reset step, done
    time.sleep(0.01)
    swap(tmp_path, make_facts(gpus={0: {"ecc_volatile_uncorrected": 5}}))  # still failing
    again = run_health(config, NODE, slurm)
    assert [n for n, _, _ in slurm.reboots] == [NODE], again.message
    [reboot] = [e for e in ledger.entries(config, NODE) if e.step == "reboot"]
    assert reboot.why.startswith("the GPU reset did not repair it")


def test_a_second_failure_soon_after_the_repair_climbs_its_own_ladder(tmp_path):
    """The previous drain's reboot, check and resume belong to it: a node failing again a
    minute after it was repaired is rebooted again (not taken for a reboot that failed)."""
    config = site(tmp_path)
    slurm = cluster()
    run_health(config, NODE, slurm)  # drain 1, reboot asked
    swap(tmp_path, make_facts())
    write_boot(tmp_path, "boot-2")
    come_back_down(slurm)
    assert run_health(config, NODE, slurm).action == "lift"
    time.sleep(2.1)  # Slurm's reason times are whole seconds (the ladder allows 1 s)
    # The same GPU falls off the bus again: the next job's prolog drains the node.
    slurm.infos[NODE] = drained(NODE, REASON, when=time.time())
    record_drain(history_dir(config), NODE, REASON, hook="prolog", gpu=SERIAL)
    again = run_health(config, NODE, slurm)
    assert len(slurm.reboots) == 2, again.message
    assert "RMA" not in again.message and "reboot requested" in again.message


def test_a_drain_after_a_resume_by_the_qualification_is_a_new_drain(tmp_path):
    """The qualification (or a person) resumed the node, not a health run: the healing entry
    of the ended drain is not taken for the new one, even a few seconds later."""
    from gpugate.store.history import record_resume

    config = site(tmp_path, make_facts())
    slurm = cluster(drained(NODE, REASON, when=time.time() - 30))
    run_health(config, NODE, slurm)  # drain 1: the reboot asked, its healing entry kept
    assert len(slurm.reboots) == 1
    record_resume(history_dir(config), NODE, who="gpugate (repair)", why="qualify q-1: passed")
    time.sleep(2.1)  # Slurm's reason times are whole seconds
    slurm.infos[NODE] = drained(NODE, REASON, when=time.time())  # drain 2, the same words
    result = run_health(config, NODE, slurm)
    assert len(slurm.reboots) == 2, result.message


def test_a_qualification_that_passed_before_the_drain_is_not_this_drains(tmp_path):
    """Drained again within the second the last qualification resumed the node: that pass and
    its resume end the earlier drain; this one's qualification is started anew."""
    from gpugate.store.history import record_resume

    config = site(tmp_path, make_facts(), level=1, qualify=True)
    now = time.time()
    ledger.note(config, NODE, ledger.QUALIFY, who="root", outcome="passed", when=now - 0.5)
    record_resume(history_dir(config), NODE, who="root", why="qualify q-1: passed", when=now - 0.4)
    slurm, starts = cluster(drained(NODE, REASON, when=now - 0.3)), Starts()
    run_health(config, NODE, slurm, detach=starts)  # the reboot asked
    write_boot(tmp_path, "boot-2")
    come_back_down(slurm)
    result = run_health(config, NODE, slurm, detach=starts)
    assert "level-1 qualification started" in result.message, result.message
    assert len(starts.tasks) == 1

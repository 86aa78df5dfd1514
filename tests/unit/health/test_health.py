"""`gpugate health` (Slurm's HealthCheckProgram) and healing by class, with FakeSlurm and
replayed snapshots."""

from __future__ import annotations

import json
import time

import pytest
from factories import make_facts, make_gpu
from fakes import NODE, FakeSlurm, drained
from health_setup import ECC, OTHERS, audit, cluster, setup, swap, write_boot

from gpugate.checks import registry
from gpugate.config import ConfigError, load_config
from gpugate.health.heal import KEEP, LIFT, heal_verdict
from gpugate.hooks.health import parse_gres_used, run_health, skip_for_jobs
from gpugate.slurm.records import NodeInfo
from gpugate.store import healing
from gpugate.store.healing import Healing
from gpugate.store.history import record_drain

HOT = {3: {"temperature_c": 95.0}}


def busy_cluster(state: str) -> BusySlurm:
    """NODE running a job (GPUs 0-3), in the same 4-node partition."""
    return BusySlurm([NodeInfo(name=NODE, state=state, partitions=("gpu",)), *OTHERS])


class BusySlurm(FakeSlurm):
    """A node running a job on GPUs 0-3: scontrol -d answers with its GresUsed."""

    def scontrol(self, *args: str) -> str:
        assert args == ("-d", "-o", "show", "node", NODE)
        return f"NodeName={NODE} Gres=gpu:8 GresUsed=gpu:h100:4(IDX:0-3) State=MIXED"


# --------------------------------------------------------------------------- the registry


def test_every_check_declares_its_fault_class():
    assert registry.undeclared_faults() == ()
    assert registry.fault_class("gpu.temperature") == registry.TRANSIENT
    assert registry.fault_class("gpu.ecc") == registry.HARDWARE
    assert registry.fault_class("no.such.check") == registry.HARDWARE


def test_an_unknown_fault_class_is_refused():
    with pytest.raises(ValueError, match="fault 'sometimes'"):
        registry.check("test.fault_class", fault="sometimes")


def test_heal_after_passes_below_one_is_refused(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("health:\n  heal_after_passes: 0\n")
    with pytest.raises(ConfigError, match=r"health\.heal_after_passes: must be at least 1"):
        load_config(str(site))


# ------------------------------------------------------------------------ the pure rules

T = Healing(node=NODE, check="gpu.temperature", fault="transient", since=1.0, boot_id="b1")
H = Healing(node=NODE, check="gpu.ecc", fault="hardware", since=1.0, boot_id="b1")


@pytest.mark.parametrize(
    "entry, failing, boot, same, action, passes, why",
    [
        (T, (), "b1", 0, KEEP, 1, "gpu.temperature passed 1 run in a row, 2 needed"),
        (
            T.replace(passes=1),
            (),
            "b1",
            0,
            LIFT,
            2,
            "healed: gpu.temperature passed 2 runs in a row",
        ),
        (
            T.replace(passes=1),
            (("gpu.temperature", "transient"),),
            "b1",
            0,
            KEEP,
            0,
            "still failing",
        ),
        (H.replace(passes=5), (), "b1", 0, KEEP, 6, "hardware fault (gpu.ecc): waits"),
        (H, (), "b2", 0, LIFT, 1, "repaired: rebooted"),
        (H, (), "b2", 3, KEEP, 1, "RMA candidate: drained 3 times for gpu.ecc"),
        (H.replace(boot_id=None), (), "b2", 0, KEEP, 1, "hardware fault"),
        (H, (("gpu.ecc", "hardware"),), "b2", 0, KEEP, 0, "still failing: gpu.ecc"),
        (H.replace(since=100.0), (), "b1", 0, "reset", 1, "repaired: GPU reset"),
        (H.replace(since=100.0), (), "b1", 0, "old reset", 1, "hardware fault"),
    ],
)
def test_heal_verdict(entry, failing, boot, same, action, passes, why):
    # "reset": a GPU reset recorded after the drain; "old reset": one from before it.
    reset_at = {"reset": 200.0, "old reset": 50.0}.get(action)
    action = {"reset": LIFT, "old reset": KEEP}.get(action, action)
    verdict = heal_verdict(
        entry, failing, boot, heal_after=2, same_check_drains=same, rma_after=3, reset_at=reset_at
    )
    assert (verdict.action, verdict.entry.passes) == (action, passes)
    assert verdict.why.startswith(why)


def test_a_hardware_failure_on_a_transient_drain_makes_it_wait_for_a_repair():
    verdict = heal_verdict(T, (("gpu.ecc", "hardware"),), "b1", heal_after=2)
    assert (verdict.entry.check, verdict.entry.fault) == ("gpu.ecc", "hardware")


# ------------------------------------------------------------------------------ the store


def test_healing_state_is_validated_on_read(tmp_path):
    state = str(tmp_path)
    healing.put(state, T)
    assert healing.load(state) == {NODE: T}
    data = json.loads((tmp_path / "healing.json").read_text())
    data["nodes"]["forged"] = {"check": "gpu.ecc", "fault": "hardware", "since": 1, "passes": "99"}
    data["nodes"]["odd"] = {"check": "gpu.ecc", "fault": "maybe", "since": 1, "passes": 1}
    (tmp_path / "healing.json").write_text(json.dumps(data))
    problems: list[str] = []
    assert set(healing.load(state, problems)) == {NODE}
    path = str(tmp_path / "healing.json")
    assert problems == [
        f"{path}: nodes['forged']: key 'passes': expected int, got str",
        f"{path}: nodes['odd']: key 'fault': 'maybe' is not one of transient, hardware",
    ]
    (tmp_path / "healing.json").write_text("[[[")
    assert healing.load(state) == {}
    healing.forget(state, NODE)  # nothing to forget: no error


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"since": -1}, "key 'since': -1 out of range"),
        ({"since": True}, "key 'since': expected float, got bool"),
        ({"passes": 10**9}, "key 'passes': 1000000000 out of range"),
        ({"check": ""}, "key 'check': empty"),
        ({"check": None}, "missing key 'check'"),
    ],
)
def test_a_bad_healing_entry_is_dropped_naming_its_key(tmp_path, change, named):
    entry = {**T.to_json(), **change}
    entry = {k: v for k, v in entry.items() if v is not None or k == "boot_id"}
    (tmp_path / "healing.json").write_text(json.dumps({"version": 1, "nodes": {NODE: entry}}))
    problems: list[str] = []
    assert healing.load(str(tmp_path), problems) == {}
    assert problems == [f"{tmp_path / 'healing.json'}: nodes[{NODE!r}]: {named}"]


def test_a_healing_file_of_another_shape_reads_as_empty_naming_why(tmp_path):
    (tmp_path / "healing.json").write_text(json.dumps({"version": 1, "nodes": []}))
    problems: list[str] = []
    assert healing.load(str(tmp_path), problems) == {}
    assert problems == [
        f"{tmp_path / 'healing.json'}: key 'nodes': expected dict[str, Any], got list"
    ]
    assert healing.load(str(tmp_path / "nowhere"), problems) == {} and len(problems) == 1


def test_a_healing_entry_keeps_a_newer_releases_keys_and_the_file_its_bytes(tmp_path):
    state = str(tmp_path)
    healing.put(state, H.replace(passes=2))
    before = (tmp_path / "healing.json").read_text()
    assert json.loads(before) == {"version": 1, "nodes": {NODE: {
        "boot_id": "b1", "check": "gpu.ecc", "fault": "hardware", "passes": 2, "since": 1.0}}}  # fmt: skip
    data = json.loads(before)
    data["nodes"][NODE]["repair_seen"] = "later"
    (tmp_path / "healing.json").write_text(json.dumps(data))
    healing.put(state, healing.load(state)[NODE].replace(passes=3))
    assert (
        json.loads((tmp_path / "healing.json").read_text())["nodes"][NODE]["repair_seen"] == "later"
    )


# ------------------------------------------------------------------------------ GresUsed


@pytest.mark.parametrize(
    "text, expected",
    [
        ("NodeName=n GresUsed=gpu:h100:4(IDX:0-3) State=MIXED", {0, 1, 2, 3}),
        ("NodeName=n GresUsed=gpu:2(IDX:1,5),nic:0 State=MIXED", {1, 5}),
        ("NodeName=n GresUsed=gpu:0(IDX:N/A) State=IDLE", set()),
        ("NodeName=n GresUsed=gpu:a:1(IDX:0),gpu:b:2(IDX:4-5) State=MIXED", {0, 4, 5}),
        # Slurm 22.05, untyped GPUs: a count without indices, so which GPUs is unknown.
        ("NodeName=n GresUsed=gpu:8 State=ALLOCATED", None),
        ("NodeName=n GresUsed=gpu:h100:2 State=MIXED", None),
        ("NodeName=n GresUsed=gpu:0 State=IDLE", set()),
    ],
)
def test_parse_gres_used(text, expected):
    assert parse_gres_used(text) == (None if expected is None else frozenset(expected))


def test_parse_gres_used_without_the_field_is_unknown():
    assert parse_gres_used("NodeName=n State=IDLE") is None


# --------------------------------------------------------------------------- the hook


def test_idle_node_with_an_ecc_fault_is_drained_and_stays_drained(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    result = run_health(config, NODE, slurm)
    assert result.drained and result.reason.startswith("gpugate: gpu.ecc: GPU3 ")
    entry = healing.load(config.state_dir)[NODE]
    assert (entry.check, entry.fault, entry.boot_id) == ("gpu.ecc", "hardware", "boot-1")
    swap(tmp_path, make_facts())
    for _ in range(4):
        result = run_health(config, NODE, slurm)
        assert result.action == "keep"
    assert slurm.resumed == [] and slurm.node(NODE).drained


def test_hardware_drain_lifted_after_a_reboot_and_a_passing_checklist(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    run_health(config, NODE, slurm)
    write_boot(tmp_path, "boot-2")
    assert run_health(config, NODE, slurm).action == "keep"  # rebooted, still failing
    swap(tmp_path, make_facts())
    result = run_health(config, NODE, slurm)
    assert (result.action, result.resumed, slurm.resumed) == ("lift", True, [NODE])
    (entry,) = audit(config)
    assert (entry["who"], entry["why"], entry["resumed"]) == (
        "gpugate health",
        "repaired: rebooted",
        True,
    )
    assert NODE not in healing.load(config.state_dir)


def test_rma_candidate_is_not_lifted_after_a_reboot(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    for hours in (30, 20, 10):  # three drains of the window, each its own event
        record_drain(
            config.state_dir,
            NODE,
            "gpugate: gpu.ecc: GPU3 ...",
            hook="prolog",
            when=time.time() - hours * 3600,
        )
    slurm = cluster()
    run_health(config, NODE, slurm)
    write_boot(tmp_path, "boot-2")
    swap(tmp_path, make_facts())
    result = run_health(config, NODE, slurm)
    assert result.action == "keep" and result.message.startswith("RMA candidate")
    assert slurm.resumed == []


def test_hot_gpu_drains_and_is_resumed_once_cool(tmp_path):
    config = setup(tmp_path, make_facts(gpus=HOT), passes=2)
    slurm = cluster()
    assert run_health(config, NODE, slurm).reason.startswith("gpugate: gpu.temperature: ")
    swap(tmp_path, make_facts())
    assert run_health(config, NODE, slurm).action == "keep"
    result = run_health(config, NODE, slurm)
    assert (result.action, slurm.resumed) == ("lift", [NODE])
    (entry,) = audit(config)
    assert entry["why"] == "healed: gpu.temperature passed 2 runs in a row"
    assert entry["who"] == "gpugate health"


def test_a_failing_run_starts_the_count_again(tmp_path):
    config = setup(tmp_path, make_facts(gpus=HOT), passes=2)
    slurm = cluster()
    run_health(config, NODE, slurm)
    swap(tmp_path, make_facts())
    run_health(config, NODE, slurm)
    swap(tmp_path, make_facts(gpus=HOT))
    run_health(config, NODE, slurm)
    swap(tmp_path, make_facts())
    assert run_health(config, NODE, slurm).action == "keep"
    assert slurm.resumed == []


def test_a_prolog_drain_is_healed_too(tmp_path):
    config = setup(tmp_path, make_facts(), passes=1)
    slurm = cluster(drained(NODE, "gpugate: gpu.temperature: GPU3 95 C", when=1000))
    result = run_health(config, NODE, slurm)
    assert (result.action, slurm.resumed) == ("lift", [NODE])


def test_an_admins_drain_is_never_touched(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC), passes=1)
    slurm = cluster(drained(NODE, "bad fan, ticket 12", user="alice"))
    assert run_health(config, NODE, slurm).blocked_by == "admin"
    swap(tmp_path, make_facts())
    run_health(config, NODE, slurm)
    assert slurm.drains == [] and slurm.resumed == []
    assert slurm.node(NODE).reason == "bad fan, ticket 12"


def test_the_drain_budget_applies(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    lost = "gpugate: gpu.lost: GPU1 lost"
    slurm = cluster(*(drained(n, lost, when=1000) for n in OTHERS[:2]))
    result = run_health(config, NODE, slurm)
    assert (result.drained, result.blocked_by) == (False, "budget")
    assert slurm.node_comments and "would drain" in slurm.node_comments[0][1]


def test_a_busy_node_skips_what_its_jobs_change_on_their_gpus(tmp_path):
    hot_and_busy = make_facts(gpus={2: {"temperature_c": 95.0, "memory_used_mib": 70000}})
    config = setup(tmp_path, hot_and_busy)
    slurm = busy_cluster("MIXED")
    result = run_health(config, NODE, slurm)
    assert (result.action, slurm.drains) == ("allow", [])
    # GPU 5 is no job's: its heat is judged.
    swap(tmp_path, make_facts(gpus={5: {"temperature_c": 95.0}}))
    assert run_health(config, NODE, slurm).reason.startswith("gpugate: gpu.temperature: GPU5")


def test_a_busy_node_still_fails_for_hardware(tmp_path):
    config = setup(tmp_path, make_facts(gpus={2: {"ecc_aggregate_uncorrected": 120}}))
    slurm = busy_cluster("ALLOCATED")
    assert run_health(config, NODE, slurm).reason.startswith("gpugate: gpu.ecc: GPU2")


def test_skipped_findings_say_why():
    from gpugate.checks import findings as F

    found = [F.fail("gpu.temperature", "GPU1 95 C", gpu=1), F.fail("host.memory", "low")]
    out = skip_for_jobs(found, frozenset({1}), any_job=True)
    assert [f.message for f in out] == [
        "gpu.temperature: GPU1: skipped: GPU in use by a job",
        "host.memory: skipped: a job runs on the node",
    ]
    assert skip_for_jobs(found, frozenset(), any_job=False) == found


def test_slurm_unreachable_changes_nothing(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    slurm.errors["node"] = RuntimeError("slurmctld down")
    result = run_health(config, NODE, slurm)
    assert (result.status, result.drained) == ("error", False)


def test_the_cli_runs_it_and_exits_0(tmp_path, monkeypatch):
    from gpugate.cli import main

    monkeypatch.setenv("SLURMD_NODENAME", NODE)
    with pytest.raises(SystemExit) as exc:
        main(["health", "--help"])
    assert exc.value.code == 0


XID79 = ("[Sun Nov 29 09:59:01 2026] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', "
         "name=<unknown>, GPU has fallen off the bus.")  # fmt: skip


@pytest.mark.parametrize("opted_in", [True, False])
def test_a_reboot_class_fault_is_drained_then_handed_to_slurm_when_opted_in(tmp_path, opted_in):
    config = setup(tmp_path, make_facts(kernel_log=(XID79,)))
    config = config.replace(health=config.health.replace(reboot=opted_in))
    slurm = cluster()
    result = run_health(config, NODE, slurm)
    assert result.drained and result.reason.startswith("gpugate: kernel.xid: GPU0")
    if opted_in:
        assert [(n, s) for n, _, s in slurm.reboots] == [(NODE, "DOWN")]
        assert slurm.reboots[0][1].startswith("gpugate: kernel.xid: reboot: GPU0")
    else:
        assert slurm.reboots == []
    run_health(config, NODE, slurm)  # the next run: still drained, never a second request
    assert len(slurm.reboots) == (1 if opted_in else 0)


def test_a_drill_drain_is_lifted_once_its_window_closed_even_if_the_drill_died(tmp_path):
    from gpugate.drill import end_drill, start_drill

    config = setup(tmp_path, make_facts(), passes=5)
    reason = "gpugate: DRILL {id}: kernel.xid: GPU0 Xid 79 (reboot the node)"
    drill = start_drill(config, NODE, "xid79", 10)
    # The window is open: the drain is the drill's own business, health leaves it.
    slurm = cluster(drained(NODE, reason.format(id=drill.id), when=1000))
    assert run_health(config, NODE, slurm).action == "keep" and slurm.resumed == []
    # The window closed (the drill command died meanwhile): the real facts pass, so it goes back
    # at once, a hardware class drain or not, audited as gpugate health.
    end_drill(config)
    slurm = cluster(drained(NODE, reason.format(id=drill.id), when=1000))
    result = run_health(config, NODE, slurm)
    assert (result.action, slurm.resumed) == ("lift", [NODE])
    assert audit(config)[-1]["who"] == "gpugate health"


def test_a_fifo_in_place_of_the_healing_file_hangs_no_health_check(tmp_path):
    import os
    import threading

    from gpugate.store.healing import healing_path

    config = setup(tmp_path, make_facts(), passes=1)
    os.makedirs(config.state_dir, exist_ok=True)
    os.mkfifo(healing_path(config.state_dir))
    slurm = cluster(drained(NODE, "gpugate: gpu.temperature: GPU3 95 C", when=1000))
    done: list = []
    # A daemon thread: a health run blocked on the FIFO fails the test instead of hanging it.
    worker = threading.Thread(target=lambda: done.append(run_health(config, NODE, slurm)),
                              daemon=True)  # fmt: skip
    worker.start()
    worker.join(30)
    assert done, "the health check blocked on a FIFO healing.json"
    assert done[0].action == "lift" and slurm.resumed == [NODE]  # read as no entry: counts anew


def isolated_here(config, boot: str = "boot-1") -> None:
    """GPU 3 of NODE taken out of Slurm's service (gpugate/isolate/), as the node records it."""
    from gpugate.isolate import state
    from gpugate.isolate.comment import IsolatedGpu

    # The serial make_gpu(3) gives: the GPU is found by device in the snapshot, not by index.
    gpu = IsolatedGpu(index=3, minor=3, serial=make_gpu(3).serial or "", since=int(time.time()) - 60,
                      why="gpu.ecc: GPU3 aggregate uncorrected ECC 120")  # fmt: skip
    record = state.Isolation(node=NODE, state=state.APPLIED, boot_id=boot,
                             gpus=(state.Isolated(gpu=gpu, line="NodeName=x Name=gpu File=y"),))  # fmt: skip
    state.save(config, record)


def isolated_node(tmp_path, monkeypatch, gpus) -> tuple:
    """A node with GPU 3 isolated, its facts' GPUs `gpus`; the put-backs asked, recorded."""
    import gpugate.admin.resume as resume
    from gpugate.admin.resume import Attempt

    config = setup(tmp_path, make_facts(gpus=gpus))
    config = config.replace(admin=config.admin.replace(history_dir=str(tmp_path / "history")))
    (tmp_path / "state").mkdir(exist_ok=True)
    isolated_here(config)
    asked: list = []
    monkeypatch.setattr(resume, "restore_isolated", lambda c, s, info, request: asked.append(
        request) or Attempt(resumed=True, why="", result="ok (this node)"))  # fmt: skip
    return config, asked


def test_an_isolated_gpu_goes_back_only_after_a_repair_and_its_own_checks(tmp_path, monkeypatch):
    config, asked = isolated_node(tmp_path, monkeypatch, ECC)
    slurm = cluster()
    result = run_health(config, NODE, slurm)  # GPU 3 still bad: out of service, not drained
    assert (result.action, slurm.drains) == ("allow", [])
    assert "GPU 3 stays isolated: still failing: gpu.ecc" in result.message
    swap(tmp_path, make_facts())  # passes again, same boot: no repair evidence yet
    assert "waits for a person or a repair" in run_health(config, NODE, slurm).message
    write_boot(tmp_path, "boot-2")  # rebooted (the repair), and its checks pass
    result = run_health(config, NODE, slurm)
    assert (result.action, result.resumed) == ("lift", True)
    assert "GPU 3 put back: repaired: rebooted" in result.message
    (request,) = asked
    assert (request.who, request.why) == ("gpugate health", "repaired: rebooted")


def shifted(bad: bool) -> list:
    """After a reboot that enumerated the GPUs anew: the isolated GPU (its serial) is NVML
    index 2, and index 3 another, healthy one (no minors: the serials tell them apart)."""
    gpus = [make_gpu(i) for i in (0, 1, 3, 2, 4, 5, 6, 7)]
    ecc = {"ecc_aggregate_uncorrected": 120} if bad else {}
    return [g.replace(index=k, **(ecc if g.serial == make_gpu(3).serial else {}))
            for k, g in enumerate(gpus)]  # fmt: skip


def test_the_isolated_gpu_is_judged_by_device_after_its_index_moved(tmp_path, monkeypatch):
    config, asked = isolated_node(tmp_path, monkeypatch, shifted(bad=True))
    slurm = cluster()
    write_boot(tmp_path, "boot-2")  # rebooted: repair evidence, but the GPU (index 2 now) fails
    result = run_health(config, NODE, slurm)
    assert "GPU 2 stays isolated: still failing: gpu.ecc" in result.message
    assert (asked, slurm.drains) == ([], [])  # its fault did not drain the node either
    swap(tmp_path, make_facts(gpus=shifted(bad=False)))
    result = run_health(config, NODE, slurm)
    assert "GPU 2 put back" in result.message and len(asked) == 1


def test_an_isolated_gpu_not_seen_stays_isolated(tmp_path, monkeypatch):
    # Another board where GPU 3 was (its serial differs): the GPU isolated is not there.
    config, asked = isolated_node(tmp_path, monkeypatch, {3: {"serial": "1652999000003"}})
    write_boot(tmp_path, "boot-2")
    result = run_health(config, NODE, cluster())
    assert "GPU 3 (minor 3) stays isolated: not seen" in result.message and asked == []


def _tree(root) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_dry_run_says_the_drain_and_does_nothing(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    before = _tree(tmp_path)
    result = run_health(config, NODE, slurm, dry_run=True)
    assert (result.status, result.action, result.drained) == ("fail", "drain", False)
    assert result.steps[0].startswith(f"would drain {NODE}: gpugate: gpu.ecc: GPU3 ")
    assert f"would healing: {NODE} (gpu.ecc, hardware), 0 passing run(s)" in result.steps
    assert result.steps[-3:] == ("would log line", "would metrics", "would event")
    assert slurm.drains == [] and slurm.node_comments == [] and not slurm.node(NODE).drained
    assert _tree(tmp_path) == before  # no healing entry, history, event or kernel position


def test_a_dry_run_says_the_lift_and_lifts_nothing(tmp_path):
    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    run_health(config, NODE, slurm)  # drained for real
    write_boot(tmp_path, "boot-2")
    swap(tmp_path, make_facts())
    before = _tree(tmp_path)
    result = run_health(config, NODE, slurm, dry_run=True)
    assert (result.action, result.resumed) == ("lift", False)
    assert result.steps[:3] == (
        f"would resume {NODE} (checked, audited): repaired: rebooted",
        f"would healing: forget {NODE}",
        f"healing: {NODE} (gpu.ecc, hardware), 0 passing run(s) "
        "(skipped: a dry run assumes the resume goes through)",
    )
    assert slurm.resumed == [] and slurm.node(NODE).drained
    assert _tree(tmp_path) == before  # no audit line, the healing entry as it was
    result = run_health(config, NODE, slurm)  # then for real: the same plan, carried out
    assert (result.action, result.resumed, slurm.resumed) == ("lift", True, [NODE])
    assert result.steps[:2] == (
        f"resume {NODE} (checked, audited): repaired: rebooted (resumed)",
        f"healing: forget {NODE}",
    )
    assert NODE not in healing.load(config.state_dir)


def test_a_refused_lift_keeps_the_drain_and_starts_the_count_again(tmp_path, monkeypatch):
    from gpugate.admin import resume

    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    run_health(config, NODE, slurm)
    write_boot(tmp_path, "boot-2")
    swap(tmp_path, make_facts())
    refused = resume.Attempt(resumed=False, why="GPU3 failing again")
    monkeypatch.setattr(resume, "check_then_resume", lambda *a: refused)
    result = run_health(config, NODE, slurm)
    assert (result.action, result.resumed, result.message) == (
        "keep", False, "not lifted: GPU3 failing again")  # fmt: skip
    assert result.steps[1] == f"healing: forget {NODE} (skipped: not resumed)"
    assert healing.load(config.state_dir)[NODE].passes == 0 and slurm.resumed == []


def test_the_cli_dry_run_prints_the_plan(tmp_path, monkeypatch, capsys):
    import gpugate.slurm.choose
    from gpugate.cli import main
    from gpugate.commands import health as command

    config = setup(tmp_path, make_facts(gpus=ECC))
    slurm = cluster()
    monkeypatch.setattr(command, "load_config", lambda path=None: config)
    monkeypatch.setattr(gpugate.slurm.choose, "backend", lambda *a, **k: slurm)
    before = _tree(tmp_path)
    assert main(["health", "--dry-run", "--node", NODE]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{NODE}: FAIL: drain: fail: gpu.ecc: GPU3 ")
    assert out[1].startswith(f"  PLAN    would drain {NODE}: gpugate: gpu.ecc: GPU3 ")
    assert slurm.drains == [] and _tree(tmp_path) == before

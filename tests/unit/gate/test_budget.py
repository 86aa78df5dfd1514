"""The drain budget: gpugate never drains more than its share of a partition on its own."""

from __future__ import annotations

from budget_cluster import NOW, cluster, node
from factories import default_config, make_facts
from fakes import NODE, FakeSlurm
from prolog_setup import env, setup

from gpugate.gate.budget import check_budget, keeps_drain
from gpugate.hooks.prolog import run_prolog
from gpugate.slurm.control import SlurmError
from gpugate.slurm.records import NodeInfo


def test_share_of_the_partition():
    cfg = default_config().budget  # 10 %, at least 1
    assert check_budget(cluster(20, ours=1), "n19", cfg, NOW).allowed  # 2 of 20 = 10 %
    verdict = check_budget(cluster(20, ours=2), "n19", cfg, NOW)
    assert not verdict.allowed and "already drained 2 of 20" in verdict.why


def test_small_partitions_may_always_lose_one_node():
    cfg = default_config().budget
    assert check_budget(cluster(2), "n01", cfg, NOW).allowed
    assert not check_budget(cluster(2, ours=1), "n01", cfg, NOW).allowed


def test_admins_drains_do_not_count_against_gpugate():
    assert check_budget(cluster(20, ours=1, admin=10), "n19", default_config().budget, NOW).allowed


def test_redraining_the_same_node_is_free():
    nodes = cluster(20, ours=2)
    assert check_budget(nodes, "n01", default_config().budget, NOW).allowed


def test_drains_per_window_across_partitions():
    cfg = default_config().budget.replace(max_drains_per_window=3, max_drained_share=1.0)
    nodes = {
        **cluster(10, ours=3, parts=("a",)),
        **{f"m{i}": node(f"m{i}", parts=("b",)) for i in range(10)},
    }
    verdict = check_budget(nodes, "m1", cfg, NOW)
    assert not verdict.allowed and "3 gpugate drains in the last 3600 s" in verdict.why
    old = {**cluster(10, ours=3, age_s=7200, parts=("a",)), "m1": node("m1", parts=("b",))}
    assert check_budget(old, "m1", cfg, NOW).allowed


def busy_slurm() -> FakeSlurm:
    """A cluster where gpugate has drained most of the partition already (6 of 11: beyond
    even the hardware checks' half)."""
    return FakeSlurm(nodes=[*cluster(10, ours=6).values(), node(NODE)])


def test_over_budget_the_prolog_comments_logs_and_lets_the_job_run(tmp_path):
    slurm = busy_slurm()
    facts = make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}})
    result = run_prolog(setup(tmp_path, facts), env(), slurm)
    assert (result.exit_code, result.drained, result.blocked_by) == (0, False, "budget")
    assert slurm.drains == []
    name, text = slurm.node_comments[0]
    assert name == "gpu-node-01" and "would drain (budget exceeded" in text and "gpu.ecc" in text
    events = (tmp_path / "state" / "events.jsonl").read_text()
    assert '"outcome":"budget_exceeded"' in events


def test_simultaneous_drains_settle_to_the_budget():
    """Two prologs saw room at once and both drained: the ranking keeps exactly one."""
    cfg = default_config().budget  # 4 nodes: limit 1
    nodes = cluster(4)
    for name in ("n01", "n02"):
        nodes[name] = node(name, ours=True, age_s=1)  # the same second
    assert keeps_drain(nodes, "n01", cfg, NOW).allowed
    verdict = keeps_drain(nodes, "n02", cfg, NOW)
    assert not verdict.allowed and "2 of 4 nodes drained by gpugate at once" in verdict.why
    nodes["n00"] = node("n00", ours=True, age_s=30)  # an older drain outranks both
    assert not keeps_drain(nodes, "n01", cfg, NOW).allowed


class RacingSlurm(FakeSlurm):
    """Another node drained in the same instant; ours sorts after it."""

    def __init__(self) -> None:
        super().__init__(nodes=[*cluster(4).values(), node(NODE), node("a-node")])

    def _write_drain(self, name: str, reason: str) -> None:
        super()._write_drain(name, reason)
        # The other prolog's drain lands at the same time as ours: the pre-check saw neither.
        self.infos["a-node"] = self.infos[name].replace(name="a-node")


def test_a_drain_beyond_the_budget_is_undone(tmp_path):
    slurm = RacingSlurm()
    config = setup(tmp_path, make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}}))
    # The share limit (1 of 6), not the hardware checks' half.
    config = config.replace(budget=config.budget.replace(hardware_checks=[]))
    result = run_prolog(config, env(), slurm)
    assert slurm.drains and slurm.resumed == ["gpu-node-01"]
    assert (result.exit_code, result.drained, result.blocked_by) == (0, False, "budget")
    assert "would drain (budget exceeded" in slurm.node_comments[0][1]


class SameNodeSlurm(FakeSlurm):
    """A second job's prolog on the same node undid the drain while ours settled."""

    def nodes(self, names=None):
        listing = super().nodes(names)
        if self.drains:  # our settle's read: the other prolog has resumed the node meanwhile
            self.infos[NODE] = node(NODE)
            listing = super().nodes(names)
        return listing


def test_a_drain_lifted_while_it_settles_lets_the_job_run(tmp_path):
    # Refusing would have Slurm drain the node itself ("Prolog error"), past the budget.
    slurm = SameNodeSlurm(nodes=[*cluster(4).values(), node(NODE)])
    config = setup(tmp_path, make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}}))
    result = run_prolog(config, env(), slurm)
    assert slurm.drains and slurm.resumed == []  # drained, then lifted by the other prolog
    assert (result.exit_code, result.drained, result.blocked_by) == (0, False, "budget")


class ResumedFirstSlurm(FakeSlurm):
    """Our settle ranks the drain beyond the budget, but the other prolog resumed it first."""

    def __init__(self) -> None:
        super().__init__(nodes=[*cluster(4).values(), node(NODE), node("a-node")])

    def _write_drain(self, name: str, reason: str) -> None:
        super()._write_drain(name, reason)
        self.infos["a-node"] = self.infos[name].replace(name="a-node")  # outranks ours

    def resume(self, name: str, force: bool = False) -> None:
        self.infos[name] = node(name)  # the other prolog's resume landed a moment earlier
        raise SlurmError("Invalid node state specified")


def test_a_drain_the_other_prolog_undid_first_lets_the_job_run(tmp_path):
    slurm = ResumedFirstSlurm()
    config = setup(tmp_path, make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}}))
    config = config.replace(budget=config.budget.replace(hardware_checks=[]))
    result = run_prolog(config, env(), slurm)
    assert (result.exit_code, result.drained, result.blocked_by) == (0, False, "budget")


def drained_for(name: str, check: str, age_s: float = 60, parts: tuple = ("gpu",)) -> NodeInfo:
    return NodeInfo(name=name, state="IDLE", flags=("DRAIN",), reason=f"gpugate: {check}: x",
                    reason_time=int(NOW - age_s), partitions=parts)  # fmt: skip


def transient_storm(n: int = 10) -> dict[str, NodeInfo]:
    """The packaged window (10 an hour) filled by transient drains (a hot room, leftover
    processes), in a partition large enough for the share, and one more node in service."""
    nodes = {f"t{i:02d}": drained_for(f"t{i:02d}", "gpu.temperature") for i in range(n)}
    nodes.update({f"n{i:03d}": node(f"n{i:03d}") for i in range(200)})
    return nodes


def test_transient_drains_never_hold_back_a_hardware_fault():
    """Issue 41 (R6): ten transient drains this hour used to fill the window, so a GPU off the
    bus (Xid 79) ran the next job; hardware faults count only hardware drains."""
    cfg = default_config().budget
    nodes = transient_storm()
    for check in ("kernel.xid", "kernel.gpu_bus", "gpu.ecc", "nvlink.links", "pcie.link"):
        verdict = check_budget(nodes, "n000", cfg, NOW, check)
        assert verdict.allowed, (check, verdict.why)
        assert keeps_drain({**nodes, "n000": drained_for("n000", check, age_s=1)}, "n000", cfg,
                           NOW, check).allowed  # fmt: skip
    # A transient drain still counts every drain: the window is full for it.
    verdict = check_budget(nodes, "n000", cfg, NOW, "gpu.processes")
    assert not verdict.allowed and "10 gpugate drains" in verdict.why


def test_hardware_drains_are_still_bounded_by_the_window():
    cfg = default_config().budget
    nodes = {f"h{i:02d}": drained_for(f"h{i:02d}", "kernel.xid") for i in range(10)}
    nodes.update({f"n{i:03d}": node(f"n{i:03d}") for i in range(200)})
    verdict = check_budget(nodes, "n000", cfg, NOW, "kernel.xid")
    assert not verdict.allowed and "hardware faults' drains only" in verdict.why
    # ... and they hold back transient drains too (counted in every pool).
    assert not check_budget(nodes, "n000", cfg, NOW, "gpu.temperature").allowed


def test_a_partition_share_taken_by_transient_drains_leaves_room_for_hardware():
    """ib.rate is a hardware fault outside budget.hardware_checks: the plain 10 % share, but
    not one already spent on overheating nodes."""
    cfg = default_config().budget
    nodes = {"t0": drained_for("t0", "gpu.temperature"), "t1": drained_for("t1", "host.memory")}
    nodes.update({f"n{i:02d}": node(f"n{i:02d}") for i in range(18)})
    assert not check_budget(nodes, "n00", cfg, NOW, "host.mounts").allowed
    assert check_budget(nodes, "n00", cfg, NOW, "ib.rate").allowed


def test_a_drain_reason_naming_no_known_check_counts_as_hardware():
    cfg = default_config().budget.replace(max_drains_per_window=2)
    nodes = {"o0": drained_for("o0", "retired.check"), "o1": drained_for("o1", "retired.check")}
    nodes.update({f"n{i:02d}": node(f"n{i:02d}") for i in range(40)})
    assert not check_budget(nodes, "n00", cfg, NOW, "kernel.xid").allowed

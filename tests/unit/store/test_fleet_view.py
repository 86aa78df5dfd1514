"""The budget's shared read of Slurm's nodes (gpugate/store/fleet_view.py): one read serves every
hook that needs one as fresh, a stale or untrusted view is never used, and a storm of concurrent
drains still keeps the budget exactly, with a bounded number of Slurm calls per node."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from factories import default_config, drain_node
from fakes import FakeSlurm

from gpugate.slurm.records import NodeInfo
from gpugate.store import fleet_view as fv


def site(tmp_path, **budget):
    config = default_config().replace(state_dir=str(tmp_path / "state"))
    return config.replace(budget=config.budget.replace(**budget))


class Clock:
    """A fake clock; sleep() advances it and runs what a test hooks on it."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now
        self.on_sleep = None

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        if self.on_sleep:
            self.on_sleep()


VARIED = [
    NodeInfo(name="n1", state="IDLE", partitions=("gpu",), gres_gpus=8),
    NodeInfo(name="n2", state="IDLE", flags=("DRAIN",), reason="gpugate: gpu.ecc: x",
             reason_user="root", reason_time=999_990, partitions=("gpu", "all"), gres_gpus=8),
    NodeInfo(name="n3", state="DOWN", flags=("NOT_RESPONDING",), reason="Not responding",
             reason_user="slurm", reason_time=5, partitions=("all",)),
    NodeInfo(name="n4", state="MIXED", partitions=("gpu",), gres_gpus=7,
             comment="gpugate-isolated: gpu3 minor=3 serial=1 since=999000 why=gpu.ecc: y"),
]  # fmt: skip


def test_a_view_keeps_every_field_the_budget_counts(tmp_path):
    config = site(tmp_path)
    slurm = FakeSlurm(VARIED)
    clock = Clock()
    first, how = fv.nodes_since(slurm, config, clock() - 1, 3.0, clock, clock.sleep)
    assert how == fv.READ and first == {n.name: n for n in VARIED}
    second, how = fv.nodes_since(slurm, config, clock() - 1, 3.0, clock, clock.sleep)
    assert how == fv.SHARED and second == first and slurm.listings == 1


def test_a_view_older_than_asked_is_read_again(tmp_path):
    config = site(tmp_path)
    slurm = FakeSlurm(["n1"])
    clock = Clock()
    fv.nodes_since(slurm, config, clock(), 3.0, clock, clock.sleep)
    clock.now += 2
    _, how = fv.nodes_since(slurm, config, clock() - 1, 3.0, clock, clock.sleep)
    assert how == fv.READ and slurm.listings == 2


def test_a_hook_waits_for_the_refresh_under_way_and_uses_it(tmp_path):
    config = site(tmp_path)
    clock = Clock()
    directory = fv.view_dir(config)
    os.makedirs(directory, mode=0o700)
    open(os.path.join(directory, fv.MARKER), "w").close()  # another hook reads Slurm now
    others = {"n9": NodeInfo(name="n9", state="IDLE", partitions=("gpu",))}

    def refreshed():
        if clock.now > 1_000_000.3:
            fv.save_view(directory, 1_000_000.2, others)

    clock.on_sleep = refreshed
    slurm = FakeSlurm(["n1"])
    nodes, how = fv.nodes_since(slurm, config, 1_000_000.1, 3.0, clock, clock.sleep)
    assert how == fv.SHARED and nodes == others and slurm.listings == 0


def test_a_refresh_that_never_comes_costs_one_read_of_our_own(tmp_path):
    config = site(tmp_path)
    clock = Clock()
    directory = fv.view_dir(config)
    os.makedirs(directory, mode=0o700)
    open(os.path.join(directory, fv.MARKER), "w").close()
    slurm = FakeSlurm(["n1"])
    nodes, how = fv.nodes_since(slurm, config, clock(), 3.0, clock, clock.sleep)
    assert how == fv.READ and set(nodes) == {"n1"} and slurm.listings == 1
    assert clock.now - 1_000_000.0 >= 3.0  # waited its wait_s, not longer than a poll beyond
    assert clock.now - 1_000_000.0 < 3.0 + 2 * fv.POLL_S


def test_a_dead_hooks_marker_is_taken_over(tmp_path):
    config = site(tmp_path)
    directory = fv.view_dir(config)
    os.makedirs(directory, mode=0o700)
    marker = os.path.join(directory, fv.MARKER)
    open(marker, "w").close()
    old = time.time() - 3600
    os.utime(marker, (old, old))
    slurm = FakeSlurm(["n1"])
    _, how = fv.nodes_since(slurm, config, time.time(), 3.0)
    assert how == fv.READ and slurm.listings == 1 and not os.path.exists(marker)
    assert fv.load_view(directory) is not None  # and its read is shared


@pytest.mark.parametrize(
    "spoil",
    [
        lambda p: os.chmod(p, 0o666),  # anyone could have written it
        lambda p: Path(p).write_text('{"read_at": 1e12, "nod'),  # torn
        lambda p: Path(p).write_text(json.dumps({"read_at": 4e9, "nodes": []})),  # future
        lambda p: Path(p).write_text(json.dumps({"read_at": "x", "nodes": [{"name": 1}]})),
        lambda p: (os.unlink(p), os.symlink("/etc/hostname", p)),  # a symlink
    ],
    ids=["writable", "torn", "future", "foreign", "symlink"],
)
def test_an_untrusted_or_spoiled_view_is_never_used(tmp_path, spoil):
    config = site(tmp_path)
    slurm = FakeSlurm(["n1"])
    fv.nodes_since(slurm, config, time.time() - 1, 3.0)
    spoil(os.path.join(fv.view_dir(config), fv.VIEW))
    nodes, how = fv.nodes_since(slurm, config, time.time() - 60, 3.0)
    assert how == fv.READ and set(nodes) == {"n1"} and slurm.listings == 2


def test_a_directory_others_can_write_is_not_shared_through(tmp_path):
    config = site(tmp_path)
    directory = fv.view_dir(config)
    os.makedirs(directory)
    os.chmod(directory, 0o777)
    os.chmod(directory, 0o777)  # private_dir tightens its own: make it someone else's kind
    slurm = FakeSlurm(["n1"])
    if os.geteuid() == 0:
        os.chown(directory, 65534, 65534)  # nobody's: root refuses it
    for _ in range(2):
        _, how = fv.nodes_since(slurm, config, time.time() - 1, 3.0)
        assert how == fv.READ
    assert slurm.listings == 2 and not os.path.exists(os.path.join(directory, fv.VIEW))


def test_concurrent_hooks_share_one_read(tmp_path):
    config = site(tmp_path)

    class Slow(FakeSlurm):
        def nodes(self, names=None):
            time.sleep(0.2)  # a 1,000-node `scontrol show node` under load
            return super().nodes(names)

    slurm = Slow([f"n{i}" for i in range(50)])
    since = time.time()
    got: list[tuple[int, str]] = []

    def hook():
        nodes, how = fv.nodes_since(slurm, config, since, 3.0)
        got.append((len(nodes), how))

    threads = [threading.Thread(target=hook) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 40 and all(n == 50 for n, _ in got)
    assert slurm.listings == 1 and sum(how == fv.READ for _, how in got) == 1


def storm(tmp_path, members: int, failing: int, settle_s: float = 1.2):
    """`failing` of `members` nodes drain at once from threads; (slurm, outcomes)."""
    config = site(tmp_path, settle_s=settle_s, jitter_s=0.3, max_drains_per_window=1000)
    names = [f"n{i:04d}" for i in range(members)]
    slurm = FakeSlurm([NodeInfo(name=n, state="IDLE", partitions=("gpu",)) for n in names])
    counts: dict[str, int] = {}
    lock = threading.Lock()
    outcomes = {}

    def count(name):
        ident = threading.current_thread().name
        with lock:
            counts[ident] = counts.get(ident, 0) + 1

    real_nodes, real_node = slurm.nodes, slurm.node

    def nodes(names=None):
        count("nodes")
        return real_nodes(names)

    def node(name):
        count("node")
        return real_node(name)

    slurm.nodes, slurm.node = nodes, node  # type: ignore[method-assign]

    def fail(name):
        outcomes[name] = drain_node(slurm, name, "gpu.driver", "a bad roll-out", config)

    threads = [threading.Thread(target=fail, args=(n,), name=n) for n in names[:failing]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return slurm, outcomes, counts, config


@pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`
@pytest.mark.parametrize("members", [64, 256])
def test_a_storm_keeps_the_budget_exactly_at_a_bounded_cost_per_node(tmp_path, members):
    slurm, outcomes, counts, config = storm(tmp_path, members, failing=members)
    limit = int(config.budget.max_drained_share * members)
    drained = [n for n, i in slurm.infos.items() if i.drained and i.gpugate_owned]
    assert len(drained) == limit == sum(o.drained for o in outcomes.values())
    assert all(o.blocked_by == "budget" for o in outcomes.values() if not o.drained)
    # Per hook: at most one read of the whole cluster per count (two counts), one node read
    # for the drain, one for its undo and one for the held notice's Comment (gpugate writes a
    # Comment only over its own: SlurmControl.set_node_comment reads it, issue 45): whatever
    # the cluster's size.
    assert max(counts.values()) <= 5
    assert slurm.listings <= members  # shared: far fewer than two per node


def test_a_count_slurm_does_not_answer_holds_back_when_the_last_view_shows_a_full_budget(tmp_path):
    config = site(tmp_path, settle_s=0, jitter_s=0)
    full = [NodeInfo(name=f"n{i}", state="IDLE", partitions=("gpu",)) for i in range(10)]
    full[1] = full[1].replace(flags=("DRAIN",), reason="gpugate: gpu.driver: x",
                              reason_user="root", reason_time=int(time.time()) - 60)  # fmt: skip
    slurm = FakeSlurm(full)
    fv.nodes_since(slurm, config, time.time(), 3.0)  # an earlier hook's read, shared
    from gpugate.slurm.control import SlurmError

    slurm.errors["nodes"] = SlurmError("scontrol -o show node: timed out after 10 s")
    outcome = drain_node(slurm, "n5", "gpu.driver", "a bad roll-out", config)
    assert not outcome.drained and outcome.blocked_by == "budget"
    assert "as read 0 s ago" in outcome.why and "timed out" in outcome.why
    assert slurm.drains == [] and slurm.node_comments  # held loudly, as over budget


def test_a_count_slurm_does_not_answer_drains_without_a_recent_view(tmp_path):
    config = site(tmp_path, settle_s=0, jitter_s=0)
    slurm = FakeSlurm(
        [NodeInfo(name=f"n{i}", state="IDLE", partitions=("gpu",)) for i in range(10)]
    )
    fv.nodes_since(slurm, config, time.time(), 3.0)
    old = time.time() - 3600
    view = os.path.join(fv.view_dir(config), fv.VIEW)
    doc = json.loads(Path(view).read_text())
    doc["read_at"] = old
    Path(view).write_text(json.dumps(doc))
    from gpugate.slurm.control import SlurmError

    slurm.errors["nodes"] = SlurmError("timed out")
    assert drain_node(slurm, "n5", "gpu.driver", "x", config).drained  # unknown: the node goes


def test_a_settle_slurm_does_not_answer_undoes_a_drain_the_last_view_already_ranks_beyond(tmp_path):
    from gpugate.gate.drain import settle_budget
    from gpugate.slurm.control import SlurmError

    config = site(tmp_path, settle_s=0, jitter_s=0)
    nodes = {f"n{i}": NodeInfo(name=f"n{i}", state="IDLE", partitions=("gpu",)) for i in range(10)}
    nodes["n1"] = nodes["n1"].replace(flags=("DRAIN",), reason="gpugate: gpu.driver: x",
                                      reason_user="root", reason_time=int(time.time()) - 1)  # fmt: skip
    slurm = FakeSlurm(nodes.values())
    slurm._write_drain("n5", "gpugate: gpu.driver: y")  # ours, set after n1's
    directory = fv.view_dir(config)
    os.makedirs(directory, mode=0o700)
    fv.save_view(directory, time.time(), nodes)  # another hook's read: n1 fills the limit of 1
    slurm.errors["nodes"] = SlurmError("timed out")
    why = settle_budget(slurm, "n5", "gpugate: gpu.driver: y", config, "gpu.driver")
    assert why and "partition gpu" in why and slurm.resumed == ["n5"]


def test_a_settle_slurm_does_not_answer_keeps_a_drain_the_last_view_leaves_room_for(tmp_path):
    from gpugate.gate.drain import settle_budget
    from gpugate.slurm.control import SlurmError

    config = site(tmp_path, settle_s=0, jitter_s=0)
    nodes = {f"n{i}": NodeInfo(name=f"n{i}", state="IDLE", partitions=("gpu",)) for i in range(10)}
    slurm = FakeSlurm(nodes.values())
    slurm._write_drain("n5", "gpugate: gpu.driver: y")
    directory = fv.view_dir(config)
    os.makedirs(directory, mode=0o700)
    fv.save_view(directory, time.time(), nodes)
    slurm.errors["nodes"] = SlurmError("timed out")
    assert settle_budget(slurm, "n5", "gpugate: gpu.driver: y", config, "gpu.driver") is None
    assert slurm.resumed == []


def test_a_slow_reader_never_removes_the_marker_of_the_hook_that_took_over(tmp_path):
    config = site(tmp_path)
    directory = fv.view_dir(config)
    os.makedirs(directory, mode=0o700)
    mine = fv._claim(directory, time.time(), stale_s=10)
    marker = os.path.join(directory, fv.MARKER)
    old = time.time() - 60
    os.utime(marker, (old, old))  # our read ran past the wait: stale to the others
    theirs = fv._claim(directory, time.time(), stale_s=10)
    assert mine and theirs and theirs != mine
    fv._unclaim(directory, mine)  # our slow read ends
    assert os.path.exists(marker)  # the new holder's marker stays
    fv._unclaim(directory, theirs)
    assert not os.path.exists(marker)


def test_selftest_says_whether_a_storm_shares_one_read_across_nodes(tmp_path):
    alone = site(tmp_path)
    assert "only this node's hooks" in fv.share_note(alone)
    assert "set admin.history_dir" in fv.share_note(alone)
    shared = alone.replace(admin=alone.admin.replace(history_dir=str(tmp_path / "nfs")))
    note = fv.share_note(shared)
    assert "every node" in note and str(tmp_path / "nfs" / fv.FLEET_DIR) in note

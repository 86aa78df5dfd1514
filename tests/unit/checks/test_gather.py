"""checks.sources.gather(): the one way in for the prolog, epilog, `gpugate check` and resume."""

from __future__ import annotations

import paths
import pytest
from factories import this_boot

from gpugate.checks import sources
from gpugate.config import load_config

ROOT = paths.ROOT
HEALTHY = str(ROOT / "config" / "snapshots" / "h100-healthy.yaml")


@pytest.fixture
def live(monkeypatch):
    """gather_dict() replaced by a recorder."""
    calls = []

    def fake(config, node, only=None, deadline_s=None, source_kwargs=None):
        calls.append({"node": node, "only": only, "deadline_s": deadline_s, "kw": source_kwargs})
        return {"node": node, "collected_at": "2026-11-29T10:00:00Z", "source_errors": {}}

    monkeypatch.setattr(sources, "gather_dict", fake)
    return calls


@pytest.fixture
def boot_a(tmp_path):
    """The packaged defaults on a node (its /proc in tmp_path) whose boot is "boot-a"."""
    return this_boot(load_config("/dev/null"), tmp_path, "boot-a")


def test_a_replayed_snapshot_is_used_as_it_is(live):
    config = load_config("/dev/null").replace(facts_file=HEALTHY)
    facts = sources.gather(config, "n1", position=("boot-a", 5), deadline_s=1.0)
    assert facts.node == "gpu-node-01" and facts.gpus and live == []
    own = load_config("/dev/null")
    assert sources.gather(own, "n1", snapshot=HEALTHY).gpus and live == []


def test_live_the_kernel_log_is_read_on_from_a_position_of_this_boot(live, boot_a):
    facts = sources.gather(boot_a, "n1", position=("boot-a", 1234), deadline_s=2.5)
    assert facts.node == "n1"
    assert live[-1] == {"node": "n1", "only": None, "deadline_s": 2.5,
                        "kw": {"kernel_log": {"since_seq": 1234}}}  # fmt: skip


@pytest.mark.parametrize("position", [None, ("boot-b", 99), (None, 99), ("boot-a", None)])
def test_a_position_of_another_or_an_unknown_boot_counts_for_nothing(live, boot_a, position):
    sources.gather(boot_a, "n1", position=position)
    assert live[-1]["kw"] == {}
    assert sources.since_seq(boot_a, position) is None

"""checks.sources.gather(): the one way in for the prolog, epilog, `gpugate check` and resume."""

from __future__ import annotations

import paths
import pytest
from factories import patch_everywhere

from gpugate.checks import sources
from gpugate.config import load_config

ROOT = paths.ROOT
HEALTHY = str(ROOT / "config" / "snapshots" / "h100-healthy.yaml")


@pytest.fixture
def live(monkeypatch):
    """gather_dict() replaced by a recorder; boot_id() says this boot is "boot-a"."""
    calls = []

    def fake(config, node, only=None, deadline_s=None, source_kwargs=None):
        calls.append({"node": node, "only": only, "deadline_s": deadline_s, "kw": source_kwargs})
        return {"node": node, "collected_at": "2026-11-29T10:00:00Z", "source_errors": {}}

    # Everywhere: a plain setattr here, then patch_everywhere importing every module, left
    # gpugate.commands.facts holding the fake for the rest of the run (test_cli's `facts`).
    patch_everywhere(monkeypatch, sources, "gather_dict", fake)
    patch_everywhere(
        monkeypatch, "gpugate.checks.sources.kernel_log", "boot_id", lambda config: "boot-a"
    )
    return calls


def test_a_replayed_snapshot_is_used_as_it_is(live):
    config = load_config("/dev/null").replace(facts_file=HEALTHY)
    facts = sources.gather(config, "n1", position=("boot-a", 5), deadline_s=1.0)
    assert facts.node == "gpu-node-01" and facts.gpus and live == []
    own = load_config("/dev/null")
    assert sources.gather(own, "n1", snapshot=HEALTHY).gpus and live == []


def test_live_the_kernel_log_is_read_on_from_a_position_of_this_boot(live):
    config = load_config("/dev/null")
    facts = sources.gather(config, "n1", position=("boot-a", 1234), deadline_s=2.5)
    assert facts.node == "n1"
    assert live[-1] == {"node": "n1", "only": None, "deadline_s": 2.5,
                        "kw": {"kernel_log": {"since_seq": 1234}}}  # fmt: skip


@pytest.mark.parametrize("position", [None, ("boot-b", 99), (None, 99), ("boot-a", None)])
def test_a_position_of_another_or_an_unknown_boot_counts_for_nothing(live, position):
    sources.gather(load_config("/dev/null"), "n1", position=position)
    assert live[-1]["kw"] == {}
    assert sources.since_seq(load_config("/dev/null"), position) is None

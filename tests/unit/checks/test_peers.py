"""The multi-node peer probe: whom each node probes, ping's summary parsed, the net.peers
verdicts."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest
from factories import default_config, findings_of, make_facts, site, statuses

from gpugate.checks.facts import PeerProbe
from gpugate.checks.sources import peers as peers_source
from gpugate.checks.sources.peers import (
    NO_PING,
    UNRESOLVED,
    choose_peers,
    parse_ping,
    ping_argv,
    probe_peer,
)
from gpugate.config import ConfigError
from gpugate.hooks.prolog import job_peers
from gpugate.runner import MISSING, NONZERO, CommandResult
from gpugate.slurm.hookenv import HookEnv

# choose_peers


def nodes(n: int) -> list[str]:
    return [f"n{i}" for i in range(1, n + 1)]


def all_choices(n: int, k: int = 4, r: int = 2, seed: str = "4242") -> dict[str, list[str]]:
    order = nodes(n)
    return {me: choose_peers(order, me, k, r, seed) for me in order}


@pytest.mark.parametrize("n", [2, 3, 5, 6, 7, 8, 9, 16, 64, 257, 1000])
def test_choice_is_bounded_and_covers_every_node(n):
    chosen = all_choices(n)
    probed_by = Counter(peer for peers in chosen.values() for peer in peers)
    for me, peers in chosen.items():
        assert me not in peers and len(peers) == len(set(peers))
        assert len(peers) <= 4 + 2
        assert set(peers) <= set(chosen)
    # Every node is probed by at least k others (all others when the job is smaller).
    assert min(probed_by[node] for node in chosen) >= min(4, n - 1)
    assert sum(len(p) for p in chosen.values()) <= n * 6  # O(N*k), not N*(N-1)


def test_small_job_probes_all_others():
    for n in range(2, 8):  # up to neighbours + random + 1 nodes
        for me, peers in all_choices(n).items():
            assert sorted(peers) == sorted(set(nodes(n)) - {me})
    assert len(all_choices(8)["n1"]) == 6  # one more node: the bound applies


def test_ring_pairs_are_probed_from_both_ends():
    chosen = all_choices(1000)
    order = nodes(1000)
    for i, me in enumerate(order):
        for d in (1, 2):  # within k/2 on either side, wrapping
            for other in (order[(i + d) % 1000], order[(i - d) % 1000]):
                assert other in chosen[me] and me in chosen[other]
    assert chosen["n1"][:4] == ["n1000", "n999", "n2", "n3"]


def test_odd_neighbours_take_one_more_after():
    assert choose_peers(nodes(20), "n10", 3, 0, "1") == ["n9", "n11", "n12"]


def test_random_picks_are_deterministic_and_vary_with_job_and_node():
    order = nodes(1000)
    first = choose_peers(order, "n500", 4, 2, "77")
    assert first == choose_peers(order, "n500", 4, 2, "77")  # a rerun, the bundle: the same
    extras = {tuple(choose_peers(order, "n500", 4, 2, str(job))[4:]) for job in range(20)}
    assert len(extras) > 10  # another job, other random peers
    assert first[4:] != choose_peers(order, "n501", 4, 2, "77")[4:]
    assert not set(first[4:]) & {"n498", "n499", "n501", "n502", "n500"}


def test_no_random_and_no_neighbours():
    assert choose_peers(nodes(100), "n50", 4, 0, "1") == ["n49", "n48", "n51", "n52"]
    assert choose_peers(nodes(100), "n50", 0, 0, "1") == []
    picked = choose_peers(nodes(100), "n50", 0, 3, "1")
    assert len(set(picked)) == 3 and "n50" not in picked


def test_node_not_in_the_hostlist_gets_seeded_picks_only():
    order = nodes(50)
    picked = choose_peers(order, "gpu-07", 4, 2, "9")
    assert len(picked) == 6 == len(set(picked)) and set(picked) <= set(order)
    assert picked == choose_peers(order, "gpu-07", 4, 2, "9")
    assert sorted(choose_peers(nodes(3), "gpu-07", 4, 2, "9")) == nodes(3)


def test_repeated_names_are_probed_once():
    assert choose_peers(["n1", "n2", "n2", "n3"], "n1", 4, 2, "1") == ["n2", "n3"]


def test_job_peers_follows_the_job_order_and_config(tmp_path):
    env = HookEnv(node="n5", job_id="12", nodelist="n[1-20]", num_nodes=20)
    config = default_config()
    assert config.prolog.peers.enabled  # on by default: 0.2 s of a job's start
    assert job_peers(config, env) == choose_peers(nodes(20), "n5", 4, 2, "12")
    assert job_peers(config, env.replace(num_nodes=1, nodelist="n5")) == []
    off = site(tmp_path, "prolog:\n  peers: {enabled: false}\n")
    assert job_peers(off, env) == []
    wide = site(tmp_path, "prolog:\n  peers: {neighbours: 6, random: 0}\n")
    assert job_peers(wide, env) == ["n4", "n3", "n2", "n6", "n7", "n8"]


@pytest.mark.parametrize("value", ["-1", "1.5", "true", "two"])
def test_peer_counts_are_validated(tmp_path, value):
    with pytest.raises(ConfigError, match=r"prolog\.peers\.random"):
        site(tmp_path, f"prolog:\n  peers: {{random: {value}}}\n")


SUMMARY = """--- 10.0.0.2 ping statistics ---
100 packets transmitted, 97 received, 3% packet loss, time 1012ms
rtt min/avg/max/mdev = 0.041/12.480/30.090/0.010 ms
"""


def test_parse_ping_summary():
    assert parse_ping(SUMMARY) == {"sent": 100, "received": 97, "avg_ms": 12.48}
    assert parse_ping("ping: unknown host") == {}


def test_argv_is_the_seeds_unfragmented_probe():
    argv = ping_argv("n2", default_config().prolog.peers)
    assert argv[:5] == ["ping", "-q", "-n", "-M", "do"]
    assert argv[argv.index("-s") + 1] == "1400" and argv[argv.index("-c") + 1] == "100"
    assert argv[argv.index("-i") + 1] == "0.002" and argv[-1] == "n2"
    # No -w: it would keep a lossy peer's ping sending until `count` replies or the deadline.
    assert "-w" not in argv


@pytest.mark.parametrize(
    ("probe", "expected"),
    [
        (PeerProbe(node="n2", sent=100, received=100, avg_ms=0.2), ["ok"]),
        (PeerProbe(node="n2", sent=100, received=97, avg_ms=0.2), ["fail"]),
        (PeerProbe(node="n2", sent=100, received=100, avg_ms=12.5), ["fail"]),
        (PeerProbe(node="n2", error="ping: local error: message too long, mtu=1400"), ["fail"]),
    ],
)
def test_net_peers_verdicts(probe, expected):
    findings = findings_of("net.peers", make_facts(peers=(probe.replace(prober="n1"),)))
    assert statuses(findings) == expected
    assert findings[0].message.startswith("net.peers: n1 -> n2")


def test_verdict_names_the_pair_from_the_snapshot_node_without_prober():
    probe = PeerProbe(node="n7", sent=100, received=90, avg_ms=0.2)
    [finding] = findings_of("net.peers", make_facts(node="gpu-03", peers=(probe,)))
    assert "gpu-03 -> n7: 10% loss" in finding.message and finding.status == "fail"


@pytest.mark.parametrize("why", [UNRESOLVED, NO_PING])
def test_a_peer_not_probed_warns_and_never_fails(why):
    peers = (PeerProbe(node="n2", prober="n1", error="ping: n2: Name or service not known",
                       skipped=why),
             PeerProbe(node="n3", prober="n1", sent=100, received=100, avg_ms=0.1))  # fmt: skip
    findings = findings_of("net.peers", make_facts(peers=peers))
    assert statuses(findings) == ["warn"]
    assert "n1 -> n2: not probed, " + why in findings[0].message
    assert "not a link fault" in findings[0].message


def fake_run(result: CommandResult):
    return lambda argv, timeout: result.replace(argv=tuple(argv))


def test_unresolved_name_is_told_apart_from_a_dead_link(monkeypatch):
    unresolved = CommandResult(argv=(), status=NONZERO, returncode=2,
                               stderr="ping: n2: Name or service not known\n")  # fmt: skip
    monkeypatch.setattr(peers_source, "run", fake_run(unresolved))
    entry = probe_peer("n2", default_config().prolog.peers, 5)
    assert entry["skipped"] == UNRESOLVED and "Name or service not known" in entry["error"]
    # Sent but nothing back: a link fault, not a name.
    dead = CommandResult(argv=(), status=NONZERO, returncode=1,
                         stdout="100 packets transmitted, 0 received, 100% packet loss\n")  # fmt: skip
    monkeypatch.setattr(peers_source, "run", fake_run(dead))
    entry = probe_peer("n2", default_config().prolog.peers, 5)
    assert "skipped" not in entry and entry["sent"] == 100 and entry["received"] == 0


def test_missing_ping_is_not_a_link_fault(monkeypatch):
    monkeypatch.setattr(peers_source, "run", fake_run(CommandResult(argv=(), status=MISSING)))
    entry = probe_peer("n2", default_config().prolog.peers, 5)
    assert entry["skipped"] == NO_PING and "command not found" in entry["error"]


def test_no_peers_no_finding():
    assert findings_of("net.peers", make_facts()) == []


@pytest.mark.skipif(shutil.which("ping") is None, reason="iputils-ping not installed")
def test_real_ping_to_loopback():
    cfg = default_config().prolog.peers.replace(count=5, interval_s=0.2)
    entry = probe_peer("127.0.0.1", cfg, 5)
    if entry.get("error") and "permission" in entry["error"].lower():
        pytest.skip("ping needs privileges here")
    assert entry["sent"] == 5 and entry["received"] == 5 and entry["avg_ms"] < 10


@pytest.mark.skipif(shutil.which("ping") is None, reason="iputils-ping not installed")
def test_real_ping_to_a_name_that_does_not_resolve():
    # localslurm's nodes are n1..nN at 127.0.0.1: names no resolver knows (RFC 2606 .invalid).
    entry = probe_peer("n2.gpugate.invalid", default_config().prolog.peers, 5)
    assert entry["skipped"] == UNRESOLVED, entry


@pytest.mark.skipif(shutil.which("ping") is None, reason="iputils-ping not installed")
def test_real_ping_to_a_silent_address_sends_count_probes_only():
    # 192.0.2.1 (TEST-NET-1, RFC 5737) never answers: `count` probes, then the verdict.
    cfg = default_config().prolog.peers.replace(count=20)
    entry = probe_peer("192.0.2.1", cfg, 10)
    if "sent" not in entry:
        pytest.skip(f"no route to TEST-NET-1 here: {entry}")
    assert entry["sent"] == 20 and entry["received"] == 0


def test_prolog_pings_while_it_gathers_and_names_the_prober(monkeypatch):
    import threading

    from gpugate.hooks import prolog

    pinged = threading.Event()

    def fake_probe(host, cfg, deadline_s):
        pinged.set()
        return {"node": host, "sent": 100, "received": 100, "avg_ms": 0.1}

    def fake_gather(config, node, position, deadline_s):
        # The probes started before the gathering: a sequential prolog would wait here in vain.
        assert pinged.wait(5), "the peers were not being probed while the node gathered"
        return make_facts(node=node)

    monkeypatch.setattr(peers_source, "probe_peer", fake_probe)
    monkeypatch.setattr(prolog, "gather", fake_gather)
    env = HookEnv(node="n2", job_id="5", nodelist="n[1-3]", num_nodes=3)
    facts = prolog.gather_for_prolog(default_config(), env, 10)
    assert [(p.prober, p.node) for p in facts.peers] == [("n2", "n1"), ("n2", "n3")]

"""The multi-node peer probe: ping's summary parsed, and the net.peers verdicts."""

from __future__ import annotations

import shutil

import pytest
from factories import default_config, findings_of, make_facts, statuses

from gpugate.checks.facts import PeerProbe
from gpugate.checks.sources.peers import parse_ping, ping_argv, probe_peer

SUMMARY = """--- 10.0.0.2 ping statistics ---
100 packets transmitted, 97 received, 3% packet loss, time 1012ms
rtt min/avg/max/mdev = 0.041/12.480/30.090/0.010 ms
"""


def test_parse_ping_summary():
    assert parse_ping(SUMMARY) == {"sent": 100, "received": 97, "avg_ms": 12.48}
    assert parse_ping("ping: unknown host") == {}


def test_argv_is_the_seeds_unfragmented_probe():
    argv = ping_argv("n2", default_config().prolog.peers, 5)
    assert argv[:5] == ["ping", "-q", "-n", "-M", "do"]
    assert argv[argv.index("-s") + 1] == "1400" and argv[argv.index("-c") + 1] == "100"
    assert argv[-1] == "n2"


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
    findings = findings_of("net.peers", make_facts(peers=(probe,)))
    assert statuses(findings) == expected
    assert "n2" in findings[0].message


def test_no_peers_no_finding():
    assert findings_of("net.peers", make_facts()) == []


@pytest.mark.skipif(shutil.which("ping") is None, reason="iputils-ping not installed")
def test_real_ping_to_loopback():
    cfg = default_config().prolog.peers.replace(count=5, interval_s=0.2)
    entry = probe_peer("127.0.0.1", cfg, 5)
    if entry.get("error") and "permission" in entry["error"].lower():
        pytest.skip("ping needs privileges here")
    assert entry["sent"] == 5 and entry["received"] == 5 and entry["avg_ms"] < 10

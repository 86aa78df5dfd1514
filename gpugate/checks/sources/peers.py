"""Probe other nodes of a multi-node job: the seed's `ping -M do -s 1400`, 100 probes.

`-M do` forbids fragmentation, so a path whose MTU is smaller than the packet loses every probe
instead of quietly fragmenting: exactly the misconfiguration that makes NCCL's socket traffic
stall. Each node probes a bounded set (`choose_peers`: its ring neighbours in the job's node
order plus a few seeded random others), so a job of N nodes sends O(N*k) probes, not N*(N-1).
The probes run concurrently, beside the node's own gathering, bounded by the prolog's deadline.
"""

from __future__ import annotations

import threading
import time
from random import Random

from gpugate.regex import lazy
from gpugate.runner import MISSING, TIMEOUT, run

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpugate.config.schema import Peers

_SENT = lazy(r"(?<!\d)(\d{1,20}) packets transmitted, (\d{1,20}) (?:packets )?received")
_RTT = lazy(r"(?:rtt|round-trip) min/avg/max/\S+ = [\d.]+/(\d+(?:\.\d+)?)/")


# Why a peer was not probed at all: not a link fault (net.peers warns, never drains).
UNRESOLVED = "name does not resolve"
NO_PING = "ping is not installed"
# iputils and busybox/inetutils wording for a name the resolver does not know.
_UNRESOLVED = lazy(r"Name or service not known|Temporary failure in name resolution|unknown host|"
                   r"No address associated with hostname|bad address")  # fmt: skip


def choose_peers(order: list[str], me: str, neighbours: int, random: int, seed: str) -> list[str]:
    """The nodes `me` probes: `neighbours` ring neighbours in the job's node order (half before,
    half after, wrapping) and `random` others chosen from `seed` and `me`; all others when
    the job is that small. Never `me`, no duplicates, never more than neighbours + random."""
    nodes = list(dict.fromkeys(order))  # a hostlist may repeat a name; keep the first place
    # A str seed hashes with SHA-512: the same picks on every node and rerun (no secret here).
    rng = Random(f"{seed}/{me}")  # noqa: S311
    if me not in nodes:
        # The hostlist does not name this node (NodeName vs hostname): no place in the ring,
        # so seeded picks alone, still bounded.
        return rng.sample(nodes, min(neighbours + random, len(nodes)))
    others = len(nodes) - 1
    if others <= neighbours + random:
        return [n for n in nodes if n != me]
    at = nodes.index(me)
    before, after = neighbours // 2, neighbours - neighbours // 2  # odd k: one more after
    ring = [nodes[(at - d) % len(nodes)] for d in range(1, before + 1)]
    ring += [nodes[(at + d) % len(nodes)] for d in range(1, after + 1)]
    taken = {me, *ring}
    rest = [n for n in nodes if n not in taken]
    return ring + rng.sample(rest, min(random, len(rest)))


def parse_ping(text: str) -> dict[str, Any]:
    """`ping -q` summary -> {sent, received, avg_ms} (keys absent when not printed)."""
    out: dict[str, Any] = {}
    m = _SENT.search(text)
    if m:
        out["sent"], out["received"] = int(m.group(1)), int(m.group(2))
    m = _RTT.search(text)
    if m:
        out["avg_ms"] = float(m.group(1))
    return out


def ping_argv(host: str, cfg: Peers) -> list[str]:
    """The ping command line for one peer (an argument list, never a shell string)."""
    # No -w: with a deadline iputils ping sends until `count` replies come back, so one lossy
    # peer held the prolog for its whole deadline (and sent hundreds of probes more). Without
    # it ping sends `count` probes and waits -W 1 s for the last replies: at most
    # count * interval + 1 s; the caller's timeout still bounds it.
    return [
        "ping", "-q", "-n", "-M", "do",
        "-s", str(cfg.packet_size),
        "-c", str(cfg.count),
        "-i", f"{cfg.interval_s:g}",
        "-W", "1",
        host,
    ]  # fmt: skip


def probe_peer(host: str, cfg: Peers, deadline_s: float) -> dict[str, Any]:
    """Ping one peer; a snapshot `peers` entry."""
    res = run(ping_argv(host, cfg), timeout=deadline_s + 1)
    entry: dict[str, Any] = {"node": host}
    entry.update(parse_ping(res.stdout))
    if res.status == MISSING:
        entry["error"], entry["skipped"] = res.describe(), NO_PING
    elif "sent" not in entry and _UNRESOLVED.search(res.stderr):
        # ping exits 2 before sending anything: the job's node name is not a host name here
        # (NodeName without DNS, e.g. NodeAddr-only clusters); it says nothing about the link.
        entry["error"], entry["skipped"] = res.stderr.strip().splitlines()[-1][:200], UNRESOLVED
    elif res.status == TIMEOUT or "sent" not in entry:
        entry["error"] = res.describe()
    elif res.stderr.strip():
        entry["error"] = res.stderr.strip().splitlines()[-1][:200]  # e.g. "message too long"
    return entry


def start_probes(
    hosts: list[str], cfg: Peers, deadline_s: float
) -> Callable[[], list[dict[str, Any]]]:
    """Start pinging every peer at once; returns the wait for the results (in the order given)."""
    results: list[dict[str, Any]] = [{"node": h, "error": "not probed"} for h in hosts]
    end = time.monotonic() + deadline_s + 2

    def work(i: int, host: str) -> None:
        results[i] = probe_peer(host, cfg, deadline_s)

    threads = [threading.Thread(target=work, args=(i, h), daemon=True) for i, h in enumerate(hosts)]
    for t in threads:
        t.start()

    def wait() -> list[dict[str, Any]]:
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        return results

    return wait


def probe_peers(hosts: list[str], cfg: Peers, deadline_s: float) -> list[dict[str, Any]]:
    """Ping every peer at once; results in the order given."""
    return start_probes(hosts, cfg, deadline_s)()

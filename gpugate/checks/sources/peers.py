"""Probe the other nodes of a multi-node job: the seed's `ping -M do -s 1400`, 100 probes.

`-M do` forbids fragmentation, so a path whose MTU is smaller than the packet loses every probe
instead of quietly fragmenting: exactly the misconfiguration that makes NCCL's socket traffic
stall. The probes to all peers run concurrently, bounded by the prolog's deadline.
"""

from __future__ import annotations

import threading

from gpugate.regex import lazy
from gpugate.runner import MISSING, TIMEOUT, run

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.config.schema import Peers

_SENT = lazy(r"(?<!\d)(\d{1,20}) packets transmitted, (\d{1,20}) (?:packets )?received")
_RTT = lazy(r"(?:rtt|round-trip) min/avg/max/\S+ = [\d.]+/(\d+(?:\.\d+)?)/")


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


def ping_argv(host: str, cfg: Peers, deadline_s: float) -> list[str]:
    """The ping command line for one peer (an argument list, never a shell string)."""
    return [
        "ping", "-q", "-n", "-M", "do",
        "-s", str(cfg.packet_size),
        "-c", str(cfg.count),
        "-i", f"{cfg.interval_s:g}",
        "-W", "1",
        "-w", str(max(1, int(deadline_s))),
        host,
    ]  # fmt: skip


def probe_peer(host: str, cfg: Peers, deadline_s: float) -> dict[str, Any]:
    """Ping one peer; a snapshot `peers` entry."""
    res = run(ping_argv(host, cfg, deadline_s), timeout=deadline_s + 1)
    entry: dict[str, Any] = {"node": host}
    entry.update(parse_ping(res.stdout))
    if res.status in (MISSING, TIMEOUT) or "sent" not in entry:
        entry["error"] = res.describe()
    elif res.stderr.strip():
        entry["error"] = res.stderr.strip().splitlines()[-1][:200]  # e.g. "message too long"
    return entry


def probe_peers(hosts: list[str], cfg: Peers, deadline_s: float) -> list[dict[str, Any]]:
    """Ping every peer at once; results in the order given."""
    results: list[dict[str, Any]] = [{"node": h, "error": "not probed"} for h in hosts]

    def work(i: int, host: str) -> None:
        results[i] = probe_peer(host, cfg, deadline_s)

    threads = [threading.Thread(target=work, args=(i, h), daemon=True) for i, h in enumerate(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s + 2)
    return results

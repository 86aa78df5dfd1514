"""Benchmark: what the multi-node peer probe costs a job of N nodes, and one node's wall time.

`peer_scale(nodes)` counts, with the packaged defaults (`prolog.peers.neighbours` and
`random`), whom every node of an N-node job probes (gpugate/checks/sources/peers.py
`choose_peers`): the most peers one node pings, the pings of the whole job (one `ping` of
`count` packets per peer), and the fewest nodes any one node is probed by. Before issue 32 each
node pinged every other: N - 1 per node, N * (N - 1) per job.

`probe_wall_s(peers, repeats)` times `probe_peers` (real `ping`, run as the prolog runs it:
all peers at once, the packaged count and interval) against localhost: what the probe adds to
a multi-node job's start on one node (the prolog probes after gathering the node's facts).

    python bench/scale_peers.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpugate.checks.sources.peers import choose_peers, probe_peers  # noqa: E402
from gpugate.config import load_config  # noqa: E402

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config

JOB_ID = "1000001"


def _config() -> Config:
    return load_config("/dev/null")  # the packaged defaults, whatever the site file says


def peer_scale(nodes: int) -> dict[str, int]:
    """For a job of `nodes` nodes: pings per node (max), pings per job, min times probed."""
    cfg = _config().prolog.peers
    order = [f"gpu-{i:05d}" for i in range(nodes)]
    chosen = {me: choose_peers(order, me, cfg.neighbours, cfg.random, JOB_ID) for me in order}
    probed_by = Counter(peer for peers in chosen.values() for peer in peers)
    return {
        "pings_per_node_max": max((len(p) for p in chosen.values()), default=0),
        "pings_per_job": sum(len(p) for p in chosen.values()),
        "min_probed_by": min((probed_by[n] for n in order), default=0) if nodes > 1 else 0,
    }


def probe_wall_s(peers: int, repeats: int) -> list[float]:
    """Wall seconds of `repeats` runs of one node's probe of `peers` peers (localhost)."""
    config = _config()
    deadline = config.prolog.deadline_s - 1.0
    out = []
    for _ in range(repeats):
        started = time.monotonic()
        results = probe_peers(["localhost"] * peers, config.prolog.peers, deadline)
        out.append(time.monotonic() - started)
        lost = [r for r in results if r.get("received") != config.prolog.peers.count]
        if lost:
            raise RuntimeError(f"ping to localhost did not answer every probe: {lost[0]}")
    return out


def main() -> int:
    """Print the scale table and the measured probe wall time."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cfg = _config().prolog.peers
    k = cfg.neighbours + cfg.random
    print(f"neighbours={cfg.neighbours} random={cfg.random} count={cfg.count} "
          f"interval_s={cfg.interval_s:g}\n")  # fmt: skip
    print("| nodes | pings/node (max) | pings/job | min probed by | all pairs (before) |")
    print("|---:|---:|---:|---:|---:|")
    for n in (1, 64, 1000):
        s = peer_scale(n)
        print(f"| {n:,} | {s['pings_per_node_max']} | {s['pings_per_job']:,} | "
              f"{s['min_probed_by']} | {n * (n - 1):,} |")  # fmt: skip
    walls = probe_wall_s(k, args.repeats)
    print(f"\none node probing {k} peers (localhost, real ping, {cfg.count} x "
          f"{cfg.interval_s * 1000:g} ms): median {statistics.median(walls):.3f} s, "
          f"max {max(walls):.3f} s over {len(walls)} runs")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

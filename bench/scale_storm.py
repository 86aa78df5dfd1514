"""Benchmark part: a fleet-wide false alarm against a real slurmctld (issue 32, Deliver 2).

A private Slurm (tests/slurm/localslurm.py: root, Debian's slurmctld) holds one real node and
N simulated ones (slurm.conf and the partition list them; no slurmd behind them, so one machine
can hold a 1,000-node table). Every simulated node's prolog fails at once: one thread per node
runs what a failing prolog runs to take its node out, the executor carrying out the drain's
plan (`gpugate.act.plans.budget_drain`: drain, undo beyond the budget, say and record a held
drain) with the site's budget (defaults: 10 % of the partition, 10 drains an hour, settle
1.5 s), each through its own CLI adapter (real `scontrol`), the history directory shared as a site's shared storage.

Measured per node: the adapter's calls (whole-cluster reads, single-node reads, writes), the
time a hook spends; for the whole storm: slurmctld's own RPC counts and mean latency by type
(`sdiag`, reset before the storm), the drains left standing against the budget's limit.

`before`: every count reads Slurm itself (the code before the shared view), `after`: the
shared view of gpugate/store/fleet_view.py; both with the same `budget.jitter_s` (--jitter).

    python bench/scale_storm.py [--nodes 64 1000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "slurm"))

from localslurm import LocalSlurm  # noqa: E402

from gpugate.act.execute import Hands, execute  # noqa: E402
from gpugate.act.plans import budget_drain  # noqa: E402
from gpugate.config import load_config  # noqa: E402
from gpugate.gate import drain as drain_mod  # noqa: E402
from gpugate.slurm.cli import CliBackend  # noqa: E402
from gpugate.slurm.reasons import drain_reason  # noqa: E402

WORKERS = 16
_SDIAG = re.compile(r"^\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:(\d+)", re.M)


class Counted(CliBackend):
    """The CLI adapter, counting what one hook asks of Slurm."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.counts = {"cluster reads": 0, "node reads": 0, "writes": 0}

    def nodes(self, names: Any = None) -> Any:
        """Counted whole-cluster read."""
        self.counts["cluster reads"] += 1
        return super().nodes(names)

    def node(self, name: str) -> Any:
        """Counted single-node read."""
        self.counts["node reads"] += 1
        return super().node(name)

    def _write_drain(self, node: str, reason: str) -> None:
        self.counts["writes"] += 1
        super()._write_drain(node, reason)

    def _write_resume(self, node: str) -> None:
        self.counts["writes"] += 1
        super()._write_resume(node)

    def _write_node_comment(self, node: str, comment: str) -> None:
        self.counts["writes"] += 1
        super()._write_node_comment(node, comment)


def sdiag(cluster: LocalSlurm) -> dict[str, tuple[int, int]]:
    """slurmctld's RPCs by type since the last reset: {type: (count, mean µs)}."""
    out = cluster.run(["sdiag"]).stdout
    return {m[0]: (int(m[1]), int(m[2])) for m in _SDIAG.findall(out)}


def _hooks(names: list[str], config_path: str, mode: str, jitter_s: float, out: Any) -> None:
    """One worker process: a thread per node, each a failing prolog's drain; results to `out`."""
    config = load_config(config_path)
    # Set here, not in the file: a spread beyond the config's 10 s cap stands for 1,000 nodes'
    # own CPUs on this machine's two (see the module's docstring).
    config = config.replace(budget=config.budget.replace(jitter_s=jitter_s))
    if mode == "before":
        drain_mod.budget_nodes = lambda slurm, config, since: slurm.nodes()  # type: ignore[assignment]
    results: dict[str, tuple[dict[str, int], float, bool]] = {}

    def hook(name: str) -> None:
        slurm = Counted(timeout=config.slurm.timeout_s)
        began = time.monotonic()
        plan = budget_drain(name, "gpu.driver", drain_reason("gpu.driver", "bad roll-out"))
        outcome = execute(plan, Hands(config, slurm)).drain
        results[name] = (slurm.counts, time.monotonic() - began, outcome.drained)

    threads = [threading.Thread(target=hook, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    out.put(results)


def storm(
    cluster: LocalSlurm, names: list[str], mode: str, base: Path, jitter_s: float = 0.5
) -> dict[str, Any]:
    """Every node in `names` fails at once; what it cost."""
    site = base / f"site-{mode}-{len(names)}-{jitter_s:g}"
    (site / "shared").mkdir(parents=True)
    (site / "gpugate.yaml").write_text(
        f"state_dir: {site / 'state'}\nevidence_dir: {site / 'evidence'}\n"
        f"admin:\n  history_dir: {site / 'shared'}\n"
    )
    # Hooks run in worker processes (a node's hook is its own process at a site; a thousand
    # threads behind one interpreter lock would slow each read far beyond a real node's).
    workers = max(1, min(WORKERS, len(names) // 8))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    cluster.run(["sdiag", "--reset"])
    began = time.monotonic()
    procs = [
        context.Process(
            target=_hooks,
            args=(names[i::workers], str(site / "gpugate.yaml"), mode, jitter_s, queue),
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    results: dict[str, tuple[dict[str, int], float, bool]] = {}
    for _ in procs:
        while True:
            try:
                results.update(queue.get(timeout=5))
                break
            except Exception:  # queue.Empty: a worker that died sends nothing
                if not any(p.is_alive() for p in procs) and queue.empty():
                    break
    for p in procs:
        p.join(60)
    wall = time.monotonic() - began
    rpcs = sdiag(cluster)
    out = cluster.run(["sinfo", "-h", "-N", "-t", "drain", "-o", "%N"]).stdout.split()
    standing = [n for n in out if n in set(names)]
    per = [r[0] for r in results.values()]
    for name in standing:  # one by one: a list with one node Slurm will not resume fails whole
        cluster.run(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)
    return {
        "mode": mode,
        "nodes": len(names),
        "jitter_s": jitter_s,
        "finished": len(results),
        "drained_standing": len(standing),
        "per_node_max": {k: max(c[k] for c in per) for k in per[0]},
        "per_node_mean": {k: round(statistics.mean(c[k] for c in per), 2) for k in per[0]},
        "hook_s_median": round(statistics.median(r[1] for r in results.values()), 2),
        "hook_s_max": round(max(r[1] for r in results.values()), 2),
        "storm_wall_s": round(wall, 1),
        "slurmctld_rpcs": {k: v for k, v in rpcs.items() if k.startswith("REQUEST_")},
        "slurmctld_rpcs_per_node": round(
            sum(v[0] for k, v in rpcs.items() if k.startswith("REQUEST_")) / len(names), 2
        ),
    }


def run(
    sizes: list[int], modes: list[str], jitters: tuple[float, ...] = (0.5,)
) -> Iterator[dict[str, Any]]:
    """One private Slurm per size; a storm per mode; each storm's figures as it ends."""
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="gpugate-storm-") as tmp:
            simulated = f"sim[0001-{size:04d}]"
            names = [f"sim{i:04d}" for i in range(1, size + 1)]
            cluster = LocalSlurm(Path(tmp) / "slurm", nodes=["n1"], gpus_per_node=0,
                                 simulated_nodes=simulated)  # fmt: skip
            os.environ["SLURM_CONF"] = str(cluster.conf_path)
            with cluster.start():
                for mode in modes:
                    for jitter in jitters:
                        yield storm(cluster, names, mode, Path(tmp), jitter)
                        time.sleep(2)


def main() -> int:
    """Print the storm figures as JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 1000])
    parser.add_argument("--modes", nargs="+", default=["before", "after"])
    parser.add_argument("--jitter", type=float, nargs="+", default=[0.5])
    args = parser.parse_args()
    for row in run(args.nodes, args.modes, tuple(args.jitter)):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

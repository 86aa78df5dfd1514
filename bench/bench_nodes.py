"""Benchmark: `gpugate nodes --sinfo-json FILE --json` against `json.load` of the same file.

Generates a 10,000-node cluster (default) as `sinfo --json` in both shapes, into bench/out/
(git-ignored):

- 22.05: a `nodes` list, one full record per node (lower-case `state` plus `state_flags`),
  copied from the recorded 22.05 output in tests/fixtures/slurm/;
- 23.02+: the aggregated `sinfo` list (`node.state` an upper-case list, `nodes.nodes` the
  names, `reason` an object), one record per (state, reason) group as sinfo prints it, from
  the recorded 23.02 output.

About 5% of the nodes are out of service: gpugate drains (prolog and epilog reasons, several
checks), admins' drains, nodes down and not responding. A history (drains.jsonl, some nodes
drained up to 4 times) and evidence bundles for the epilog drains sit in a private state
directory, as on a real admin host. Then, interleaved and with the page cache warm, it times
`python -c "import json; json.load(open(FILE))"` and `python -m gpugate nodes --sinfo-json FILE
--json` with the same interpreter, median of --runs, and prints a Markdown table with the
ratio of wall times (the target: gpugate at most 3x json.load) and of CPU times (user + system;
steadier than wall time on a shared machine).

    python bench/bench_nodes.py [--nodes 10000] [--runs 7]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out", "nodes")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "slurm")
TARGET = 3.0

GPUGATE_REASONS = [
    ("gpu.ecc", "GPU3 volatile uncorrected ECC 2 > 0 (reset it)", "ecc_error"),
    ("gpu.ecc", "GPU5 aggregate uncorrected ECC 120 > 100", "ecc_error"),
    ("kernel.xid", "GPU1 (0000:18:00) Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS: GPU has fallen off the bus (reboot the node)", "gpu_xid_hardware"),
    ("nvlink.links", "GPU2 12/18 NVLinks active", "nvlink_error"),
    ("pcie.link", "GPU6 PCIe x8 < x16", None),
    ("ib.ports", "mlx5_3/1 Down (expected 8 active ports)", None),
    ("host.nofile", "soft nofile 1024 < 1048576", None),
]  # fmt: skip


def plan(n: int, seed: int = 7) -> list[dict]:
    """One dict per node: name, state, flags, reason, user, time; ~5% out of service."""
    rng = random.Random(seed)
    base = 1_790_000_000
    nodes = []
    for i in range(n):
        name = f"gpu-{i // 1000:02d}-{i % 1000:03d}"
        k = rng.random()
        node = {
            "name": name,
            "state": "allocated",
            "flags": [],
            "reason": "",
            "user": "",
            "time": 0,
        }
        if k < 0.03:
            check, detail, _ = rng.choice(GPUGATE_REASONS)
            if rng.random() < 0.5:
                detail = f"evidence {700000 + i}/{name}-r0: {detail}"
            node.update(state=rng.choice(["idle", "mixed"]), flags=["DRAIN"],
                        reason=f"gpugate: {check}: {detail}", user="root",
                        time=base + rng.randrange(86400 * 20))  # fmt: skip
        elif k < 0.04:
            node.update(state="idle", flags=["DRAIN"], reason=f"IT-{rng.randrange(9999)} swap PSU",
                        user=rng.choice(["alice", "bob"]), time=base + rng.randrange(86400 * 20))  # fmt: skip
        elif k < 0.05:
            node.update(state="down", flags=["NOT_RESPONDING"], reason="Not responding",
                        user="slurm", time=base + rng.randrange(86400 * 20))  # fmt: skip
        elif k < 0.25:
            node["state"] = "idle"
        elif k < 0.35:
            node["state"] = "mixed"
        nodes.append(node)
    return nodes


def sinfo_2205(nodes: list[dict]) -> dict:
    """The 22.05 shape: one full `nodes` record per node."""
    with open(os.path.join(FIXTURES, "22.05", "sinfo.drained.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    template = doc["nodes"][0]
    records = []
    for n in nodes:
        rec = copy.deepcopy(template)
        rec.update(name=n["name"], address=n["name"], hostname=n["name"], state=n["state"],
                   state_flags=n["flags"], reason=n["reason"], reason_set_by_user=n["user"],
                   reason_changed_at=n["time"])  # fmt: skip
        records.append(rec)
    doc["nodes"] = records
    return doc


def sinfo_2302(nodes: list[dict]) -> dict:
    """The 23.02+ shape: aggregated `sinfo` records, one per (state, reason) group."""
    with open(
        os.path.join(FIXTURES, "23.02", "sinfo.allocated-drain-excerpt.json"), encoding="utf-8"
    ) as fh:
        doc = json.load(fh)
    template = doc["sinfo"][0]
    groups: dict[tuple, list[dict]] = {}
    for n in nodes:
        key = (n["state"], tuple(n["flags"]), n["reason"], n["user"], n["time"])
        groups.setdefault(key, []).append(n)
    records = []
    for (state, flags, reason, user, when), members in groups.items():
        rec = copy.deepcopy(template)
        rec["node"]["state"] = [state.upper(), *flags]
        names = [m["name"] for m in members]
        rec["nodes"].update(nodes=names, total=len(names), allocated=0, idle=0, other=0)
        rec["reason"] = {"description": reason, "time": when, "user": user}
        records.append(rec)
    doc["sinfo"] = records
    return doc


def write_state(nodes: list[dict], base: str, seed: int = 7) -> str:
    """History, evidence bundles and a config naming them; returns the config's path."""
    rng = random.Random(seed)
    state, evidence = os.path.join(base, "state"), os.path.join(base, "evidence")
    os.makedirs(state, exist_ok=True)
    lines = []
    for n in nodes:
        if not n["reason"].startswith("gpugate:"):
            continue
        check = n["reason"].split(":")[1].strip()
        category = next((c for k, _, c in GPUGATE_REASONS if k == check), None)
        bundle = None
        if "evidence " in n["reason"]:  # an epilog drain: its bundle, named in the reason
            rel = n["reason"].split("evidence ", 1)[1].split(":", 1)[0]
            bundle = os.path.join(evidence, rel)
            os.makedirs(bundle, exist_ok=True)
            with open(os.path.join(bundle, "summary.json"), "w", encoding="utf-8") as fh:
                json.dump({"node": n["name"], "category": category, "xid": None}, fh)
        for back in range(rng.randrange(1, 5)):
            when = n["time"] - back * 86400 * rng.uniform(1, 6)
            lines.append({"node": n["name"], "when": when, "check": check, "reason": n["reason"],
                          "category": category, "bundle": None if back else bundle})  # fmt: skip
    lines.sort(key=lambda e: e["when"])
    with open(os.path.join(state, "drains.jsonl"), "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in lines)
    config = os.path.join(base, "gpugate.yaml")
    with open(config, "w", encoding="utf-8") as fh:
        fh.write(f"state_dir: {state}\nevidence_dir: {evidence}\n"
                 "admin:\n  history_window_days: 36500\n")  # fmt: skip
    return config


def timed(argv: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run, its output read and dropped as a pipe would."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True)
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        sys.exit(f"{argv}: exit {res.returncode}: {res.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu


def bench(path: str, config: str, runs: int, env: dict) -> dict[str, float]:
    """Medians of wall and CPU time of json.load and of gpugate nodes on one file, interleaved."""
    load = [sys.executable, "-c", f"import json; json.load(open({path!r}))"]
    gpugate = [sys.executable, "-m", "gpugate", "nodes", "--sinfo-json", path, "--json",
               "--config", config]  # fmt: skip
    out = subprocess.run(gpugate, env=env, capture_output=True, check=True).stdout
    rows = json.loads(out)["nodes"]
    assert rows and rows[0]["drained"], "the most urgent node comes first"
    times: dict[str, list[float]] = {"base": [], "base_cpu": [], "ours": [], "ours_cpu": []}
    for _ in range(runs):
        for name, argv in (("base", load), ("ours", gpugate)):
            wall, cpu = timed(argv, env)
            times[name].append(wall)
            times[name + "_cpu"].append(cpu)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    """Generate both files, time both commands, print the Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    nodes = plan(args.nodes)
    config = write_state(nodes, OUT)
    env = dict(os.environ, GPUGATE_CACHE_DIR=os.path.join(OUT, "cache"), PYTHONPATH=ROOT)
    env.pop("GPUGATE_CONFIG", None)
    # As installed, gpugate's modules have their .pyc: let the warm-up run write them.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    print("| shape | nodes | file MB | json.load s | gpugate nodes s | ratio (wall) "
          "| ratio (CPU) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for shape, make in (("22.05 `nodes`", sinfo_2205), ("23.02+ `sinfo`", sinfo_2302)):
        path = os.path.join(OUT, f"sinfo-{shape.split()[0]}-{args.nodes}.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(make(nodes), fh, indent=2)
        t = bench(path, config, args.runs, env)
        ratio = t["ours"] / t["base"]
        worst = max(worst, ratio)
        size = os.path.getsize(path) / 2**20
        print(f"| {shape} | {args.nodes} | {size:.1f} | {t['base']:.3f} | {t['ours']:.3f} "
              f"| {ratio:.2f} | {t['ours_cpu'] / t['base_cpu']:.2f} |")  # fmt: skip
    print(f"\ntarget: at most {TARGET:.0f}x json.load; worst {worst:.2f}x")
    sys.exit(0 if worst <= TARGET else 1)


if __name__ == "__main__":
    main()

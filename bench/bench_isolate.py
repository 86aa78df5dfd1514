"""Benchmark: how long one faulty GPU is out of service before its node serves again, and back.

Starts a private 2-node Slurm with device cgroups and 8 fake GPUs per node
(tests/slurm/localslurm.py, root, Debian's Slurm) with gpugate's hooks and `isolate.unit:
gpu`, then per round: n1's snapshot gains an uncorrectable ECC error on GPU 3, one job is sent
to n1, and the clock runs from that submission until Slurm shows n1 in service with
`Gres=gpu:7` (gpugate's prolog drains, `gpugate isolate apply` waits for the node to be idle,
denies the device, rewrites both files, reconfigures, reads back, resumes). Then the snapshot is
healed and `gpugate resume n1` timed until n1 is in service with `Gres=gpu:8` again.

The yardstick is the bare Slurm work an admin would do by hand for the same result, timed the
same way: `scontrol update State=DRAIN`, both files written, `scontrol reconfigure`, poll until
`Gres=gpu:7`, `scontrol update State=RESUME` (no checks, no cgroup rule, no records).

Needs Slurm 24.11+ (22.05 cannot take the count change: the script says so and stops).

    python bench/bench_isolate.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "slurm"))

from gpugate_site import Site  # noqa: E402
from localslurm import LocalSlurm, slurm_version, state_flags  # noqa: E402

ISOLATE = "isolate:\n  unit: gpu\n  settle_s: 60\n  wait_idle_s: 120\n"
BAD, GPUS = 3, 8


def until(cluster: LocalSlurm, gpus: int, timeout: float = 180) -> float:
    """Poll n1 until it is in service with `gpu:<gpus>`; the monotonic time it was seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            fields = cluster.node("n1")
        except Exception:  # slurmctld restarting
            time.sleep(0.1)
            continue
        in_service = not {"DRAIN", "INVALID_REG"} & state_flags(fields.get("State", ""))
        if fields.get("Gres", "").split("(")[0] == f"gpu:{gpus}" and in_service:
            return time.monotonic()
        time.sleep(0.1)
    raise TimeoutError(f"n1 never in service with gpu:{gpus}")


def gpugate_round(site: Site, cluster: LocalSlurm) -> tuple[float, float]:
    """(fault to back in service with 7 GPUs, resume to back with 8), seconds."""
    site.use_snapshot_with_minors("n1", "h100-ecc")
    started = time.monotonic()
    cluster.submit(wrap="true", nodelist="n1", gres="gpu:1")
    out = until(cluster, GPUS - 1) - started
    site.use_snapshot_with_minors("n1", "h100-healthy")
    env = {**cluster.env(), "GPUGATE_CONFIG": str(site.config), "SLURMD_NODENAME": "n1"}
    started = time.monotonic()
    subprocess.run([str(site.gpugate), "resume", "n1", "--why", "bench"], env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    back = until(cluster, GPUS) - started
    return out, back


def by_hand_round(cluster: LocalSlurm) -> float:
    """The bare Slurm steps for the same result; seconds from the drain to back with 7."""
    started = time.monotonic()
    cluster.drain("n1", "by hand: GPU 3")
    cluster.set_gpus("n1", [i for i in range(GPUS) if i != BAD])
    cluster.run(["scontrol", "reconfigure"])
    until_drained_count(cluster, GPUS - 1)
    cluster.resume("n1", wait=False)
    out = until(cluster, GPUS - 1) - started
    cluster.drain("n1", "by hand: back")
    cluster.set_gpus("n1", list(range(GPUS)))
    cluster.run(["scontrol", "reconfigure"])
    until_drained_count(cluster, GPUS)
    cluster.resume("n1", wait=False)
    until(cluster, GPUS)
    return out


def until_drained_count(cluster: LocalSlurm, gpus: int, timeout: float = 120) -> None:
    """Poll until n1 (still drained) reports `gpu:<gpus>`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            fields = cluster.node("n1")
            registered = fields.get("SlurmdStartTime") not in (None, "None")
            states = state_flags(fields.get("State", ""))
            if (
                fields.get("Gres", "").split("(")[0] == f"gpu:{gpus}"
                and registered
                and ("UNKNOWN" not in states)
            ):
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"n1 never reported gpu:{gpus}")


def main() -> int:
    """Run the rounds and print medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if slurm_version() < (24, 11):
        print(f"Slurm {slurm_version()}: a GPU count change needs 24.11's reconfigure; nothing "
              "to measure here (gpugate drains the node instead)")  # fmt: skip
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-isolate-") as tmp:
        site = Site(Path(tmp), config_extra=ISOLATE)
        for node in ("n1", "n2"):
            site.use_snapshot_with_minors(node, "h100-healthy")
        with site.cluster(["n1", "n2"], device_cgroups=True, gpus_per_node=GPUS) as cluster:
            outs, backs, hand = [], [], []
            for _ in range(args.rounds):
                out, back = gpugate_round(site, cluster)
                outs.append(out)
                backs.append(back)
                hand.append(by_hand_round(cluster))
    print(f"Slurm {'.'.join(map(str, slurm_version()))}, {args.rounds} rounds, medians (min-max):")
    for name, values in (("gpugate: fault -> in service with 7 GPUs", outs),
                         ("gpugate: resume -> in service with 8 GPUs", backs),
                         ("by hand: drain -> in service with 7 GPUs", hand)):  # fmt: skip
        print(f"  {name}: {statistics.median(values):.1f} s ({min(values):.1f}-{max(values):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: `gpugate diagnose --json` against two grep baselines, in one run.

Generates a synthetic training log (default 1 GB, into bench/out/, which git ignores) full of
realistic noise: iteration lines from many ranks with launcher prefixes, NCCL INFO chatter,
warnings, ANSI-coloured `\\r` progress bars, a few harmless lines that hit the prefilter (NCCL
retries, benign words), and the decisive lines near the end (a CUDA OOM on one rank, the other
ranks' NCCL watchdog timeouts, torchrun's summary). Then, in one run and with the page cache
warm, it times, interleaved, median of --runs each: `LC_ALL=C grep -E` with sixteen usual
failure words (GREP16), `LC_ALL=C grep -F` with one literal (`Traceback`) and gpugate (both
engines), and prints a Markdown table: wall and CPU seconds (user + system, children included:
on a shared machine the CPU time is the steadier figure), ratios to both baselines, peak RSS. Targets (issue 30): gpugate at most 2x the sixteen-word grep, within 3x of the
one-literal grep, peak memory under 50 MB, whatever the number of signatures.

    python bench/bench_diagnose.py [--size-mb 1024] [--runs 3] [--no-python-engine]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.path.join(ROOT, "bench", "out")
EXPECTED = {"category": "cuda_oom", "failing_rank": 3}
TIME = "/usr/bin/time"
# The baseline an admin would type: sixteen usual failure words of training logs (Python,
# PyTorch, the shell, the kernel, Slurm), as one ERE alternation. Not gpugate's own keys: its
# cost must not follow its signature table.
GREP16 = [
    "error", "Error", "ERROR", "exception", "Exception", "Traceback", "failed", "FAILED",
    "fatal", "Fatal", "Killed", "killed", "out of memory", "timeout", "timed out",
    "Segmentation fault",
]  # fmt: skip
LITERAL = "Traceback"  # the one-literal baseline: what every Python failure prints
BOUNDS = {"grep -E (16 words)": 2.0, "grep -F (1 literal)": 3.0}
PEAK_MB = 50


def noise_block(rng: random.Random, lines: int) -> bytes:
    """One block of ordinary training-log lines (no failure), varied by the seed."""
    out = []
    for i in range(lines):
        k = rng.random()
        rank = rng.randrange(64)
        if k < 0.30:
            out.append(
                f"[rank{rank}]: iteration {i:8d}/ 500000 | consumed samples: {i * 512:12d} | "
                f"elapsed time per iteration (ms): {rng.uniform(800, 900):.1f} | learning rate: "
                f"2.999E-04 | global batch size: 512 | lm loss: {rng.uniform(2, 3):.6E} | loss "
                f"scale: 65536.0 | grad norm: {rng.uniform(0.1, 1):.3f} | number of skipped "
                "iterations: 0 | number of nan iterations: 0 |"
            )
        elif k < 0.50:
            out.append(
                f"gpu-node-{rank // 8:02d}:{rng.randrange(99999)}:{rng.randrange(99999)} "
                f"[{rank % 8}] NCCL INFO Channel {rng.randrange(32):02d}/0 : {rank}[{rank % 8}] -> "
                f"{rng.randrange(64)}[{rng.randrange(8)}] via P2P/IPC/read"
            )
        elif k < 0.65:
            bar = "".join(
                f"\x1b[32m{p}%\x1b[0m|{'#' * (p // 10):<10}| {p}/100 [00:{p:02d}<01:00, 1.2it/s]\r"
                for p in range(0, 100, 20)
            )
            out.append(f"[default{rank % 8}]:{bar}")
        elif k < 0.80:
            out.append(
                f"[2024-05-08 08:47:31,877] [INFO] [logging.py:96:log_dist] [Rank {rank}] "
                f"step={i}, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]"
            )
        elif k < 0.95:
            out.append(
                f"192.168.1.{rank}: time (ms) | forward-compute: {rng.uniform(100, 200):.2f} | "
                f"backward-compute: {rng.uniform(200, 400):.2f} | optimizer: 101.33"
            )
        elif k < 0.99995:
            out.append(
                f"[rank{rank}]:/usr/lib/python3/site-packages/torch/utils/checkpoint.py:61: "
                "UserWarning: None of the inputs have requires_grad=True. Gradients will be None"
            )
        else:  # rare harmless prefilter hits
            out.append(
                rng.choice(
                    [
                        f"gpu-node-01:42:42 [{rank % 8}] NCCL WARN Call to connect returned "
                        "Connection refused, retrying",
                        f"[rank{rank}]: loss scale overflow, will retry with a smaller scale "
                        "(error budget 3)",
                    ]
                )
            )
    return ("\n".join(out) + "\n").encode()


TAIL = """\
[rank3]: Traceback (most recent call last):
[rank3]:   File "/opt/train/pretrain.py", line 412, in train_step
[rank3]:     loss.backward()
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 3 has a total \
capacity of 79.10 GiB of which 1.02 GiB is free.
{timeouts}W0508 09:31:02.000000 4242 torch/distributed/elastic/multiprocessing/api.py:897] Sending \
process 4243 closing signal SIGTERM
E0508 09:31:03.000000 4242 torch/distributed/elastic/multiprocessing/api.py:869] failed \
(exitcode: 1) local_rank: 3 (pid: 4246) of binary: /usr/bin/python3
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  time      : 2024-05-08_09:31:02
  host      : gpu-node-00
  rank      : 3 (local_rank: 3)
  exitcode  : 1 (pid: 4246)
"""


def tail() -> bytes:
    """The decisive lines: one rank's CUDA OOM, then the others' watchdog timeouts."""
    timeouts = "".join(
        f"[rank{r}]:[E508 09:31:00.1 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=9000, OpType=ALLREDUCE, "
        "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"
        for r in range(64)
        if r != 3
    )
    return TAIL.format(timeouts=timeouts).encode()


def make_log(path: str, size: int) -> None:
    """Write `size` bytes of noise (a few varied blocks, repeated) then the decisive tail."""
    if os.path.exists(path) and os.path.getsize(path) >= size:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    blocks = [noise_block(random.Random(seed), 20000) for seed in range(4)]
    written = 0
    with open(path + ".tmp", "wb") as f:
        while written < size:
            block = blocks[(written // len(blocks[0])) % len(blocks)]
            f.write(block)
            written += len(block)
        f.write(tail())
    os.replace(path + ".tmp", path)


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float, float, bytes]:
    """Wall seconds, CPU seconds, peak RSS in MB of the command (and its children), stdout.

    CPU is user + system from wait4(), which on Linux counts the descendants the command
    waited for (gpugate's grep).
    The peak comes from GNU time when installed: wait4() on a child forked from this Python
    would also count the parent's pages that the child held before exec.
    """
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile() as rss:
        prefix = [TIME, "-f", "%M", "-o", rss.name] if os.path.exists(TIME) else []
        started = time.perf_counter()
        with subprocess.Popen(prefix + argv, env=env, stdout=subprocess.PIPE) as proc:
            assert proc.stdout is not None  # a PIPE
            out = proc.stdout.read()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        took = time.perf_counter() - started
        kb = int(rss.read().split()[-1]) if prefix else usage.ru_maxrss
    if proc.returncode not in (0, 1):  # grep: 1 = no match
        sys.exit(f"{argv[:3]}: exit {proc.returncode}")
    return took, usage.ru_utime + usage.ru_stime, kb / 1024, out


def main() -> None:
    """Generate the log, time the baselines and gpugate, print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024, help="log size (default 1024)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per command (median)")
    ap.add_argument(
        "--no-python-engine", action="store_true", help="skip the slow Python engine row"
    )
    args = ap.parse_args()
    size = args.size_mb * 1024 * 1024
    path = os.path.join(OUT, f"train-{args.size_mb}mb.log")
    make_log(path, size)
    gpugate = os.path.join(os.path.dirname(sys.executable), "gpugate")
    env = dict(os.environ, LC_ALL="C")
    commands = {
        "grep -F (1 literal)": ["grep", "-F", LITERAL, path],
        "grep -E (16 words)": ["grep", "-E", "|".join(GREP16), path],
        "gpugate": [gpugate, "diagnose", "--json", path],
    }
    if not args.no_python_engine:
        commands["gpugate (python engine)"] = [
            gpugate, "diagnose", "--json", "--engine", "python", path,
        ]  # fmt: skip
    for argv in commands.values():  # warm the page cache and check the verdict
        *_, out = run(argv, env)
        if argv[0] == gpugate:
            verdict = json.loads(out)
            got = {k: verdict[k] for k in EXPECTED}
            if got != EXPECTED:
                sys.exit(f"wrong diagnosis {got}, expected {EXPECTED}")
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    peaks: dict[str, float] = dict.fromkeys(commands, 0.0)
    for _ in range(args.runs):
        for name, argv in commands.items():
            took, cpu, peak, _ = run(argv, env)
            times[name].append(took)
            cpus[name].append(cpu)
            peaks[name] = max(peaks[name], peak)
    print(table(os.path.getsize(path), times, cpus, peaks))


def table(
    size: int, times: dict[str, list[float]], cpus: dict[str, list[float]], peaks: dict[str, float]
) -> str:
    """Markdown: one row per command, wall and CPU against each baseline, and the verdict."""
    wall = {name: statistics.median(t) for name, t in times.items()}
    cpu = {name: statistics.median(t) for name, t in cpus.items()}
    heads = " | ".join(f"x {b} wall / cpu (bound {x:g})" for b, x in BOUNDS.items())
    rows = [
        f"| {size / 2**20:.0f} MiB log | wall s | cpu s | {heads} | peak MB |",
        "|---|---|---|" + "---|" * len(BOUNDS) + "---|",
    ]
    for name in times:
        ratios = " | ".join(
            f"{wall[name] / wall[b]:.2f} / {cpu[name] / cpu[b]:.2f}" for b in BOUNDS
        )
        rows.append(
            f"| {name} | {wall[name]:.2f} | {cpu[name]:.2f} | {ratios} | {peaks[name]:.0f} |"
        )
    rows.append("")
    for label, fig in (("wall", wall), ("cpu", cpu)):
        ok = all(fig["gpugate"] <= x * fig[b] for b, x in BOUNDS.items())
        rows.append(f"gpugate within the time bounds by {label}: {'yes' if ok else 'NO'}")
    rows.append(f"gpugate under {PEAK_MB} MB: {'yes' if peaks['gpugate'] < PEAK_MB else 'NO'}")
    return "\n".join(rows)


if __name__ == "__main__":
    main()

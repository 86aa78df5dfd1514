"""Benchmark: `latest_complete()` on a 2 GiB and a 2 MiB torch-like checkpoint.

Completeness is judged from the end of a file (the ZIP end records and central directory), so
the time must not grow with the checkpoint's size. Each checkpoint is a ZIP laid out like
`torch.save`'s (`archive/data.pkl`, a stored `archive/data/0`, `archive/version`), written in
8 MiB chunks of random bytes: real blocks on disk, not a sparse file. They go under
`bench/out/` (git-ignored) and are deleted afterwards unless `--keep`.

Timed, median of `--runs`, interleaved:
- `latest_complete()` with the page cache warm;
- the same after `posix_fadvise(DONTNEED)` evicted the file's cached pages (cold; per file,
  so nothing else on the machine is touched);
- bytes read per call (the process's `rchar` from /proc/self/io);
- `zipfile.ZipFile(path).namelist()`, for comparison (it too reads only the end);
- `gpugate checkpoint latest DIR` end to end, once each (a fresh process, after one
  warm-up run);
- whether `latest_complete()` with the default settle time finds the checkpoint right after
  it was written (a complete torch ZIP proves itself by its end record: it should, at once;
  before issue 11 it was "may still be being written" for SETTLE_S seconds).

    python bench/bench_checkpoint.py [--runs 20] [--big-mb 2048] [--keep]
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import time
import zipfile

from gpugate.checkpoints.discover import SETTLE_S, latest_complete

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "checkpoints")
CHUNK = 8 << 20


def write_checkpoint(path: str, size: int) -> None:
    """A torch-like ZIP whose storage member holds `size` bytes of real data."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    state = {"state_dict": {"weight": "storage 0"}, "global_step": 1}
    chunk = os.urandom(CHUNK)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps(state, protocol=2))
        z.writestr("archive/byteorder", b"little")
        with z.open("archive/data/0", "w", force_zip64=True) as member:
            for done in range(0, size, CHUNK):
                member.write(chunk[: min(CHUNK, size - done)])
        z.writestr("archive/version", b"3\n")
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def evict(path: str) -> None:
    """Drop this file's pages from the page cache (nothing else)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def rchar() -> int:
    """Bytes this process has read through read()/pread() so far."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def timed(fn: object, *args: object) -> float:
    started = time.perf_counter()
    fn(*args)  # type: ignore[operator]
    return (time.perf_counter() - started) * 1000


def one_round(directory: str, path: str, results: dict[str, list[float]]) -> None:
    """One warm, one cold, one zipfile measurement, plus the bytes read by the call."""
    before = rchar()
    results["warm"].append(timed(latest_complete, directory, 0))
    results["bytes"].append(rchar() - before)  # includes reading /proc/self/io once (~400 B)
    evict(path)
    results["cold"].append(timed(latest_complete, directory, 0))
    results["zipfile"].append(timed(lambda: zipfile.ZipFile(path).namelist()))


def cli_ms(directory: str) -> float:
    gpugate = os.path.join(os.path.dirname(sys.executable), "gpugate")
    argv = [gpugate, "checkpoint", "latest", directory, "--settle-s", "0"]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    took = (time.perf_counter() - started) * 1000
    if proc.returncode != 0:
        sys.exit(f"{argv}: exit {proc.returncode}: {proc.stderr[-500:]}")
    return took


def main() -> None:
    """Write the two checkpoints, time them, print a Markdown table, clean up."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--big-mb", type=int, default=2048)
    ap.add_argument("--small-mb", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep bench/out/checkpoints")
    args = ap.parse_args()
    cases = [(f"{args.big_mb} MiB", args.big_mb), (f"{args.small_mb} MiB", args.small_mb)]
    dirs = {label: os.path.join(OUT, label.replace(" ", "")) for label, _ in cases}
    try:
        fresh = {}
        for label, mb in cases:
            started = time.perf_counter()
            write_checkpoint(os.path.join(dirs[label], "ckpt_1.pt"), mb << 20)
            print(f"wrote {label} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
            fresh[label] = latest_complete(dirs[label]) is not None  # default settle time
        results = {
            label: {k: [] for k in ("warm", "cold", "zipfile", "bytes")} for label, _ in cases
        }
        for _ in range(args.runs):
            for label, _ in cases:
                path = os.path.join(dirs[label], "ckpt_1.pt")
                one_round(dirs[label], path, results[label])
        cli_ms(dirs[cases[1][0]])  # warm-up: the first start-up also loads the interpreter's files
        cli = {label: cli_ms(dirs[label]) for label, _ in cases}
        print(f"{args.runs} runs each, interleaved; {os.cpu_count()} CPUs; "
              f"Python {sys.version.split()[0]}\n")  # fmt: skip
        print("| checkpoint | file size | `latest_complete` warm, median ms | cold (evicted), "
              "median ms | bytes read per call | `zipfile.ZipFile` median ms | "
              "`gpugate checkpoint latest` ms (once) | found just after writing "
              f"(settle {SETTLE_S:g} s) |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for label, _ in cases:
            r = results[label]
            size = os.path.getsize(os.path.join(dirs[label], "ckpt_1.pt"))
            print(f"| {label} | {size:,} B | {statistics.median(r['warm']):.3f} | "
                  f"{statistics.median(r['cold']):.3f} | {statistics.median(r['bytes']):,.0f} | "
                  f"{statistics.median(r['zipfile']):.3f} | {cli[label]:.0f} | "
                  f"{'yes' if fresh[label] else 'no'} |")  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(OUT, ignore_errors=True)


if __name__ == "__main__":
    main()

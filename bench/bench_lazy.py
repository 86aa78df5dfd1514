"""What each late import in gpugate/startup.py (LAZY) saves: the figures for its table.

For every module LAZY lists, the warm hook runs (a replayed Prolog, TaskProlog, `gpugate check`,
Epilog and HealthCheckProgram, as tests/unit/commands/test_startup.py runs them) are listed, and in a fresh
`/usr/bin/python3 -Es` that first imports everything the first run lacking the module imported,
the module's own import is timed (median of --runs): what that run would pay were the import at
the top. Modules every run imports anyway are printed as such (their entry should go).

    python bench/bench_lazy.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from test_startup import RUNS, hook_env, imported  # noqa: E402 - the test's own runs

from gpugate.startup import LAZY  # noqa: E402 - from this tree

PYTHON = "/usr/bin/python3"
TIME_IMPORT = """
import sys, time
sys.path.insert(0, {root!r})
for name in {before!r}:
    try:
        __import__(name)
    except Exception:
        pass
started = time.perf_counter()
__import__({module!r})
print((time.perf_counter() - started) * 1000)
"""


def import_ms(module: str, before: list[str], runs: int) -> float:
    """Median ms to import `module` in a fresh interpreter that already imported `before`."""
    code = TIME_IMPORT.format(root=ROOT, before=before, module=module)
    times = []
    for _ in range(runs):
        out = subprocess.run([PYTHON, "-Es", "-c", code], capture_output=True, text=True)
        if out.returncode != 0:
            return float("nan")  # not installed here (torch, pyslurm)
        times.append(float(out.stdout))
    return statistics.median(times)


def main() -> None:
    """Print one Markdown row per LAZY module: the run that skips it and the ms it saves there."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpugate-lazy-") as tmp:
        env = hook_env(tmp)
        seen = {
            name: imported(argv, env, 102, warm_first=True, python=(PYTHON, "-Es"), paths=[ROOT])
            for name, argv in RUNS.items()
        }
    print("| module | skipped by | ms it saves there |")
    print("|---|---|---:|")
    for module in LAZY:
        lacking = [name for name, mods in seen.items() if module not in mods]
        if not lacking:
            print(f"| {module} | (every run imports it) | 0 |")
            continue
        run = "check" if "check" in lacking else lacking[0]
        before = sorted(m for m in seen[run] if not m.startswith("_") and m != "__main__")
        ms = import_ms(module, before, args.runs)
        print(f"| {module} | {', '.join(lacking)} | {ms:.1f} |")


if __name__ == "__main__":
    main()

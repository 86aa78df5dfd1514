"""Calls the Slurm adapter on one backend, in a process of its own, and prints what came back.

    SLURM_CONF=... python tests/slurm/backend_driver.py KIND < calls.json

`calls.json` is a list of `[method, arg, ...]` (e.g. `["requeue", "14_1", false]`); the output is
one JSON object: `kind` (the backend used) and, per call, `{"ok": value}` or `{"error": class,
"message": text}`. A child per cluster because `import pyslurm` runs `slurm_init()` once per
process, reading SLURM_CONF then: a test process that meets several clusters cannot hold it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from gpugate.record import to_plain
from gpugate.slurm.choose import backend


def main() -> int:
    """Run the calls read from stdin on the backend named in argv[1]; JSON on stdout."""
    kind = sys.argv[1]
    slurm = backend(kind)
    results: list[dict] = []
    for method, *args in json.load(sys.stdin):
        try:
            results.append({"ok": to_plain(getattr(slurm, method)(*args))})
        except Exception as exc:  # what each backend raises is what the test compares
            results.append({"error": type(exc).__name__, "message": str(exc)})
    json.dump({"kind": slurm.kind, "why": slurm.why, "results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

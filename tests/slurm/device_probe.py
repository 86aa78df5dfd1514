"""Which fake GPUs a job may open, asked from inside the job (device-cgroup clusters).

`LocalSlurm(device_cgroups=True)` makes fake GPUs with NVIDIA's device numbers, which no
driver serves here: `open()` fails ENXIO where the job's device cgroup allows the device and
EPERM where it does not. So the job itself says what it can reach, not its variables.
"""

from __future__ import annotations

import json
import time
from typing import Any

PROBE = """import errno, json, os, sys
result = {}
for index in range(int(sys.argv[2])):
    try:
        os.close(os.open(os.path.join(sys.argv[1], "nvidia%d" % index), os.O_RDWR))
        result[index] = "opened"
    except OSError as exc:
        result[index] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps({"gpus": os.environ.get("SLURM_JOB_GPUS"), "open": result}))
"""


def probe(cluster: Any, node: str, gpus: int | None, total: int = 8, timeout: float = 60) -> dict:
    """Run PROBE as an ordinary user's job on `node` asking for `gpus` GPUs (None: none);
    {"gpus": SLURM_JOB_GPUS, "open": {index: "ENXIO" | "EPERM"}}."""
    script = cluster.work_dir / "device_probe.py"
    script.write_text(PROBE)
    script.chmod(0o644)
    out = cluster.work_dir / f"probe.{node}.{gpus}.{time.monotonic_ns()}.out"
    options: dict[str, Any] = {"nodelist": node, "output": str(out)}
    if gpus:
        options["gres"] = f"gpu:{gpus}"
    job = cluster.submit(wrap=f"python3 {script} {cluster.base / 'dev' / node} {total}", **options)
    cluster.wait_job(job, "COMPLETED", timeout=timeout)
    result = json.loads(out.read_text().strip().splitlines()[-1])
    result["open"] = {int(index): what for index, what in result["open"].items()}
    return result


def opened(result: dict) -> set[int]:
    """The GPU indices the job could open (ENXIO: allowed by the cgroup, no driver here)."""
    return {index for index, what in result["open"].items() if what == "ENXIO"}


def refused(result: dict) -> set[int]:
    """The GPU indices the device cgroup refused to the job."""
    return {index for index, what in result["open"].items() if what == "EPERM"}

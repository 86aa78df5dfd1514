"""What the requeue's end-to-end tests share: the controller's decision read back, a checkpoint file."""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

from e2e import Site


def torch_zip(path: Path, truncate: bool = False) -> None:
    """A torch.save-like zip (archive/data.pkl, data/0, version); truncated = cut before its end."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/data/0", b"\x00" * 4096)
        z.writestr("archive/version", b"3\n")
    if truncate:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


def decision(site: Site, job: int, timeout: float = 40, runs: int = 1) -> dict:
    """The controller epilog's decision for `job`, from its event line (a finished job takes
    no AdminComment), once it has run `runs` times."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [
            e for e in site.events() if e["hook"] == "epilog-slurmctld" and e.get("job") == str(job)
        ]
        if len(found) >= runs:
            assert found[-1]["requeue"] is False
            # The controller read the job through the backend this suite runs on (cli, or
            # pyslurm in .ci/run's second pass): never a silent fallback.
            assert found[-1]["slurm"] == site.backend, found[-1]
            return found[-1]
        time.sleep(0.5)
    raise AssertionError(f"no epilog-slurmctld decision for job {job}")

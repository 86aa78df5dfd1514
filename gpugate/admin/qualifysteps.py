"""`gpugate selftest`: which `gpugate qualify` steps this site can run, and the fix for the rest.

A step the site cannot run is "not run" in a qualification (never a drain, issue 28), so a
missing tool is a warning here, not a broken site. Checked on this host, each tool with a
timeout and as an argument list:
- dcgm: qualify.dcgmi is found, and gpugate's own DCGM step starts (`cli_command()`: the job
  runs this interpreter with this process's sys.path, e.g. /usr/bin/python3 + /opt/gpugate/lib);
- allreduce, h2d, pairs: qualify.python runs and imports torch and torch.distributed (NCCL or
  only gloo is said: on gloo the all-reduce measures the host network, not the GPUs').
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from gpugate import runner
from gpugate.child import ChildError, cli_command
from gpugate.qualify.dcgm import FIX_DCGMI
from gpugate.qualify.payload import FIX_TORCH

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.config.schema import Qualify

STEPS = ("dcgm", "allreduce", "h2d", "pairs")
# Importing torch (CUDA libraries included) can take tens of seconds on a cold node.
TORCH_TIMEOUT_S = 90.0
STEP_TIMEOUT_S = 30.0
TORCH_PROBE = (
    "import torch, torch.distributed; "
    "print(torch.__version__, torch.distributed.is_nccl_available())"
)


@dataclass(frozen=True)
class StepCheck:
    """One qualify step on this site: runnable or not, why, and the fix when it is not."""

    step: str
    runnable: bool
    why: str
    fix: str = ""


def probe_torch(
    python: str,
    timeout: float = TORCH_TIMEOUT_S,
    run: Callable[..., runner.CommandResult] = runner.run,
) -> tuple[str | None, bool, str]:
    """(torch version or None, NCCL available, why not) of `python`, by running it."""
    res = run([python, "-c", TORCH_PROBE], timeout=timeout)
    if res.status == runner.MISSING:
        return None, False, f"qualify.python {python} is not found or not executable here"
    if not res.ok:
        said = _last_line(res.stderr) or res.describe()
        if "No module named" in said and "torch" in said:
            return None, False, f"no torch in {python} ({said})"
        return None, False, f"{python} cannot import torch: {said}"
    words = res.stdout.split()
    if len(words) != 2:
        return None, False, f"{python}: unexpected answer {res.stdout.strip()[:80]!r}"
    return words[0], words[1] == "True", ""


def probe_dcgm_step(
    dcgmi: str,
    timeout: float = STEP_TIMEOUT_S,
    run: Callable[..., runner.CommandResult] = runner.run,
) -> str:
    """Why the DCGM step cannot run here ("" when it can): no dcgmi, or no gpugate to start it."""
    if shutil.which(dcgmi) is None:
        return f"qualify.dcgmi {dcgmi} is not found here"
    try:
        argv = [*cli_command(), "--version"]
    except ChildError as exc:
        return f"gpugate's DCGM step cannot start: {exc}"
    res = run(argv, timeout=timeout)
    if not res.ok:  # not res.describe(): the argv carries the whole sys.path
        said = _last_line(res.stderr) or f"{res.status} (exit {res.returncode})"
        return f"gpugate's DCGM step cannot start ({argv[0]}): {said}"
    return ""


def check_qualify_steps(
    qc: Qualify, run: Callable[..., runner.CommandResult] = runner.run
) -> list[StepCheck]:
    """Each of STEPS on this host: runnable, or not with why and the exact fix."""
    checks = []
    why = probe_dcgm_step(qc.dcgmi, run=run)
    fix = FIX_DCGMI if "dcgmi" in why else "run `gpugate selftest` with the gpugate the jobs run"
    checks.append(StepCheck("dcgm", not why, why or f"{qc.dcgmi} found", "" if not why else fix))
    version, nccl, why = probe_torch(qc.python, run=run)
    for step in STEPS[1:]:
        if version is None:
            checks.append(StepCheck(step, False, why, FIX_TORCH))
        else:
            backend = "NCCL" if nccl else "gloo only: this torch has no NCCL"
            checks.append(StepCheck(step, True, f"torch {version} in {qc.python} ({backend})"))
    return checks


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""

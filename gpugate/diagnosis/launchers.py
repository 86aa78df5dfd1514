"""The rank a matched line names in its own words, by launcher, and lines whose rank is a detector.

cleaning.py reads the rank a line's *prefix* names (torchrun, srun --label, Open MPI's tags,
vLLM's worker prefix). Here, the rank a line's text names, as each launcher prints it:
- ProcessGroupNCCL and DeepSpeed/Megatron: `[Rank 3]`, `[PG 0 Rank 3]`, `[PG ID 0 PG GUID 0(x)
  Rank 3]` (PyTorch 1.x to 2.9, deepspeed/utils/logging.py);
- Open MPI's mpirun: `process rank 3 with PID` ("noticed that", "has exited due to"),
  `MPI_ABORT was invoked on rank 3` (ompi/runtime/ompi_mpi_abort.c);
- MPICH/Hydra and Cray MPICH: `(rank 0 in comm 0)`, `MPI_Abort(MPI_COMM_WORLD, 1) - process 3`,
  Hydra's `RANK 3 PID 42 RUNNING AT host` (MPICH >= 4), `MPICH ERROR [Rank 0]`;
- Slurm's own lines: srun's `srun: error: host: task 2: Out Of Memory` (one task; a range such
  as `tasks 0-3` names none, and `Terminated` is srun's SIGTERM to the survivors, not an origin).
  A task is a rank only where srun --label shows one task per rank (rank.py): srun may as well
  start one torchrun agent per node, whose task number is a node's;
- TensorFlow's (and JAX's) coordination service: `Task /job:worker/replica:0/task:2 heartbeat
  timeout` names the worker that failed (the task id is its process index), printed by the
  leader; a worker's own "encountered the following error" names no origin.
Detectors: a line that reports other ranks as missing (Horovod's stall inspector `[missing
ranks: 1]`, c10d's `Rank 1 failed to pass monitoredBarrier`) was printed by a healthy rank: the
ranks it names are the origin, its reporter never is. A line that says the failure came from
another, unnamed rank (Horovod's "has been shut down ... caused by an exception on one of the
ranks") names no origin at all.
"""

from __future__ import annotations

import re

from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.diagnosis.cleaning import Cleaned

_BODY_RANK_RE = lazy(r"\[(?:PG (?:ID )?\d+ (?:PG GUID \d+(?:\([^)\]]*\))? )?)?Rank (\d+)\]")
_TEXT_RANK_RE = lazy(
    r"""process\ rank\ (?P<mpirun>\d+)\ with\ PID                 # Open MPI's mpirun
    | MPI_ABORT\ was\ invoked\ on\ rank\ (?P<abort>\d+)\b           # Open MPI
    | \(rank\ (?P<comm>\d+)\ in\ comm\ \d+\)                        # MPICH / Cray MPICH Abort
    | MPI_Abort\(MPI_COMM_WORLD,\ ?-?\d+\)\ -\ process\ (?P<proc>\d+)\b  # MPICH
    | \bRANK\ (?P<hydra>\d+)\ PID\ \d+\ RUNNING\ AT\b                # Hydra (MPICH >= 4)
    | [Tt]ask\ /job:(?:jax_)?worker/replica:\d+/task:(?P<tf>\d+)\ heartbeat\ timeout  # TF/JAX
    """,
    re.X,
)
# srun's own line on one task's end; `Terminated` is srun's SIGTERM to the survivors.
_SRUN_TASK_RE = lazy(r"^srun: error: \S+: task (\d+): (?!Terminated)")
# Ranks that a healthy rank says did not arrive: the origin.
_MISSING_RE = lazy(
    r"\[missing ranks: (?P<h>[\d, ]+)\]"  # Horovod's stall inspector (operations.cc <= 0.19)
    r"|\bRanks? (?P<mb>\d+(?:, \d+)*) failed to pass monitoredBarrier"  # c10d ProcessGroupGloo
)
# A reporter saying the failure came from another rank it does not name.
_VICTIM_RE = lazy(r"Horovod has been shut down|caused by an exception on one of the ranks")


def missing_ranks(text: str) -> tuple[int, ...] | None:
    """The ranks a stall or barrier report says did not arrive, or None for any other line."""
    if "issing ranks" not in text and "monitoredBarrier" not in text:
        return None
    m = _MISSING_RE.search(text)
    if m is None:
        return None
    found = m.group("h") or m.group("mb")
    return tuple(sorted({int(r) for r in found.replace(" ", "").split(",") if r}))


def origin_rank(text: str, prefix_rank: int | None, named: int | None) -> int | None:
    """The rank where the failure on this line began, as far as the line itself says.

    `prefix_rank` is the rank of the line's launcher prefix (cleaning.py), `named` the rank a
    signature's own pattern captured. A detector's line gives the one rank it says is missing;
    a victim's line gives none; else the prefix, the signature's rank, then the launcher's words.
    """
    missing = missing_ranks(text)
    if missing is not None:
        return missing[0] if len(missing) == 1 else None
    if _VICTIM_RE.search(text):
        return None
    if prefix_rank is not None:
        return prefix_rank
    if named is not None:
        return named
    return text_rank(text)


def text_rank(text: str) -> int | None:
    """The rank a launcher's own words on this line name (see the module's list), or None."""
    if "Rank " in text:
        body = _BODY_RANK_RE.search(text)
        if body is not None:
            return int(body.group(1))
    m = _TEXT_RANK_RE.search(text)
    if m is None:
        return None
    return int(next(g for g in m.groups() if g is not None))


def srun_task(text: str) -> int | None:
    """The one task srun's own `srun: error: host: task N: ...` line says ended, or None."""
    if not text.startswith("srun: error: "):
        return None
    m = _SRUN_TASK_RE.match(text)
    return int(m.group(1)) if m else None


def place_fields(line: Cleaned) -> dict[str, Any]:
    """Match fields for where a line came from: the host a prefix named (`prefix_host`), srun
    --label's task (`srun_label`, with `label_rank` when an inner prefix names another rank),
    the task srun's own line names (`srun_task`), the ranks a detector says are `missing`."""
    out: dict[str, Any] = {}
    if line.host is not None:
        out["prefix_host"] = line.host
    if line.task is not None:
        out["srun_label"] = line.task
        if line.rank is not None and line.rank != line.task:
            out["label_rank"] = line.rank
    missing = missing_ranks(line.text)
    if missing:
        out["missing"] = ", ".join(map(str, missing))
    task = srun_task(line.text)
    if task is not None:
        out["srun_task"] = task
    return out

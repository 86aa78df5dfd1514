"""The failure categories (docs/interfaces.md's closed set): whose fault each is, and what it means.

One table, read by the diagnosis (which lines are hardware claims), the epilog's bundle, the
requeue decision (which causes are the cluster's) and the admin table (what to do). A category
is one of these kinds:
- ``hardware``: the node's GPU or its links (ECC, NVLink, a hardware Xid): the node's fault;
- ``infrastructure``: the cluster failed the job in another way (a node died);
- ``symptom``: what every rank prints when one of them fell over (NCCL); the cluster's fault
  only when a node's own evidence shows it;
- ``user``: the job's own doing (its code, its memory, its time limit, its cancellation);
- ``none``: the run ended well (its own success line, Slurm's exit 0:0) and nothing failed after;
- ``unexplained``: a failure that no signature names (``other``: a signal, a non-zero exit, an
  abort, a traceback at the end);
- ``undetermined``: the logs show neither a failure nor a good end (``unknown``: a fragment).
  Never a clean end and never the cluster's fault: no requeue, no drain, no suspicion.
"""

from __future__ import annotations  # `str | None` below: Python 3.9 (requires-python)

HARDWARE, INFRASTRUCTURE, SYMPTOM, USER = "hardware", "infrastructure", "symptom", "user"
NONE, UNEXPLAINED, UNDETERMINED = "none", "unexplained", "undetermined"

# category -> kind, in docs/interfaces.md's order.
KIND: dict[str, str] = {
    "nccl_timeout": SYMPTOM,
    "nccl_error": SYMPTOM,
    "cuda_oom": USER,
    "host_oom": USER,
    "gpu_xid_hardware": HARDWARE,
    "gpu_xid_user_app": USER,
    "ecc_error": HARDWARE,
    "nvlink_error": HARDWARE,
    "illegal_memory_access": USER,
    "slurm_time_limit": USER,
    "slurm_node_failure": INFRASTRUCTURE,
    "slurm_cancelled": USER,
    "no_failure": NONE,
    "other": UNEXPLAINED,
    "unknown": UNDETERMINED,
}
CATEGORIES = tuple(KIND)
HARDWARE_CATEGORIES = frozenset(c for c, k in KIND.items() if k == HARDWARE)
# Causes that are the cluster's fault, whatever the job did.
INFRASTRUCTURE_CATEGORIES = frozenset(c for c, k in KIND.items() if k in (HARDWARE, INFRASTRUCTURE))
SYMPTOM_CATEGORIES = frozenset(c for c, k in KIND.items() if k == SYMPTOM)

# category -> (what it is, what to do): one sentence each, for people.
EXPLAIN: dict[str, tuple[str, str]] = {
    "nccl_timeout": ("an NCCL collective timed out (a rank stopped participating)",
                     "look for the rank or node that fell behind (Xid, IB link, OOM at that time); "
                     "resubmit, and drain the node if it repeats"),
    "nccl_error": ("NCCL failed (network, peer process or system error)",
                   "check the InfiniBand/RoCE links and NCCL environment of the nodes; resubmit"),
    "cuda_oom": ("the GPU ran out of memory", "reduce the batch or sequence size, or enable "
                 "activation checkpointing / sharding; the node is fine"),
    "host_oom": ("the host ran out of RAM and the kernel or Slurm killed a process",
                 "request more memory (--mem) or reduce data-loader workers and CPU offload"),
    "gpu_xid_hardware": ("a GPU hardware or driver fault (Xid)",
                         "drain the node and reset or reboot it before the next job; resubmit"),
    "gpu_xid_user_app": ("the application faulted on the GPU (Xid 13/31/43)",
                         "debug the code (CUDA_LAUNCH_BLOCKING=1); drain only if the same GPU repeats"),
    "ecc_error": ("an uncorrectable GPU memory (ECC) error",
                  "drain the node and reset the GPU (row remap) before the next job; resubmit"),
    "nvlink_error": ("an NVLink/NVSwitch fabric error",
                     "drain the node and reset the GPUs / restart the fabric manager; resubmit"),
    "illegal_memory_access": ("a CUDA illegal memory access (usually a bug in a kernel)",
                              "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; check for an Xid"),
    "slurm_time_limit": ("Slurm killed the job at its time limit",
                         "resubmit from the latest checkpoint or ask for a longer --time"),
    "slurm_node_failure": ("a node of the job failed (Slurm NODE_FAIL)",
                           "resubmit excluding the node; an admin should check it"),
    "slurm_cancelled": ("the job was cancelled, preempted or requeued by Slurm",
                        "resubmit or requeue if that was not intended"),
    "other": ("the job failed for a reason without a specific signature",
              "read the evidence lines and the traceback above them"),
    "no_failure": ("the run ended well and no failure followed", "nothing to do"),
    "unknown": ("the logs show neither a failure nor the run ending well (a fragment, or output "
                "cut before the end)", "read the job's whole output and Slurm's exit code "
                "(sacct -j JOB); nothing here points at the node"),
}  # fmt: skip


def kind(category: str | None) -> str | None:
    """The category's kind (HARDWARE, INFRASTRUCTURE, ...), None for a name not in the table."""
    return KIND.get(category or "")


def is_hardware(category: str | None) -> bool:
    """Whether a category points at the node's GPU or its links rather than the job."""
    return category in HARDWARE_CATEGORIES


def is_infrastructure(category: str | None) -> bool:
    """Whether a category is the cluster's fault whatever the job did (hardware or a dead node)."""
    return category in INFRASTRUCTURE_CATEGORIES


# Root-cause order, most specific first (higher wins). Why this order:
# - GPU hardware (ECC, NVLink, hardware Xids) explains everything a job prints after it, node
#   failures included; the three share a tier and the *first* fatal one wins (Xid 79 before the
#   NVSwitch SXids it triggers is an Xid 79).
# - A node failure outranks the CUDA/NCCL errors that the dying node causes.
# - Host and GPU OOM, application Xids and illegal memory accesses happen on one rank; the other
#   ranks then fail their collectives, so they outrank every NCCL symptom.
# - NCCL errors and timeouts are symptoms of one tier: the first one printed is the root (an IB
#   completion error before the watchdog fires is why it fired; a peer's "remote process
#   exited" after a timeout is that timeout's abort).
# - Slurm's own kill lines (time limit, scancel, preemption) explain a job that hung quietly;
#   errors printed before them still win, errors after them are fallout (FALLOUT below).
# - MINOR_TIER: events that explain a failure only when nothing above is visible (a lone Xid 63,
#   a Lightning SIGTERM notice), then `other` (generic exceptions, signals, launcher summaries).
TIERS: dict[str, int] = {
    **dict.fromkeys(sorted(HARDWARE_CATEGORIES), 100),  # the categories table's hardware kind
    "slurm_node_failure": 90,
    "host_oom": 80,
    "cuda_oom": 70,
    "gpu_xid_user_app": 60,
    "illegal_memory_access": 50,
    "nccl_error": 35,
    "nccl_timeout": 35,
    "slurm_time_limit": 20,
    "slurm_cancelled": 15,
    "other": 5,
}

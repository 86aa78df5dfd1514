"""Job-log failure signatures: one table of what a dying training job prints, and the matching.

Each `Signature` names a diagnosis category, a compiled pattern (searched in one cleaned line
segment, compiled on first use), the anchors that any matching line must contain (the scanner's
cheap prefilter searches a key of each, `KEYS` below: only lines holding a key are ever decoded,
and only anchors they hold send a line to a pattern), a specificity, a strength and an example
line (the tests check that every example matches its pattern and passes the prefilter).

Formats by era and framework are in section 6 of docs/gpu-facts.md; kernel
lines (Xid, SXid, OOM killer) in sections 1 and 2. Xid lines are classified with the Xid catalog.

Strength says what one line proves:
- ``fatal``: the job failed this way (at the category's rank, see `categories.TIERS`).
- ``minor``: an event that explains a failure only when nothing more specific is visible (a
  non-fatal Xid such as 63, a SIGTERM notice): ranked just above the generic ``other``.
- ``precursor``: counts only before the first fatal line of its file and only if the job failed
  (none in the table today: NCCL WARN lines are read by kind, and chatter decides nothing).
- ``context``: no category; feeds a detail (torchrun's "Root Cause" block names the rank).
"""

from __future__ import annotations

import re

from gpugate.diagnosis import launchers as L
from gpugate.diagnosis import nccl_warn
from gpugate.diagnosis import outcomes as O
from gpugate.diagnosis.cleaning import clean, clean_line
from gpugate.diagnosis.outcomes import CONTEXT, FATAL, MINOR, PRECURSOR
from gpugate.record import Record
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable

__all__ = ["CONTEXT", "FATAL", "MINOR", "PRECURSOR", "SIGNATURES", "Match", "Signature",
           "clean", "match_line", "match_segment", "segments"]  # fmt: skip

# Per-segment work is capped: a progress bar can put megabytes on one "line".
SEGMENT_MAX = 2000
TEXT_MAX = 400  # characters of a line kept as evidence


class Signature(Record):
    """One failure signature: category, pattern, anchors, and how telling a match is."""

    name: str
    category: str | None  # None for context lines (torchrun summary fields)
    anchors: tuple[str, ...]  # every line the pattern matches contains one of these
    pattern: re.Pattern[str]
    example: str
    # Among signatures matching the same line, the highest wins (a CUDA OOM inside a
    # RuntimeError line is a CUDA OOM, not a generic exception).
    specificity: int = 50
    strength: str = FATAL
    # Xid-like lines: (match, text) -> (category, strength, xid); the catalog decides.
    resolve: Callable[..., Any] | None = None


class Match(Record):
    """What one line segment says: the winning signature and what it extracted."""

    signature: str
    category: str | None
    strength: str
    specificity: int
    text: str  # cleaned (no ANSI, no rank prefix), capped
    rank: int | None = None  # global rank named by a prefix or by the message
    xid: int | None = None  # root Xid of this line (Xid 45 "caused by previous Xid N" gives N)
    # Other named groups: gpu, exitcode, signal, ...; `said`: the words of a failure that no
    # category names (a library's status), quoted in the summary.
    fields: dict[str, Any] = {}


def _sig(
    name: str,
    category: str | None,
    anchors: str,
    pattern: str,
    example: str,
    specificity: int = 50,
    strength: str = FATAL,
    resolve: Callable[..., Any] | None = None,
) -> Signature:
    """A table row: anchors as one `|`-separated string, the pattern compiled on first use."""
    return Signature(name=name, category=category, anchors=tuple(anchors.split("|")),
                     pattern=lazy(pattern), example=example,
                     specificity=specificity, strength=strength, resolve=resolve)  # fmt: skip


# The table. Patterns are searched (not matched) in a cleaned segment, so prefixes, timestamps
# and glog headers in front do not matter. Examples are written for this table, not copied.
SIGNATURES: tuple[Signature, ...] = (
    # --- kernel and driver lines mixed into the input ---------------------------------------
    _sig("kernel.xid", "gpu_xid_hardware", "Xid",
         r"NVRM: Xid \([^)]*\): (?P<xid>\d+)",
         "[ 9.1] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
         specificity=95, resolve=O.xid_outcome),
    _sig("kernel.xid_loose", "gpu_xid_hardware", "Xid|XID",
         r"(?<![\w-])(?:Xid|XID)(?: error)?[ :=]+(?P<xid>[1-9]\d{0,2})\b(?!\.\d)",
         "dcgm health: GPU 2 reported Xid 48 (double bit ECC error)",
         specificity=85, resolve=O.xid_outcome),
    _sig("kernel.sxid", "nvlink_error", "Xid",
         r"SXid \([^)]*\): (?P<sxid>\d+), (?P<sev>\w+)",
         "nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 12028, Fatal, Link 02 egress non-posted PRIV error",
         specificity=90, resolve=O.sxid_outcome),
    _sig("fabricmanager.nvswitch", "nvlink_error", "RROR",
         r"detected NVSwitch (?P<sev>fatal|non-fatal) error",
         "[Mar 02 2025 10:11:12] [ERROR] [tid 812] detected NVSwitch fatal error 20034 on fid 0 on "
         "NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61",
         specificity=85, resolve=O.sxid_outcome),
    _sig("kernel.fallen_off_bus", "gpu_xid_hardware", "fallen off|NVRM",
         r"fallen off the bus", "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
         specificity=80),
    _sig("kernel.rm_init_failed", "gpu_xid_hardware", "NVRM",
         r"RmInitAdapter failed|rm_init_adapter failed",
         "NVRM: GPU 0000:1a:00.0: RmInitAdapter failed! (0x22:0x38:884)", specificity=70),
    _sig("kernel.reset_required", "gpu_xid_hardware", "NVRM|RROR",
         r"Reset required|NV_ERR_RESET_REQUIRED",
         "NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED]",
         specificity=70),
    # GSP firmware stopped answering (heartbeat, RPC timeout, memory-subsystem error): the GPU
    # needs a reset (NVIDIA's catalog: Xid 119/120 are RESET_GPU); some drivers log no Xid.
    _sig("kernel.gsp_timeout", "gpu_xid_hardware", "NVRM",
         r"NVRM: .*(?:_kgspIsHeartbeatTimedOut|GSP Timeout \*|_kgspLogRpcTimeout|"
         r"kgmmuCheckMemSubsysError|Memory Subsystem Error detected)",
         "NVRM: GPU3 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 81 heartbeat 18",
         specificity=65),
    _sig("smi.gpu_lost", "gpu_xid_hardware", "GPU is lost|rror",
         r"GPU is lost|Unable to determine the device handle for GPU ?\S*: Unknown Error",
         "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
         specificity=70),
    # nvidia-smi output pasted into a log. The table's `ERR!` is a reading the driver could not
    # take from the GPU (a sensor, the power reading: labels-43b 566); minor, like an
    # informational Xid: it explains a failure only when nothing more telling is there.
    _sig("smi.err_reading", "gpu_xid_hardware", "ERR! ",
         r"^\s*\|[^\n]*?\bERR! [^\n]*\|\s*$",
         "| N/A   41C    P0   ERR! / 300W |  1024MiB / 81920MiB |      0%      Default |",
         specificity=40, strength=MINOR),
    # `nvidia-smi -q` (R470+, labels-43b 574), its memory sections. Fatal: "Remapping Failure
    # Occurred : Yes" (as Xid 64, RESET_GPU in NVIDIA's catalog). Minor, as Xid 63 (they explain
    # a failure only when nothing more telling is there; a count is history): Remapped Rows'
    # "Pending : Yes" (a remap waits for a GPU reset; "Pending" with Yes/No is that section's
    # alone, the MIG, ECC and driver-model modes print Enabled/Disabled/N/A), non-zero counters
    # (rows remapped for uncorrectable errors, volatile or aggregate `DRAM Uncorrectable`,
    # `SRAM Uncorrectable Parity`, pages retired for `Double Bit ECC` or `Single Bit ECC`) and
    # "Pending Page Blacklist : Yes". A healthy GPU prints No and zero counts: nothing matches.
    _sig("smi.ecc_counts", "ecc_error", "Pending      |Uncorrectable|Bit ECC|Page Blacklist",
         r"^\s*(?:(?:DRAM|SRAM) Uncorrectable(?: [\w-]+)?|Uncorrectable Error|(?:Double|Single) Bit ECC)"
         r"\s*:\s*[1-9]\d*\s*$|^\s*(?:Pending|Pending Page Blacklist)\s*:\s*Yes\s*$",
         "        Pending                           : Yes", specificity=40, strength=MINOR),
    _sig("smi.remap_failure", "ecc_error", "Remapping Failure", r"^\s*Remapping Failure Occurred\s*:\s*Yes\s*$",
         "        Remapping Failure Occurred        : Yes", specificity=60),
    _sig("kernel.oom_killer", "host_oom", "oom-kill",
         r"invoked oom-killer|oom-kill:constraint=",
         "[812.1] python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0",
         specificity=85),
    # The OOM killer's report; kernels before 4.x and some dmesg excerpts print the kill line
    # without its "Out of memory:" head, and the reaper's line follows it.
    _sig("kernel.oom_killed", "host_oom", "of memory|Killed process|oom_reaper",
         r"(?:Out of memory|Memory cgroup out of memory): Kill(?:ed)? process \d+|"
         r"\bKilled process \d+ \([^)]*\),? total-vm:|oom_reaper: reaped process \d+",
         "Memory cgroup out of memory: Killed process 4242 (python) total-vm:912kB, anon-rss:80kB",
         specificity=90),
    # --- Slurm -----------------------------------------------------------------------------
    _sig("slurm.oom_kill_event", "host_oom", "oom-kill|oom_kill",
         r"Detected \d+ oom[-_]kill event",
         "slurmstepd: error: Detected 3 oom_kill events in StepId=77.0. Some of the step tasks have been OOM Killed.",
         specificity=95),
    _sig("slurm.memory_limit", "host_oom", "memory limit",
         r"exceeded (?:job |step )?memory limit",
         "slurmstepd: error: StepId=77.batch exceeded memory limit (9000 > 8000), being killed",
         specificity=90),
    _sig("slurm.task_oom", "host_oom", "Of Memory|rror",
         r"tasks? [\d,\-]+: Out Of Memory|\bOUT_OF_MEMORY\b",
         "srun: error: node-a7: task 5: Out Of Memory", specificity=95),
    _sig("slurm.time_limit", "slurm_time_limit", "CANCELLED|rror",
         r"DUE TO TIME LIMIT",
         "slurmstepd: error: *** JOB 77 ON node-a1 CANCELLED AT 2024-02-01T10:00:00 DUE TO TIME LIMIT ***",
         specificity=90),
    _sig("slurm.node_failure", "slurm_node_failure", "CANCELLED|rror|NODE_FAIL",
         r"DUE TO NODE FAIL|Node failure on \S+|\bNODE_FAIL\b",  # the last: sacct/squeue's state
         "srun: error: Node failure on node-b3", specificity=90),
    # slurmctld's own words when a node dies under a job (Slurm 20.11-24.05
    # src/slurmctld/job_mgr.c kill_running_job_by_node_name: "requeue job %pJ due to failure of
    # node %s", "Killing %pJ on failed node %s"; ping_nodes.c: "Nodes %s not responding, setting
    # DOWN"), pasted beside a job log that says nothing itself.
    _sig("slurm.ctld_node_failure", "slurm_node_failure", "failure of node|failed node|not responding",
         r"requeue job \S+ due to failure of node \S+|Killing \S+ on failed node \S+|"
         r"\bNodes? \S+ not responding, setting DOWN",
         "slurmctld: requeue job JobId=81234 due to failure of node gpu-c07", specificity=90),
    # `sinfo -R`'s REASON column (default format "%50E %9u %19H %N"): the reasons slurmctld sets
    # itself for a dead node ("Not responding", ping_nodes.c; "Node unexpectedly rebooted
    # boot_time=%u last response=%u", node_mgr.c), then user, timestamp and nodelist. A site's own drain reasons are not
    # read: they are free text.
    # `scontrol show node` prints the same reason as "Reason=Not responding [slurm@%s]".
    _sig("slurm.sinfo_down_reason", "slurm_node_failure", "Not responding|unexpectedly rebooted",
         r"^\s*(?:Not responding|Node unexpectedly rebooted)\b[^\n]{0,50}?\s\S+\s+\d{4}-\d\d-\d\dT[\d:]{8}\s+\S"
         r"|\bReason=(?:Not responding|Node unexpectedly rebooted) \[\w+@",
         "Not responding       slurm     2025-03-04T05:06:07 gpu-c07", specificity=85),
    _sig("slurm.preempted", "slurm_cancelled", "CANCELLED",
         r"DUE TO (?:PREEMPTION|JOB REQUEUE)",
         "slurmstepd: error: *** STEP 77.0 ON node-a1 CANCELLED AT 2024-02-01T10:00:00 DUE TO PREEMPTION ***",
         specificity=85),
    _sig("slurm.cancelled", "slurm_cancelled", "CANCELLED",
         r"\*\*\* (?:JOB|STEP) \S+ (?:ON \S+ )?CANCELLED AT \S+(?: DUE [Tt][Oo] SIGNAL \w+)? \*\*\*"
         r"|CANCELLED by \d+",
         "slurmstepd: error: *** JOB 77 ON node-a1 CANCELLED AT 2024-02-01T10:00:00 ***",
         specificity=80),
    _sig("slurm.uncorrectable_memory", "ecc_error", "RROR",
         r"UNCORRECTABLE MEMORY ERROR",
         "slurmstepd: error: *** JOB 77 ON node-a1 UNCORRECTABLE MEMORY ERROR AT 2024-02-01T10:00:00 ***",
         specificity=85),
    _sig("slurm.step_failed", "other", "rror",
         r"\*\*\* (?:JOB|STEP) \S+ ON \S+ FAILED",
         "slurmstepd: error: *** STEP 77.0 ON node-a1 FAILED (non-zero exit code or other failure mode) ***",
         specificity=20),
    _sig("srun.task_exit", "other", "rror",
         r"srun: error: \S+: tasks? [\d,\-]+: (?P<how>Exited with exit code [1-9]\d*|Killed|"
         r"Segmentation fault|Aborted|Bus error)",
         "srun: error: node-a1: task 3: Exited with exit code 1", specificity=20,
         resolve=O.exit_outcome),
    # --- CUDA ------------------------------------------------------------------------------
    _sig("cuda.ecc", "ecc_error", "rror",
         r"uncorrectable ECC error|cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE",
         "RuntimeError: CUDA error: uncorrectable ECC error encountered", specificity=90),
    _sig("cuda.nvlink", "nvlink_error", "rror",
         r"uncorrectable NVLink error|cudaErrorNvlinkUncorrectable|CUDA_ERROR_NVLINK_UNCORRECTABLE",
         "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution",
         specificity=90),
    # CUDA runtime's peer-to-peer errors between two GPUs (cuda_runtime_api / driver_types.h,
    # CUDA 11-12): cudaErrorPeerAccessUnsupported (217) "peer access is not supported between
    # these two devices", cudaErrorPeerAccessNotEnabled (705) "peer access has not been enabled";
    # the driver API's CUDA_ERROR_PEER_ACCESS_UNSUPPORTED. The GPUs' link (NVLink/P2P) is the
    # cause. Not in NCCL's words: its transport failing on it ("NCCL WARN Cuda failure 217 ...",
    # checks.h CUDACHECK, repeated as PyTorch's "Last error: Cuda failure '...'") stays an NCCL
    # failure (the corpus labels' rule). Only as an error (a program that probes P2P and falls
    # back may print the words in a notice).
    _sig("cuda.peer_access", "nvlink_error",
         "peer access|PeerAccess|PEER_ACCESS",
         r"^(?!.*(?:NCCL|Cuda failure)).*?(?:[Ee]rror|[Ff]ail).*?(?:peer access is not supported between|peer access has not been enabled|"
         r"cudaErrorPeerAccess(?:Unsupported|NotEnabled)|CUDA_ERROR_PEER_ACCESS_(?:UNSUPPORTED|NOT_ENABLED))",
         "RuntimeError: CUDA error: peer access is not supported between these two devices",
         specificity=85),
    # CUDA 12's cudaErrorContained / CUDA_ERROR_CONTAINED (226, driver_types.h: "an exception
    # occurred on the device that is now contained by the GPU's error containment capability";
    # causes: invalid accesses of peer GPU memory over NVLink, or hardware errors).
    _sig("cuda.contained", "nvlink_error", "Contained|CONTAINED|'s error containment",
         r"cudaErrorContained|CUDA_ERROR_CONTAINED|contained by the GPU's error containment",
         "RuntimeError: CUDA error: cudaErrorContained: an exception occurred on the device that "
         "is now contained by the GPU's error containment capability", specificity=85),
    _sig("cuda.oom", "cuda_oom", "of memory|OfMemory|rror|RROR",
         r"(?:CUDA|HIP) out of memory|OutOfMemoryError|CUDA error: out of memory|"
         r"[Cc]uda failure '?out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|"
         r"cudaMalloc\w* (?:failed|error)\b.*out of memory|"
         r"RESOURCE_EXHAUSTED: Out of memory|OOM when allocating tensor",
         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.1 GiB",
         specificity=90, resolve=O.oom_outcome),
    # Other frameworks' words for a GPU allocation failure: TensorFlow/XLA (`Resource exhausted:
    # OOM when allocating tensor`, JAX's `Resource exhausted: Out of memory while trying to
    # allocate`, wrapped), Caffe (`Check failed: error == cudaSuccess (2 vs. 0)  out of
    # memory`, cudaErrorMemoryAllocation is 2), Chainer/CuPy's memory pool.
    _sig("cuda.oom_framework", "cuda_oom", "Resource exhausted|out of memory|Out of memory",
         r"Resource exhausted: (?:OOM when allocating|Out(?: of memory)?\b)|"
         r"error == cudaSuccess \(2 vs\. 0\)\s+out of memory|"
         r"[Oo]ut of memory (?:allocating [\d,]+ bytes|to allocate \d+ bytes)",
         "OP_REQUIRES failed at tile_ops.cc:123 : Resource exhausted: OOM when allocating tensor "
         "with shape[16,1,8,4] and type float on /job:localhost/replica:0/task:0/device:GPU:0",
         specificity=85, resolve=O.oom_outcome),
    _sig("cuda.oom_library", "cuda_oom", "rror",
         r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED",
         "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
         specificity=70),
    # cuBLAS and cuDNN returning an error status other than allocation (which cuda.oom_library
    # reads): TensorFlow's stream executor ("failed to run cuBLAS routine cublasSgemm_v2:
    # CUBLAS_STATUS_EXECUTION_FAILED", labels-43a 515), PyTorch ("CUDA error:
    # CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm(...)`", 516; "cuDNN error:
    # CUDNN_STATUS_EXECUTION_FAILED", 539) and Transformer Engine's cudnn-frontend ("cuDNN Error:
    # [cudnn_frontend] Error: No execution plans support the graph", 521). The library's kernel
    # failed or refused the call: no category names it (the corpus labels: other), but the line
    # says what failed.
    _sig("cuda.library_status", "other", "CUBLAS_STATUS_|CUDNN_STATUS_|rror",
         r"(?P<said>\b(?:CUBLAS|CUDNN)_STATUS_(?!ALLOC_FAILED\b|SUCCESS\b)[A-Z_]+"
         r"|cuDNN [Ee]rror: [^.\n]{1,80})",
         "E tensorflow/stream_executor/cuda/cuda_blas.cc:543] failed to run cuBLAS routine "
         "cublasGemmEx: CUBLAS_STATUS_EXECUTION_FAILED", specificity=50),
    _sig("cuda.illegal_address", "illegal_memory_access", "illegal memory|rror|RROR|access was",
         r"illegal memory access|CUDA_ERROR_ILLEGAL_ADDRESS|cudaErrorIllegalAddress|"
         r"\bal memory access was encountered",  # CUDA's words cut by a wrap: "an illeg|al ..."
         "RuntimeError: CUDA error: an illegal memory access was encountered", specificity=85),
    _sig("cuda.busy_unavailable", "gpu_xid_hardware", "rror",
         r"CUDA-capable devices? (?:\(s\) )?(?:is|are|is/are) busy or unavailable|cudaErrorDevicesUnavailable",
         "RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable",
         specificity=60),
    _sig("cuda.launch_failure", "other", "rror|launch failure",
         r"unspecified launch failure|cudaErrorLaunchFailure|CUDA_ERROR_LAUNCH_FAILED",
         "RuntimeError: CUDA error: unspecified launch failure", specificity=80),
    _sig("cuda.app_fault", "other", "rror",
         r"device-side assert(?:ion)? triggered|misaligned address|an illegal instruction was encountered",
         "RuntimeError: CUDA error: device-side assert triggered", specificity=70),
    # A kernel's own assertion (PyTorch aten/src/ATen/native/cuda/*.cu CUDA_KERNEL_ASSERT, printed
    # by the device's assert: "%s:%d: %s: block: [%d,%d,%d], thread: [%d,%d,%d] Assertion `%s`
    # failed."), e.g. indexSelectLargeIndex's `srcIndex < srcSelectDimSize`: a bug in the job.
    _sig("cuda.kernel_assert", "other", "Assertion",
         r"\.cu:\d+: \S+: block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion `",
         "/opt/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1290: indexSelectLargeIndex: block: "
         "[41,0,0], thread: [96,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
         specificity=70),
    # The NCCL watchdog reporting its rank's CUDA error; the error's own words (illegal
    # access, ECC) are more specific and win when the line holds them.
    _sig("nccl.watchdog_exception", "other", "atchdog",
         r"watchdog thread terminated with\b",
         "[rank0]:[E ProcessGroupNCCL.cpp:1414] [PG 0 Rank 0] Process group watchdog thread "
         "terminated with exception: CUDA erro", specificity=25),
    _sig("cuda.error", "other", "rror",
         r"CUDA error: (?P<detail>[^\n]{1,80})", "  what():  CUDA error: unknown error",
         specificity=30),
    # --- NCCL / torch.distributed ------------------------------------------------------------
    _sig("nccl.watchdog_timeout", "nccl_timeout", "atchdog",
         r"[Ww]atchdog caught collective(?: operation)?(?: timeout)?\b",
         "[E ProcessGroupNCCL.cpp:455] [Rank 5] Watchdog caught collective operation timeout: "
         "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600004 milliseconds before timing out.",
         specificity=90),
    # PyTorch >= 2.5: the watchdog's dump request (the timeout line itself may be cut off).
    _sig("nccl.dump_signal", "nccl_timeout", "dump signal",
         r"Received a dump signal due to a collective timeout",
         "[rank1]:[E1129 01:02:03.000000000 ProcessGroupNCCL.cpp:1890] [PG ID 0 PG GUID 0(default_pg) "
         "Rank 1] Received a dump signal due to a collective timeout from this local rank and we "
         "will try our best to dump the debug info.",
         specificity=85),
    # The second half of a watchdog line a terminal wrapped, or a Work's own timeout message.
    _sig("nccl.work_timeout", "nccl_timeout", "WorkNCCL",
         r"WorkNCCL\(SeqNum=\d+, OpType=\w+.*?\) ran for \d+ milliseconds before timing out",
         "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
         "Timeout(ms)=600000) ran for 600321 milliseconds before timing out.",
         specificity=80),
    # The watchdog's stack frames alone (the message was lost above the excerpt).
    _sig("nccl.check_timeout_frame", "nccl_timeout", "checkTimeout",
         r"ProcessGroupNCCL::WorkNCCL::checkTimeout|c10d::ProcessGroupNCCL::watchdogHandler",
         "frame #4: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::"
         "duration<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f in libtorch_cuda.so)",
         specificity=40),
    # c10d's store and socket timeouts (rendezvous, barrier, a peer that never came).
    _sig("c10d.store_timeout", "nccl_timeout", "imeout|imed out",
         r"Socket Timeout|wait timeout after \d+ ?ms|[Tt]imed out after \d+ seconds waiting for"
         r"|client socket has timed out after|Timed out initializing process group in store based "
         r"barrier|DistStoreError: .*[Tt]ime(?:d )?out|TCPStore.*(?:timed out|Timeout)",
         "torch.distributed.DistStoreError: wait timeout after 1800000ms, keys: /default_pg/0//cuda//0",
         specificity=60),
    # c10d's socket layer giving up on a peer (PyTorch 2.3+ torch/csrc/distributed/c10d/
    # socket.cpp waitForInput: "[c10d] waitForInput: socket %s timed out after %dms"), as an
    # inference engine's (SGLang, vLLM) process group init or collective RPC waits on its store.
    _sig("c10d.socket_wait_timeout", "nccl_timeout", "waitForInput",
         r"waitForInput: socket \S+.*? timed out after \d+ ?ms",
         "[rank1]:[W1203 10:11:12.000000000 socket.cpp:487] [c10d] waitForInput: socket "
         "SocketImpl(fd=41, addr=[gpu-a1]:40112, remote=[gpu-a0]:29500) timed out after 1800000ms",
         specificity=60),
    _sig("nccl.watchdog_stuck", "nccl_timeout", "atchdog|imed out",
         r"watchdog got stuck|Heartbeat monitor timed out",
         "[PG 0 Rank 2] Heartbeat monitor timed out! Process will be terminated after dumping debug info.",
         specificity=80),
    _sig("gloo.timeout", "nccl_timeout", "imed out",
         r"Timed out waiting \d+ms for (?:recv|send) operation",
         "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:84] Timed out waiting 1800000ms for recv operation to complete",
         specificity=70),
    _sig("nccl.ops_failed", "nccl_timeout", "imed out",
         r"Some NCCL operations have failed or timed out",
         "Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, ...",
         specificity=20),
    _sig("nccl.error", "nccl_error", "rror",
         r"NCCL [Ee]rror(?: \d+)?(?: in: \S+)?:?,? (?P<detail>[^,\n]{1,80})",
         "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, "
         "remote process exited or there was a network error, NCCL version 2.19.3",
         specificity=80),
    _sig("nccl.result", "nccl_error", "rror",
         r"\bnccl(?:System|Internal|UnhandledCuda|InvalidUsage|InvalidArgument|Remote)Error\b",
         "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
         specificity=75),
    # Without a reason, the abort is the watchdog's doing (PyTorch 1.x prints the timeout apart).
    _sig("nccl.comm_aborted", "nccl_timeout", "rror",
         r"NCCL communicator was aborted(?: on rank (?P<rank>\d+))?(?!.*Original reason)",
         "RuntimeError: NCCL communicator was aborted on rank 3.", specificity=30),
    # Only the Python exception: `terminate called ... instance of 'c10::DistBackendError'` is
    # the standard tear-down after a watchdog timeout on every rank.
    _sig("nccl.dist_backend", "nccl_error", "rror",
         r"^\s*(?:torch\.distributed\.)?Dist(?:Backend|Network)Error:",
         "torch.distributed.DistBackendError: [3] is setting up NCCL communicator and retrieving "
         "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: "
         "Connection reset by peer",
         specificity=40),
    # Every NCCL WARN kind that is a failure NCCL returned (nccl_warn.KINDS); chatter decides
    # nothing. Fatal at the NCCL symptom tier: a rank's own OOM or Xid still outranks it.
    _sig("nccl.warn", "nccl_error", " WARN ",  # not every "WARNING" line of a log
         nccl_warn.WARN_RE.pattern,
         "gpu-b7:99:120 [2] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
         "10.0.0.4<54321> with error 12, opcode 0, len 0, vendor err 129",
         specificity=55, resolve=O.nccl_warn_outcome),
    # NCCL's error return travelling up its call chain (`NCCL INFO bootstrap.cc:270 -> 2`, the
    # NCCLCHECK trace; 2 system, 3 internal, 6 remote error): an NCCL failure even when its WARN
    # line is missing, minor so that any more telling line wins.
    _sig("nccl.return_chain", "nccl_error", ".cc:|.cu:",
         # 7 is ncclInProgress, no error; "-> 1[1]" would be a channel's peer
         r"NCCL INFO [\w/.-]+\.(?:cc|cu):\d+ -> (?P<code>[1-6])\b(?!\[)",
         "gpu-a1:191:219 [0] NCCL INFO bootstrap.cc:270 -> 2", specificity=30, strength=MINOR),
    # The same words outside a WARN line: PyTorch's "Last error:" echo of NCCL's last WARN under
    # the failing rank's prefix (labels-43c 601); origin.nccl_kind reads it as the rank's own.
    _sig("nccl.no_algorithm", "nccl_error", "no algorithm/protocol",
         r"no algorithm/protocol available", "[rank238]: Error : no algorithm/protocol available "
         "for function AllGather with datatype ncclInt8.", specificity=60,
         resolve=lambda m, text: ("nccl_error", FATAL, None, {"detail": nccl_warn.NO_ALGORITHM})),
    # NCCL 2.0-2.3 applications print the failed call's result themselves.
    _sig("nccl.failure", "nccl_error", "NCCL failure",
         r"NCCL failure .*'(?P<detail>[^']{1,80})'",
         "NCCL failure train.cu:110 'unhandled system error'", specificity=75),
    # Other runtimes' words for a failed NCCL call: Horovod (horovod/common/ops/nccl_operations.cc
    # nccl_context: `op_name + " failed: " + ncclGetErrorString(result)`, raised in TensorFlow as
    # "UnknownError: ncclCommInitRank failed: unhandled system error"), XLA/JAX
    # (xla/service/gpu/nccl_utils.cc: "NCCL operation ncclCommInitRank(&comm, nranks, id, rank)
    # failed: unhandled cuda error"). The detail is ncclGetErrorString's words.
    _sig("nccl.call_failed", "nccl_error", " failed: ",
         r"\bnccl[A-Z]\w*(?:\([^()\n]*\))? failed: (?P<detail>[a-z][a-z ]{2,60}[a-z])",
         "tensorflow.python.framework.errors_impl.UnknownError: ncclCommInitRank failed: unhandled "
         "system error", specificity=80),
    # CuPy/Chainer's NcclError (cupy_backends/cuda/libs/nccl.pyx: "%s: %s" of the result's name
    # and ncclGetErrorString), e.g. "NCCL_ERROR_UNHANDLED_CUDA_ERROR: unhandled cuda error".
    _sig("nccl.cupy_error", "nccl_error", "NCCL_ERROR_",
         r"\bNCCL_ERROR_(?:UNHANDLED_CUDA_ERROR|SYSTEM_ERROR|INTERNAL_ERROR|INVALID_ARGUMENT|"
         r"INVALID_USAGE|REMOTE_ERROR)\b",
         "cupy_backends.cuda.libs.nccl.NcclError: NCCL_ERROR_SYSTEM_ERROR: unhandled system error",
         specificity=75),
    # --- host memory -----------------------------------------------------------------------
    # Ray's memory monitor (Ray 2.2+, doc/source/ray-core/scheduling/ray-oom-prevention.rst):
    # the raylet's summary (src/ray/raylet/node_manager.cc: "%d Workers (tasks / actors) killed
    # due to memory pressure (OOM), %d Workers crashed due to other reasons at node ...", not
    # when it killed 0) and the killed task's error ("Memory on the node (IP: %s, ID: %s) where
    # the task ... was running was %s / %s (%f), which exceeds the memory usage threshold of %f.
    # Ray killed this worker ...").
    _sig("ray.workers_killed", "host_oom", "memory pressure",
         r"(?<!\D0 Workers \(tasks / actors\) )(?<!^0 Workers \(tasks / actors\) )"
         r"killed due to memory pressure",
         "(raylet) [2025-01-02 03:04:05,678 E 812 812] (raylet) node_manager.cc:3069: 2 Workers "
         "(tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other "
         "reasons at node (ID: 0f3c, IP: 10.0.0.7) over the last time period.",
         specificity=90),
    _sig("ray.memory_monitor", "host_oom", "memory usage threshold",
         r"which exceeds the memory usage threshold\b",
         "Memory on the node (IP: 10.0.0.7, ID: 0f3c) where the task (task ID: 9a, name=f, pid=812, "
         "memory used=11.2GB) was running was 60.1GB / 62.8GB (0.957), which exceeds the memory "
         "usage threshold of 0.95. Ray killed this worker (ID: 77) because it was the most "
         "recently scheduled task", specificity=90),
    # The task's or actor's own error (python/ray/exceptions.py OutOfMemoryError, "Task was
    # killed due to the node running low on memory."; an actor's death cause carries the exit
    # type NODE_OUT_OF_MEMORY, src/ray/protobuf/common.proto). Host RAM, not the GPU's: it
    # outranks cuda.oom's bare "OutOfMemoryError".
    # Ray before 2.0 raised its own (python/ray/memory_monitor.py: "RayOutOfMemoryError: More
    # than 95% of the memory on node %s is used").
    _sig("ray.node_low_memory", "host_oom", "running low on memory|NODE_OUT_OF_MEMORY|OfMemory",
         r"node running low on memory|Worker exit type: NODE_OUT_OF_MEMORY|"
         r"\bray\.exceptions\.OutOfMemoryError\b|\bRayOutOfMemoryError\b",
         "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
         specificity=95),
    # An allocator aborting the process when the host refuses memory: Rust's std
    # (library/std/src/alloc.rs default_alloc_error_hook: "memory allocation of {} bytes failed").
    # Others: jemalloc's abort (src/jemalloc.c "<jemalloc>: Error in malloc(): out of memory"),
    # Go's runtime ("fatal error: runtime: out of memory", runtime/malloc.go), the JVM's
    # java.lang.OutOfMemoryError (heap or native memory; not the GPU's "OutOfMemoryError"), and
    # Kubernetes' container state "OOMKilled" (the pod's memory cgroup) in a pasted describe.
    _sig("host.alloc_abort", "host_oom", "memory allocation of|of memory|OfMemory|OOMKilled",
         r"memory allocation of \d+ bytes failed|<jemalloc>: Error in \w+\(\): out of memory|"
         r"fatal error: runtime: out of memory|\bjava\.lang\.OutOfMemoryError\b|\bOOMKilled\b",
         "memory allocation of 34359738368 bytes failed", specificity=92),
    _sig("host.dataloader_killed", "host_oom", "rror|Killed",
         r"DataLoader worker \(pid\(?s?\)? ?[\d, ]+\) is killed by signal: Killed",
         "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.", specificity=70),
    # ENOMEM on a line of NCCL's or of the RDMA stack ("NCCL WARN Call to ibv_create_cq failed
    # with error Cannot allocate memory", "NET/OFI Unable to register memory ... Error: Cannot
    # allocate memory", labels-43b 583, 584) is the locked-memory limit or the NIC's resources,
    # NCCL's own init failure: nccl.warn reads it, never the host's RAM; the bare words on
    # another line beside such a WARN are its echo (rank.py, _enomem_of_nccl).
    _sig("host.cpu_alloc", "host_oom", "allocate memory|not enough memory|bad_alloc|rror",
         r"DefaultCPUAllocator: (?:can't|not enough memory)|std::bad_alloc|"
         r"^(?!.*(?:NCCL|\bibv_|NET/OFI|NET/IB|register memory)).*?(?P<enomem>Cannot allocate memory)|"
         r"^(?:[A-Za-z_]\w*\.)*MemoryError\b",
         "RuntimeError: [enforce fail at alloc_cpu.cpp:83] DefaultCPUAllocator: can't allocate memory: "
         "you tried to allocate 3221225472 bytes.",
         specificity=60),
    # --- launchers and signals -----------------------------------------------------------------
    # A crash inside NCCL itself (kernel line) is an NCCL failure, not an anonymous segfault.
    _sig("kernel.nccl_segfault", "nccl_error", "rror",
         r"segfault at \S+ ip \S+ sp \S+ error \d+ in libnccl",
         "kern  :warn  : 2025-03-01T10:11:12,000000+00:00 pt_main_thread[4242]: segfault at 7f00 ip "
         "00007f11 sp 00007f22 error 4 in libnccl.so.2[7f7c+d3d3000]",
         specificity=65),
    _sig("signal.sigsegv", "other", "SIG|egmentation|rror|xitcode",
         r"SIGSEGV|[Ss]egmentation fault|segfault at|Signal 11\b",  # zsh: "[1] 42 segmentation fault"
         "/var/spool/slurmd/job77/slurm_script: line 9: 4242 Segmentation fault (core dumped) python train.py",
         specificity=60),
    _sig("signal.shell_killed", "other", "Killed",
         r"line \d+: +\d+ (?P<how>Killed)\b|^(?P<signame>Killed)$",
         "/var/spool/slurmd/job77/slurm_script: line 12: 4242 Killed                  python train.py",
         specificity=20, resolve=O.exit_outcome),
    # A shell's or the C runtime's word for the other fatal signals (SIGABRT, SIGFPE, SIGILL).
    _sig("signal.shell_other", "other", "Aborted|exception|Illegal instruction",
         r"line \d+: +\d+ (?:Aborted|Floating point exception|Illegal instruction)\b|"
         r"\b(?:Aborted|Floating point exception|Illegal instruction) \(core dumped\)",
         "/var/spool/slurmd/job77/slurm_script: line 9: 4242 Aborted (core dumped) python train.py",
         specificity=25),
    # Open MPI's launcher names the rank a signal killed (mpirun / mpiexec / Horovod; Open MPI 5's
    # PRRTE says "prterun noticed"); its help text wraps, the signal then on the next line.
    _sig("mpirun.rank_signal", "other", "noticed that process rank",
         r"(?:mpirun|mpiexec|orterun|prterun) noticed that process rank (?P<rank>\d+) with PID \d+ on node \S+ "
         r"exited on(?:\s+signal (?P<signal>\d+)|\s*$)",
         "mpirun noticed that process rank 3 with PID 0 on node gpu-a2 exited on signal 9 (Killed).",
         specificity=65, resolve=O.exit_outcome),
    # Open MPI's launcher on a process that ended without MPI_Finalize (orte's and PRRTE's help
    # text "... has exited due to process rank N with PID ... exiting improperly"): the first
    # process it saw go, on the node where the failure was (644: its node's daemon was lost).
    _sig("mpirun.rank_exit", "other", "exited due to process rank",
         r"(?:mpirun|mpiexec|orterun|prterun|prte) has exited due to process rank (?P<rank>\d+) with PID \d+",
         "prterun has exited due to process rank 2 with PID 4242 on node gpu-b7 exiting",
         specificity=30),
    # --- MPI and PMI start-up: the launcher never got the ranks running (labels-43c) ---------
    # Open MPI's rsh launcher starts `orted` on each node over ssh; a node whose non-interactive
    # PATH lacks it answers "bash: orted: command not found" (603, 604), then mpirun prints its
    # help text (orte/mca/plm/base/help-plm-base.txt; PRRTE's `prted` and "PRTE was unable").
    # Anchors reuse the prefilter's start bytes ("c", "r", "b", "m"): "ORTE" or "PMI" would add one.
    _sig("mpi.orted_not_found", "other", "command not found",
         r"\b(?:orted|prted): command not found", "bash: orted: command not found", specificity=45,
         resolve=O.explained("Open MPI could not start its daemons: orted not found on the "
                             "remote node's PATH")),
    # Its daemons: none started (help-plm-base.txt: 603, 604, 606), or one mpirun had started
    # stopped answering (orte/mca/errmgr's help text: 607).
    _sig("mpi.daemons", "other", "reliably start|lost communication",
         r"\b(?:ORTE|PRTE|PRRTE) (?:(?P<start>was unable to reliably start one or more daemons)"
         r"|has lost communication with (?:a remote|its) daemon)",
         "ORTE was unable to reliably start one or more daemons.", specificity=40,
         resolve=O.explained("Open MPI lost contact with a remote daemon: its node or the "
                             "network to it failed",
                             start="Open MPI could not start its daemons on the other nodes "
                                   "(ssh, PATH or LD_LIBRARY_PATH there)")),
    # srun direct-launching an Open MPI built without Slurm's PMI (ompi/mca/ess help text,
    # after "PMI2_Init failed" or "PMI_Get_clique_size ... failed": 612, 613, 618, 619).
    _sig("mpi.no_slurm_pmi", "other", "built with SLURM",
         r"OMPI was not built with SLURM's PMI support",
         "but OMPI was not built with SLURM's PMI support and therefore cannot", specificity=45,
         resolve=O.explained("srun started an Open MPI that was not built with Slurm's PMI "
                             "support (use a matching srun --mpi=pmix/pmi2, or mpirun)")),
    # PMIx's own start-up failing (its help text "It looks like pmix_init failed for some
    # reason", e.g. its psec/munge component missing: 610). A bare "PMIX ERROR: ..." line is no
    # signature: Open MPI 4 prints some (gds_ds12_lock) on healthy runs.
    _sig("pmix.init_failed", "other", "pmix_init failed",
         r"\bpmix_init failed\b", "It looks like pmix_init failed for some reason; your parallel "
         "process is", specificity=40,
         resolve=O.explained("PMIx failed to initialise: the MPI processes could not start")),
    # A PMIx call failing with a status of its own (PMIX_ERROR_LOG: "PMIX ERROR: UNPACK-FAILURE
    # in file ...", labels-43d 643). The bare "ERROR in file gds_ds12_lock_pthread.c" that Open
    # MPI 4 prints at finalize on healthy runs (655) and NOT-FOUND lookups name no failure.
    _sig("pmix.error_status", "other", "RROR",
         r"PMIX ERROR: (?!ERROR\b|NOT-FOUND\b)(?P<status>[A-Z][A-Z_]*(?:-[A-Z_]+)*) in file",
         "[node1:05450] PMIX ERROR: UNPACK-FAILURE in file server/pmix_server_ops.c at line 197",
         specificity=35,
         resolve=O.explained("PMIx failed: {status} (mismatched PMIx versions between the "
                             "launcher and the processes, or a PMIx fault)")),
    # PRRTE's state machine marking processes or daemons lost (oob/tcp: "ACTIVATE PROC
    # [prterun-...@0,7] STATE COMMUNICATION FAILURE", labels-43d 659): its daemons lost contact.
    _sig("prrte.comm_failure", "other", "COMMUNICATION FAILURE",
         r"\bPROC \[[^\]]*\] STATE COMMUNICATION FAILURE\b",
         "[n1:6775] [prterun-n1-6775@0,0] ACTIVATE PROC [prterun-n1-6775@0,7] STATE "
         "COMMUNICATION FAILURE AT oob_tcp_component.c:872", specificity=40,
         resolve=O.explained("Open MPI (PRRTE) lost contact with its daemons: a node or the "
                             "network to it failed")),
    # srun asked for an MPI plugin this Slurm lacks (src/common/mpi.c: "Couldn't find the
    # specified plugin name for mpi/pmix", "cannot create mpi context for mpi/pmix": 609).
    _sig("srun.mpi_plugin", "other", "rror",
         r"srun: error: (?:[Cc]annot create mpi context|[Cc]annot find mpi plugin|Couldn't find "
         r"the specified plugin name) for (?P<plugin>mpi/[\w.]+)",
         "srun: error: cannot create mpi context for mpi/pmix", specificity=45,
         resolve=O.explained("srun has no {plugin} plugin: this Slurm was built without it "
                             "(srun --mpi=list names those it has)")),
    # Horovod's stall inspector (horovod/common/operations.cc, <= 0.19) names the ranks that did
    # not submit a tensor: the ranks the others wait for (launchers.py, rank.py's culprits).
    _sig("horovod.missing_ranks", None, "missing ranks",
         r"\[missing ranks: (?P<missing>\d+(?:, \d+)*)\]",
         "W horovod/common/operations.cc:588] HorovodBroadcast_w_0 [missing ranks: 1]",
         strength=CONTEXT),
    # Open MPI's mpirun names the first process that exited non-zero (orte/tools/orterun, help
    # text "The first process to do so was:" then "  Process name: [[jobid,1],rank]").
    _sig("mpirun.first_exit", None, "first process to do so",
         r"The first process to do so was", "The first process to do so was:", strength=CONTEXT),
    _sig("mpirun.process_name", None, "Process name",
         r"^\s*Process name:\s*\[\[\d+,\d+\],(?P<rank>\d+)\]", "  Process name: [[50371,1],0]",
         specificity=1, strength=CONTEXT),
    # MPICH's Hydra banner on a process that ended badly (MPICH >= 4 names its rank: src/pm/hydra
    # "=   RANK 6 PID 2447372 RUNNING AT node0009"); one banner names the origin, several none.
    _sig("hydra.bad_rank", None, "RUNNING AT",
         r"^[#=\s]*RANK (?P<rank>\d+) PID \d+ RUNNING AT \S+",
         "=   RANK 6 PID 2447372 RUNNING AT node0009", specificity=1, strength=CONTEXT),
    # TensorFlow's coordination service (also JAX's multi-process runtime) on the leader: a worker
    # task failed, was preempted or crashed; the task id is the worker's process index
    # (tensorflow/core/distributed_runtime/coordination/coordination_service.cc).
    _sig("tf.coordination_task_error", "other", "coordination service",
         r"/job:(?:(?:jax_)?worker/replica:\d+/task:(?P<rank>\d+)|\w+/replica:\d+/task:\d+) has "
         r"been set to ERROR in coordination service",
         "E coordination_service.cc:954] /job:worker/replica:0/task:3 has been set to ERROR in "
         "coordination service: UNAVAILABLE: Task /job:worker/replica:0/task:3 heartbeat timeout.",
         specificity=40),
    # The coordination service's agent on a task giving up (XLA/TF `distributed/client.cc`:
    # "Coordination service agent in error status: DEADLINE_EXCEEDED", labels-43d 649): the task
    # could not register with or lost the leader. CANCELLED is the agent's own shutdown.
    _sig("tf.coordination_agent_error", "other", "service agent",
         r"Coordination service agent in error status: (?!CANCELLED\b)(?P<status>[A-Z_]+)",
         "E client.cc:96] Coordination service agent in error status: DEADLINE_EXCEEDED: "
         "Deadline Exceeded", specificity=35,
         resolve=O.explained("the coordination service failed: {status} (a task did not "
                             "register or lost the leader)")),
    # TF's collective ops given a group whose size disagrees across workers (collective_param_
    # resolver: "Collective Op has group_size 8 and group_key2 but that group has size 4",
    # labels-43d 656): the workers were started with different cluster specs.
    _sig("tf.collective_group_mismatch", "other", "group has size",
         r"Collective Op\s+has group_size \d+ and group_key\s*\d+ but that group has size \d+",
         "Internal: Collective Op has group_size 8 and group_key2 but that group has size 4",
         specificity=40,
         resolve=O.explained("TF's collective group sizes disagree across workers (each "
                             "worker's TF_CONFIG must name the same cluster)")),
    # gloo's TCP transport losing a peer (the CPU side of torch.distributed).
    _sig("gloo.peer_lost", "nccl_error", "gloo",
         r"gloo/transport/tcp/\w+\.cc:\d+\] (?:Connection closed by peer|Connection refused|"
         r"Read error|Connection reset by peer)",
         "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
         "[10.0.0.3]:29500", specificity=60),
    # PyTorch's DataLoader worker killed by SIGBUS: its shared-memory tensors outgrew /dev/shm
    # (torch/utils/data/_utils/signal_handling.py prints the first line, the loader raises the
    # second; labels-43c 615). Not a GPU fault: the container's --shm-size or the worker count.
    _sig("dataloader.bus_error", "other", "bus error|Bus error",
         r"Unexpected bus error encountered in worker|DataLoader worker \(pid \d+\) is killed by "
         r"signal: Bus error",
         "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
         "shared memory (shm).", specificity=30,
         resolve=O.explained("a DataLoader worker died of SIGBUS: /dev/shm is too small for its "
                             "shared tensors (raise the container's --shm-size or use fewer "
                             "workers)")),
    _sig("signal.bus_error", "other", "Bus error",
         r"line \d+: +\d+ Bus error\b|\bBus error \(core dumped\)",
         "/var/spool/slurmd/job77/slurm_script: line 9: 4242 Bus error (core dumped) python train.py",
         specificity=20),
    _sig("signal.lightning_sigterm", "slurm_cancelled", "SIG",
         r"(?:Received|Bypassing) SIGTERM", "[rank: 0] Received SIGTERM: 15", specificity=30,
         strength=MINOR),
    _sig("signal.child", "other", "SIG",
         r"Signal (?P<signal>\d+) \((?P<signame>SIG[A-Z]+)\) received by PID|"
         r"died with <Signals\.(?P<how>SIG[A-Z]+): \d+>|interrupted by signal \d+: ?SIG[A-Z]+",
         "  traceback : Signal 9 (SIGKILL) received by PID 4242", specificity=35,
         resolve=O.exit_outcome),
    # Lightning's launcher: "[rank: 2] Child process with PID 6 terminated with code 1".
    _sig("lightning.child_terminated", "other", "terminated with code",
         r"Child process with PID \d+ terminated with code (?P<exitcode>-?\d+)",
         "[rank: 2] Child process with PID 60233 terminated with code 1. Forcefully terminating all "
         "other processes to avoid zombies", specificity=30, resolve=O.exit_outcome),
    _sig("torchrun.agent_failed", "other", "xitcode",
         r"failed \(exitcode: (?P<exitcode>-?[1-9]\d*)\) local_rank: (?P<local_rank>\d+)",
         "E0102 03:04:05.000000 4242 torch/distributed/elastic/multiprocessing/api.py:881] failed "
         "(exitcode: -6) local_rank: 1 (pid: 4243) of binary: /usr/bin/python3",
         specificity=65, resolve=O.exit_outcome),
    _sig("torchrun.child_failed", "other", "rror", r"ChildFailedError",
         "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", specificity=25),
    _sig("deepspeed.exit", "other", "RROR|rror",
         # No rank: DeepSpeed's sigkill_handler prints `cmd`, the launch loop's last command,
         # whichever process failed (deepspeed/launcher/launch.py), so its --local_rank is noise.
         r"exits with return code = (?P<exitcode>-?[1-9]\d*)|returned non-zero exit status (?P<status>\d+)",
         "[2024-01-02 03:04:05,678] [ERROR] [launch.py:321:sigkill_handler] ['python', 'train.py'] "
         "exits with return code = 1",
         specificity=20, resolve=O.exit_outcome),
    # --- how a run ended badly, where no line above says why (category `other`, see END_ONLY) --
# Their anchors reuse the prefilter's start bytes (`rror`, `RROR`, `TERMINAT`, ...): "MPI_",
# "ORTE" or "spank" would each add a start byte and slow every scan (tests/unit/diagnosis/test_scan_cost.py).
    # MPI's own abort: Open MPI's MPI_ERRORS_ARE_FATAL banner and "Local abort before MPI_INIT"
    # (ompi/errhandler), MPICH's "Fatal error in MPI_..."/"aborting job:" and Cray MPICH's
    # "MPICH ERROR [Rank N] ... Abort(" (labels-43a 504, 527, 531, 536).
    _sig("end.mpi_abort", "other", "RROR|rror|Local abort|aborting job",
         r"MPI_ERRORS_ARE_FATAL|\*\*\* An error occurred in MPI_\w+|Local abort (?:before|after) MPI_INIT"
         r"|Fatal error in P?MPI_\w+|^\s*(?:\[[^\]]*\]:? )?aborting job:?\s*$"
         r"|MPICH ERROR \[Rank (?P<rank>\d+)\].*? Abort\(",
         "*** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,", specificity=15),
    # A launcher's verdict on its processes: MPICH Hydra's "BAD TERMINATION OF ONE OF YOUR
    # APPLICATION PROCESSES" banner (labels-43a 530), Open MPI's "Primary job terminated
    # normally, but N process returned" (its next line: "a non-zero exit code. Per
    # user-direction, the job has been aborted."), "mpirun detected that one or more processes
    # exited with non-zero status", an ORTE internal error (522) or a failed mapping (528), and
    # Slurm's SPANK plugin stack failing a task's start (537).
    _sig("end.launcher", "other",
         "TERMINAT|user-direction|non-zero status|rror|failed to map|plugin stack|required plugin",
         r"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"
         r"|^a non-zero exit code\. Per user-direction|exited with non-zero status"
         r"|An internal error has occurred in ORTE|FORCE-TERMINATE AT|Your job failed to map"
         r"|Failed to invoke spank plugin stack|spank: required plugin \S+: \w+\(\) failed",
         "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", specificity=15),
    # A fatal signal as Open MPI's handler and MVAPICH's print it (`*** Process received
    # signal ***`, `Signal: Bus error (7)`, `[error_sighandler] Caught error: Aborted (signal 6)`,
    # labels-43a 509, 531), a C++ runtime's abort, and glibc's "(core dumped)".
    _sig("end.signal", "other", "received signal|Signal: |Caught error|terminate called|core dumped",
         r"\*\*\* Process received signal \*\*\*|(?:^|\] )Signal: [A-Z][\w ]+ \(\d+\)"
         r"|\[error_sighandler\] Caught error: .*\(signal \d+\)"
         r"|terminate called (?:after throwing an instance of|without an active exception)"
         r"|\(core dumped\)",
         "[gpu-b7:04242] Signal: Bus error (7)", specificity=15),
    # Slurm's word that a task failed (srun --kill-on-bad-exit: "... CANCELLED AT ... DUE TO
    # TASK FAILURE", labels-43b 563), srun's report of tasks it terminated, and slurmctld's
    # `_job_complete: JobId=N WTERMSIG S` / `WEXITSTATUS N` (src/slurmctld/job_mgr.c; 580).
    _sig("end.slurm", "other", "TASK FAILURE|Terminated|_job_complete",
         r"DUE TO TASK FAILURE|srun: error: \S+: tasks? [\d,\-]+: Terminated"
         r"|_job_complete: JobId=\d+ (?:WTERMSIG \d+|WEXITSTATUS [1-9]\d*)",
         "[2025-03-01T10:11:12.000] _job_complete: JobId=81234 WTERMSIG 9", specificity=15),
    # TensorFlow's remote errors (gRPC status names, tensorflow/python/framework/errors_impl.py)
    # as its logger or a raised error prints them: one worker's view of a peer that went away.
    _sig("end.tf_remote", "other", "rror",
         r"(?:ERROR:tensorflow:|errors_impl\.)\S*.*?\b(?:Unavailable|Aborted|DeadlineExceeded|Internal)Error\b",
         "tensorflow.python.framework.errors_impl.UnavailableError: failed to connect to all "
         "addresses", specificity=15),
    # TensorFlow's collective executor aborting its collectives (tensorflow/core/common_runtime/
    # base_collective_executor.cc: `LOG(WARNING) << "BaseCollectiveExecutor::StartAbort " << s`):
    # a multi-worker job's collective failed, the status says why (labels-43a 513). "Out of
    # range: End of sequence" is not a failure: TF 2.0-2.1 print it when a dataset ends an epoch.
    _sig("end.tf_collective_abort", "other", "StartAbort",
         r"BaseCollectiveExecutor::StartAbort (?!Out of range\b)(?P<said>[A-Z][^\n]{0,80})",
         "W tensorflow/core/common_runtime/base_collective_executor.cc:217] "
         "BaseCollectiveExecutor::StartAbort Unavailable: Connection reset by peer", specificity=15),
    _sig("python.exception", "other", "rror|xception",
         r"^\s*(?:[A-Za-z_]\w*\.)*(?P<exception>[A-Z]\w*Error|(?:[A-Z]\w*)?Exception)(?::\s|:?$)(?!.*[Rr]etry)",
         "ValueError: too many values to unpack (expected 2)", specificity=10),
    # --- context: torchrun's ChildFailedError summary ------------------------------------------
    # PyTorch 1.9 prints "Root Cause:", later ones "Root Cause (first observed failure):"; a
    # table collapsed onto one line carries its rank field on the same line.
    # The same table collapsed onto one line (a paste that lost its newlines): the Root Cause's
    # rank and exit code side by side, so the line fails the job itself (a SIGKILL reads as the
    # host's OOM killer, as the table's own exitcode field does) and names the rank.
    _sig("torchrun.table_collapsed", "other", "Root Cause",
         r"Root Cause(?: \(first observed failure\))?:.*?\brank\s*:?\s*(?P<rank>\d+) "
         r"\(local[_ ]rank: ?\d+\)\s*exitcode\s*:\s*(?P<exitcode>-?\d+)",
         "Root Cause (first observed failure): [0]: time : 2024-11-02_09:12:01 host : gpu-p4 "
         "rank : 2 (local_rank: 2) exitcode : -9 (pid: 8812) error_file: <N/A>",
         specificity=55, resolve=O.exit_outcome),
    _sig("torchrun.root_cause", None, "Root Cause",
         r"Root Cause(?: \(first observed failure\))?:(?:.*?rank\s*:?\s*(?P<root_rank>\d+)\s*\(local[_ ]rank)?",
         "Root Cause (first observed failure):", strength=CONTEXT),
    # The rank row, also collapsed by a paste (`host: gpu-3rank2 (local rank: 2)exitcode: -9`).
    _sig("torchrun.rank_field", None, "local_rank|local rank",
         r"(?:^|[\s|:]|(?<=[a-z0-9]))rank\s*:?\s*(?P<rank>\d+)\s*\(local[_ ]rank:?\s*\d+\)",
         "  rank      : 5 (local_rank: 1)", strength=CONTEXT),
    # The row above it names the host (the template's `host      : ${hostname}`). These context
    # rows below have specificity 1: on a line that also holds a failure, the failure wins.
    _sig("torchrun.host_field", None, "host      :",
         r"^[\s|]*host\s+:\s*(?P<host>[A-Za-z0-9][\w.-]*)\s*$", "  host      : gpu-b7",
         specificity=1, strength=CONTEXT),
    # A traceback's first line: under a rank prefix (PyTorch >= 2.4 prefixes each rank's stderr,
    # `[rank1]: Traceback ...`) it says which rank raised the exception printed just above.
    _sig("python.traceback", None, "Traceback (most recent call last)",
         r"^\s*Traceback \(most recent call last\):?\s*$",
         "[rank1]: Traceback (most recent call last):", specificity=1, strength=CONTEXT),
    # torchrun's agent after its rendezvous (torch/distributed/elastic/agent/server/api.py,
    # "Rendezvous complete for workers. Result:" then "  global_ranks=[4, 5, 6, 7]"): the global
    # rank of each of this node's local ranks.
    _sig("torchrun.global_ranks", None, "global_ranks=",
         r"^\s*global_ranks=\[(?P<ranks>[\d, ]*)\]", "  global_ranks=[4, 5, 6, 7]",
         specificity=1, strength=CONTEXT),
    # Lightning 2.x: "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/4" (fabric/utilities/
    # distributed.py) and "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1,2,3]" (accelerators/cuda.py):
    # as many processes as visible GPUs is one node with a process per GPU.
    _sig("lightning.member", None, "MEMBER:",
         r"Initializing distributed: GLOBAL_RANK: \d+, MEMBER: \d+/(?P<world>\d+)",
         "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/4", specificity=1, strength=CONTEXT),
    _sig("lightning.visible", None, "- CUDA_VISIBLE_DEVICES:",
         r"LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES: \[(?P<devices>[\d, ]*)\]",
         "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1,2,3]", specificity=1, strength=CONTEXT),
    # DeepSpeed's launcher (deepspeed/launcher/launch.py, 0.x): `nnodes=1, num_local_procs=4,
    # node_rank=0`; one node with a process per GPU makes "GPU n" local rank n, as torchrun's.
    _sig("deepspeed.launch_info", None, "num_local_procs",
         r"nnodes=(?P<nnodes>\d+), num_local_procs=(?P<nprocs>\d+)",
         "[2024-05-08 11:02:14,330] [INFO] [launch.py:152:main] nnodes=1, num_local_procs=4, node_rank=0",
         specificity=1, strength=CONTEXT),
    # torchrun's launch configuration: one node with a process per GPU makes "GPU n" rank n.
    _sig("torchrun.launch_config", None, "max_nodes|nproc_per_node",
         r"\]\s+(?P<key>max_nodes|nproc_per_node)\s*:\s*(?P<n>\d+)\s*$",
         "I1102 10:00:00.812000 1 torch/distributed/launcher/api.py:188]   max_nodes        : 1",
         strength=CONTEXT),
    # A failure table's exit code fails the job even when the agent's own line is not in the
    # excerpt (its rank comes from the table's Root Cause, see rank.py).
    _sig("torchrun.exitcode_field", "other", "xitcode",
         r"^[\s|]*exitcode\s*:\s*(?P<exitcode>-?\d+)", "  exitcode  : -9 (pid: 4242)",
         specificity=22, resolve=O.exit_outcome),
    # PyTorch's desync report (TORCH_NCCL_DESYNC_DEBUG) names the ranks that did not join:
    # "...the lagging/dead/mismatched ranks that caused the desync are:" then "[1] finished
    # collective #2, but didn't join collective #3".
    _sig("torch.desync_header", None, "caused the desync", r"ranks that caused the desync are",
         " - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:",
         strength=CONTEXT),
    _sig("torch.desync_rank", None, "collective #",
         r"^\s*-?\s*\[(?P<culprit>\d+)\] (?:finished|joined|didn't join|did not join|is running|has not)",
         "    [1] finished collective #2, but didn't join collective #3 (count from 1)",
         strength=CONTEXT),
    # --- context: the run ended well (positive evidence: without it a quiet log is `unknown`) --
    # The job's own last words, each seen in a real log of a run that ended well: HF Trainer's
    # metrics (dict or `train_runtime = ` table) and "Training completed."; Lightning's
    # "`Trainer.fit` stopped:"; Megatron's "[after training is done]"; a trainer's "Total
    # training time: N seconds" (not detectron2's "Total training time: 0:40:17 (...)", which
    # its `finally` prints after a crash too); nccl-tests' "# Out of bounds values : 0 OK" and
    # "Collective test concluded"; tf_cnn_benchmarks' "total images/sec:"; all_reduce_bench's
    # "busbw: N Gbps"; Slurm's own: slurmctld's `_job_complete: JobId=N WEXITSTATUS 0`, the
    # job's own sacct row (not a step's: `N.batch`) `COMPLETED 0:0`, scontrol's
    # `JobState=COMPLETED`. A fatal line after the last of them still fails the run.
    _sig("run.completed", None,
         "train_runtime|fit` stopped|training is done|Training completed|training time:|"
         "Out of bounds|test concluded|images/sec:|Gbps|WEXITSTATUS 0|COMPLETED",
         r"'train_runtime': |\btrain_runtime\s+= |`Trainer\.fit` stopped: |\[after training is done\]"
         r"|Training completed\. Do not forget to share|Total training time: [\d.]+ seconds"
         r"|# Out of bounds values : 0 OK|# Collective test concluded|^total images/sec: [\d.]+"
         r"|^\s*busbw: [\d.]+\s+Gbps|_job_complete: JobId=\d+ WEXITSTATUS 0\b"
         r"|^\s*\d+(?:_\d+)?\s+(?:\S+\s+){0,8}COMPLETED\s+0:0\b|\bJobState=COMPLETED\b",
         "{'train_runtime': 812.4, 'train_samples_per_second': 3.2, 'epoch': 3.0}",
         strength=CONTEXT),
    # An MPI smoke test's own greeting, "Hello World" (655): its only work is to print it. (A
    # benchmark table's end has no word to anchor on: ending.py reads it from the log's tail.)
    _sig("run.completed_test", None, "Hello World|Hello world", r"\bHello,? [Ww]orld",
         "Hello World from rank 1 of 2", strength=CONTEXT),
)  # fmt: skip

# The lines that say the run ended well (ending.py: positive evidence for `no_failure`).
COMPLETED = frozenset({"run.completed", "run.completed_test"})

# Lines that say a process or job ended badly, not why (a signal, an exit code, an abort, a
# launcher's banner): a verdict of `other` that only such lines decided has low confidence.
END_ONLY = frozenset({
    "end.mpi_abort", "end.launcher", "end.signal", "end.slurm", "end.tf_remote",
    "end.tf_collective_abort",
    "slurm.step_failed", "srun.task_exit", "signal.sigsegv", "signal.shell_killed",
    "signal.shell_other", "signal.bus_error", "signal.child", "mpirun.rank_signal",
    "mpirun.rank_exit",
    "lightning.child_terminated", "torchrun.agent_failed", "torchrun.child_failed",
    "torchrun.table_collapsed", "torchrun.exitcode_field", "deepspeed.exit",
})  # fmt: skip

ANCHORS: tuple[str, ...] = tuple(dict.fromkeys(a for s in SIGNATURES for a in s.anchors))
# The anchors `|`-joined, for documentation.
ALTERNATION = "|".join(ANCHORS)
ANCHOR_BYTES: tuple[bytes, ...] = tuple(a.encode() for a in ANCHORS)
_BY_ANCHOR: dict[str, tuple[Signature, ...]] = {
    a: tuple(s for s in SIGNATURES if a in s.anchors) for a in ANCHORS
}

# --- the scan's prefilter: keys that start on few, rare bytes ----------------------------------
# A multi-literal search pays at every position holding the first byte of some literal: GNU
# grep's DFA leaves its idle loop there, Python's `re` tries its alternation there. Anchors such
# as "exception" or " WARN " start on the commonest bytes of a log, so each new anchor slowed the
# one alternation (1 GB: 2.0 s against 0.8 s for grep with 16 usual words). The scan therefore
# searches, instead of each anchor, its *key*: the anchor's tail from a rare byte on
# ("xception", "WARN "), KEY_MIN bytes at least. A line holding an anchor holds its key, so the
# keys find a superset of the anchor lines; the anchors and patterns are checked there only.
# What a scan costs is the frequency of the bytes that start a key, paid once per distinct byte
# however many keys share it: the start bytes are chosen as a weighted set cover (each byte's
# weight its frequency in logs, every anchor covered by one of its possible start bytes), so
# a new anchor mostly reuses a byte already paid for (tests/unit/diagnosis/test_scan_cost.py).
KEY_MIN = 4
# Printable bytes from commonest to rarest in real job logs, with their frequency in 1/10,000
# (counted over the 132 logs of the project's labelled corpus, 170 kB; ties by byte value).
BYTE_ORDER = b" e0rntoaisc:l1dp2u./m-3546_hgb87f9C,kNy][=xIwLvE(OF)RPT|S^\"AGMD'>U*Bz<W+VKX`j%H#q}{Z;JY@!&?$\\~Q"
_PER_10K = (
    1188, 527, 412, 382, 359, 358, 352, 346, 344, 315, 280, 240, 231, 230, 208, 194, 194, 159,
    159, 155, 152, 142, 140, 130, 127, 117, 111, 105, 104, 101, 97, 91, 90, 87, 86, 86, 77, 74,
    64, 63, 63, 52, 51, 50, 49, 42, 42, 40, 39, 39, 39, 38, 36, 36, 35, 32, 31, 31, 30, 29, 27,
    27, 25, 23, 22, 22, 15, 13, 13, 13, 11, 9, 9, 8, 6, 6, 5, 5, 5, 5, 4, 2, 2, 2, 2, 1, 1, 1, 1,
    1, 1, 0, 0, 0, 0,
)  # fmt: skip
# Rarer than any counted byte: a byte the corpus never showed (tab, non-ASCII) still costs a bit.
BYTE_WEIGHT: dict[int, float] = {b: max(w, 0.5) for b, w in zip(BYTE_ORDER, _PER_10K)}


def _weight(byte: int) -> float:
    return BYTE_WEIGHT.get(byte, 0.5)


def _starts(anchor: bytes) -> list[int]:
    """Where a key may start in an anchor: KEY_MIN bytes at least are left (a short anchor: 0),
    never inside a UTF-8 character."""
    return [0] + [i for i in range(1, len(anchor) - KEY_MIN + 1) if anchor[i] & 0xC0 != 0x80]


def start_bytes(anchors: Iterable[str]) -> frozenset[int]:
    """The bytes keys start on: a greedy weighted set cover of the anchors' possible starts."""
    options = {a: {a.encode()[i] for i in _starts(a.encode())} for a in dict.fromkeys(anchors)}
    left, chosen = set(options), set()
    while left:
        served: dict[int, int] = {}
        for a in left:
            for b in options[a]:
                served[b] = served.get(b, 0) + 1
        best = min(served, key=lambda b: (_weight(b) / served[b], b))
        chosen.add(best)
        left = {a for a in left if best not in options[a]}
    # Greedy leaves bytes that later choices made redundant: drop them, the commonest first.
    for b in sorted(chosen, key=_weight, reverse=True):
        if all(options[a] & (chosen - {b}) for a in options):
            chosen.discard(b)
    return frozenset(chosen)


def prefilter_key(anchor: str, starts: frozenset[int]) -> str:
    """The anchor's longest tail that starts on one of `starts`.

    Longest: the scan pays for the start byte wherever it occurs, whichever key begins with it,
    and a longer key lets fewer ordinary lines through ("f memory", not "memory").
    """
    raw = anchor.encode()
    i = next(i for i in _starts(raw) if raw[i] in starts)
    return raw[i:].decode()


def prefilter_keys(anchors: Iterable[str]) -> tuple[str, ...]:
    """The keys of these anchors, a key left out where a shorter key lies inside it."""
    anchors = tuple(dict.fromkeys(anchors))
    starts = start_bytes(anchors)
    keys = sorted({prefilter_key(a, starts) for a in anchors}, key=lambda k: (len(k), k))
    kept: list[str] = []
    for key in keys:
        if not any(k in key for k in kept):
            kept.append(key)
    return tuple(kept)


def grep_ere(keys: Iterable[str]) -> str:
    """The keys as one ERE alternation, metacharacters bracketed (`.cc:` is `[.]cc:`)."""
    # `^` escaped instead: `[^]` would open a negated bracket.
    esc = {c: f"[{c}]" for c in ".[]()*+?{}$\\|"} | {"^": "\\^"}
    return "|".join("".join(esc.get(c, c) for c in k) for k in keys)


def key_regex(keys: Iterable[str]) -> re.Pattern[bytes]:
    """The keys as one compiled bytes alternation, factored by leading bytes (a trie).

    `re` tries its alternation wherever a key's first byte occurs and there walks the branches
    in turn: factored, a position tries the keys that share its bytes, not every key.
    """
    return lazy(_trie([k.encode() for k in keys]))


def _trie(keys: list[bytes]) -> bytes:
    """A regex matching exactly these byte strings, common leading bytes factored out."""
    if any(not k for k in keys):  # one key is a prefix of the others: it alone decides
        return b""
    by_first: dict[int, list[bytes]] = {}
    for k in keys:
        by_first.setdefault(k[0], []).append(k[1:])
    alts = [re.escape(bytes([b])) + _trie(tails) for b, tails in sorted(by_first.items())]
    return alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"


KEYS: tuple[str, ...] = prefilter_keys(ANCHORS)
KEY_BYTES: tuple[bytes, ...] = tuple(k.encode() for k in KEYS)
GREP_ERE = grep_ere(KEYS)  # what `grep -E` searches
KEY_RE = key_regex(KEYS)  # what the Python engine searches


def segments(raw: bytes) -> list[bytes]:
    """The parts of one raw line worth matching: `\\r`-separated, with an anchor, capped."""
    parts = raw.split(b"\r") if b"\r" in raw else [raw]
    out = []
    for part in parts:
        if len(part) > SEGMENT_MAX:
            part = _window(part)
        if part and any(a in part for a in ANCHOR_BYTES):
            out.append(part)
    return out


def _window(part: bytes) -> bytes:
    """A long segment cut around its first anchor (the error text sits right after it)."""
    first = min((i for i in (part.find(a) for a in ANCHOR_BYTES) if i >= 0), default=0)
    start = max(0, first - SEGMENT_MAX // 4)
    return part[start : start + SEGMENT_MAX]


def match_segment(segment: bytes) -> Match | None:
    """The most specific signature matching one line segment, or None."""
    line = clean_line(segment)
    text = line.text
    best: tuple[int, Signature, re.Match[str]] | None = None
    # Every anchor the text holds, overlapping ones included ("out of memory" holds "of memory":
    # a regex alternation would find only one of them and skip the other's signatures).
    for anchor in [a for a in ANCHORS if a in text]:
        for sig in _BY_ANCHOR[anchor]:
            if best is not None and sig.specificity <= best[0]:
                continue
            m = sig.pattern.search(text)
            if m is not None:
                best = (sig.specificity, sig, m)
    if best is None:
        return None
    _, sig, m = best
    found = _to_match(sig, m, text, line.rank)
    place = L.place_fields(line)  # the launcher's host prefix, srun's task: where it was printed
    if place:
        found = found.replace(fields={**found.fields, **place})
    return found


def _to_match(sig: Signature, m: re.Match[str], text: str, prefix_rank: int | None) -> Match:
    category, strength, code = sig.category, sig.strength, None
    extra: dict[str, object] = {}
    if sig.resolve is not None:
        category, strength, code, *more = sig.resolve(m, text)
        extra = more[0] if more else {}
    groups = {k: v for k, v in m.groupdict().items() if v is not None}
    groups.pop("msg", None)
    groups.update(extra)
    named = groups.pop("rank", None)
    # The origin's rank (launchers.py): a detector's or victim's own rank is not the origin.
    rank = L.origin_rank(text, prefix_rank, int(named) if named else None)
    groups.pop("xid", None)
    return Match(
        signature=sig.name,
        category=category,
        strength=strength,
        specificity=sig.specificity,
        text=text[:TEXT_MAX],
        rank=rank,
        xid=code,
        fields=groups,
    )


def match_line(raw: bytes) -> list[Match]:
    """Every signature match in one raw line (one per `\\r` segment at most)."""
    out = []
    for seg in segments(raw):
        m = match_segment(seg)
        if m is not None:
            out.append(m)
    return out

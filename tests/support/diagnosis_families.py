"""The failure families with a log fixture each (tests/fixtures/diagnosis), per format version."""

from __future__ import annotations

# (fixture, category, xid, failing_rank)
FAMILIES = [
    # --- NCCL WARN kinds -> nccl_error (rank: a NCCL WARN line names a device, not a rank) ---
    # NCCL 2.12 src/transport/net_ib.cc ncclIbTest: "Got completion from peer %s with error %d,
    # opcode %d, len %d, vendor err %d"; status 12 = IBV_WC_RETRY_EXC_ERR, before the timeouts.
    ("nccl-ib-completion--2.12.log", "nccl_error", None, None),
    # NCCL 2.19 net_ib.cc: "with status=%d opcode=%d len=%d vendor err %d (%s)%s%s%s%s"
    # (Send/Recv, " localGid ", " remoteGids"); ncclRemoteError (6) in the "-> 6" trail.
    ("nccl-ib-completion--2.19.log", "nccl_error", None, None),
    # NCCL 2.23 net_ib.cc: "NET/IB: Got completion ... len=%u vendor err %u (%s)... hca %s";
    # status 5 = IBV_WC_WR_FLUSH_ERR on a Recv.
    ("nccl-ib-completion-flush--2.23.log", "nccl_error", None, None),
    # NCCL 2.27+ net_ib ncclIbLogCompletionWithError: "status=%s(%d) opcode=%s(%d) vendor_err=%u" with
    # ibvWcStatusStr names; 13 = IBV_WC_RNR_RETRY_EXC_ERR.
    ("nccl-ib-completion-rnr--2.27.log", "nccl_error", None, None),
    # NCCL 2.12 net_ib.cc ncclIbAsyncThreadMain: "NET/IB : Got async event : %s" (port error).
    ("nccl-ib-async-port--2.12.log", "nccl_error", None, None),
    # NCCL 2.21 net_ib.cc: "NET/IB : %s:%d Got async event : %s" (device:port first).
    ("nccl-ib-async-port--2.21.log", "nccl_error", None, None),
    # NCCL 2.7 src/include/socket.h connectAddress: "Connect to %s failed : %s", then PyTorch
    # 1.7 torch/lib/c10d/ProcessGroupNCCL.cpp "NCCL error in: ..., unhandled system error".
    ("nccl-socket-connect--2.7.log", "nccl_error", None, None),
    # NCCL 2.19 src/misc/socket.cc: "socketProgressOpt: Call to recv from %s failed : %s".
    ("nccl-socket-recv--2.19.log", "nccl_error", None, None),
    # NCCL 2.8 src/include/socket.h socketProgressOpt: "Net : Call to recv from %s failed : %s".
    ("nccl-socket-recv--2.8.log", "nccl_error", None, None),
    # NCCL 2.18 src/proxy.cc: "Proxy Call to rank %d failed (%s)", "[Proxy Service %d] Failed to
    # execute operation %s from rank %d, retcode %d"; PyTorch 2.1 "Last error:" tail.
    ("nccl-proxy-call--2.18.log", "nccl_error", None, None),
    # NCCL 2.14 src/init.cc: "Duplicate GPU detected : rank %d and rank %d both on CUDA device
    # %lx" -> ncclInvalidUsage; two ranks named, none is the origin.
    ("nccl-duplicate-gpu--2.14.log", "nccl_error", None, None),
    # NCCL 2.18 init.cc "Invalid rank requested : %d/%d"; PyTorch 2.1 NCCLUtils.hpp "invalid usage
    # (run with NCCL_DEBUG=WARN for details)", "ncclInvalidUsage: This usually reflects ...".
    ("nccl-invalid-usage--2.18.log", "nccl_error", None, None),
    # NCCL 2.19 src/include/checks.h CUDACHECK: "Cuda failure '%s'" (not out of memory) ->
    # "unhandled cuda error", "ncclUnhandledCudaError: Call to CUDA function failed."
    ("nccl-cuda-failure--2.19.log", "nccl_error", None, None),
    # PyTorch 1.11 ProcessGroupNCCL.cpp + NCCL 2.10 ncclGetErrorString: "unhandled system error",
    # "ncclSystemError: System call (socket, malloc, munmap, etc) failed."
    ("nccl-unhandled-system--2.10.log", "nccl_error", None, None),
    # NCCL 2.18 misc/socket.cc "socketProgress: Connection closed by remote peer %s"; PyTorch 2.1
    # "remote process exited or there was a network error", "ncclRemoteError: A call failed ...".
    ("nccl-remote-exited--2.18.log", "nccl_error", None, None),
    # --- ProcessGroupNCCL / c10d timeouts -> nccl_timeout ---
    # PyTorch 1.8 ProcessGroupNCCL.cpp: "[E ProcessGroupNCCL.cpp:566] [Rank %d] Watchdog caught
    # collective operation timeout: WorkNCCL(OpType=..., Timeout(ms)=...)" (no SeqNum yet); all ranks.
    ("pg-timeout--1.8.log", "nccl_timeout", None, None),
    # PyTorch 1.13: SeqNum added; "Some NCCL operations have failed or timed out" per rank.
    ("pg-timeout--1.13.log", "nccl_timeout", None, None),
    # PyTorch 2.0: NumelIn/NumelOut added; what(): "[Rank 2] NCCL watchdog thread terminated with
    # exception: [Rank 2] Watchdog caught ..." after every rank timed out.
    ("pg-timeout--2.0.log", "nccl_timeout", None, None),
    # PyTorch 2.1: "[E ProcessGroupNCCL.cpp:916] [Rank 0] NCCL watchdog thread terminated ..." and
    # the "Exception raised from checkTimeout" frames (c10/util/Exception.cpp layout).
    ("pg-timeout--2.1.log", "nccl_timeout", None, None),
    # PyTorch 2.2 ProcessGroupNCCL.cpp WorkNCCL::checkTimeout frames alone (excerpt starts after
    # what()), then CPython faulthandler "Fatal Python error: Aborted".
    ("pg-checktimeout-frames-alone--2.2.log", "nccl_timeout", None, None),
    # PyTorch 2.2: c10 logging rank prefix "[rank%d]:[E ProcessGroupNCCL.cpp:523]"; all ranks.
    ("pg-timeout--2.2.log", "nccl_timeout", None, None),
    # PyTorch 2.3: glog time "[rank3]:[E1129 hh:mm:ss.nnnnnnnnn ProcessGroupNCCL.cpp:572]" and
    # logPrefix "[PG 0 Rank 3]"; "Timeout at NCCL work: ..."; all 8 ranks.
    ("pg-timeout--2.3.log", "nccl_timeout", None, None),
    # PyTorch 2.4: logPrefix "[PG ID 0 PG GUID 0(default_pg) Rank 5]", "Exception (either an error
    # or timeout) detected by watchdog at work: ..."; one rank alone reports. Its watchdog waited
    # on a peer: a reporter, not the origin (the corpus labels' rule 4), so no rank.
    ("pg-timeout-one-rank--2.4.log", "nccl_timeout", None, None),
    # PyTorch 2.5 ProcessGroupNCCL.cpp HeartbeatMonitor getNCCLWatchdogTimeoutErrorMsg: "Received
    # a dump signal due to a collective timeout from this local rank" on rank 2, "from  rank 2"
    # (two spaces) and "Observed flight recorder dump signal from another rank via TCPStore." on
    # the others: rank 2's watchdog fired first, but it too waited on a peer: no origin named.
    ("pg-dump-signal-one-origin--2.5.log", "nccl_timeout", None, None),
    # PyTorch 2.7: every rank's own watchdog fired ("from this local rank" everywhere): no rank.
    ("pg-dump-signal-all-ranks--2.7.log", "nccl_timeout", None, None),
    # PyTorch 2.2 ProcessGroupNCCL.cpp broadcastUniqueNCCLID: "[%d] is setting up NCCL communicator
    # and retrieving ncclUniqueId from [0] via c10d key-value store by key '%s', but store->get('%s')
    # got error: Socket Timeout" (DistBackendError), ranks 1-3 alike.
    ("store-distbackend-socket-timeout--2.2.log", "nccl_timeout", None, None),
    # PyTorch 2.0 torch/csrc/distributed/c10d/socket.cpp: "[c10d] The client socket has timed out
    # after %ds while trying to connect to (%s, %d)." raised as RuntimeError by TCPStore.
    ("store-client-socket-timeout--2.0.log", "nccl_timeout", None, None),
    # PyTorch 2.4 c10d/TCPStore.cpp doWait: "wait timeout after %dms, keys: ..." (DistStoreError).
    ("store-wait-timeout--2.4.log", "nccl_timeout", None, None),
    # PyTorch 2.1 TCPStore.cpp waitForWorkers: "Timed out after %d seconds waiting for clients.
    # %d/%d clients joined." (DistStoreError).
    ("store-clients-timeout--2.1.log", "nccl_timeout", None, None),
    # The PyTorch 2.4 watchdog line of every rank hard-wrapped by a terminal at 80 columns.
    ("pg-timeout-wrapped-80--2.4.log", "nccl_timeout", None, None),
    # The PyTorch 1.12 watchdog line, two ranks, hard-wrapped at 80 columns.
    ("pg-timeout-wrapped-80--1.12.log", "nccl_timeout", None, None),
    # --- torchrun / elastic ChildFailedError tables -> other with the Root Cause rank ---
    # PyTorch 2.1 torch/distributed/elastic/multiprocessing/errors/__init__.py ChildFailedError
    # format_msg: "Root Cause (first observed failure):", "rank      : %d (local_rank: %d)".
    ("torchrun-table--2.1.log", "other", None, 1),
    # PyTorch 2.0 layout pasted outside a code block: runs of spaces collapsed, lines joined.
    ("torchrun-table-collapsed--2.0.log", "other", None, 3),
    # PyTorch 2.3 layout with every line indented by a job runner ("    | ").
    ("torchrun-table-indented--2.3.log", "other", None, 6),
    # PyTorch 1.9 errors/__init__.py layout: stars, "Root Cause:", "msg: \"Process failed with
    # exitcode 1\"", "Other Failures:".
    ("torchrun-table--1.9.log", "other", None, 2),
    # PyTorch 2.2 table cut before Root Cause: the one failure listed and elastic api.py's
    # "failed (exitcode: 1) local_rank: 3 (pid: ...) of binary: ..." name rank 3.
    ("torchrun-table-no-root-cause--2.2.log", "other", None, 3),
    # PyTorch 2.1 table with "exitcode  : -9" and "Signal 9 (SIGKILL) received by PID", no
    # scheduler kill line and no line naming the RAM: `other` (the summary names the OOM killer
    # as the usual sender, to be confirmed in the kernel log).
    ("torchrun-sigkill--2.1.log", "other", None, 0),
    # --- failing rank from every format ---
    # DeepSpeed 0.14 deepspeed/launcher/launch.py: "[launch.py:152:main] nnodes=1, num_local_procs=4",
    # sigkill_handler "Killing subprocess %d", "[...] exits with return code = %d" naming
    # '--local_rank=2' on one node.
    # The line's --local_rank=2 is NOT the failed process: sigkill_handler prints `cmd`, the
    # launch loop's last command, whichever process failed. So no rank.
    ("deepspeed-launcher-rank--0.14.log", "other", None, None),
    # DeepSpeed 0.12 launch.py: "exits with return code = -9", no scheduler line, no RAM named.
    ("deepspeed-launcher-sigkill--0.12.log", "other", None, None),  # no rank: see above
    # PyTorch 2.4 "[rank3]:" prefix glued to the end of a tqdm bar (no newline after "]").
    ("rank-progress-bar-glued--2.4.log", "illegal_memory_access", None, 3),
    # PyTorch 2.4 what(): "[PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread
    # terminated with exception: CUDA error: an illegal memory access was encountered".
    ("rank-pg-guid--2.4.log", "illegal_memory_access", None, 1),
    # Accelerate 0.2x launch (num_machines 1) over PyTorch 2.0 elastic api.py "failed (exitcode: 1)
    # local_rank: 2": one node, so local rank 2 is rank 2.
    ("rank-local-rank-one-node--2.0.log", "other", None, 2),
    # PyTorch 2.4 c10/cuda/CUDACachingAllocator.cpp: "GPU 3 has a total capacity of 79.1 GiB of
    # which ... is free"; torchrun launcher/api.py launch configs "max_nodes : 1", "nproc_per_node : 8":
    # one process per GPU on one node, so GPU 3 is rank 3.
    ("rank-oom-capacity-per-gpu--2.4.log", "cuda_oom", None, 3),
    # Lightning 2.1 lightning/fabric/utilities/rank_zero.py rank_prefixed_message "[rank: %d]" and
    # strategies/launchers/subprocess_script.py _ChildProcessObserver "Child process with PID %d
    # terminated with code %d. Forcefully terminating all other processes to avoid zombies".
    ("rank-lightning--2.1.log", "other", None, 2),
    # --- the rest of the closed set ---
    # Slurm 23.02 src/slurmd/slurmstepd/req.c: "*** JOB %u ON %s CANCELLED AT %s DUE TO TIME LIMIT ***".
    ("slurm-time-limit--23.02.log", "slurm_time_limit", None, None),
    # Slurm 22.05 srun "Node failure on %s" and "... DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR
    # DETAILS ***" after the dying node's CUDA/NCCL errors.
    ("slurm-node-failure--22.05.log", "slurm_node_failure", None, None),
    # Slurm 23.11 scancel: "*** STEP %u.%u ON %s CANCELLED AT %s ***" with no reason.
    ("slurm-cancelled--23.11.log", "slurm_cancelled", None, None),
    # Slurm 23.02 preemption: "... CANCELLED AT %s DUE TO PREEMPTION ***".
    ("slurm-preempted--23.02.log", "slurm_cancelled", None, None),
    # Slurm 23.02 src/plugins/task/cgroup: "Detected %u oom_kill event in StepId=%s. Some of the
    # step tasks have been OOM Killed." and srun "task %d: Out Of Memory".
    ("host-oom-slurm-cgroup--23.02.log", "host_oom", None, None),
    # NVIDIA driver 535 journal (kernel:) "NVRM: Xid (PCI:%s): 79, pid='<unknown>', ... GPU has
    # fallen off the bus." (docs/gpu-facts.md section 1).
    ("xid-79-fallen-off-bus--535.log", "gpu_xid_hardware", 79, None),
    # Driver 535 dmesg -T: Xid 31 "MMU Fault: ENGINE GRAPHICS ... Fault is of type FAULT_PDE";
    # the Xid outranks the CUDA illegal access it causes.
    ("xid-31-mmu-fault--535.log", "gpu_xid_user_app", 31, None),
    # Driver 470 dmesg: Xid 13 "Graphics SM Warp Exception ... Out Of Range Address".
    ("xid-13-graphics-exception--470.log", "gpu_xid_user_app", 13, None),
    # PyTorch 2.1 c10/cuda/CUDAException: "CUDA error: uncorrectable ECC error encountered" beats
    # the watchdog timeout it causes.
    ("ecc-cuda-uncorrectable--2.1.log", "ecc_error", None, None),
    # Driver 550 Xid 94 "Contained: SM (0x1). RST: No, D-RST: No" then its app Xid 43: root 94.
    ("xid-94-contained-ecc--550.log", "ecc_error", 94, None),
    # Driver 535 dmesg --time-format iso: Xid 74 "NVLink: fatal error detected on link %d(...)".
    ("xid-74-nvlink--535.log", "nvlink_error", 74, None),
    # PyTorch 2.0 "CUDA error: an illegal memory access was encountered" + its CUDA_LAUNCH_BLOCKING hint.
    ("illegal-memory-access--2.0.log", "illegal_memory_access", None, None),
    # --- other runtimes' words for the same families ---
    # Ray 2.9 src/ray/raylet/node_manager.cc: "(raylet) ... %d Workers (tasks / actors) killed due
    # to memory pressure (OOM), %d Workers crashed due to other reasons at node (ID: %s, IP: %s)";
    # the NCCL errors of the killed worker's peers after it are its victims: host_oom stays.
    ("ray-raylet-memory-pressure--2.9.log", "host_oom", None, None),
    # The same summary with 0 killed (only crashes): no memory verdict; the worker's error decides.
    ("ray-raylet-zero-killed--2.9.log", "other", None, None),
    # Ray 2.9 python/ray/exceptions.py OutOfMemoryError ("Task was killed due to the node running
    # low on memory.") and the memory monitor's "Memory on the node (IP: %s, ID: %s) where the
    # task (...) was running was %s / %s (%f), which exceeds the memory usage threshold of %f.":
    # host RAM, not the GPU's (not cuda_oom for "OutOfMemoryError").
    ("ray-oom-error-task--2.9.log", "host_oom", None, None),
    # Ray 2.9 RayActorError death cause with "Worker exit type: NODE_OUT_OF_MEMORY"
    # (src/ray/protobuf/common.proto WorkerExitType), fields tab-indented.
    ("ray-actor-node-oom--2.9.log", "host_oom", None, None),
    # Rust 1.75 library/std/src/alloc.rs default_alloc_error_hook: "memory allocation of %d bytes
    # failed", then abort (a Rust tokenizer/data tool), and bash's "Aborted (core dumped)".
    ("rust-alloc-abort--1.75.log", "host_oom", None, None),
    # PyTorch 2.3 c10/cuda/CUDAException.h "CUDA error: %s" with CUDA 12's
    # cudaErrorPeerAccessUnsupported (217) string "peer access is not supported between these two
    # devices": the GPUs' peer link -> nvlink_error (NCCL's own "Cuda failure" with the same
    # words stays nccl_error: nccl-cuda-failure--2.19.log above).
    ("cuda-peer-access--2.3.log", "nvlink_error", None, None),
    # Horovod 0.19 horovod/common/ops/nccl_operations.cc: op name + " failed: " +
    # ncclGetErrorString(), raised by TensorFlow 1.15 as errors_impl.UnknownError, under mpirun
    # --tag-output "[1,%d]<stderr>:" prefixes.
    ("horovod-nccl-comminit--0.19.log", "nccl_error", None, None),
    # jaxlib 0.4 xla/service/gpu/nccl_utils.cc: "NCCL operation %s failed: %s", logged by
    # runtime/support.cc "Intercepted XLA runtime error:" then XlaRuntimeError.
    ("xla-nccl-call--0.4.log", "nccl_error", None, None),
    # PyTorch 2.5 torch/csrc/distributed/c10d/socket.cpp waitForInput "[c10d] waitForInput: socket
    # %s timed out after %dms" on two ranks, under SGLang's "[%s TP%d] Scheduler hit an exception".
    ("c10d-socket-wait-timeout--2.5.log", "nccl_timeout", None, None),
    # Slurm 23.11 slurmctld (src/slurmctld/ping_nodes.c "Nodes %s not responding, setting DOWN",
    # job_mgr.c "Killing %pJ on failed node %s", "requeue job %pJ due to failure of node %s")
    # pasted after a job log that stops without an error.
    ("slurmctld-requeue-node-failure--23.11.log", "slurm_node_failure", None, None),
    # Slurm 23.11 `sinfo -R` (default "%50E %9u %19H %N") with slurmctld's "Not responding" reason.
    ("slurm-sinfo-not-responding--23.11.log", "slurm_node_failure", None, None),
    # The same table with a site's free-text drain reason beside a finished run: no failure.
    ("slurm-sinfo-site-reason--23.11.log", "no_failure", None, None),
    # PyTorch 2.1 aten/src/ATen/native/cuda/Indexing.cu indexSelectLargeIndex CUDA_KERNEL_ASSERT:
    # "%s:%d: %s: block: [%d,%d,%d], thread: [%d,%d,%d] Assertion `%s` failed." after ordinary
    # Lightning progress lines: a bug in the job (other), not a clean end.
    ("cuda-kernel-assert--2.1.log", "other", None, None),
    # PyTorch 2.1 ChildFailedError table collapsed onto one line, "exitcode : -9" and "Signal 9
    # (SIGKILL) received by PID", after lines showing the process's RSS growing: no line says
    # the RAM ran out (a reader may suspect it; the diagnosis does not claim it).
    ("torchrun-table-collapsed-sigkill--2.1.log", "other", None, 2),
    # A finished PyTorch 2.3 / Lightning run with c10d socket retries, NCCL INFO and a missing-metadata line.
    ("ok-noisy-run--2.3.log", "no_failure", None, None),
    # A Megatron-style fragment (NCCL INFO, iterations, a missing-metadata warning) that stops
    # before any end: neither a failure nor a success, so unknown (issue 43), never no_failure.
    ("fragment-iterations--2.3.log", "unknown", None, None),
]  # fmt: skip

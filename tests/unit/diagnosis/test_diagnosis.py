"""`gpugate diagnose`: signatures, ranking, failing rank, noise, engines and the CLI.

Every log snippet here was written for these tests from the formats in section 6 (and 1-2) of
docs/gpu-facts.md; none is copied from the corpus.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil

import pytest

from gpugate.commands import diagnose as cmd_diagnose
from gpugate.diagnosis import categories as C
from gpugate.diagnosis import engine as D
from gpugate.diagnosis import rank as R
from gpugate.diagnosis import scan as SC
from gpugate.diagnosis import signatures as S
from gpugate.diagnosis import verdict as V

HAS_GREP = shutil.which("grep") is not None
ENGINES = ["python", pytest.param("grep", marks=pytest.mark.skipif(not HAS_GREP, reason="no grep"))]

WATCHDOG_1X = (
    "[E ProcessGroupNCCL.cpp:737] [Rank {r}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=51210, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800871 milliseconds "
    "before timing out.\n"
)
WATCHDOG_22 = (
    "[rank{r}]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=88, OpType=_REDUCE_SCATTER_BASE, "
    "NumelIn=1024, NumelOut=128, Timeout(ms)=600000) ran for 600093 milliseconds before timing out.\n"
)


def all_ranks(template: str, n: int = 4) -> str:
    """The same line from every rank."""
    return "".join(template.format(r=r) for r in range(n))


TORCHRUN_SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2025-03-02_11:20:31
  host      : gpu-b12
  rank      : 6 (local_rank: 2)
  exitcode  : -6 (pid: 9120)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 9120
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-03-02_11:20:30
  host      : gpu-b12
  rank      : {rank} (local_rank: 1)
  exitcode  : {code} (pid: 9119)
  error_file: <N/A>
  traceback : {tb}
============================================================
"""


def torchrun(rank: int = 5, code: int = 1, tb: str = "To enable traceback see: https://x") -> str:
    """torchrun's ChildFailedError summary naming `rank` as the root cause."""
    return TORCHRUN_SUMMARY.format(rank=rank, code=code, tb=tb)


# (id, log text, category, xid, failing_rank)
CASES = [
    # --- nccl_timeout ---
    ("timeout-pt1x-all-ranks", "iteration 10 | loss 2.1\n" + all_ranks(WATCHDOG_1X), "nccl_timeout", None, None),
    ("timeout-pt22-all-ranks", all_ranks(WATCHDOG_22, 8), "nccl_timeout", None, None),
    # The rank whose watchdog fired waited on another: it reports the timeout, it is no origin.
    ("timeout-one-rank", WATCHDOG_22.format(r=13), "nccl_timeout", None, None),
    ("timeout-aborted-original-reason",
     "RuntimeError: NCCL communicator was aborted on rank 1.  Original reason for failure was: "
     "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=BROADCAST, "
     "Timeout(ms)=1800000) ran for 1806130 milliseconds before timing out.\n"
     "RuntimeError: NCCL communicator was aborted on rank 0.  Original reason for failure was: "
     "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=BROADCAST, "
     "Timeout(ms)=1800000) ran for 1806127 milliseconds before timing out.\n",
     "nccl_timeout", None, None),
    ("timeout-heartbeat",
     "[rank2]:[E0102 10:00:00.1 ProcessGroupNCCL.cpp:1309] [PG 0 Rank 2] Heartbeat monitor timed "
     "out! Process will be terminated after dumping debug info.\n"
     "[rank5]:[E0102 10:00:00.1 ProcessGroupNCCL.cpp:1309] [PG 0 Rank 5] Heartbeat monitor timed "
     "out! Process will be terminated after dumping debug info.\n", "nccl_timeout", None, None),
    ("timeout-teardown-distbackend",
     all_ranks(WATCHDOG_22) + "[rank1]:terminate called after throwing an instance of "
     "'c10::DistBackendError'\n[rank1]:  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process "
     "group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective "
     "operation timeout: WorkNCCL(SeqNum=88, OpType=ALLGATHER, Timeout(ms)=600000) ran for 600031 "
     "milliseconds before timing out.\n", "nccl_timeout", None, None),
    ("timeout-pt18-aborted-no-reason", all_ranks(WATCHDOG_1X, 2) + "RuntimeError: NCCL "
     "communicator was aborted on rank 0.\nRuntimeError: NCCL communicator was aborted on rank 1.\n",
     "nccl_timeout", None, None),
    ("timeout-torchrun-sigabrt", all_ranks(WATCHDOG_22) + torchrun(rank=0, code=-6,
     tb="Signal 6 (SIGABRT) received by PID 9119"), "nccl_timeout", None, None),
    # --- nccl_error ---
    ("nccl-error-old-system",
     "    work = default_pg.barrier(opts=opts)\nRuntimeError: NCCL error in: /opt/conda/torch/lib/c10d/"
     "ProcessGroupNCCL.cpp:911, unhandled system error, NCCL version 2.10.3\n"
     "ncclSystemError: System call (socket, malloc, munmap, etc) failed.\n", "nccl_error", None, None),
    ("nccl-error-remote-rank",
     "[rank5]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
     "NCCLUtils.hpp:275, remote process exited or there was a network error, NCCL version 2.21.5\n"
     "[rank5]: ncclRemoteError: A call failed possibly due to a network error or a remote process "
     "exiting prematurely.\n[rank5]: Last error:\n", "nccl_error", None, None),  # a victim
    ("nccl-error-what", "terminate called after throwing an instance of 'std::runtime_error'\n"
     "  what():  NCCL error: unhandled cuda error, NCCL version 2.8.4\n", "nccl_error", None, None),
    ("nccl-error-2-old", "RuntimeError: NCCL Error 2: unhandled system error\n", "nccl_error", None, None),
    ("nccl-segfault-kernel", "kern  :warn  : 2025-02-11T01:02:03,000001+00:00 pt_main_thread[77]: "
     "segfault at 7f00aa ip 00007f0011 sp 00007f0022 error 4 in libnccl.so.2[7f0000+d3d3000]\n",
     "nccl_error", None, None),
    ("nccl-warn-ib-before-timeouts",
     "gpu-a3:2211:2290 [1] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer "
     "10.10.0.7<47221> with error 12, opcode 32753, len 0, vendor err 129 (Recv)\n"
     + all_ranks(WATCHDOG_22), "nccl_error", None, None),
    # --- cuda_oom ---
    ("oom-pt112", "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB "
     "total capacity; 14.51 GiB already allocated; 3.75 MiB free; 14.71 GiB reserved in total by "
     "PyTorch)\n", "cuda_oom", None, None),
    ("oom-pt20-rank", "[rank2]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate "
     "1.50 GiB (GPU 2; 39.39 GiB total capacity; 36.1 GiB already allocated; 800.12 MiB free; 37.2 "
     "GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
     "max_split_size_mb\n", "cuda_oom", None, 2),
    ("oom-pt21-capacty", "[default1]:torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to "
     "allocate 96.00 MiB. GPU 1 has a total capacty of 79.15 GiB of which 30.44 MiB is free.\n",
     "cuda_oom", None, 1),
    ("oom-pt25", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has "
     "a total capacity of 23.55 GiB of which 2.1 GiB is free. If reserved but unallocated memory is "
     "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n", "cuda_oom", None, None),
    ("oom-cuda-error", "    torch.distributed.barrier()\nRuntimeError: CUDA error: out of memory\n",
     "cuda_oom", None, None),
    ("oom-nccl-cuda-failure", "gpu-c1:311:311 [3] include/alloc.h:48 NCCL WARN Cuda failure 'out of "
     "memory'\n", "cuda_oom", None, None),
    ("oom-tensorflow", "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when "
     "allocating tensor with shape[8192,8192] and type float on /job:localhost/replica:0/task:0/"
     "device:GPU:0 by allocator GPU_0_bfc\n", "cuda_oom", None, None),
    ("oom-one-rank-others-timeout",
     "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
     "total capacity of 79.1 GiB of which 1.0 GiB is free.\n" + all_ranks(WATCHDOG_22, 8),
     "cuda_oom", None, 3),
    # --- host_oom ---
    ("host-kernel-oom", "[812345.123] python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE"
     "|__GFP_COMP), order=0, oom_score_adj=0\n[812345.130] oom-kill:constraint=CONSTRAINT_MEMCG,"
     "nodemask=(null),cpuset=step_0,mems_allowed=0-1,oom_memcg=/slurm/uid_1000/job_42,task_memcg="
     "/slurm/uid_1000/job_42/step_0,task=python,pid=7781,uid=1000\n[812345.131] Memory cgroup out of "
     "memory: Killed process 7781 (python) total-vm:91234567kB, anon-rss:81234567kB, file-rss:0kB\n",
     "host_oom", None, None),
    ("host-kernel-oom-old", "Out of memory: Kill process 4321 (python) score 912 or sacrifice child\n"
     "Killed process 4321 (python) total-vm:12345kB, anon-rss:11111kB, file-rss:0kB\n",
     "host_oom", None, None),
    ("host-slurm-old", "slurmstepd: error: Detected 2 oom-kill event(s) in step 3756240.batch cgroup.\n",
     "host_oom", None, None),
    ("host-slurm-2205", "slurmstepd: error: Detected 1 oom_kill event in StepId=440575.0. Some of "
     "the step tasks have been OOM Killed.\nsrun: error: gpu-d4: task 0: Out Of Memory\n",
     "host_oom", None, None),
    ("host-slurm-recent", "[2026-03-28T14:27:13.072] error: Detected 1 oom_kill event in "
     "StepId=9.0. Some of the step tasks have been OOM Killed.\n", "host_oom", None, None),
    ("host-mem-limit", "slurmstepd: error: StepId=7.batch exceeded memory limit (734003200 > "
     "52428800), being killed\n", "host_oom", None, None),
    ("host-sigkill-attributed", all_ranks(WATCHDOG_22) + "[9912.1] Out of memory: Killed process "
     "9119 (python3) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:1000\n"
     + torchrun(rank=1, code=-9, tb="Signal 9 (SIGKILL) received by PID 9119"), "host_oom", None, 1),
    ("host-dataloader", "RuntimeError: DataLoader worker (pid 28817) is killed by signal: Killed.\n",
     "host_oom", None, None),
    ("host-cpu-alloc", "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: "
     "not enough memory: you tried to allocate 412316860416 bytes.\n", "host_oom", None, None),
    # --- gpu_xid_hardware ---
    ("xid79-plain", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n",
     "gpu_xid_hardware", 79, None),
    ("xid79-legacy-no-pci", "[ 1843.308145] NVRM: Xid (0000:b1:00): 79, GPU has fallen off the bus.\n",
     "gpu_xid_hardware", 79, None),
    ("xid79-syslog-under-timeouts", all_ranks(WATCHDOG_1X) + "Jun  4 02:11:09 gpu-a7 kernel: "
     "[99.1] NVRM: Xid (PCI:0000:b1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the "
     "bus.\n", "gpu_xid_hardware", 79, None),
    ("xid119-dmesg-T", "[Mon Jan  6 03:02:01 2025] NVRM: Xid (PCI:0000:4e:00): 119, pid=8812, "
     "name=python3, Timeout after 6s of waiting for RPC response from GPU2 GSP! Expected function 76 "
     "(GSP_RM_CONTROL) (0x20800a4c 0x4).\n", "gpu_xid_hardware", 119, None),
    ("xid62-iso", "kern  :warn  : 2025-01-21T08:41:30,287197+00:00 NVRM: Xid (PCI:0000:1a:00): 62, "
     "pid=1, name=python, 0000(0000) 00000000 00000000\n", "gpu_xid_hardware", 62, None),
    ("fallen-off-multiline-no-xid", "NVRM: The NVIDIA GPU 0000:b3:00.0\n      NVRM: (PCI ID: "
     "10de:2330) installed in this system has\n      NVRM: fallen off the bus and is not "
     "responding to commands.\n", "gpu_xid_hardware", None, None),
    ("smi-gpu-lost", "Unable to determine the device handle for GPU 0000:91:00.0: Unknown Error\n",
     "gpu_xid_hardware", None, None),
    ("rm-init-failed", "NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)\n",
     "gpu_xid_hardware", None, None),
    ("xid45-caused-by-79", "NVRM: Xid (PCI:0000:9a:00): 45, pid=2001, name=python3, Ch 00000010 "
     "caused by previous Xid 79\n", "gpu_xid_hardware", 79, None),
    ("xid79-then-sxid", "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has "
     "fallen off the bus.\nnvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 12 LTSSM "
     "Fault Up\n", "gpu_xid_hardware", 79, None),
    ("first-fatal-after-minor-63", "NVRM: Xid (PCI:0000:10:00): 63, pid=7, Row Remapper: New row "
     "marked for remapping, reset gpu to activate\nNVRM: Xid (PCI:0000:10:00): 79, GPU has fallen "
     "off the bus.\n", "gpu_xid_hardware", 79, None),
    # --- ecc_error ---
    ("xid48-dbe", "NVRM: Xid (PCI:0000:c3:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
     "double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x3f0 "
     "partition 2, subpartition 0.\n", "ecc_error", 48, None),
    ("xid63-alone", "Mar 3 01:02:03 gpu-e2 kernel: [5.5] NVRM: Xid (PCI:0000:10:00): 63, pid=42, "
     "Row Remapper: New row marked for remapping, reset gpu to activate\n", "ecc_error", 63, None),
    ("xid95", "NVRM: Xid (PCI:0000:41:00): 95, pid=5, name=python, Uncontained: FBHUB. RST: Yes, "
     "D-RST: No\n", "ecc_error", 95, None),
    ("ecc-cuda-under-watchdog", all_ranks(WATCHDOG_1X) + "RuntimeError: transform: failed to "
     "synchronize: cudaErrorECCUncorrectable: uncorrectable ECC error encountered\n"
     "  what():  CUDA error: uncorrectable ECC error encountered\n", "ecc_error", None, None),
    ("ecc-first-then-79", "NVRM: Xid (PCI:0000:c3:00): 48, DBE\nNVRM: Xid (PCI:0000:c3:00): 79, GPU "
     "has fallen off the bus.\n", "ecc_error", 48, None),
    ("ecc-slurm", "slurmstepd: error: *** JOB 55 ON gpu-a1 UNCORRECTABLE MEMORY ERROR AT "
     "2024-04-04T04:04:04 ***\n", "ecc_error", None, None),
    # --- nvlink_error ---
    ("xid74", "NVRM: Xid (PCI:0000:b7:00): 74, pid=3, name=python, NVLink: fatal error detected on "
     "link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)\n", "nvlink_error", 74, None),
    ("sxid-fatal", "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Fatal, Link 44 egress "
     "non-posted PRIV error (First)\n", "nvlink_error", None, None),
    ("xid45-caused-by-149", "NVRM: Xid (PCI:0000:dc:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 07 "
     "(0x00000000 0x00000000 0x00000000)\nNVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, "
     "Ch 00000001 caused by previous Xid 149\n", "nvlink_error", 149, None),
    ("xid45-only-caused-by-149", "NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=python3, Ch 00000001 "
     "caused by previous Xid 149\n", "nvlink_error", 149, None),
    ("fabric-manager-fatal", "[Feb 27 2025 15:10:02] [INFO] [tid 1808] multicast group 1 is freed.\n"
     "[Feb 27 2025 15:10:02] [ERROR] [tid 12727] detected NVSwitch fatal error 12028 on fid 0 on "
     "NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61\n", "nvlink_error", None, None),
    ("nvlink-cuda", "RuntimeError: CUDA error: uncorrectable NVLink error detected during the "
     "execution\n", "nvlink_error", None, None),
    # --- gpu_xid_user_app ---
    ("xid13", "NVRM: Xid (PCI:0000:70:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 1, SM 1): "
     "Out Of Range Address\nRuntimeError: CUDA error: an illegal memory access was encountered\n",
     "gpu_xid_user_app", 13, None),
    ("xid31-mmu", "NVRM: Xid (PCI:0000:3b:00): 31, pid=13705, name=python, channel 0x0000000c, intr "
     "00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of "
     "type FAULT_PDE ACCESS_TYPE_VIRT_READ\n" + all_ranks(WATCHDOG_22), "gpu_xid_user_app", 31, None),
    ("xid43", "NVRM: Xid (PCI:0000:18:00): 43, pid=812, name=python, Ch 00000008\n",
     "gpu_xid_user_app", 43, None),
    # --- illegal_memory_access ---
    ("ima-runtime", "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel "
     "errors might be asynchronously reported at some other API call, so the stacktrace below might "
     "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n",
     "illegal_memory_access", None, None),
    ("ima-watchdog", "[rank4]:[E ProcessGroupNCCL.cpp:1182] [Rank 4] NCCL watchdog thread terminated "
     "with exception: CUDA error: an illegal memory access was encountered\n" + all_ranks(WATCHDOG_22),
     "illegal_memory_access", None, 4),
    ("ima-accelerator-error", "torch.AcceleratorError: CUDA error: an illegal memory access was "
     "encountered\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n",
     "illegal_memory_access", None, None),
    # --- slurm_time_limit ---
    ("time-limit-with-fallout",
     " iteration 300/ 1000 | lm loss: 3.1E+00 |\nslurmstepd: error: *** STEP 991.0 ON node-07 "
     "CANCELLED AT 2023-07-01T12:00:05 DUE TO TIME LIMIT ***\nslurmstepd: error: *** JOB 991 ON "
     "node-07 CANCELLED AT 2023-07-01T12:00:05 DUE TO TIME LIMIT ***\nsrun: Job step aborted: "
     "Waiting up to 32 seconds for job step to finish.\n" + all_ranks(WATCHDOG_22)
     + "RuntimeError: NCCL communicator was aborted on rank 2.\n" + torchrun(rank=2, code=-15),
     "slurm_time_limit", None, None),
    ("time-limit-lightning", "[rank: 0] Received SIGTERM: 15\nBypassing SIGTERM: 15\n"
     "slurmstepd-gpu-a2: error: *** JOB 12 ON gpu-a2 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME "
     "LIMIT ***\n", "slurm_time_limit", None, None),
    ("time-limit-recent-prefix", "[2025-06-01T10:00:00.123] error: *** JOB 77 ON gpu-a1 CANCELLED "
     "AT 2025-06-01T10:00:00 DUE TO TIME LIMIT ***\n", "slurm_time_limit", None, None),
    # --- slurm_node_failure ---
    ("node-failure-after-cuda",
     "terminate called after throwing an instance of 'c10::CUDAError'\n  what():  CUDA error: "
     "unknown error\nException raised from query at CUDAEvent.h:91\n"
     "srun: error: Node failure on gpu-x19\nsrun: Job step aborted: Waiting up to 62 seconds\n",
     "slurm_node_failure", None, None),
    ("node-failure-slurmstepd", "slurmstepd: error: *** STEP 8.0 ON gpu-x1 CANCELLED AT "
     "2023-03-06T03:17:51 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n",
     "slurm_node_failure", None, None),
    ("node-failure-old", "slurmstepd: error: *** JOB 8 ON gpu-x1 CANCELLED AT 2019-03-06T03:17:51 "
     "DUE TO NODE FAILURE ***\n", "slurm_node_failure", None, None),
    # --- slurm_cancelled ---
    ("scancel", " iteration 20/ 100 |\nsrun: Job step aborted: Waiting up to 62 seconds for job step "
     "to finish.\nslurmstepd: error: *** STEP 5.0 ON r1n1 CANCELLED AT 2022-05-23T08:46:02 ***\n"
     "Main process received SIGTERM, exiting\nslurmstepd: error: *** JOB 5 ON r1n1 CANCELLED AT "
     "2022-05-23T08:46:02 ***\n", "slurm_cancelled", None, None),
    ("scancel-very-old", "slurmstepd: *** JOB 1479012 CANCELLED AT 2015-02-04T06:33:25 *** on "
     "sh-2-3\n", "slurm_cancelled", None, None),
    ("preempted", "slurmstepd: error: *** JOB 9 ON gpu-a1 CANCELLED AT 2024-01-01T00:00:00 DUE TO "
     "PREEMPTION ***\n", "slurm_cancelled", None, None),
    ("requeue", "slurmstepd: error: *** JOB 9 ON gpu-a1 CANCELLED AT 2024-01-01T00:00:00 DUE TO JOB "
     "REQUEUE ***\n", "slurm_cancelled", None, None),
    ("cancel-signal", "slurmstepd: error: *** JOB 9 ON gpu-a1 CANCELLED AT 2024-01-01T00:00:00 DUE to "
     "SIGNAL Terminated ***\n", "slurm_cancelled", None, None),
    # --- other ---
    ("unspecified-launch-failure", "RuntimeError: CUDA error: unspecified launch failure\n",
     "other", None, None),
    ("sigsegv-torchrun", torchrun(rank=3, code=-11, tb="Signal 11 (SIGSEGV) received by PID 9119"),
     "other", None, 3),
    ("sigsegv-bash", "/var/spool/slurmd/job42/slurm_script: line 31: 5150 Segmentation fault "
     "(core dumped) python train.py\n", "other", None, None),
    ("bare-childfailed", "E0801 13:23:20.000000 32974 torch/distributed/elastic/multiprocessing/"
     "api.py:874] failed (exitcode: 1) local_rank: 1 (pid: 33054) of binary: /usr/bin/python3\n"
     + torchrun(rank=1, code=1), "other", None, 1),
    # The agent names the local rank that failed (one node: the rank).
    ("childfailed-old-agent", "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: "
     "1) local_rank: 0 (pid: 130182) of binary: /usr/bin/python3.8\n", "other", None, 0),
    ("accelerate-died-sigkill", "subprocess.CalledProcessError: Command '['python', 'train.py']' "
     "died with <Signals.SIGKILL: 9>.\n", "other", None, None),
    # A SIGKILL that no line explains: `other` (rule 5: host_oom only where a line names the
    # RAM); the summary names the OOM killer as the usual sender, to be confirmed.
    ("sigkill-without-kill-line", torchrun(rank=0, code=-9, tb="Signal 9 (SIGKILL) received by PID 2198"),
     "other", None, 0),
    ("deepspeed-exit", "[2023-04-14 13:11:27,879] [INFO] [launch.py:428:sigkill_handler] Killing "
     "subprocess 13266\n[2023-04-14 13:11:27,880] [ERROR] [launch.py:434:sigkill_handler] "
     "['/usr/bin/python3', '-u', 'main.py', '--local_rank=0'] exits with return code = 1\n",
     "other", None, None),
    ("python-exception", "Traceback (most recent call last):\n  File \"train.py\", line 3, in "
     "<module>\n    main()\nKeyError: 'labels'\n", "other", None, None),
    ("shell-killed-without-kill-line", "/var/spool/slurmd/job9/slurm_script: line 20: 31337 Killed"
     "                  python train.py --config big.yaml\n", "other", None, None),
    ("bus-error-shm", "ERROR: Unexpected bus error encountered in worker. This might be caused by "
     "insufficient shared memory (shm).\n", "other", None, None),
    ("cuda-unknown-error", "  what():  CUDA error: unknown error\n", "other", None, None),
    ("xid45-alone", "NVRM: Xid (PCI:0000:9a:00): 45, pid=2001, name=python3, Ch 00000010\n",
     "other", 45, None),
]  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("text", "category", "xid", "rank"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_case(tmp_path, engine, text, category, xid, rank):
    d = diagnose_text(tmp_path, text, engine)
    got = (d.category, d.xid, d.failing_rank)
    assert got == (category, xid, rank), d.to_json()
    assert d.evidence, "a failure needs evidence"


def diagnose_text(tmp_path, text: str | bytes, engine: str = "python") -> V.Diagnosis:
    """Write the log to a file and diagnose it with one engine."""
    log = tmp_path / "job.log"
    log.write_bytes(text.encode() if isinstance(text, str) else text)
    return D.diagnose([str(log)], engine=engine)


def test_every_category_has_a_case():
    covered = {c[2] for c in CASES} | {"no_failure", "unknown"}
    assert covered == set(C.CATEGORIES)
    assert set(R.TIERS) | {"no_failure", "unknown"} == set(C.CATEGORIES) == set(C.EXPLAIN)


# The closed set of categories (docs/interfaces.md), in its order.
DESIGN_CATEGORIES = (
    "nccl_timeout", "nccl_error", "cuda_oom", "host_oom", "gpu_xid_hardware", "gpu_xid_user_app",
    "ecc_error", "nvlink_error", "illegal_memory_access", "slurm_time_limit",
    "slurm_node_failure", "slurm_cancelled", "no_failure", "other", "unknown",
)  # fmt: skip


def test_one_table_says_whose_fault_each_category_is():
    assert C.CATEGORIES == DESIGN_CATEGORIES
    hardware = {"ecc_error", "nvlink_error", "gpu_xid_hardware"}
    assert hardware == C.HARDWARE_CATEGORIES
    assert hardware | {"slurm_node_failure"} == C.INFRASTRUCTURE_CATEGORIES
    assert {"nccl_timeout", "nccl_error"} == C.SYMPTOM_CATEGORIES
    assert C.kind("cuda_oom") == C.USER and C.kind("nope") is None
    # unknown is neither a clean end nor anyone's fault: never hardware, never infrastructure.
    assert C.kind("unknown") == C.UNDETERMINED != C.kind("no_failure")
    assert not C.is_hardware("unknown") and not C.is_infrastructure("unknown")
    # Hardware outranks everything a job prints after it: the top tier is the hardware kind.
    top = max(R.TIERS.values())
    assert {c for c, t in R.TIERS.items() if t == top} == C.HARDWARE_CATEGORIES


# --- the signature table itself ---------------------------------------------------------------


@pytest.mark.parametrize("sig", S.SIGNATURES, ids=lambda s: s.name)
def test_signature_example_matches_and_passes_prefilter(sig):
    assert sig.pattern.search(S.clean(sig.example.encode())[0]), sig.example
    assert any(a in sig.example for a in sig.anchors), "example must contain one of its anchors"
    assert set(sig.anchors) <= set(S.ANCHORS)
    m = S.match_segment(sig.example.encode())
    assert m is not None and m.signature == sig.name, m


def test_signature_names_unique_and_categories_closed():
    names = [s.name for s in S.SIGNATURES]
    assert len(names) == len(set(names))
    assert {s.category for s in S.SIGNATURES} - {None} <= set(C.CATEGORIES)


def test_grep_reads_every_key_as_python_does():
    # Python looks for a key with `in`; grep gets one ERE alternation with metacharacters
    # bracketed. Each key as ERE must match exactly the key's own text (a dot no wildcard).
    import re

    assert all(a and "\n" not in a for a in S.ANCHORS)
    assert len(S.ALTERNATION.split("|")) == len(S.ANCHORS)
    pieces = S.GREP_ERE.split("|")
    assert len(pieces) == len(S.KEYS)
    for key, ere in zip(S.KEYS, pieces):
        assert re.fullmatch(ere, key), (key, ere)
        assert not re.search(ere, key.replace(".", "x")) or "." not in key
    # Every anchor holds a key: the keys' lines are a superset of the anchors' lines.
    assert all(any(k in a for k in S.KEYS) for a in S.ANCHORS)


# --- ranking and failing rank ------------------------------------------------------------------


def test_error_before_time_limit_wins(tmp_path):
    text = (
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n"
        + all_ranks(WATCHDOG_22)
        + "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***\n"
    )
    d = diagnose_text(tmp_path, text)
    assert (d.category, d.failing_rank) == ("cuda_oom", 1)


def test_handled_error_then_finished_run_is_no_failure(tmp_path):
    text = (
        'Traceback (most recent call last):\n  File "hub.py", line 9, in fetch\n'
        "FileNotFoundError: [Errno 2] No such file or directory: 'cache/tokenizer.json'\n" + HEALTHY
    )
    assert diagnose_text(tmp_path, text).category == "no_failure"
    # ...but not when the error is specific, nor when the run never finished.
    assert (
        diagnose_text(tmp_path, "RuntimeError: CUDA error: out of memory\n" + HEALTHY).category
        == "cuda_oom"
    )
    assert diagnose_text(tmp_path, HEALTHY + "KeyError: 'labels'\n").category == "other"


def test_precursor_after_first_fatal_is_ignored(tmp_path):
    text = all_ranks(WATCHDOG_22) + (
        "gpu-a1:1:1 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.1<1> with error 5, "
        "opcode 0, len 0, vendor err 249\n"
    )
    assert diagnose_text(tmp_path, text).category == "nccl_timeout"


def test_timeout_every_rank_has_no_failing_rank_but_says_how_many(tmp_path):
    d = diagnose_text(tmp_path, all_ranks(WATCHDOG_22, 16))
    assert d.failing_rank is None
    assert "16 ranks" in d.summary


def test_unprefixed_oom_takes_the_torchrun_root_cause_rank(tmp_path):
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n"
    d = diagnose_text(tmp_path, oom + torchrun(rank=6, code=1))
    assert (d.category, d.failing_rank) == ("cuda_oom", 6)
    assert any("Root Cause" in e.text for e in d.evidence)


def test_oom_on_several_ranks_names_no_rank(tmp_path):
    oom = "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n"
    d = diagnose_text(tmp_path, oom.format(r=2) + oom.format(r=6) + torchrun(rank=6, code=1))
    assert (d.category, d.failing_rank) == ("cuda_oom", None)


def test_gpu_index_is_not_a_rank(tmp_path):
    d = diagnose_text(tmp_path, "torch.OutOfMemoryError: CUDA out of memory. GPU 5 has a total "
                      "capacity of 79 GiB of which 1 GiB is free.\n")  # fmt: skip
    assert d.failing_rank is None


def test_pdsh_and_ray_prefixes_are_stripped(tmp_path):
    text = (
        "192.168.13.81: [rank7]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "(RayWorkerVllm pid=7046) INFO: loading weights\n"
    )
    d = diagnose_text(tmp_path, text)
    assert (d.category, d.failing_rank) == ("illegal_memory_access", 7)
    assert d.evidence[0].text.startswith("RuntimeError: CUDA error")


# --- no failure and noise ----------------------------------------------------------------------

HEALTHY = (
    "gpu-a1:812:903 [0] NCCL INFO Bootstrap : Using ib0:10.1.1.1<0>\n"
    "gpu-a1:812:903 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.1.1.1<0>\n"
    "gpu-a1:812:903 [0] NCCL INFO comm 0x55d0 rank 0 nranks 16 cudaDev 0 busId 18000 - Init COMPLETE\n"
    "gpu-a1:812:903 [0] NCCL INFO Channel 00/02 : 0[18000] -> 1[2a000] via P2P/IPC/read\n"
    "gpu-a1:812:903 [0] NCCL WARN Call to connect returned Connection refused, retrying\n"
    "WARNING: could not find the metadata file /ckpt/latest_checkpointed_iteration.txt\n"
    "    will not load any checkpoints and will start from random\n"
    "/usr/lib/python3/dist-packages/torch/utils/checkpoint.py:31: UserWarning: None of the inputs "
    "have requires_grad=True. Gradients will be None\n"
    "[W socket.cpp:601] [c10d] The client socket has failed to connect to [gpu-a1]:29500 "
    "(errno: 99 - Cannot assign requested address).\n"
    "wandb: Network error (ConnectionError), entering retry loop.\n"
    " iteration       10/    1000 | lm loss: 8.1E+00 | loss scale: 4096.0 | number of skipped "
    "iterations:   0 | number of nan iterations:   0 |\n"
    "\x1b[32m 50%|#####     | 8/16 [07:39<07:40, 57.45s/it]\x1b[0m\r100%|##########| 16/16 "
    "[15:19<00:00, 57.45s/it]\n"
    "{'train_runtime': 919.1, 'train_samples_per_second': 1.088, 'epoch': 1.0}\n"
    "`Trainer.fit` stopped: `max_steps=400` reached.\n"
    "Training completed. Do not forget to share your model on huggingface.co/models =)\n"
)


@pytest.mark.parametrize("engine", ENGINES)
def test_noisy_healthy_log_is_no_failure(tmp_path, engine):
    d = diagnose_text(tmp_path, HEALTHY * 50, engine)
    assert (d.category, d.xid, d.failing_rank, d.evidence) == ("no_failure", None, None, ())


@pytest.mark.parametrize("engine", ENGINES)
def test_ansi_progress_bars_binary_junk_and_long_lines(tmp_path, engine):
    junk = bytes(range(256)) * 40 + b"\xff\xfe\x00garbage\n"
    long_bar = b"".join(b"\x1b[34m%3d%%|###| step %d\x1b[0m\r" % (i % 100, i) for i in range(40000))
    assert len(long_bar) > 1_000_000
    text = (
        HEALTHY.encode()
        + junk
        + long_bar
        + b"\x1b[31m[rank6]: torch.OutOfMemoryError: CUDA out of \x1b[1mmemory\x1b[0m. GPU 6\x1b[0m\n"
        + b"\xc3\x28 trailing invalid utf-8 \xa0\xa1\n"
    )
    d = diagnose_text(tmp_path, text, engine)
    assert (d.category, d.failing_rank) == ("cuda_oom", 6)
    (ev,) = d.evidence
    assert "\x1b" not in ev.text and "\r" not in ev.text
    assert ev.line == (HEALTHY.encode() + junk).count(b"\n") + 1  # on the progress bar's line
    assert len(ev.text) <= S.TEXT_MAX


@pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`
def test_error_inside_a_giant_line_without_newline(tmp_path):
    # Longer than LINE_MAX: matched in fragments, never held whole.
    bar = b"0%|          | 0/9 [00:00<?, ?it/s]\r" * (SC.LINE_MAX // 36 + 1000)
    text = (
        b"ok\n"
        + bar
        + b"RuntimeError: CUDA error: an illegal memory access was encountered\r"
        + bar
    )
    d = diagnose_text(tmp_path, text)
    assert d.category == "illegal_memory_access"
    assert d.evidence[0].line == 2


def test_line_numbers_count_across_chunks(tmp_path):
    filler = b"iteration 1 | loss 2.0\n" * (3 * SC.CHUNK // 23)
    text = filler + b"srun: error: Node failure on gpu-q1\n"
    d = diagnose_text(tmp_path, text)
    assert (d.category, d.evidence[0].line) == ("slurm_node_failure", filler.count(b"\n") + 1)


# --- engines -----------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_GREP, reason="no grep")
def test_engines_agree_on_every_case(tmp_path):
    text = "".join(c[1] for c in CASES)
    a = diagnose_text(tmp_path, text, "python").to_json()
    b = diagnose_text(tmp_path, text, "grep").to_json()
    for out in (a, b):
        for f in out.pop("files"):
            assert f["error"] is None
    assert a == b


def test_missing_grep_falls_back_to_python(tmp_path, monkeypatch):
    monkeypatch.setattr(SC, "_find_grep", lambda: None)
    d = diagnose_text(tmp_path, WATCHDOG_22.format(r=1), "auto")
    assert d.category == "nccl_timeout"
    assert d.files[0].engine == "python"


def test_gzip_log(tmp_path):
    log = tmp_path / "job.log.gz"
    log.write_bytes(gzip.compress(HEALTHY.encode() + b"RuntimeError: CUDA error: out of memory\n"))
    d = D.diagnose([str(log)])
    assert d.category == "cuda_oom"
    assert d.files[0].engine == "python+gzip"


def test_several_files_kernel_log_beside_job_log(tmp_path):
    job = tmp_path / "job.out"
    job.write_text(all_ranks(WATCHDOG_1X))
    kern = tmp_path / "dmesg.txt"
    kern.write_text("[77.7] NVRM: Xid (PCI:0000:18:00): 94, pid=9, name=python, Contained: SM\n")
    d = D.diagnose([str(job), str(kern)])
    assert (d.category, d.xid) == ("ecc_error", 94)
    assert d.evidence[0].file == str(kern)


# --- CLI ---------------------------------------------------------------------------------------


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = cmd_diagnose.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json_contract(tmp_path, capsys):
    log = tmp_path / "job.log"
    log.write_text(
        all_ranks(WATCHDOG_22)
        + "[1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
    )
    rc, out, _ = run_cli(capsys, ["--json", str(log)])
    d = json.loads(out)
    assert rc == 0
    assert {"category", "xid", "failing_rank", "evidence", "summary", "signals", "files"} <= set(d)
    assert (d["category"], d["xid"], d["failing_rank"]) == ("gpu_xid_hardware", 79, None)
    assert all(isinstance(e, str) for e in d["evidence"])
    assert "Xid" in d["evidence"][0]
    assert d["signals"]["nccl_timeout"] == 4


def test_cli_human_report(tmp_path, capsys):
    log = tmp_path / "job.log"
    log.write_text(HEALTHY + "srun: error: Node failure on gpu-q1\n")
    rc, out, _ = run_cli(capsys, [str(log)])
    assert rc == 0
    assert "slurm_node_failure" in out
    assert "what to do:" in out
    assert f"{log}:{HEALTHY.count(chr(10)) + 1}: srun: error: Node failure on gpu-q1" in out


def test_cli_no_failure_exits_zero(tmp_path, capsys):
    log = tmp_path / "ok.log"
    log.write_text(HEALTHY)
    rc, out, _ = run_cli(capsys, ["--json", str(log)])
    assert (rc, json.loads(out)["category"]) == (0, "no_failure")


def test_cli_missing_file_is_reported_and_others_read(tmp_path, capsys):
    log = tmp_path / "job.log"
    log.write_text("RuntimeError: CUDA error: unspecified launch failure\n")
    missing = tmp_path / "nope.log"
    rc, out, err = run_cli(capsys, ["--json", str(missing), str(log)])
    assert rc == 2
    assert f"cannot read {missing}" in err
    d = json.loads(out)
    assert d["category"] == "other"
    assert d["errors"] == [f"{missing}: No such file or directory"]


def test_cli_only_unreadable_files(tmp_path, capsys):
    rc, out, err = run_cli(capsys, [str(tmp_path / "a.log"), str(tmp_path)])
    assert (rc, out) == (2, "")
    assert err.count("cannot read") == 2


def test_cli_stdin(monkeypatch, capsys):
    data = b"[rank2]: RuntimeError: NCCL error in: x.cpp:1, internal error, NCCL version 2.18.1\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    rc, out, _ = run_cli(capsys, ["--json", "-"])
    d = json.loads(out)
    # An NCCL error is a symptom: the rank printing it is not named as the origin.
    assert (rc, d["category"], d["failing_rank"]) == (0, "nccl_error", None)
    assert d["files"][0]["path"] == "<stdin>"


def test_cli_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cmd_diagnose.main([])
    assert exc.value.code == 2


# --- where each line came from: a job's own output is never hardware evidence ----------------

FAKE_XID79 = "[1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
REAL_XID48 = "[9.0] NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU.\n"


def test_a_job_printing_xid_79_gets_its_other_lines_judged_and_the_claim_reported(tmp_path):
    job = tmp_path / "job.out"
    job.write_text(all_ranks(WATCHDOG_22) + FAKE_XID79 * 3)
    d = D.diagnose([str(job)], sources=[V.JOB_FILE])
    assert (d.category, d.xid, d.decided_by, d.trusted) == ("nccl_timeout", None, "job file", False)
    assert "gpu_xid_hardware" not in d.signals
    assert [V.claim_text(e) for e in d.untrusted] == [
        "job output claiming Xid 79 (not trusted)"
    ] * 3
    assert (d.job_output_category, d.job_output_xid) == ("gpu_xid_hardware", 79)
    out = d.to_json()
    assert out["untrusted"][0]["source"] == "job file" and out["untrusted"][0]["trusted"] is False
    assert out["job_output_category"] == "gpu_xid_hardware"
    assert "not trusted" in d.summary


def test_only_fake_hardware_lines_make_no_verdict_not_a_hardware_one():
    job = (FAKE_XID79 + "RuntimeError: CUDA error: uncorrectable ECC error encountered\n").encode()
    d = D.diagnose_streams([D.Input(name="job.out", source=V.JOB_FILE, stream=io.BytesIO(job))])
    assert (d.category, d.xid) == ("unknown", None)
    assert len(d.untrusted) == 2 and d.job_output_category == "gpu_xid_hardware"


def test_the_kernel_log_decides_beside_a_job_file_that_lies(tmp_path):
    job = tmp_path / "job.out"
    job.write_text(FAKE_XID79 + CUDA_OOM_LINE)
    kern = tmp_path / "dmesg.txt"
    kern.write_text(REAL_XID48)
    d = D.diagnose([str(job), str(kern)], sources=[V.JOB_FILE, V.KERNEL_LOG])
    assert (d.category, d.xid, d.decided_by, d.trusted) == ("ecc_error", 48, "kernel log", True)
    where = d.to_json()["evidence_locations"][0]
    assert (where["file"], where["source"], where["trusted"]) == (str(kern), "kernel log", True)


def test_an_admins_log_keeps_todays_verdict(tmp_path):
    job = tmp_path / "job.out"
    job.write_text(all_ranks(WATCHDOG_22) + FAKE_XID79)
    d = D.diagnose([str(job)])
    assert (d.category, d.xid, d.decided_by, d.untrusted) == (
        "gpu_xid_hardware",
        79,
        "log file",
        (),
    )
    assert d.to_json()["evidence_locations"][0]["source"] == "log file"


def test_sources_must_be_known_and_one_per_input(tmp_path):
    with pytest.raises(ValueError, match="one source"):
        D.diagnose([str(tmp_path / "a")], sources=["stdout"])
    with pytest.raises(ValueError, match="one source"):
        D.diagnose([str(tmp_path / "a")], sources=[])


CUDA_OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"


def test_cli_job_output_with_a_kernel_log(tmp_path, capsys):
    job = tmp_path / "job.out"
    job.write_text(CUDA_OOM_LINE + FAKE_XID79)
    kern = tmp_path / "dmesg.txt"
    kern.write_text("[1.0] kernel: nothing here\n")
    rc, out, _ = run_cli(capsys, ["--json", "--job-output", "--kernel-log", str(kern), str(job)])
    d = json.loads(out)
    assert (rc, d["category"], d["xid"], d["decided_by"]) == (0, "cuda_oom", None, "job file")
    assert d["untrusted"][0]["claim"] == "job output claiming Xid 79 (not trusted)"
    assert [f["source"] for f in d["files"]] == ["job file", "kernel log"]
    rc, out, _ = run_cli(capsys, ["--job-output", str(job)])
    assert "not trusted (printed by the job" in out and "claiming Xid 79" in out


def test_cli_kernel_log_alone_is_enough(tmp_path, capsys):
    kern = tmp_path / "dmesg.txt"
    kern.write_text(REAL_XID48)
    rc, out, _ = run_cli(capsys, ["--json", "--kernel-log", str(kern)])
    d = json.loads(out)
    assert (rc, d["category"], d["xid"], d["trusted"]) == (0, "ecc_error", 48, True)
    rc, out, _ = run_cli(capsys, ["--kernel-log", str(kern)])
    assert "[kernel log]" in out


# --- per-input budgets: only what the stream gives is diagnosed -------------------------------


def test_a_limited_stream_stops_at_its_byte_budget_on_a_sparse_file(tmp_path):
    sparse = tmp_path / "nccl.bin"
    with open(sparse, "wb") as fh:
        fh.truncate(50 * 10**9)  # 50 GB of nothing, as a job can leave it
    fd = os.open(sparse, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        stream = SC.LimitedStream(fd, size - (1 << 20), 1 << 20)
        d = D.diagnose_streams([D.Input(name=str(sparse), source=V.JOB_FILE, stream=stream,
                                        offset=size - (1 << 20))])  # fmt: skip
    finally:
        os.close(fd)
    assert d.category == "unknown"  # zeros: nothing failed, nothing ended well
    assert (d.files[0].bytes, d.files[0].stopped) == (1 << 20, None)  # the tail, to its end
    fd = os.open(sparse, os.O_RDONLY)
    try:
        stream = SC.LimitedStream(fd, 0, 1 << 20)
        assert len(stream.read(2 << 20)) == 1 << 20 and stream.read(10) == b""
        assert stream.stopped == "byte budget"
    finally:
        os.close(fd)


def test_a_limited_stream_stops_at_its_deadline(tmp_path):
    log = tmp_path / "job.out"
    log.write_text(CUDA_OOM_LINE)
    fd = os.open(log, os.O_RDONLY)
    try:
        stream = SC.LimitedStream(fd, 0, 1 << 20, seconds=0)
        d = D.diagnose_streams([D.Input(name="job.out", source=V.JOB_FILE, stream=stream)])
    finally:
        os.close(fd)
    assert (d.category, d.files[0].bytes, d.files[0].stopped) == ("unknown", 0, "time budget")


# --- families (issue 14): structure, not strings ------------------------------------------------

IB_WARN = ("gpu-c3:811:902 [5] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from "
           "peer 10.1.0.9<40221> with status=12 opcode=1 len=0 vendor err 129 (Send) hca mlx5_3\n")  # fmt: skip
WATCHDOG_LINE = ("[rank3]:[E1129 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught "
                 "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=8, "
                 "NumelOut=8, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.\n")  # fmt: skip
REMOTE_EXIT = ("[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
               "remote process exited or there was a network error, NCCL version 2.21.5\n")  # fmt: skip


def test_ib_completion_error_names_its_status(tmp_path):
    d = diagnose_text(tmp_path, IB_WARN)
    assert d.category == "nccl_error"
    assert "status 12: transport retry counter exceeded" in d.summary
    assert "vendor err 129" in d.summary


@pytest.mark.parametrize("line", [
    "h:1:1 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]\n",
    "h:1:1 [0] misc/socket.cc:540 NCCL WARN socketPollConnect: Connect to 10.0.0.2<4000> returned "
    "111(Connection refused), retrying\n",
    "h:1:1 [0] transport/net_ib.cc:110 NCCL WARN NET/IB : mlx5_0:1 Got async event : port active\n",
    "h:1:1 [0] init.cc:120 NCCL WARN NCCL_SOCKET_NTHREADS is deprecated\n",
])  # fmt: skip
def test_nccl_warn_chatter_is_no_failure(tmp_path, line):
    assert diagnose_text(tmp_path, line).category == "unknown"  # chatter alone: no end seen
    assert diagnose_text(tmp_path, line + HEALTHY).category == "no_failure"


@pytest.mark.parametrize(("line", "kind"), [
    ("h:1:1 [2] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and rank 0 both on CUDA "
     "device 1000\n", "duplicate GPU"),
    ("h:1:1 [0] transport/net_ib.cc:90 NCCL WARN NET/IB : mlx5_1:1 Got async event : port error\n",
     "async event: port error"),
    ("h:1:1 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.0.0.2<45763> failed "
     ": Software caused connection abort\n", "socket connection failure"),
    ("h:1:1 [0] proxy.cc:1519 NCCL WARN [Proxy Service 0] Failed to execute operation Connect from "
     "rank 0, retcode 2\n", "proxy failure"),
    ("*host* [0] include/socket.h:185 WARN Call to connect failed : Connection refused\n",
     "socket connection failure"),
])  # fmt: skip
def test_nccl_warn_failure_kinds(tmp_path, line, kind):
    d = diagnose_text(tmp_path, line)
    assert (d.category, d.failing_rank) == ("nccl_error", None)
    assert kind in d.summary


def test_first_nccl_symptom_is_the_root(tmp_path):
    # A timeout, then the peers' "remote process exited": the abort of that timeout.
    assert diagnose_text(tmp_path, WATCHDOG_LINE + REMOTE_EXIT).category == "nccl_timeout"
    # An IB retry-exceeded error, then the watchdog fires: the link is why.
    assert diagnose_text(tmp_path, IB_WARN + WATCHDOG_LINE).category == "nccl_error"


@pytest.mark.parametrize("text", [
    "[rank1]:[E418 01:32:50.9 ProcessGroupNCCL.cpp:1890] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
    "Received a dump signal due to a collective timeout from this local rank and we will try our "
    "best to dump the debug info.\n",
    # A terminal wrapped the watchdog's line at 80 columns.
    "[E ProcessGroupNCCL.cpp:828] [Rank 1] Watchdog caught collective\n operation timeout: "
    "WorkNCCL(SeqNum=4, OpType=ALLGATHER, Timeout(ms)=1800000) ran for 1800081 millisecon\nds\n",
    "frame #3: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<"
    "long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f0 in libtorch_cuda.so)\n",
    "torch.distributed.DistStoreError: wait timeout after 1800000ms, keys: /default_pg//cuda//0\n",
])  # fmt: skip
def test_timeout_formats(tmp_path, text):
    d = diagnose_text(tmp_path, text)
    assert (d.category, d.failing_rank) == ("nccl_timeout", None)


def test_a_scheduler_kill_explains_sigkill_and_store_timeouts(tmp_path):
    limit = "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***\n"
    sigkill = torchrun(rank=0, code=-9, tb="Signal 9 (SIGKILL) received by PID 1")
    assert diagnose_text(tmp_path, limit + sigkill).category == "slurm_time_limit"
    preempt = limit.replace("TIME LIMIT", "PREEMPTION")
    barrier = ("RuntimeError: Timed out initializing process group in store based barrier on rank: 0, "
               "for key: store_based_barrier_key:1 (world_size=8, worker_count=16)\n")  # fmt: skip
    assert diagnose_text(tmp_path, barrier + preempt).category == "slurm_cancelled"
    alone = diagnose_text(tmp_path, sigkill)
    assert alone.category == "other" and alone.confidence == "low"
    assert "SIGKILLed and no line says why" in alone.summary and "OOM killer" in alone.summary
    oom = "Out of memory: Killed process 2198 (python) total-vm:96000000kB\n"
    assert diagnose_text(tmp_path, oom + sigkill).category == "host_oom"  # a line names the RAM


def test_an_app_xid_then_a_context_switch_timeout_on_that_gpu_is_the_apps(tmp_path):
    app = "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception\n"
    ctx = "NVRM: Xid (PCI:0000:{b}:00): 109, pid=17, name=python, Ch 00000008, errorString CTX SWITCH TIMEOUT\n"
    same = diagnose_text(tmp_path, app + ctx.format(b="cb"))
    assert (same.category, same.xid) == ("gpu_xid_user_app", 13)
    other_gpu = diagnose_text(tmp_path, app + ctx.format(b="1a"))
    assert (other_gpu.category, other_gpu.xid) == ("gpu_xid_hardware", 109)


def test_ranks_from_every_format(tmp_path):
    glued = ("Epoch 1: 100%|##########| 10/10 [00:01<00:00][rank3]:RuntimeError: CUDA error: an "
             "illegal memory access was encountered\n")  # fmt: skip
    assert diagnose_text(tmp_path, glued).failing_rank == 3
    pg = ("[E ProcessGroupNCCL.cpp:1414] [PG ID 0 PG GUID 0(default_pg) Rank 5] Process group watchdog "
          "thread terminated with exception: CUDA error: unspecified launch failure\n")  # fmt: skip
    assert (diagnose_text(tmp_path, pg).category, diagnose_text(tmp_path, pg).failing_rank) == (
        "other",
        5,
    )
    agent = ("E0801 13:23:20.000000 1 torch/distributed/elastic/multiprocessing/api.py:874] failed "
             "(exitcode: 1) local_rank: 3 (pid: 33054) of binary: /usr/bin/python3\n")  # fmt: skip
    assert diagnose_text(tmp_path, agent).failing_rank == 3
    # torchrun's Root Cause names the global rank; the agent's local rank is the fallback.
    assert diagnose_text(tmp_path, agent + torchrun(rank=11, code=1)).failing_rank == 11


def test_a_failure_table_alone_is_a_failure(tmp_path):
    d = diagnose_text(tmp_path, torchrun(rank=2, code=1))
    assert (d.category, d.failing_rank) == ("other", 2)


def test_no_failure_is_sure_only_when_nothing_failure_like_was_seen(tmp_path):
    done = "step 1 loss 2.0\n{'train_runtime': 81.2, 'epoch': 3.0}\n"
    assert diagnose_text(tmp_path, done).confidence == "high"
    handled = "ValueError: bad row 17, skipped\n{'train_runtime': 81.2, 'epoch': 3.0}\n"
    d = diagnose_text(tmp_path, handled)
    assert (d.category, d.confidence) == ("no_failure", "medium")


@pytest.mark.parametrize("line", [
    "  (0) Resource exhausted: OOM when allocating tensor with shape[16,112,112,147] and type float "
    "on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n",
    "E local_client.cc:672] Execution of replica 0 failed: Resource exhausted: Out \nof memory while "
    "trying to allocate 5520758552 bytes.\n",
    "F0903 10:11:12.000 1 syncedmem.cpp:71] Check failed: error == cudaSuccess (2 vs. 0)  out of memory\n",
    "Exception in main training loop: Out of memory allocating 25,600,000 bytes (allocated so far: "
    "3,635,267,072 bytes).\n",
    # An NCCL WARN holding both "out of memory" and "of memory": both anchors are looked up.
    "h:1:1 [0] init.cu:218 WARN Cuda failure 'out of memory'\n",
])  # fmt: skip
def test_gpu_oom_in_other_frameworks(tmp_path, line):
    assert diagnose_text(tmp_path, line).category == "cuda_oom"


def test_a_rank_watchdog_names_the_rank_of_its_own_cuda_error(tmp_path):
    text = ("RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered\n"
            "what(): [PG ID 2 PG GUID 3 Rank 0] Process group watchdog thread terminated with\n")  # fmt: skip
    d = diagnose_text(tmp_path, text)
    assert (d.category, d.failing_rank) == ("illegal_memory_access", 0)


def test_a_zsh_segfault_is_a_failure(tmp_path):
    d = diagnose_text(tmp_path, "[1]    83815 segmentation fault  python train.py --cuda\n")
    assert d.category == "other"


@pytest.mark.parametrize(("text", "category", "rank"), [
    ("Exception: no valid batches in shard 3\n", "other", None),
    ("/var/spool/slurmd/job9/slurm_script: line 4: 812 Aborted (core dumped) python t.py\n", "other", None),
    ("Floating point exception (core dumped)\n", "other", None),
    ("mpirun noticed that process rank 3 with PID 0 on node gpu-a2 exited on signal 11 "
     "(Segmentation fault).\n", "other", 3),
    ("mpirun noticed that process rank 5 with PID 0 on node gpu-a2 exited on signal 9 (Killed).\n",
     "other", 5),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by "
     "peer [10.0.0.3]:29500\n", "nccl_error", None),
    ("torch.distributed.DistNetworkError: failed to recv, got 0 bytes\n", "nccl_error", None),
    ("       JobID    JobName      State ExitCode\n        4711      train  NODE_FAIL      0:0\n",
     "slurm_node_failure", None),
    ("RuntimeError: cudaMalloc failed: out of memory\n", "cuda_oom", None),
])  # fmt: skip
def test_more_launchers_and_runtimes(tmp_path, text, category, rank):
    d = diagnose_text(tmp_path, text)
    assert (d.category, d.failing_rank) == (category, rank)


def test_an_nccl_error_seen_only_as_its_return_chain(tmp_path):
    chain = "".join(f"n1:19:21 [0] NCCL INFO {f} -> 2\n"
                    for f in ("misc/socket.cc:564", "bootstrap.cc:270", "init.cc:1303"))  # fmt: skip
    assert diagnose_text(tmp_path, chain).category == "nccl_error"
    # A channel's peer ("-> 1[1]") and ncclInProgress ("-> 7") are no error.
    chatter = ("n1:19:21 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
               "n1:19:21 [0] NCCL INFO init.cc:1000 -> 7\n")  # fmt: skip
    assert diagnose_text(tmp_path, chatter).category == "unknown"


def test_the_desync_report_names_the_rank_the_others_waited_for(tmp_path):
    text = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, "
            "OpType=ALLREDUCE, Timeout(ms)=8000) ran for 8097 milliseconds before timing out.\n"
            " - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:\n"
            "     [1] finished collective #2, but didn't join collective #3 (count from 1)\n")  # fmt: skip
    d = diagnose_text(tmp_path, text)
    assert (d.category, d.failing_rank) == ("nccl_timeout", 1)


def test_nccl_2_3_socket_creation_warning(tmp_path):
    line = "include/socket.h:344 WARN Socket creation failed : Address family not supported by protocol\n"
    assert diagnose_text(tmp_path, line).category == "nccl_error"

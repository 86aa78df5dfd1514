"""The failing rank from each launcher's own shapes (issue 43, deliverable 2).

Every text below is cut from a real log (whole lines, never edited inside a line): the corpus
file or the public page is cited above each case. The rule under test: the rank is the origin's,
never the rank that only detected or relayed the failure.
"""

from __future__ import annotations

import io
import shutil

import pytest

from gpugate.diagnosis import engine as D
from gpugate.diagnosis import launchers as L
from gpugate.diagnosis import signatures as S
from gpugate.diagnosis.cleaning import clean_line
from gpugate.diagnosis.rank import Collector
from gpugate.diagnosis.scan import scan_stream

ENGINES = ["python"] + (["grep"] if shutil.which("grep") else [])

# (case id, log text, category (None: not this test's concern), failing rank)
CASES = [
    # srun --label `N: ` on a Megatron-DeepSpeed run; slurmstepd's line reaches the log under
    # task 0's label (the relay, not the origin) and srun's own line names task 2, which the
    # labels show is rank 2 (corpus/logs/572-host-oom-srun-label-megatron-ds-rank-memory-...).
    (
        "srun-label-task",
        b"> 2: [Rank 2] (after 1 iterations) memory (MB) | allocated: "
        b"7063.22802734375 | max allocated: 23105.095703125 | reserved: 35048.0 | max reserved: "
        b"35048.0\n"
        b"> 0: slurmstepd: error: Detected 1 oom_kill event in StepId=17109804.0. Some of the step "
        b"tasks have been OOM Killed.\n"
        b"> srun: error: nid008576: task 2: Out Of Memory\n"
        b"> srun: Terminating StepId=17109804.0\n",
        "host_oom",
        2,
    ),
    # The same srun lines without --label: the task may be a per-node agent, so no rank
    # (../shared/corpus/logs/333-host-oom-slurm-oom-kill-events-cgroup-then-step-cancelled).
    (
        "srun-task-unlabelled",
        b"slurmstepd: error: Detected 1 oom-kill event(s) in step "
        b"3495064.0 cgroup. Some of your processes may have been killed by the cgroup "
        b"out-of-memory handler.\n"
        b"srun: error: Orion-01-01: task 4: Out Of Memory\n",
        "host_oom",
        None,
    ),
    # Open MPI --tag-output `[1,N]<stderr>:`, here doubled
    # (corpus/logs/510-other-horovodrun-rank0-dataloader-unexpected-bus-error-shm.log).
    (
        "openmpi-tag-output",
        b"[1,0]<stderr>:ERROR: Unexpected bus error encountered in worker. "
        b"This might be caused by insufficient shared memory (shm).\n"
        b"[1,0]<stderr>:[1,0]<stderr>:Traceback (most recent call last):\n",
        "other",
        0,
    ),
    # mpirun's "rank N ... exited on signal" (alone, a SIGKILL reads as the OOM killer's: the
    # category is issue 43's first deliverable, not this test's)
    # (corpus/logs/501-other-openmpi-rank7-signal9-keras-8gpu-no-other-error.log).
    (
        "openmpi-rank-signal",
        b"mpirun noticed that process rank 7 with PID 0 on node HOSTNAME "
        b"exited on signal 9 (Killed).\n",
        None,
        7,
    ),
    # vLLM v1's `(VllmWorker rank=N pid=M)` and its logger header
    # (corpus/logs/577-nccl-unhandled-cuda-error-comminitrank-vllmworker-rank-prefix-v1.log).
    (
        "vllm-worker-rank",
        b"(VllmWorker rank=3 pid=406) ERROR 07-23 19:34:51 "
        b"[multiproc_executor.py:487] RuntimeError: NCCL error: unhandled cuda error (run with "
        b"NCCL_DEBUG=INFO for details)\n",
        "nccl_error",
        3,
    ),
    # ... and with rank 7's traceback cut off before its error: rank 7 may have failed on its
    # own, so rank 3's own error no longer names the one origin (the 577 label: no rank).
    (
        "vllm-worker-rank-other-traceback",
        b"(VllmWorker rank=3 pid=406) ERROR 07-23 19:34:51 "
        b"[multiproc_executor.py:487] RuntimeError: NCCL error: unhandled cuda error (run with "
        b"NCCL_DEBUG=INFO for details)\n"
        b"(VllmWorker rank=7 pid=410) ERROR 07-23 19:34:51 [multiproc_executor.py:487] WorkerProc "
        b"failed to start.\n"
        b"(VllmWorker rank=7 pid=410) ERROR 07-23 19:34:51 [multiproc_executor.py:487] Traceback "
        b"(most recent call last):\n",
        "nccl_error",
        None,
    ),
    # Ray's `(RayWorkerWrapper pid=N, ip=A)` names no rank
    # (corpus/logs/560-nccl-internal-error-init-device-raywokerwrapper-ip-prefix-vllm.log).
    (
        "ray-worker-wrapper",
        b"(RayWorkerWrapper pid=335, ip=10.1.0.67) ERROR 01-29 07:44:33 "
        b"worker_base.py:467] RuntimeError: NCCL error: internal error - please report this issue "
        b"to the NCCL developers\n",
        "nccl_error",
        None,
    ),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("case", "text", "category", "rank"), CASES, ids=[c[0] for c in CASES])
def test_launcher_rank(case, text, category, rank, engine, tmp_path):
    log = tmp_path / f"{case}.log"
    log.write_bytes(text)
    d = D.diagnose([str(log)], engine=engine)
    assert d.failing_rank == rank, d.to_json()
    assert category is None or d.category == category, d.to_json()


def test_mpirun_first_process_is_the_origin_not_horovods_reporter():
    # Horovod's "has been shut down" on rank 1 reports another rank's exception; mpirun names
    # the first process to exit non-zero: rank 0
    # (corpus/logs/500-other-horovod-shut-down-rank1-openmpi-first-process-rank0-exit1.log).
    text = (
        b"[1,1]<stderr>:RuntimeError: Horovod has been shut down. This was caused by an exception "
        b"on one of the ranks or an attempt to allreduce, allgather or broadcast a tensor after "
        b"one of the ranks finished execution. If the shutdown was caused by an exception, you "
        b"should see the exception in the log before the first shutdown message.\n"
        b"--------------------------------------------------------------------------\n"
        b"Primary job  terminated normally, but 1 process returned\n"
        b"a non-zero exit code. Per user-direction, the job has been aborted.\n"
        b"--------------------------------------------------------------------------\n"
        b"--------------------------------------------------------------------------\n"
        b"mpirun detected that one or more processes exited with non-zero status, thus causing\n"
        b"the job to be terminated. The first process to do so was:\n"
        b"\n"
        b"  Process name: [[50371,1],0]\n"
        b"  Exit code:    1\n"
    )
    d = D.diagnose_bytes(text)
    assert (d.category, d.failing_rank) == ("other", 0), d.to_json()
    assert "mpirun" in (d.rank_reason or "")
    # Without mpirun's block, the reporter's rank is not taken for the origin.
    alone = D.diagnose_bytes(text.split(b"\n", 1)[0] + b"\n")
    assert alone.failing_rank is None


def test_slurm_line_under_a_task_label_is_the_relay_not_the_rank():
    # srun -l on a pyxis failure: slurmstepd's own words under task 0's label
    # (corpus/logs/537-other-srun-label-pyxis-container-start-failed-spank-task-init.log).
    line = clean_line(b"0: slurmstepd: error: pyxis: container start failed with error code: 1")
    assert (line.text, line.rank, line.task) == (
        "slurmstepd: error: pyxis: container start failed with error code: 1",
        None,
        0,
    )
    # An inner rank prefix wins over srun's task label: one task per node, not per rank.
    inner = clean_line(b"0: [rank3]: Traceback (most recent call last):")
    assert (inner.rank, inner.task) == (3, 0)


def test_srun_task_lines():
    # corpus/logs/534-other-srun-mpi-pmix-osu-iallreduce-cuda-segfault-two-nodes-...: a task's
    # own end names it; srun's SIGTERM to the survivors ("Terminated") names no origin.
    assert L.srun_task("srun: error: nid006550: task 2: Segmentation fault (core dumped)") == 2
    assert L.srun_task("srun: error: nid006550: task 3: Terminated") is None
    # corpus/logs/563-slurm-step-cancelled-due-to-task-failure-srun-terminated-desi.log
    assert L.srun_task("srun: error: nid002888: tasks 0-57,59-63: Terminated") is None


def test_rank_named_in_launcher_words():
    # Cray MPICH's abort (corpus/logs/536-other-cray-mpich-error-rank0-abort-gtl-library-...).
    cray = (
        "MPICH ERROR [Rank 0] [job id 410301.1] [Thu Feb 13 12:42:18 2025] [nid005414] - "
        "Abort(-1) (rank 0 in comm 0): MPIDI_CRAY_init: GPU_SUPPORT_ENABLED is requested, but "
        "GTL library is not linked"
    )
    assert L.text_rank(cray) == 0
    assert L.text_rank(cray.replace("[Rank 0]", "")) == 0  # MPICH's "(rank 0 in comm 0)" alone
    # DeepSpeed/Megatron's `[Rank N]` (corpus/logs/572-host-oom-srun-label-megatron-ds-...).
    assert L.text_rank("[Rank 2] (after 1 iterations) memory (MB) | allocated: 7063.228") == 2
    # A TensorFlow worker reporting an error from the parameter server names no rank
    # (corpus/logs/512-other-tf-ps-strategy-job-worker-task-unavailable-grpc-socket-closed.log).
    tf = (
        "ERROR:tensorflow:/job:worker/task:2 encountered the following error when processing "
        "closure: UnavailableError():Graph execution error:"
    )
    assert L.text_rank(tf) is None


def test_watchdog_timeout_names_its_detector_not_the_origin():
    # The NCCL watchdog of rank 3 caught the timeout: rank 3 waited, it did not fail
    # (../shared/corpus/logs/216-nccl-timeout-old-format-quoted-broadcast-traceback.log).
    d = D.diagnose_bytes(
        b"> [E ProcessGroupNCCL.cpp:737] [Rank 3] Watchdog caught collective operation timeout: "
        b"WorkNCCL(SeqNum=56693, OpType=BROADCAST, Timeout(ms)=1800000) ran for 1804371 "
        b"milliseconds before timing out.\n"
    )
    assert (d.category, d.failing_rank) == ("nccl_timeout", None), d.to_json()


def test_monitored_barrier_names_the_rank_that_did_not_arrive():
    # PyTorch's own example of monitored_barrier's error, printed on rank 0 about rank 1
    # (https://github.com/pytorch/pytorch/blob/main/docs/source/distributed.rst).
    d = D.diagnose_bytes(
        b"RuntimeError: Rank 1 failed to pass monitoredBarrier in 2000 ms\n"
        b" Original exception:\n"
        b"[gloo/transport/tcp/pair.cc:598] Connection closed by peer "
        b"[2401:db00:eef0:1100:3560:0:1c05:25d]:8594\n"
    )
    assert d.failing_rank == 1, d.to_json()
    assert "waited for" in (d.rank_reason or "")
    # Rank 0 reporting four ranks: no single origin, and never the reporter
    # (https://github.com/NVIDIA/nccl/issues/849, its title).
    many = D.diagnose_bytes(
        b"RuntimeError: [Rank 0]: Ranks 4, 5, 6, 7 failed to pass monitoredBarrier in 2000000 ms\n"
    )
    assert many.failing_rank is None, many.to_json()


def test_horovod_stall_report_names_the_missing_rank_not_its_reporter():
    # Rank 0 (Open MPI's tag) reports rank 1 missing (https://github.com/horovod/horovod/issues/1012).
    line = (
        b"[1,0]<stderr>:[2019-04-13 13:53:31.851506: W horovod/common/operations.cc:588] "
        b"HorovodBroadcast_dense_1_bias_Momentum_0 [missing ranks: 1]"
    )
    (m,) = S.match_line(line)
    assert (m.signature, m.rank, m.fields["missing"]) == ("horovod.missing_ranks", 1, "1")
    assert L.missing_ranks("HorovodBroadcast_x_0 [missing ranks: 0, 2]") == (0, 2)
    assert L.origin_rank("HorovodBroadcast_x_0 [missing ranks: 0, 2]", 1, None) is None


def test_hydra_banners_each_name_a_rank_and_several_name_no_origin():
    # MPICH's Hydra printed a banner for every rank it saw killed
    # (https://github.com/bsc-performance-tools/extrae/issues/101): no single origin.
    banner = (
        b"===================================================================================\n"
        b"=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
        b"=   RANK %d PID %d RUNNING AT node0009\n"
        b"=   KILLED BY SIGNAL: 9 (Killed)\n"
        b"===================================================================================\n"
        b"\n"
    )
    (m,) = S.match_line(b"=   RANK 6 PID 2447372 RUNNING AT node0009")
    assert (m.signature, m.rank) == ("hydra.bad_rank", 6)
    data = b"".join(banner % (r, pid) for r, pid in ((6, 2447372), (7, 2447373), (8, 2447374)))
    col = Collector()
    scan_stream(io.BytesIO(data), 0, col)
    assert sorted(r for _, _, r in col.first_exits) == [6, 7, 8]
    assert D.diagnose_bytes(data).failing_rank is None


def test_coordination_service_names_the_failed_task_not_its_leader():
    # JAX's multi-process runtime (TensorFlow's coordination service) on its leader: task 37's
    # heartbeat stopped (https://github.com/EleutherAI/architecture-objective/issues/26).
    d = D.diagnose_bytes(
        b"2022-11-15 16:03:15.140058: E external/org_tensorflow/tensorflow/core/distributed_runtime/"
        b"coordination/coordination_service.cc:954] /job:jax_worker/replica:0/task:37 has been set "
        b"to ERROR in coordination service: UNAVAILABLE: Task /job:jax_worker/replica:0/task:37 "
        b"heartbeat timeout. This indicates that the remote task has failed, got preempted, or "
        b"crashed unexpectedly. [type.googleapis.com/tensorflow.CoordinationServiceError='']\n"
    )
    assert (d.category, d.failing_rank) == ("other", 37), d.to_json()
    assert L.text_rank("UNAVAILABLE: Task /job:worker/replica:0/task:2 heartbeat timeout.") == 2


def test_open_mpi_wrapped_signal_line_names_its_rank():
    # mpiexec's notice wrapped before "signal" (https://github.com/adda-team/adda/issues/151).
    d = D.diagnose_bytes(
        b"[proton:10319] *** End of error message ***\n"
        b"--------------------------------------------------------------------------\n"
        b"mpiexec noticed that process rank 0 with PID 10313 on node proton exited on \n"
        b"signal 6 (Aborted).\n"
        b"--------------------------------------------------------------------------\n"
    )
    assert (d.category, d.failing_rank) == ("other", 0), d.to_json()

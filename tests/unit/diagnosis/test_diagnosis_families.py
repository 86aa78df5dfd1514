"""`gpugate diagnose` on the project's own family fixtures: one log per family and format version.

Every file under tests/fixtures/diagnosis/ was written for these tests (hosts, pids, paths, sizes
invented); each reproduces the structure of one real format: its prefixes, headers, timestamps,
the fixed words the program prints and how terminals or pastes wrap them. The comment beside
each row names the source file (and the version) whose format strings the fixture follows. None
is copied from ../shared/corpus or from any issue.

File names are `<family>--<version>.log`: the version is the producing program's (NCCL, PyTorch,
DeepSpeed, Slurm, the NVIDIA driver branch) whose format the file shows.
"""

from __future__ import annotations

import os
import shutil

import paths
import pytest
from diagnosis_families import FAMILIES

from gpugate.diagnosis import categories as C
from gpugate.diagnosis import engine as D

HAS_GREP = shutil.which("grep") is not None
ENGINES = ["python", pytest.param("grep", marks=pytest.mark.skipif(not HAS_GREP, reason="no grep"))]
FIXTURES = os.path.join(paths.FIXTURES, "diagnosis")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("fixture", "category", "xid", "rank"), FAMILIES, ids=[f[0] for f in FAMILIES]
)
def test_family(engine, fixture, category, xid, rank):
    d = D.diagnose([os.path.join(FIXTURES, fixture)], engine=engine)
    assert (d.category, d.xid, d.failing_rank) == (category, xid, rank), d.to_json()
    if category not in ("no_failure", "unknown"):
        assert d.evidence, "a failure needs evidence"
    else:
        assert not d.evidence, "no failure and unknown have no decisive line"


def test_every_fixture_is_in_the_table():
    on_disk = {n for n in os.listdir(FIXTURES) if n.endswith(".log")}
    assert on_disk == {f[0] for f in FAMILIES}


def test_every_category_has_a_family_fixture():
    assert {f[1] for f in FAMILIES} == set(C.CATEGORIES)


def test_fixture_names_carry_family_and_version():
    for name in (f[0] for f in FAMILIES):
        family, _, version = name[: -len(".log")].partition("--")
        assert family and version[:1].isdigit(), name


# One line each: another runtime's words for a family, against the signature whose words are
# close (a JVM's or Ray's "OutOfMemoryError" is host RAM, not the GPU's; a peer-access error is
# the GPUs' link unless NCCL says it). Written for this test, formats as cited in signatures.py.
ONE_LINERS = [
    ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
     "host_oom"),
    ("ray.memory_monitor.RayOutOfMemoryError: More than 95% of the memory on node gpu-a1 is used "
     "(61.2 / 64.0 GB).", "host_oom"),
    ("Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space", "host_oom"),
    ("fatal error: runtime: out of memory", "host_oom"),
    ("<jemalloc>: Error in malloc(): out of memory. Requested: 68719476736", "host_oom"),
    ("memory allocation of 68719476736 bytes failed", "host_oom"),
    ("      Reason:       OOMKilled", "host_oom"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "cuda_oom"),
    ("RuntimeError: CUDA error: peer access has not been enabled", "nvlink_error"),
    ("CUDA_ERROR_CONTAINED: an exception occurred on the device that is now contained by the GPU's "
     "error containment capability", "nvlink_error"),
    ("INFO: peer access is not supported between these two devices; using host staging",
     "unknown"),
    ("gpu-a1:1:2 [0] transport/p2p.cc:204 NCCL WARN Cuda failure 217 'peer access is not "
     "supported between these two devices'", "nccl_error"),
    ("horovod.common.exceptions.HorovodInternalError: ncclAllReduce failed: unhandled cuda error",
     "nccl_error"),
    ("cupy_backends.cuda.libs.nccl.NcclError: NCCL_ERROR_UNHANDLED_CUDA_ERROR: unhandled cuda error",
     "nccl_error"),
    ("   NodeName=gpu-c07 Arch=x86_64 CoresPerSocket=32 Reason=Not responding [slurm@2025-02-10T03:01:40]",
     "slurm_node_failure"),
    ("Node unexpectedly rebooted boot_time=1738 slurm     2025-02-10T03:01:40 gpu-c07",
     "slurm_node_failure"),
    ("(raylet) node_manager.cc:3024: 0 Workers (tasks / actors) killed due to memory pressure (OOM), "
     "2 Workers crashed due to other reasons at node (ID: 1f, IP: 10.0.0.2)", "unknown"),
    # Issue 43. ENOMEM from NCCL's RDMA layer is its init failing (locked memory, NIC
    # resources), not host RAM; the same words without NCCL stay host RAM.
    ("gpu-a1:812:830 [3] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_create_cq failed with error "
     "Cannot allocate memory", "nccl_error"),
    ("gpu-a1:812:830 [3] register_mr_buffers:465 NCCL WARN NET/OFI Unable to register memory "
     "(type = 2) for device 3. RC: 12, Error: Cannot allocate memory", "nccl_error"),
    ("OSError: [Errno 12] Cannot allocate memory", "host_oom"),
    ("gpu-a1:812:830 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-Ab12Cd "
     "to 33030144 bytes, error: No space left on device (28)", "nccl_error"),
    ("gpu-a1:812:830 [0] graph/xml.h:101 NCCL WARN Attribute class of node nic not found",
     "nccl_error"),
    # cuBLAS/cuDNN statuses: a failure no category names (other); allocation is the GPU's OOM.
    ("E tensorflow/stream_executor/cuda/cuda_blas.cc:428] failed to run cuBLAS routine "
     "cublasGemmBatchedEx: CUBLAS_STATUS_EXECUTION_FAILED", "other"),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
     "cuda_oom"),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_MAPPING_ERROR", "other"),
    # TensorFlow's collective abort; "Out of range: End of sequence" ends a dataset, no failure.
    ("W tensorflow/core/common_runtime/base_collective_executor.cc:249] BaseCollectiveExecutor::"
     "StartAbort Internal: Collective ops is aborted by: worker 1 is unreachable", "other"),
    ("W tensorflow/core/common_runtime/base_collective_executor.cc:217] BaseCollectiveExecutor::"
     "StartAbort Out of range: End of sequence", "unknown"),
    # nvidia-smi pasted into a log: ERR! readings, pending or failed row remaps, non-zero
    # uncorrectable counts and retired pages; the healthy values decide nothing.
    ("|  3  NVIDIA A100-SXM4-80GB  On   | 00000000:4E:00.0 Off |                  ERR! |",
     "gpu_xid_hardware"),
    ("| N/A   34C    P0    61W / 400W |      4MiB / 81920MiB |      0%      Default |", "unknown"),
    ("        Pending                           : Yes", "ecc_error"),
    ("        Pending                           : No", "unknown"),
    ("        Remapping Failure Occurred        : Yes", "ecc_error"),
    ("            DRAM Uncorrectable            : 12", "ecc_error"),
    ("            SRAM Uncorrectable Parity     : 0", "unknown"),
    ("        Double Bit ECC                    : 3", "ecc_error"),
    ("        Pending Page Blacklist            : Yes", "ecc_error"),
    # labels-43c: NCCL finding no algorithm/protocol (600's WARN, 601's "Last error:" echo) and
    # its shared-memory transport failing (616, 621); healthy INFO lines naming algorithms and
    # protocols decide nothing.
    (":41367:41367 [1] enqueue.cc:422 NCCL WARN Error : no algorithm/protocol available",
     "nccl_error"),
    ("238: [rank238]: Error : no algorithm/protocol available for function AllGather with datatype "
     "ncclInt8.", "nccl_error"),
    ("g148:14937:69361 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory "
     "segment /dev/shm/nccl-glnlGK (size 14156128), error: No such file or directory (2)",
     "nccl_error"),
    ("[3] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device",
     "nccl_error"),
    ("gpu-a1:812:830 [0] NCCL INFO NCCL_ALGO set by environment to CollNet", "unknown"),
    ("gpu-a1:812:830 [0] NCCL INFO NCCL_PROTO set by environment to Simple", "unknown"),
    ("g148:14937:69361 [0] NCCL INFO Channel 00/1 : 0[0] -> 7[7] via P2P/CUMEM", "unknown"),
    # labels-43c: MPI/PMI start-up failures (603, 606, 607, 612, 610, 609) and a DataLoader's
    # SIGBUS from a small /dev/shm (615) are `other`; a banner or another missing command is not.
    ("bash: orted: command not found", "other"),
    ("ORTE was unable to reliably start one or more daemons.", "other"),
    ("ORTE has lost communication with a remote daemon.", "other"),
    ("but OMPI was not built with SLURM's PMI support and therefore cannot", "other"),
    ("It looks like pmix_init failed for some reason; your parallel process is", "other"),
    ("srun: error: cannot create mpi context for mpi/pmix", "other"),
    ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
     "shared memory (shm).", "other"),
    ("bash: module: command not found", "unknown"),
    ("mpirun (Open MPI) 4.1.5", "unknown"),
    ("srun: MPI types are...", "unknown"),
    # Open MPI 4 prints this on healthy runs (its shared-memory gds lock): no signature.
    ("[gpu-a1:04242] PMIX ERROR: ERROR in file ../../../../../../src/mca/gds/ds12/"
     "gds_ds12_lock_pthread.c at line 168", "unknown"),
    # labels-43d: PMIx, PRRTE, the coordination service, TF collectives.
    ("[jenkins03:05450] PMIX ERROR: UNPACK-FAILURE in file src/server/pmix_server_ops.c at "
     "line 197", "other"),
    ("[r33:677544] [prterun-r33-677544@0,0] [1660083904.703457] ACTIVATE PROC "
     "[prterun-r33-677544@0,7] STATE COMMUNICATION FAILURE AT oob_tcp_component.c:872", "other"),
    ("2024-04-12 23:39:41.656900: E external/xla/xla/pjrt/distributed/client.cc:96] "
     "Coordination service agent in error status: DEADLINE_EXCEEDED: Deadline Exceeded", "other"),
    ("  (1) Internal:  Collective Op  has group_size 8 and group_key2 but that group has size 4",
     "other"),
    # Not failures: a lookup that found nothing, the agent's own shutdown, a state that is not
    # the failure one, a config print.
    ("[gpu-a1:04242] PMIX ERROR: NOT-FOUND in file dstore_base.c at line 2866", "unknown"),
    ("I client.cc:96] Coordination service agent in error status: CANCELLED: shutting down",
     "unknown"),
    ("[n1:6775] [prterun-n1-6775@0,0] ACTIVATE PROC [prterun-n1-6775@0,7] STATE RUNNING",
     "unknown"),
    ("collective group_size=8 group_key=2 group has size 8", "unknown"),
]  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("text", "category"), ONE_LINERS, ids=[t[:40] for t, _ in ONE_LINERS])
def test_other_runtimes_one_line(tmp_path, engine, text, category):
    log = tmp_path / "job.log"
    log.write_text(text + "\n")
    assert D.diagnose([str(log)], engine=engine).category == category


# `nvidia-smi -q` of a healthy node (no remap pending, every ECC and remap counter zero): a
# paste of it decides nothing. Written for this test, in the R535 layout; the real capture
# beside it (../shared/reference/real-outputs, 8 H100s, counters all zero) where present.
HEALTHY_Q = """\
    ECC Mode
        Current                           : Enabled
        Pending                           : Enabled
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable Parity     : 0
            SRAM Uncorrectable SEC-DED    : 0
            DRAM Correctable              : 0
            DRAM Uncorrectable            : 0
        Aggregate
            SRAM Correctable              : 0
            SRAM Uncorrectable Parity     : 0
            SRAM Uncorrectable SEC-DED    : 0
            DRAM Correctable              : 0
            DRAM Uncorrectable            : 0
    Retired Pages
        Single Bit ECC                    : N/A
        Double Bit ECC                    : N/A
        Pending Page Blacklist            : N/A
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 0
        Pending                           : No
        Remapping Failure Occurred        : No
"""
HEALTHY_CAPTURE = (paths.SHARED / "reference/real-outputs/nvidia-smi"
                   / "h100-80gb-hbm3-x8.535.161.08.q.power-brake.txt")  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
def test_a_healthy_nvidia_smi_q_is_no_failure(tmp_path, engine):
    log = tmp_path / "smi.log"
    log.write_text(HEALTHY_Q)
    d = D.diagnose([str(log)], engine=engine)
    assert (d.category, d.evidence) == ("unknown", ())
    # The same section with a row remap pending and four rows remapped is ECC evidence.
    log.write_text(HEALTHY_Q.replace("Error               : 0", "Error               : 4")
                   .replace(": No\n        Remapping", ": Yes\n        Remapping"))  # fmt: skip
    d = D.diagnose([str(log)], engine=engine)
    assert d.category == "ecc_error" and d.confidence == "low"
    assert len(d.evidence) == 2 and {e.signature for e in d.evidence} == {"smi.ecc_counts"}


@pytest.mark.shared("captures")
@pytest.mark.parametrize("engine", ENGINES)
def test_a_real_healthy_nvidia_smi_q_capture_is_no_failure(engine):
    if not HEALTHY_CAPTURE.is_file():
        pytest.skip(f"{HEALTHY_CAPTURE} not present")
    d = D.diagnose([str(HEALTHY_CAPTURE)], engine=engine)
    assert (d.category, d.evidence) == ("unknown", ())


def test_rdma_enomem_says_it_is_not_host_ram(tmp_path):
    log = tmp_path / "nccl.log"
    enomem = [t for t, _ in ONE_LINERS if "NCCL WARN" in t and "Cannot allocate memory" in t]
    assert len(enomem) == 2
    for line in enomem:
        # The bare words echoed on a later line (a Python exception) are NCCL's failure too.
        log.write_text(line + "\nRuntimeError: [enforce fail] Cannot allocate memory\n")
        d = D.diagnose([str(log)])
        assert (d.category, d.confidence) == ("nccl_error", "high"), d.to_json()
        log.write_text(line + "\n")
        d = D.diagnose([str(log)])
        assert (d.category, d.confidence) == ("nccl_error", "high")
        assert "ulimit -l" in d.summary and "not the host's RAM" in d.summary


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("bash: orted: command not found", "orted not found on the remote node's PATH"),
        ("srun: error: cannot create mpi context for mpi/pmix", "srun has no mpi/pmix plugin"),
        ("but OMPI was not built with SLURM's PMI support and therefore cannot",
         "not built with Slurm's PMI support"),
    ],
)  # fmt: skip
def test_mpi_start_up_failure_says_what_it_is(tmp_path, line, words):
    log = tmp_path / "job.log"
    log.write_text(line + "\n")
    d = D.diagnose([str(log)])
    assert d.category == "other" and words in d.summary, d.to_json()

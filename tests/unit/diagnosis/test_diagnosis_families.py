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
]  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("text", "category"), ONE_LINERS, ids=[t[:40] for t, _ in ONE_LINERS])
def test_other_runtimes_one_line(tmp_path, engine, text, category):
    log = tmp_path / "job.log"
    log.write_text(text + "\n")
    assert D.diagnose([str(log)], engine=engine).category == category

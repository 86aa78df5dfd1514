"""End to end: PyTorch's flight recorder on, dumped, collected and read on a real local Slurm.

A 2-rank torch.distributed job (gloo, one rank per node, srun, rendezvous on 127.0.0.1) runs
with the variables the TaskProlog exported; rank 1 (node n2) sleeps before all_reduce #4,
rank 0 times out in it (3 s), dumps and exits non-zero; rank 1 dumps when its sleep ends
(8 s), still outside all_reduce #4, and exits non-zero too. (A SIGTERM handler that dumps
lost the race with srun's SIGKILL here: KillWait=2 and an empty dump.) The job fails, and
each node's epilog collects its own rank's dump, as the job's user, into the node's bundle
(`flightrec/` and `flightrec.json`).

Gloo records into the flight recorder in torch 2.14.1 but does not dump on a timeout (only
NCCL's watchdog does), so the job dumps itself: `torch._C._distributed_c10d._dump_fr_trace()`,
PyTorch's own serializer, the same bytes the watchdog writes, to TORCH_FR_DUMP_TEMP_FILE +
rank, exactly where the watchdog would put them.

A second job writes a hostile dump (a pickle whose REDUCE would create a marker file) into its
job directory, another at PyTorch's default `/tmp/nccl_trace_rank_*`, and a symlink: all are
refused and reported in decisive.txt (and by sha256 in flightrec.json, never kept), the marker
never appears, and the default-location file is gone after the epilog (the job user's, read).

The two slurmd run on one host, so the NCCL directory (node-local on a real cluster) is made
per node (Site.nccl_dir_per_node); srun passes the batch step's environment on, so
the job points its rank at its own node's copy of the exported path.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402
from torchenv import torch_python_or_skip  # noqa: E402

NODES = ["n1", "n2"]
HOSTILE_RANK = 9173  # an unlikely rank: its default-location name is this test's own

JOB = """\
import datetime, os, re, sys, time
import torch, torch.distributed as dist

rank, node = int(os.environ["SLURM_PROCID"]), os.environ["SLURMD_NODENAME"]
print(f"rank {rank} on {node}:", *(f"{k}={os.environ.get(k)}" for k in (
    "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")), flush=True)
# One host, a directory per node (see the test's docstring).
prefix = re.sub(r"/n[0-9]+/nccl/", f"/{node}/nccl/", os.environ["TORCH_FR_DUMP_TEMP_FILE"])

def dump():
    with open(prefix + str(rank), "wb") as fh:
        fh.write(torch._C._distributed_c10d._dump_fr_trace())

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=3))
t = torch.ones(8)
for _ in range(3):
    dist.all_reduce(t)
if rank == 1:
    time.sleep(8)  # in compute, past rank 0's timeout: never entering all_reduce #4
    dump()
    os._exit(1)
try:
    dist.all_reduce(t)
except RuntimeError as exc:
    print(f"rank {rank}: {exc}"[:300], file=sys.stderr, flush=True)
    dump()
    os._exit(1)
"""

HOSTILE = """\
import os, pickle, sys
marker = {marker!r}

class Exec:
    def __reduce__(self):
        return (exec, (f"open({{marker!r}}, 'w').write('ran')",))

data = pickle.dumps({{"version": "2.10", "entries": [Exec()]}}, protocol=4)
prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
open(prefix + "0", "wb").write(data)
os.symlink("/etc/shadow", prefix + "1")
open("/tmp/nccl_trace_rank_{rank}", "wb").write(data)
sys.exit(1)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def torch_python() -> str:
    return torch_python_or_skip()  # one the job user can run


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites, torch_python: str) -> SlurmSite:
    return slurm_site(NODES, nccl_per_node=True)


def _bundles(site: Site, job: int, timeout: float = 30) -> dict[str, str]:
    """Each node's bundle directory of `job`, waiting for both epilogs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {n: site.evidence / str(job) / f"{n}-r0" for n in NODES}
        if all((d / "summary.json").exists() for d in found.values()):
            return {n: str(d) for n, d in found.items()}
        time.sleep(0.5)
    raise AssertionError(f"job {job}: bundles {sorted(os.listdir(site.evidence / str(job)))}")


def _flightrec(bundle: str) -> dict:
    with open(os.path.join(bundle, "flightrec.json")) as fh:
        return json.load(fh)


def test_a_hanging_rank_s_dumps_are_collected_from_both_nodes(
    cluster: LocalSlurm, site: Site, torch_python: str
):
    started = time.monotonic()
    script = site.base / "fr_job.py"
    script.write_text(JOB.replace("{port}", str(_free_port())))
    batch = f"#!/bin/sh\nsrun -N2 --ntasks-per-node=1 {torch_python} {script}\n"
    out = site.base / "fr.out"
    job = cluster.submit(script=batch, nodes=2, output=str(out), no_requeue=True)
    cluster.wait_job(job, "FAILED", timeout=90)
    bundles = _bundles(site, job)
    text = out.read_text()
    # The TaskProlog's exports, both names, pointing into the job's own directory.
    assert "TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_TRACE_BUFFER_SIZE=2000" in text, text
    assert f"TORCH_FR_DUMP_TEMP_FILE={site.base}/n1/nccl/{job}/fr_rank_" in text, text
    for rank, node in enumerate(NODES):
        doc = _flightrec(bundles[node])
        assert doc["errors"] == [], doc["errors"]
        (record,) = doc["records"]
        assert record["node"] == node and record.get("rank") == rank, record
        # Kept as the JSON of its plain data, never as the user's pickle under its own name.
        assert sorted(os.listdir(os.path.join(bundles[node], "flightrec"))) == [
            f"fr_rank_{rank}.json"
        ]
        with open(os.path.join(bundles[node], "flightrec", f"fr_rank_{rank}.json")) as fh:
            assert isinstance(json.load(fh)["entries"], list)
        with open(os.path.join(bundles[node], "summary.json")) as fh:
            summary = json.load(fh)
        assert summary["flightrec_dumps"] == 1
        # Not read as a log: the dumps are pickles.
        assert not any("fr_rank_" in f for f in summary["files"] if f.startswith("logs/"))
    # The culprit, from the two nodes' bundles: `gpugate evidence JOB` and `gpugate diagnose`.
    culprit = "rank 1 on n2 never entered all_reduce #4 of process group 0 (default_pg)"
    evidence = json.loads(_gpugate(site, "evidence", str(job), "--json"))
    fr = evidence["flight_recorder"]
    assert (fr["rank"], fr["node"], fr["op"], fr["seq"]) == (1, "n2", "all_reduce", 4), fr
    assert fr["state"] == "not_entered" and fr["waiting_ranks"] == [0], fr
    assert culprit in _gpugate(site, "evidence", str(job))
    diagnosis = json.loads(_gpugate(site, "diagnose", "--json", *bundles.values()))
    assert diagnosis["flight_recorder"]["text"].startswith(culprit), diagnosis["flight_recorder"]
    assert culprit in diagnosis["summary"], diagnosis["summary"]
    print(f"job {job}: failed, dumps of both ranks collected in {time.monotonic() - started:.0f} s")


def _gpugate(site: Site, *args: str) -> str:
    """`gpugate ARGS` as root (the admin reading the bundles), the site's config; its stdout."""
    import subprocess

    gpugate = os.path.join(os.path.dirname(sys.executable), "gpugate")
    env = dict(os.environ, GPUGATE_CONFIG=str(site.config))
    done = subprocess.run([gpugate, *args], capture_output=True, env=env,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_a_hostile_dump_is_refused_and_reported_and_runs_nothing(
    cluster: LocalSlurm,
    site: Site,
    torch_python: str,
    default_dump_place: None,
):
    marker = site.base / "hostile-ran"
    script = site.base / "hostile.py"
    script.write_text(HOSTILE.format(marker=str(marker), rank=HOSTILE_RANK))
    default = f"/tmp/nccl_trace_rank_{HOSTILE_RANK}"
    assert not os.path.lexists(default), "left over from an earlier run"
    out = site.base / "hostile.out"
    job = cluster.submit(script=f"#!/bin/sh\n{torch_python} {script}\n", nodes=1,
                         nodelist="n1", output=str(out), no_requeue=True)  # fmt: skip
    cluster.wait_job(job, "FAILED", timeout=60)
    bundle = site.evidence / str(job) / "n1-r0"
    deadline = time.monotonic() + 30
    while not (bundle / "summary.json").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    doc = _flightrec(str(bundle))
    why = {e["name"]: e["error"] for e in doc["errors"]}
    assert set(why) == {"fr_rank_0", "fr_rank_1", f"nccl_trace_rank_{HOSTILE_RANK}"}, doc
    assert "symlink" in why["fr_rank_1"]
    assert doc["records"] == []
    decisive = (bundle / "decisive.txt").read_text()
    assert "gpugate: flight-recorder dump fr_rank_0 refused: " in decisive, decisive
    assert not marker.exists(), "the hostile pickle ran"
    assert not os.path.lexists(default)  # collected, so removed from the shared /tmp
    # Refused dumps are never kept: their error and sha256 are, in flightrec.json.
    assert not (bundle / "flightrec").exists()
    assert all(len(e.get("sha256", "")) == 64 for e in doc["errors"] if e["name"] != "fr_rank_1")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

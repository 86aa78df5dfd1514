"""The qualification payload (gpugate/qualify/payload.py), run for real on gloo ranks (issue 17)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from torchenv import torch_python_or_skip

from gpugate.qualify import payload

PAYLOAD = Path(payload.__file__)
# No torch in the project's own venv: the payload must say so, not crash.
PLAIN_PYTHON = sys.executable


def free_port() -> int:
    """A TCP port nobody listens on now (the rendezvous binds it next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def task_env(rank: int, ntasks: int, node: str, port: int, **extra: str) -> dict[str, str]:
    """What srun and the job script give one task, without Slurm."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GPUGATE_QUALIFY"))}
    env.update(SLURM_PROCID=str(rank), SLURM_NTASKS=str(ntasks), SLURM_LOCALID="0",
               SLURMD_NODENAME=node, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               GLOO_SOCKET_IFNAME="lo")  # fmt: skip
    env.update(extra)
    return env


def run_ranks(py: str, out: Path, args: list[str], **extra: str) -> tuple[dict, list[int]]:
    """Two gloo ranks on "nodes" n1 and n2; rank 0's JSON and both exit codes."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [py, str(PAYLOAD), "allreduce", "--out", str(out), "--backend", "gloo", *args],
            env=task_env(rank, 2, f"n{rank + 1}", port, **extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    codes = [p.wait(timeout=60) for p in procs]
    return json.loads(out.read_text()), codes


ARGS = ["--size-mib", "2", "--iters", "4", "--warmup", "1", "--timeout-s", "40"]


def test_two_gloo_ranks_measure_and_a_delayed_node_drops_the_bandwidth(tmp_path: Path) -> None:
    py = torch_python_or_skip()
    healthy, codes = run_ranks(py, tmp_path / "healthy.json", ARGS)
    assert codes == [0, 0]
    assert healthy["test"] == "allreduce" and healthy["backend"] == "gloo"
    assert healthy["world_size"] == 2 and healthy["nodes"] == ["n1", "n2"]
    assert healthy["size_bytes"] == 2 << 20 and healthy["iters"] == 4
    assert healthy["injected_delay"] is None
    per_iter = healthy["seconds"] / 4
    assert healthy["algbw_gbps"] == pytest.approx((2 << 20) / per_iter / 1e9)
    # NCCL-tests' all_reduce bus bandwidth: algbw * 2(n-1)/n, n = 2.
    assert healthy["busbw_gbps"] == pytest.approx(healthy["algbw_gbps"])
    # 150 ms before each of 4 iterations on n2: at least 0.6 s, whatever the machine's speed.
    slow, codes = run_ranks(
        py, tmp_path / "slow.json", ARGS, GPUGATE_QUALIFY_TEST_DELAY="n2:150,n9:5"
    )
    assert codes == [0, 0]
    assert slow["injected_delay"] == {"n2": 150.0, "n9": 5.0}
    assert slow["seconds"] >= 0.6
    assert slow["busbw_gbps"] < healthy["busbw_gbps"] / 2


def start(py: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """One payload process, its output kept for the failure message."""
    return subprocess.Popen(
        [py, str(PAYLOAD), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_errors_end_in_an_error_json_not_a_hang(tmp_path: Path) -> None:
    py = torch_python_or_skip()
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
    # Three at once (torch's import dominates): rank 0 of two whose peer never comes, bounded
    # by --timeout-s; NCCL asked for without a GPU; h2d without a GPU.
    alone = start(py, ["allreduce", "--out", str(tmp_path / "alone.json"), "--timeout-s", "5"],
                  task_env(0, 2, "n1", free_port()))  # fmt: skip
    nccl = start(py, ["allreduce", "--out", str(tmp_path / "nccl.json"), "--backend", "nccl"],
                 task_env(0, 1, "n1", free_port(), **no_gpu))  # fmt: skip
    h2d = start(py, ["h2d", "--out", str(tmp_path / "h2d.json"), "--size-mib", "1"],
                task_env(0, 1, "n1", 0, **no_gpu))  # fmt: skip
    codes = [p.wait(timeout=60) for p in (alone, nccl, h2d)]
    assert codes == [payload.EXIT_TIMEOUT, payload.EXIT_ERROR, 0], [
        p.stdout.read() for p in (alone, nccl, h2d)
    ]
    assert json.loads((tmp_path / "alone.json").read_text()) == {
        "test": "allreduce",
        "rank": 0,
        "node": "n1",
        "error": "timed out after 5 s (rendezvous or collective did not finish)",
    }
    assert (
        json.loads((tmp_path / "nccl.json").read_text())["error"]
        == "--backend nccl: a rank has no CUDA device"
    )
    # Without CUDA, h2d is skipped (not judged), not failed.
    assert json.loads((tmp_path / "h2d.json").read_text()) == {
        "test": "h2d",
        "node": "n1",
        "gpus": [],
        "skipped": "no CUDA device",
    }


@pytest.mark.parametrize("test", ["allreduce", "h2d"])
def test_without_torch_the_payload_is_not_run_with_the_fix(tmp_path: Path, test: str) -> None:
    # The system python, isolated (-I): what a node without PyTorch runs (issue 28 Deliver 3).
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else PLAIN_PYTHON
    out = tmp_path / "r.json"
    done = subprocess.run(
        [py, "-I", str(PAYLOAD), test, "--out", str(out)],
        env=task_env(0, 1, "n1", 0), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode == 0:
        pytest.skip(f"{py} has torch")
    assert done.returncode == payload.EXIT_NOT_RUN
    got = json.loads(out.read_text())
    assert "error" not in got
    assert got["not_run"].startswith(f"no torch in {py}")
    assert got["fix"] == payload.FIX_TORCH
    assert "qualify.python" in got["fix"]


@pytest.mark.parametrize(
    ("bad", "error"),
    [({"MASTER_PORT": "none"}, "MASTER_PORT must be a port number, got 'none'"),
     ({"SLURM_PROCID": "x"}, "bad Slurm task variable: invalid literal for int() with base 10: 'x'")],
)  # fmt: skip
def test_bad_task_environment_is_named(tmp_path: Path, bad: dict, error: str) -> None:
    out = tmp_path / "r.json"
    done = subprocess.run(
        [PLAIN_PYTHON, str(PAYLOAD), "allreduce", "--out", str(out)],
        env=task_env(0, 2, "n1", 0, **bad), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == payload.EXIT_ERROR
    assert json.loads(out.read_text()) == {"test": "allreduce", "error": error}


def test_parse_delay() -> None:
    assert payload.parse_delay(None) is None and payload.parse_delay(" ") is None
    assert payload.parse_delay("gpu01:250, gpu-02:0.5") == {"gpu01": 250.0, "gpu-02": 0.5}
    for bad in ("gpu01", "gpu01:x", ":5", "gpu01:-3"):
        with pytest.raises(payload.PayloadError, match="is not NODE:MS"):
            payload.parse_delay(bad)


def test_bus_bandwidth_follows_nccl_tests() -> None:
    # 1 GB in 0.1 s: algbw 10 GB/s; 8 ranks: busbw = 10 * 2 * 7 / 8.
    assert payload.bus_bandwidth(10**9, 0.1, 8) == pytest.approx((10.0, 17.5))
    assert payload.bus_bandwidth(10**9, 0.5, 1) == (2.0, None)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        payload.build_parser().parse_args(["allreduce", "--out", "x", "--iters", "0"])
    with pytest.raises(SystemExit):
        payload.build_parser().parse_args(["h2d"])


def test_nccl_asked_of_a_torch_without_it_is_not_run() -> None:
    """`--backend nccl` where every rank has a GPU but torch has no NCCL: a tool the site
    lacks, "not run" with the fix (issue 28); auto falls back to gloo."""
    from types import SimpleNamespace

    class Flag:
        def __init__(self, value: list[int], dtype: object = None) -> None:
            self.value = value[0]

        def item(self) -> int:
            return self.value

    torch = SimpleNamespace(
        cuda=SimpleNamespace(is_available=lambda: True, device_count=lambda: 8),
        tensor=Flag,
        int32=None,
    )
    dist = SimpleNamespace(
        all_reduce=lambda flag, op=None: None,
        ReduceOp=SimpleNamespace(MIN="min"),
        is_nccl_available=lambda: False,
    )
    with pytest.raises(payload.NotRun) as err:
        payload._choose_backend(torch, dist, "nccl")
    assert "has no NCCL" in str(err.value) and err.value.fix == payload.FIX_NCCL
    assert payload._choose_backend(torch, dist, "auto") == "gloo"

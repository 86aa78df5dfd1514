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


def test_a_missing_peer_ends_in_an_error_json_not_a_hang(tmp_path: Path) -> None:
    py = torch_python_or_skip()
    out = tmp_path / "alone.json"
    h2d_out = tmp_path / "h2d.json"
    # Rank 0 of two, the other rank never comes: bounded by --timeout-s.
    alone = subprocess.Popen(
        [py, str(PAYLOAD), "allreduce", "--out", str(out), "--timeout-s", "5"],
        env=task_env(0, 2, "n1", free_port()), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    done = subprocess.run(
        [py, str(PAYLOAD), "h2d", "--out", str(h2d_out), "--size-mib", "1"],
        env=task_env(0, 1, "n1", 0, CUDA_VISIBLE_DEVICES=""), capture_output=True, timeout=60,
    )  # fmt: skip
    assert alone.wait(timeout=30) != 0
    result = json.loads(out.read_text())
    assert result["test"] == "allreduce" and (result["rank"], result["node"]) == (0, "n1")
    assert "timed out after 5 s" in result["error"] or "Timeout" in result["error"]
    # Without CUDA, h2d is skipped (not judged), not failed.
    assert done.returncode == 0
    assert json.loads(h2d_out.read_text()) == {
        "test": "h2d",
        "node": "n1",
        "gpus": [],
        "skipped": "no CUDA device",
    }


def test_without_torch_the_payload_reports_it(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = subprocess.run(
        [PLAIN_PYTHON, str(PAYLOAD), "allreduce", "--out", str(out)],
        env=task_env(0, 1, "n1", 0), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode == 0:
        pytest.skip("this interpreter has torch")
    assert done.returncode == payload.EXIT_ERROR
    assert json.loads(out.read_text())["error"].startswith("no torch in ")


def test_bad_task_environment_is_named(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = subprocess.run(
        [PLAIN_PYTHON, str(PAYLOAD), "allreduce", "--out", str(out)],
        env=task_env(0, 2, "n1", 0, MASTER_PORT="none"), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == payload.EXIT_ERROR
    assert json.loads(out.read_text()) == {
        "test": "allreduce",
        "error": "MASTER_PORT must be a port number, got 'none'",
    }


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

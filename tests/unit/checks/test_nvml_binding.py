"""The real binding: `gpugate facts` through nvidia-ml-py and ctypes into a C libnvidia-ml.so.1.

tests/nvml_stub/nvml_stub.c is compiled here against NVIDIA's own nvml.h (PyPI nvidia-nvml-dev)
into a stand-in libnvidia-ml.so.1, which pynvml loads by that name as on a node (found through
LD_LIBRARY_PATH). Its values come from a scenario file: the real B200 and GB200 captures
(tests/nvml_stub/*.scenario), and faults added to them (a lost GPU, a driver not loaded, ...).
Everything between `gpugate facts` and the C ABI is the code that runs on a node.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import paths
import pytest
import yaml

STUB = paths.NVML_STUB
GPUGATE = str(Path(sys.executable).parent / "gpugate")
# NVML_ERROR_* (nvml.h)
NO_PERMISSION, DRIVER_NOT_LOADED, GPU_IS_LOST, RESET_REQUIRED = 4, 9, 15, 16
LIB_RM_VERSION_MISMATCH = 18
LIBRARY_VERSION = "580.105.08"  # the B200 capture's driver


def _nvml_include() -> str | None:
    """The folder of nvml.h: $NVML_INCLUDE, else the installed nvidia-nvml-dev's."""
    if os.environ.get("NVML_INCLUDE"):
        given = os.environ["NVML_INCLUDE"]
        return given if os.path.isfile(os.path.join(given, "nvml.h")) else None
    found = [
        h for p in sys.path for h in glob.glob(os.path.join(p, "nvidia", "*", "include", "nvml.h"))
    ]
    return os.path.dirname(sorted(found)[-1]) if found else None


def _build(out: Path, *cflags: str) -> Path:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        pytest.skip(
            "no C compiler (cc/gcc) to build the stand-in libnvidia-ml.so.1: apt-get install gcc libc6-dev"
        )
    include = _nvml_include()
    if not include:
        pytest.skip(
            "nvml.h not found: pip install nvidia-nvml-dev (the [test] extra), or set NVML_INCLUDE"
        )
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CC=compiler, NVML_INCLUDE=include)
    # As a driver package installs it: the versioned file, and libnvidia-ml.so.1 linking to it.
    lib = out / f"libnvidia-ml.so.{LIBRARY_VERSION}"
    subprocess.run(
        ["sh", str(STUB / "build.sh"), str(lib), *cflags], env=env, check=True, timeout=120
    )
    (out / "libnvidia-ml.so.1").symlink_to(lib.name)
    return out


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("nvml-stub"))


def facts(libdir: Path, tmp_path: Path, scenario: str, extra: str = "", **env: str) -> dict:
    """`gpugate facts --source nvml` on the stub; `extra` lines are appended to the scenario."""
    path = tmp_path / "scenario"
    path.write_text((STUB / f"{scenario}.scenario").read_text() + "\n" + extra)
    config = tmp_path / "gpugate.yaml"
    config.write_text("")
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUGATE_", "NVML_STUB_"))}
    library_path = os.pathsep.join(filter(None, [str(libdir), os.environ.get("LD_LIBRARY_PATH")]))
    run_env.update(LD_LIBRARY_PATH=library_path, NVML_STUB_SCENARIO=str(path), **env)
    run_env["GPUGATE_CACHE_DIR"] = str(tmp_path / "cache")  # never the host's /var/cache/gpugate
    done = subprocess.run([GPUGATE, "facts", "--source", "nvml", "--config", str(config)], env=run_env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def scenario_values(name: str) -> tuple[dict, list[dict]]:
    """The scenario's system keys, and each GPU's keys (gpu.N over gpu.*)."""
    system, common, per_gpu = {}, {}, {}
    for line in (STUB / f"{name}.scenario").read_text().splitlines():
        key, sep, value = line.split("#", 1)[0].partition("=")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key.startswith("gpu.*."):
            common[key[6:]] = value
        elif key.startswith("gpu."):
            index, _, field = key[4:].partition(".")
            per_gpu.setdefault(int(index), {})[field] = value
        else:
            system[key] = value
    count = int(system["count"])
    return system, [{**common, **per_gpu.get(i, {})} for i in range(count)]


def expected_gpu(index: int, v: dict) -> dict:
    """The facts.Gpu keys a GPU with scenario keys `v` must have."""
    corrected, uncorrected, pending, failure = (int(x) for x in v["remapped_rows"].split())
    return {
        "index": index,
        "name": v["name"],
        "uuid": v["uuid"],
        "serial": v["serial"],
        "minor_number": int(v["minor"]),
        "pci_bus_id": v["bus_id"],
        "error": None,
        "temperature_c": float(v["temp"]),
        "power_draw_w": int(v["power_mw"]) / 1000,
        "power_limit_w": int(v["limit_mw"]) / 1000,
        "throttle_reasons": ["gpu_idle"],
        "ecc_mode_enabled": v["ecc_mode"] == "1",
        "ecc_volatile_corrected": int(v["ecc_corrected_volatile"]),
        "ecc_volatile_uncorrected": int(v["ecc_uncorrected_volatile"]),
        "ecc_aggregate_corrected": int(v["ecc_corrected_aggregate"]),
        "ecc_aggregate_uncorrected": int(v["ecc_uncorrected_aggregate"]),
        "retired_pages_pending": None,  # N/A in the captures
        "remapped_rows": {
            "corrected": corrected,
            "uncorrected": uncorrected,
            "pending": bool(pending),
            "failure": bool(failure),
        },
        "pcie": {
            "gen": int(v["pcie_gen"]),
            "max_gen": int(v["pcie_max_gen"]),
            "width": int(v["pcie_width"]),
            "max_width": int(v["pcie_max_width"]),
            "replay_errors": int(v["pcie_replay"]),
        },
        "nvlink_active": [True] * int(v["nvlinks"]),
        "nvlink_errors": {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0},
        "memory_total_mib": int(v["memory_total_mib"]),
        "memory_used_mib": int(v["memory_used_mib"]),
        "processes": [],
        "persistence_mode": v["persistence"] == "1",
        "fabric_state": "completed",
        "fabric_status": "success",
        "recovery_action": "none",
    }


@pytest.mark.parametrize("board", ["b200", "gb200"])
def test_real_capture_reads_back_through_the_binding(
    libdir: Path, tmp_path: Path, board: str
) -> None:
    snapshot = facts(libdir, tmp_path, board)
    system, gpus = scenario_values(board)
    assert not snapshot.get("source_errors")
    assert snapshot["driver_version"] == system["driver"]
    assert snapshot["cuda_driver_version"] == "13.0"
    assert len(snapshot["gpus"]) == len(gpus) == {"b200": 8, "gb200": 4}[board]
    for index, (gpu, v) in enumerate(zip(snapshot["gpus"], gpus)):
        want = expected_gpu(index, v)
        assert {k: gpu.get(k) for k in want} == want, f"GPU {index}"


def test_b200_capture_values(libdir: Path, tmp_path: Path) -> None:
    """Spot checks against qx-b200 itself, so a wrong scenario cannot pass by agreeing with itself."""
    gpu = facts(libdir, tmp_path, "b200")["gpus"][7]
    assert (gpu["name"], gpu["pci_bus_id"], gpu["temperature_c"]) == (
        "NVIDIA B200",
        "00000000:CC:00.0",
        51.0,
    )
    assert (gpu["power_limit_w"], gpu["memory_total_mib"], gpu["persistence_mode"]) == (
        1000.0,
        183359,
        False,
    )


def test_a_lost_gpu_is_named_and_the_others_are_read(libdir: Path, tmp_path: Path) -> None:
    gpus = facts(libdir, tmp_path, "b200", f"gpu.3.error = {GPU_IS_LOST}\n")["gpus"]
    assert gpus[3]["error"] == "gpu_is_lost"
    assert [g["error"] for g in gpus if g["index"] != 3] == [None] * 7
    assert gpus[4]["uuid"] == "GPU-00000004-0000-0000-0000-000000000004"


def test_a_gpu_without_a_handle(libdir: Path, tmp_path: Path) -> None:
    gpus = facts(libdir, tmp_path, "gb200", f"gpu.1.handle_error = {RESET_REQUIRED}\n")["gpus"]
    assert gpus[1]["error"] == "reset_required"
    assert gpus[1]["uuid"] is None
    assert gpus[2]["error"] is None


def test_driver_not_loaded(libdir: Path, tmp_path: Path) -> None:
    snapshot = facts(libdir, tmp_path, "b200", NVML_STUB_INIT=str(DRIVER_NOT_LOADED))
    why = snapshot["source_errors"]["nvml"]
    assert "driver_not_loaded" in why and "kernel module is not loaded" in why
    assert not snapshot.get("gpus")


def test_a_library_that_does_not_match_the_kernel_module(libdir: Path, tmp_path: Path) -> None:
    """A driver updated without a reboot: the loaded library's version is named."""
    snapshot = facts(libdir, tmp_path, "b200", NVML_STUB_INIT=str(LIB_RM_VERSION_MISMATCH))
    assert "lib_rm_version_mismatch" in snapshot["source_errors"]["nvml"]
    assert snapshot["nvml_error"] == "lib_rm_version_mismatch"
    assert snapshot["nvml_library_version"] == LIBRARY_VERSION


def test_one_refused_call_is_noted(libdir: Path, tmp_path: Path) -> None:
    gpu = facts(libdir, tmp_path, "b200", f"gpu.2.fail.nvmlDeviceGetSerial = {NO_PERMISSION}\n")[
        "gpus"
    ][2]
    assert gpu["serial"] is None
    assert gpu["read_errors"] == {"nvmlDeviceGetSerial": "no_permission"}
    assert gpu["error"] is None and gpu["uuid"] == "GPU-00000002-0000-0000-0000-000000000002"


def test_a_link_down_and_its_errors(libdir: Path, tmp_path: Path) -> None:
    extra = "gpu.1.nvlink_down = 7\ngpu.1.nvlink_crc_flit = 7:12\ngpu.1.nvlink_replay = 7:3,9:1\n"
    gpus = facts(libdir, tmp_path, "b200", extra)["gpus"]
    assert gpus[1]["nvlink_active"] == [link != 7 for link in range(18)]
    assert gpus[1]["nvlink_errors"] == {"replay": 4, "recovery": 0, "crc_flit": 12, "crc_data": 0}
    assert gpus[0]["nvlink_active"] == [True] * 18


def test_processes(libdir: Path, tmp_path: Path) -> None:
    gpu = facts(libdir, tmp_path, "gb200", f"gpu.0.processes = {os.getpid()}:2048,1:0\n")["gpus"][0]
    assert [(p["pid"], p["used_memory_mib"]) for p in gpu["processes"]] == [
        (os.getpid(), 2048),
        (1, 0),
    ]


def test_a_driver_without_the_deprecated_temperature_call(tmp_path: Path) -> None:
    """NVML 13 deprecates nvmlDeviceGetTemperature, CUDA 14 removes it: nvmlDeviceGetTemperatureV."""
    libdir = _build(tmp_path / "lib", "-DNVML_STUB_NO_LEGACY_TEMPERATURE")
    gpus = facts(libdir, tmp_path, "b200")["gpus"]
    assert [g["temperature_c"] for g in gpus] == [39.0, 53.0, 38.0, 52.0, 38.0, 51.0, 37.0, 51.0]
    assert not any(g.get("read_errors") for g in gpus)


def test_a_snapshot_costs_at_most_160_nvml_calls(libdir: Path, tmp_path: Path) -> None:
    """Issue 13: an 8-GPU snapshot made ~940 calls (576 per-link NVLink counters); at most 150,
    and 160 since issue 31 reads each GPU's device minor (no field value carries it)."""
    calls = tmp_path / "calls"
    facts(libdir, tmp_path, "b200", NVML_STUB_CALLS=str(calls))
    counts = dict(line.rsplit(" ", 1) for line in calls.read_text().splitlines())
    assert int(counts.pop("total")) <= 160, counts
    assert "nvmlDeviceGetNvLinkErrorCounter" not in counts


def judge(snapshot: dict, tmp_path: Path, *checks: str) -> dict:
    """`gpugate check --facts --json` on a snapshot the binding gathered, these checks only."""
    path = tmp_path / "snapshot.yaml"
    path.write_text(yaml.safe_dump(snapshot))
    only = [arg for check in checks for arg in ("--only", check)]
    config = tmp_path / "gpugate.yaml"
    config.write_text("")
    done = subprocess.run(
        [GPUGATE, "check", "--facts", str(path), "--config", str(config), "--json", *only],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


GPU_CHECKS = ("gpu.count", "gpu.lost", "gpu.ecc", "gpu.memory_errors", "gpu.recovery_action",
              "nvlink.links", "nvlink.fabric", "pcie.link")  # fmt: skip


@pytest.mark.parametrize("board", ["b200", "gb200"])
def test_the_healthy_boards_are_judged_ok(libdir: Path, tmp_path: Path, board: str) -> None:
    """Read through the binding, judged by the board's rules: links evaluated, not unknown."""
    verdict = judge(facts(libdir, tmp_path, board), tmp_path, *GPU_CHECKS)
    assert verdict["action"] == "allow"
    assert {f["check"]: f["status"] for f in verdict["findings"]} == dict.fromkeys(GPU_CHECKS, "ok")


def test_a_lost_gpu_and_a_link_down_drain_naming_them(libdir: Path, tmp_path: Path) -> None:
    # As a GPU that fell off the bus often answers: its PCI info still, then nothing.
    extra = f"gpu.3.fail.nvmlDeviceGetUUID = {GPU_IS_LOST}\ngpu.3.fail.nvmlDeviceGetName = {GPU_IS_LOST}\n"
    extra += "gpu.1.nvlink_down = 7\n"
    verdict = judge(facts(libdir, tmp_path, "b200", extra), tmp_path, "gpu.lost", "nvlink.links")
    assert verdict["action"] == "drain"
    failed = {f["check"]: f for f in verdict["findings"] if f["status"] == "fail"}
    assert failed["gpu.lost"]["gpu"] == 3 and "00000000:97:00.0" in failed["gpu.lost"]["message"]
    assert (
        failed["nvlink.links"]["gpu"] == 1
        and "inactive links: 7" in failed["nvlink.links"]["message"]
    )

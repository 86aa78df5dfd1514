"""The host source: limits, /proc/meminfo, /proc/modules and the PCI GPU count."""

from __future__ import annotations

import resource
from pathlib import Path

import paths
from factories import default_config

from gpugate.checks.facts import facts_from_dict
from gpugate.checks.sources import host

FIXTURES = paths.FIXTURES


def config(proc_root: Path, sysfs_root: Path):
    cfg = default_config()
    sources = cfg.sources.replace(proc_root=str(proc_root), sysfs_root=str(sysfs_root))
    return cfg.replace(sources=sources)


def test_read_host_on_the_h100_fixtures():
    data = host.read_host(config(FIXTURES / "proc-h100", FIXTURES / "sys-pci"))
    facts = facts_from_dict(data)
    assert facts.memory.total_mib == 2113448524 // 1024
    assert facts.memory.available_mib == 2044812108 // 1024
    assert facts.memory.swap_total_mib == 8388604 // 1024
    assert facts.memory.swap_used_mib == 256  # SwapTotal - SwapFree = 262144 kB
    assert facts.kernel_modules[:5] == ("nvidia_peermem", "nvidia_uvm", "nvidia_drm",
                                        "nvidia_modeset", "nvidia")  # fmt: skip
    assert {"mlx5_core", "mlx5_ib", "nvidia_peermem"} <= set(facts.kernel_modules)
    # Four 3D controllers; the NVSwitch (0x0680) and the ASPEED VGA (not NVIDIA) are no GPUs.
    assert facts.pci_gpu_count == 4
    assert facts.nvidia_module_version == "550.54.15"  # /sys/module/nvidia/version


def test_limits_are_this_process_limits():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert host.read_limits() == {"nofile_soft": soft, "nofile_hard": hard}


def test_missing_files_leave_keys_unknown(tmp_path):
    data = host.read_host(config(tmp_path / "proc", tmp_path / "sys"))
    assert set(data) == {"limits"}  # absent means "not known", never zero
    assert facts_from_dict(data).pci_gpu_count is None


def test_no_nvidia_module_loaded_leaves_its_version_absent(tmp_path):
    (tmp_path / "sys" / "module" / "nvidia").mkdir(parents=True)  # no version file
    data = host.read_host(config(tmp_path / "proc", tmp_path / "sys"))
    assert "nvidia_module_version" not in data


def test_no_nvidia_gpu_on_the_bus(tmp_path):
    dev = tmp_path / "bus" / "pci" / "devices" / "0000:00:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x8086\n")
    (dev / "class").write_text("0x060000\n")
    assert host.count_pci_gpus(str(tmp_path / "bus" / "pci" / "devices")) == 0


def test_nvidia_vga_class_counts(tmp_path):
    for name, pci_class in (("0000:01:00.0", "0x030000"), ("0000:01:00.1", "0x040300")):
        dev = tmp_path / name
        dev.mkdir()
        (dev / "vendor").write_text("0x10de\n")
        (dev / "class").write_text(pci_class + "\n")
    assert host.count_pci_gpus(str(tmp_path)) == 1  # the GPU, not its HDMI audio function


def test_parse_meminfo_without_memavailable_or_swap():
    # Kernels before 3.14 have no MemAvailable; a missing key is left out, not zero.
    assert host.parse_meminfo("MemTotal:       1024000 kB\nMemFree:  512000 kB\n") == {
        "total_mib": 1000
    }


def test_parse_modules_skips_blank_lines():
    text = "nvidia 8609792 91 - Live 0x0 (OE)\n\nmlx5_core 1 0 - Live 0x0\n"
    assert host.parse_modules(text) == ["nvidia", "mlx5_core"]


def test_read_text(tmp_path):
    f = tmp_path / "attr"
    f.write_bytes(b"0x10de\n\xff")
    assert host.read_text(str(f)) == "0x10de\n\ufffd"
    assert host.read_text(str(tmp_path / "missing")) is None
    assert host.read_text(str(tmp_path)) is None  # a directory

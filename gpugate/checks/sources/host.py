"""Host facts: open-file limits, memory, kernel modules, NVIDIA GPUs on the PCI bus and driver.

`pci_gpu_count` and `nvidia_module_version` are what the host says whatever NVML says: when
NVML cannot start, they tell a GPU node with a broken driver (GPUs on the bus, the kernel
module at another version than the library) from a CPU-only node.

Everything but the limits is read under the configured /proc and /sys roots, so the tests
point them at committed fixture trees. A file that cannot be read leaves its keys absent
("not known"), never zero.
"""

from __future__ import annotations

import os
import resource

from gpugate.checks.sources import proc_path, sys_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config

NVIDIA_VENDOR = "0x10de"
# PCI class codes (PCI Code and ID Assignment spec): 0x0300 VGA controller, 0x0302 3D
# controller (datacenter GPUs). NVSwitches are 0x0680 "other bridge" and are not GPUs.
GPU_CLASSES = ("0x0300", "0x0302")

# /proc/meminfo key -> snapshot key (values in kB, see proc(5)).
_MEMINFO = {"MemTotal": "total_mib", "MemAvailable": "available_mib", "SwapTotal": "swap_total_mib"}


def read_text(path: str) -> str | None:
    """The text of a small procfs/sysfs file, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (OSError, ValueError):  # missing, EIO/EINVAL from a driver attribute, a bad path
        return None


def read_host(config: Config) -> dict:
    """Limits, memory, kernel modules and the PCI GPU count as snapshot keys."""
    facts: dict = {"limits": read_limits()}
    memory = parse_meminfo(read_text(proc_path(config, "meminfo")) or "")
    if memory:
        facts["memory"] = memory
    modules = read_text(proc_path(config, "modules"))
    if modules is not None:
        facts["kernel_modules"] = parse_modules(modules)
    count = count_pci_gpus(sys_path(config, "bus", "pci", "devices"))
    if count is not None:
        facts["pci_gpu_count"] = count
    # The loaded nvidia.ko's version (absent: not loaded); NVML refuses to start when the
    # library's differs (NVML_ERROR_LIB_RM_VERSION_MISMATCH), e.g. after an update, before a reboot.
    version = (read_text(sys_path(config, "module", "nvidia", "version")) or "").strip()
    if version:
        facts["nvidia_module_version"] = version
    return facts


def read_limits() -> dict:
    """This process's open-file limit (soft and hard).

    The prolog is started by slurmd and inherits slurmd's limits, which are what job steps
    start from (and the hard ceiling when Slurm propagates the submit shell's soft limits,
    PropagateResourceLimits). Run by hand, `gpugate facts` reports the calling shell's limits.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"nofile_soft": soft, "nofile_hard": hard}


def parse_meminfo(text: str) -> dict:
    """`/proc/meminfo` text -> {total_mib, available_mib, swap_total_mib, swap_used_mib}."""
    kib: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        # int() refuses "²" (a digit, not a decimal) and 5000 digits; 20 hold any 64-bit value.
        if fields and fields[0].isdecimal() and len(fields[0]) <= 20:
            kib[key.strip()] = int(fields[0])
    memory = {snap: kib[key] // 1024 for key, snap in _MEMINFO.items() if key in kib}
    if "SwapTotal" in kib and "SwapFree" in kib:
        memory["swap_used_mib"] = (kib["SwapTotal"] - kib["SwapFree"]) // 1024
    return memory


def parse_modules(text: str) -> list[str]:
    """`/proc/modules` text -> module names (the first field of each line)."""
    return [line.split(None, 1)[0] for line in text.splitlines() if line.strip()]


def count_pci_gpus(devices_dir: str) -> int | None:
    """NVIDIA GPUs (display/3D class) under `<sysfs>/bus/pci/devices`; None if unreadable."""
    try:
        names = os.listdir(devices_dir)
    except OSError:
        return None
    return sum(1 for name in names if _is_nvidia_gpu(os.path.join(devices_dir, name)))


def _is_nvidia_gpu(device_dir: str) -> bool:
    vendor = (read_text(os.path.join(device_dir, "vendor")) or "").strip().lower()
    if vendor != NVIDIA_VENDOR:
        return False
    pci_class = (read_text(os.path.join(device_dir, "class")) or "").strip().lower()
    return pci_class.startswith(GPU_CLASSES)


def loaded_library_version(maps_path: str) -> str | None:
    """`550.90.07` for /usr/lib64/libnvidia-ml.so.550.90.07 mapped into this process, else None.

    libnvidia-ml.so.1 is a link to the versioned file the driver package installed; the kernel
    module's version is /sys/module/nvidia/version (read_host). Read when nvmlInit fails.
    """
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                _, found, version = line.strip().rpartition("/libnvidia-ml.so.")
                if found and version[:1].isdecimal() and version != "1":
                    return version
    except OSError:
        pass
    return None

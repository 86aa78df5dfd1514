"""`nvidia-smi -q -x` output turned into a gpugate snapshot (docs/snapshot.md).

`snapshot_from_xml(text)` reads what `nvidia-smi -q -x` printed on a node (DTD v11 to v13 seen:
drivers 515 to 595) and returns the snapshot keys NVML would have given there: `driver_version`,
`cuda_driver_version` and `gpus`. `gpugate facts --from-nvidia-smi-xml FILE` writes it, so a
capture from a node (or a vendor's test data) replays through `gpugate check --facts`.

Absent means unknown: a field nvidia-smi printed as `N/A`, `Not Supported`, `Unknown Error`,
`Insufficient Permissions`, or did not print at all, is left out (None), never 0. The capture
holds no kernel log, InfiniBand, host or mount facts and no NVLink link states (those are
`nvidia-smi nvlink -s`), so those keys stay absent too; `pci_gpu_count` (sysfs) is not in it.

Tag names follow nvidia-smi's XML (nvsmi_device_v13.dtd, driver 580; the v11 and v12 names of
drivers 515/535 too): `clocks_event_reasons` (v12+) or `clocks_throttle_reasons` (v11),
`gpu_power_readings` (v12+) or `power_readings` (v11), `instant_power_draw` (580) or
`power_draw`, `current_power_limit` (580) or `enforced_power_limit` / `power_limit`.
"""

from __future__ import annotations

from xml.etree import ElementTree

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any
    from xml.etree.ElementTree import Element

# What nvidia-smi prints where NVML had no value: each means "not known".
_UNKNOWN = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error",
            "insufficient permissions", "none", "not available"}  # fmt: skip

# nvidia-smi's reason tag (after the clocks_event_reason_ / clocks_throttle_reason_ prefix) ->
# the name gpugate/checks/sources/nvml.py gives the same NVML bit.
_REASON_NAMES = {"display_clocks_setting": "display_clock_setting"}

# Fabric states as nvidia-smi prints them (nvmlGpuFabricState_t): N/A where there is no fabric.
_FABRIC_STATES = {"not started": "not_started", "in progress": "in_progress",
                  "completed": "completed"}  # fmt: skip


class NvidiaSmiXmlError(ValueError):
    """The text is not `nvidia-smi -q -x` output."""


def snapshot_from_xml(text: str, node: str | None = None) -> dict[str, Any]:
    """The snapshot keys `nvidia-smi -q -x` output carries; `node` names the node if given."""

    try:
        # No DTD reaches the parser (_without_doctype), so no entity can be declared: none of
        # the entity-expansion attacks S314 warns of applies to what is left.
        root = ElementTree.fromstring(_without_doctype(text))  # noqa: S314
    except ElementTree.ParseError as exc:
        raise NvidiaSmiXmlError(f"not XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiXmlError(f"not nvidia-smi -q -x output: root element <{root.tag}>")
    snapshot: dict[str, Any] = {}
    if node:
        snapshot["node"] = node
    snapshot["driver_version"] = _text(root, "driver_version")
    snapshot["cuda_driver_version"] = _text(root, "cuda_version")
    snapshot["gpus"] = [gpu_from_xml(g, i) for i, g in enumerate(root.findall("gpu"))]
    stamp = _text(root, "timestamp")
    if stamp:
        # As nvidia-smi printed it, in the node's local time: not `collected_at` (UTC).
        snapshot["nvidia_smi_timestamp"] = stamp
    return _known(snapshot)


def _without_doctype(text: str) -> str:
    # nvidia-smi's DOCTYPE only names its DTD file (`SYSTEM "nvsmi_device_v13.dtd"`), which is
    # not here; it is dropped. One with an internal subset (`[...]`, entity declarations) is
    # not nvidia-smi's and is refused.
    start = text.find("<!DOCTYPE")
    if start < 0:
        return text
    end = text.find(">", start)
    if end < 0 or "[" in text[start:end]:
        raise NvidiaSmiXmlError("not nvidia-smi -q -x output: a DOCTYPE with declarations")
    return text[:start] + text[end + 1 :]


def gpu_from_xml(g: Element, index: int) -> dict[str, Any]:
    """One `<gpu>` element as the snapshot's GPU keys (index: its place in the file)."""
    gpu: dict[str, Any] = {
        "index": index,
        "uuid": _text(g, "uuid"),
        "name": _text(g, "product_name"),
        "pci_bus_id": _text(g, "pci/pci_bus_id") or g.get("id") or None,
        "serial": _text(g, "serial"),
        # nvmlDeviceGetMinorNumber: the GPU is /dev/nvidia<minor>, not /dev/nvidia<index>.
        "minor_number": _int(g, "minor_number"),
        "temperature_c": _number(g, "temperature/gpu_temp"),
        "throttle_reasons": _reasons(g),
        "ecc_mode_enabled": _flag(g, "ecc_mode/current_ecc"),
        "retired_pages_pending": _flag(g, "retired_pages/pending_retirement"),
        # `<remapped_rows>N/A</remapped_rows>`: pre-Ampere, or MIG enabled: absent.
        "remapped_rows": _group(g, "remapped_rows", _REMAPPED_ROWS),
        "pcie": _group(g, "pci", _PCIE),
        "memory_used_mib": _int(g, "fb_memory_usage/used"),
        "memory_total_mib": _int(g, "fb_memory_usage/total"),
        "processes": _processes(g),
        "persistence_mode": _flag(g, "persistence_mode"),
        "recovery_action": _recovery_action(g),
    }
    gpu.update(_power(g))
    gpu.update(_ecc_counts(g))
    gpu.update(_fabric(g))
    return _known(gpu)


def _text(e: Element, path: str) -> str | None:
    """The element's text, stripped; None where it is absent or nvidia-smi had no value."""
    found = e.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return None if value.lower() in _UNKNOWN else value


def _number(e: Element, path: str) -> float | None:
    """`39 C`, `195.79 W`, `0 MiB`, `16x`: the leading number."""
    value = _text(e, path)
    if value is None:
        return None
    head = value.split()[0].rstrip("xX")
    try:
        return float(head)
    except ValueError:
        return None


def _int(e: Element, path: str) -> int | None:
    value = _number(e, path)
    return None if value is None else int(value)


def _flag(e: Element, path: str) -> bool | None:
    """Enabled/Disabled, Yes/No, Active/Not Active, True/False."""
    value = _text(e, path)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("enabled", "yes", "active", "true"):
        return True
    if lowered in ("disabled", "no", "not active", "false"):
        return False
    return None


def _snake(value: str | None) -> str | None:
    return None if value is None else "_".join(value.lower().split())


def _reasons(g: Element) -> list[str] | None:
    for block, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        found = g.find(block)
        if found is None:
            continue
        active, known = [], False
        for child in found:
            state = _flag(found, child.tag)
            known = known or state is not None
            if state:
                name = child.tag.removeprefix(prefix)
                active.append(_REASON_NAMES.get(name, name))
        return active if known else None
    return None


def _power(g: Element) -> dict[str, Any]:
    block = g.find("gpu_power_readings")  # v12+: the GPU alone, apart from the module (GB200)
    if block is None:
        block = g.find("power_readings")
    if block is None:
        return {}
    draw = _first(block, "instant_power_draw", "power_draw", "average_power_draw")
    limit = _first(block, "current_power_limit", "enforced_power_limit", "power_limit")
    return {"power_draw_w": draw, "power_limit_w": limit}


def _first(e: Element, *paths: str) -> float | None:
    for path in paths:
        value = _number(e, path)
        if value is not None:
            return value
    return None


def _ecc_counts(g: Element) -> dict[str, Any]:
    """Totals over memory locations, as nvmlDeviceGetTotalEccErrors gives them."""
    out = {}
    for period in ("volatile", "aggregate"):
        block = g.find(f"ecc_errors/{period}")
        if block is None:
            continue
        uncorrected, corrected = _ecc_block(block)
        out[f"ecc_{period}_uncorrected"] = uncorrected
        out[f"ecc_{period}_corrected"] = corrected
    return out


def _ecc_block(block: Element) -> tuple[int | None, int | None]:
    if block.find("double_bit") is not None or block.find("single_bit") is not None:
        # v11 and older (Volta/Turing drivers): per-location counters with a total.
        return _int(block, "double_bit/total"), _int(block, "single_bit/total")
    # v12+: sram_/dram_ counters; SRAM uncorrectable is split in parity and SEC-DED on Ampere+.
    uncorrected = [c for c in block if "uncorrectable" in c.tag]
    corrected = [c for c in block if c.tag.endswith("_correctable")]
    return _sum(block, uncorrected), _sum(block, corrected)


def _sum(block: Element, children: list[Any]) -> int | None:
    values = [_int(block, c.tag) for c in children]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


# key -> (reader, path under the group's element), per group of keys read from one element.
_REMAPPED_ROWS = {
    "corrected": (_int, "remapped_row_corr"),
    "uncorrected": (_int, "remapped_row_unc"),
    "pending": (_flag, "remapped_row_pending"),
    "failure": (_flag, "remapped_row_failure"),
}
_PCIE = {
    "gen": (_int, "pci_gpu_link_info/pcie_gen/current_link_gen"),
    # nvidia-smi's "Max" is nvmlDeviceGetMaxPcieLinkGeneration, as in nvml.py (GPU and slot);
    # "Device Max" (max_device_link_gen) is the GPU's alone: a GB200 reads 5 here and 6 there.
    "max_gen": (_int, "pci_gpu_link_info/pcie_gen/max_link_gen"),
    "width": (_int, "pci_gpu_link_info/link_widths/current_link_width"),
    "max_width": (_int, "pci_gpu_link_info/link_widths/max_link_width"),
    "replay_errors": (_int, "replay_counter"),
}


def _group(g: Element, path: str, fields: dict[str, Any]) -> dict[str, Any] | None:
    """The keys of `fields` read under `path`; None where none of them is known (`N/A`)."""
    block = g.find(path)
    if block is None:
        return None
    return _known({key: read(block, sub) for key, (read, sub) in fields.items()}) or None


def _known(values: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _processes(g: Element) -> list[dict[str, Any]] | None:
    block = g.find("processes")
    if block is None:
        return None
    if block.text and block.text.strip() and not len(block):
        return None  # `<processes>N/A</processes>`: nvidia-smi could not list them
    out = []
    for proc in block.findall("process_info"):
        kind = (_text(proc, "type") or "C").upper()
        if "C" not in kind:
            continue  # graphics-only (Xorg): NVML's compute-process list does not hold it
        entry = {
            "pid": _int(proc, "pid"),
            "name": _text(proc, "process_name"),
            "used_memory_mib": _int(proc, "used_memory"),
        }
        out.append(_known(entry))
    return out


def _recovery_action(g: Element) -> str | None:
    # `None` here is NVML_GPU_RECOVERY_ACTION_NONE ("nothing to do"), not a missing value.
    found = g.find("gpu_recovery_action")
    value = (found.text or "").strip() if found is not None else ""
    if value.lower() == "none":
        return "none"
    return _snake(value) if value.lower() not in _UNKNOWN else None


def _fabric(g: Element) -> dict[str, Any]:
    state = _text(g, "fabric/state")
    if state is None:
        return {}  # no NVSwitch fabric (N/A): not applicable, both keys stay absent
    return {
        "fabric_state": _FABRIC_STATES.get(state.lower(), _snake(state)),
        "fabric_status": _snake(_text(g, "fabric/status")),
    }

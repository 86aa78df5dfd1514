"""InfiniBand/RoCE ports from `<sysfs>/class/infiniband/<dev>/ports/<n>/`.

File formats come from the kernel's drivers/infiniband/core/sysfs.c: `state` and `phys_state`
are "<num>: <NAME>", `rate` is "<Gb> Gb/sec (<width>X <SPEED>)" and may hold a fraction
("2.5 Gb/sec (1X SDR)"), and `counters/*` are decimal PMA counters, or "N/A (no PMA)" on a
device without a performance-management agent.
"""

from __future__ import annotations

import os
import re

from gpugate.checks.sources import sys_path
from gpugate.checks.sources.host import read_text
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.config.schema import Config

_RATE_RE = lazy(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def read_infiniband(config: Config) -> dict[str, Any]:
    """Every port of every IB/RoCE device; `[]` on a node without /sys/class/infiniband."""
    root = sys_path(config, "class", "infiniband")
    if not os.path.isdir(root):
        return {"infiniband": []}  # no RDMA driver loaded: no ports, not an error
    ports = []
    for device in sorted(os.listdir(root), key=_natural):
        ports_dir = os.path.join(root, device, "ports")
        for port in sorted(_listdir(ports_dir), key=_natural):
            if port.isdigit():
                ports.append(read_port(os.path.join(ports_dir, port), device, int(port)))
    return {"infiniband": ports}


def read_port(port_dir: str, device: str, port: int) -> dict[str, Any]:
    """One port directory -> an `infiniband` snapshot entry."""
    return {
        "device": device,
        "port": port,
        "state": parse_state(read_text(os.path.join(port_dir, "state"))),
        "phys_state": parse_state(read_text(os.path.join(port_dir, "phys_state"))),
        "rate_gbps": parse_rate(read_text(os.path.join(port_dir, "rate"))),
        "link_layer": _strip(read_text(os.path.join(port_dir, "link_layer"))),
        "counters": read_counters(os.path.join(port_dir, "counters")),
    }


def parse_state(text: str | None) -> str | None:
    """`4: ACTIVE` -> `ACTIVE`, `5: LinkUp` -> `LinkUp` (the name after the number)."""
    value = _strip(text)
    if value is None:
        return None
    number, sep, name = value.partition(":")
    return name.strip() if sep and number.strip().isdigit() else value


def parse_rate(text: str | None) -> float | None:
    """`400 Gb/sec (4X NDR)` -> 400.0, `2.5 Gb/sec (1X SDR)` -> 2.5; None if unreadable."""
    m = _RATE_RE.match(text or "")
    return float(m.group(1)) if m else None


def read_counters(counters_dir: str) -> dict[str, int]:
    """The integer counters of one port; unreadable and `N/A (no PMA)` values are skipped."""
    counters = {}
    for name in sorted(_listdir(counters_dir)):
        value = _strip(read_text(os.path.join(counters_dir, name)))
        # int() refuses "²" (a digit, not a decimal) and 5000 digits; 20 hold any 64-bit value.
        if value is not None and value.isdecimal() and len(value) <= 20:
            counters[name] = int(value)
    return counters


def _strip(text: str | None) -> str | None:
    if text is None:
        return None
    return text.strip() or None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _natural(name: str) -> tuple[Any, ...]:
    # mlx5_2 before mlx5_10: compare digit runs as numbers.
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))

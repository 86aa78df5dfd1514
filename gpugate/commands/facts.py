"""`gpugate facts`: gather this node's facts and write them as a YAML snapshot."""

from __future__ import annotations

import sys

from gpugate.checks.sources import gather_dict
from gpugate.checks.sources.nvidia_smi_xml import NvidiaSmiXmlError, snapshot_from_xml
from gpugate.cli import make_parser
from gpugate.config import load_config
from gpugate.fsutil import atomic_write, read_text
from gpugate.node import node_name
from gpugate.yamlio import dump_yaml

XML_MAX = 64 << 20  # `nvidia-smi -q -x` of 8 GPUs is well under 1 MiB

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser
    from typing import Any


def parser() -> ArgumentParser:
    """Options of `gpugate facts`."""
    p = make_parser(
        "gpugate facts",
        "Gather this node's facts (NVML, kernel log, InfiniBand, limits, memory, "
        "mounts) and write them as a YAML snapshot that `gpugate check --facts` replays.",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.add_argument("--config", metavar="FILE", help="site config")
    p.add_argument(
        "--source",
        action="append",
        metavar="NAME",
        help="gather only this source (nvml, kernel_log, infiniband, host, mounts)",
    )
    p.add_argument(
        "--from-nvidia-smi-xml",
        metavar="FILE",
        help="convert this `nvidia-smi -q -x` output instead of reading the node",
    )
    return p  # fmt: skip


def main(argv: list[str]) -> int:
    """Run `gpugate facts`."""
    args = parser().parse_args(argv)

    if args.from_nvidia_smi_xml:
        snapshot = _from_xml(args.from_nvidia_smi_xml)
        if snapshot is None:
            return 2
    else:
        snapshot = gather_dict(load_config(args.config), node_name(), only=args.source)
    text = "# gpugate facts snapshot\n" + dump_yaml(snapshot)
    if args.output:
        atomic_write(args.output, text, mode=0o644)
    else:
        sys.stdout.write(text)
    errors = snapshot.get("source_errors") or {}
    for name, why in errors.items():
        print(f"gpugate facts: source {name}: {why}", file=sys.stderr)
    return 0


def _from_xml(path: str) -> dict[str, Any] | None:
    try:  # a regular file under the cap, opened without blocking (never a FIFO or a device)
        return snapshot_from_xml(read_text(path, XML_MAX))
    except OSError as exc:
        print(f"gpugate facts: {path}: {exc.strerror or exc}", file=sys.stderr)
        return None
    except NvidiaSmiXmlError as exc:
        print(f"gpugate facts: {path}: {exc}", file=sys.stderr)
        return None

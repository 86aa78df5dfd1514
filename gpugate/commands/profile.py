"""`gpugate profile --from FACTS.yaml`: learn a node class's expectations from a known-good node.

What a GPU board cannot know is the site's: how many GPUs and fabric ports a node has, at
what rate, which driver it runs, how its slots are wired (a PCIe card in a slot wired x8 is
no degraded link there). `gpugate facts -o good.yaml` on a node the site knows is healthy,
then `gpugate profile --from good.yaml -o class.yaml`, writes those values in the site
config's own syntax: the file is a valid site config (`--config class.yaml`), and its
`expect:` and `checks:` blocks can be pasted under a node class
(`classes: [{nodes: "gpu[001-128]", expect: {...}}]`).
"""

from __future__ import annotations

import sys

from gpugate.checks.facts import load_snapshot
from gpugate.cli import make_parser
from gpugate.config import ConfigError, load_config
from gpugate.config.classes import split_classes
from gpugate.fsutil import atomic_write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser
    from typing import Any

    from gpugate.checks.facts import Facts, Gpu
    from gpugate.config.schema import Config


def parser() -> ArgumentParser:
    """Options of `gpugate profile`."""
    p = make_parser(
        "gpugate profile",
        "Learn a node-class profile (GPU count, fabric ports and rate, driver, NVLinks, PCIe "
        "width and generation) from the snapshot of a known-good node, written as a site "
        "config (expect: and checks:) that a site includes for that class of nodes.",
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="FACTS",
        required=True,
        help="snapshot of a known-good node (`gpugate facts -o FILE`)",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.add_argument(
        "--nodes",
        metavar="HOSTLIST",
        help='write it as one node class of these nodes: classes: [{nodes: "gpu[01-16]", ...}]',
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="site config (its checks.ib.link_layers say which ports count)",
    )
    return p  # fmt: skip


def _links(g: Gpu) -> int | None:
    return None if g.nvlink_active is None else sum(1 for up in g.nvlink_active if up)


def _least(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def gpu_expectations(gpus: tuple[Gpu, ...]) -> dict[str, Any]:
    """GPU count, NVLinks per GPU, PCIe width/generation and NVSwitch from NVML's GPUs."""
    readable = [g for g in gpus if not g.error]
    pcie = [g.pcie for g in readable if g.pcie is not None]
    # The trained maximum is what the slot allows (NVML: "possible with this device and
    # system"); the narrowest GPU's is the class's, so a slot wired x8 is expected at x8.
    return {
        "gpu_count": len(gpus),
        "nvlinks_per_gpu": _least([_links(g) for g in readable]),
        "pcie_gen": _least([p.max_gen for p in pcie]),
        "pcie_width": _least([p.max_width if p.max_width is not None else p.width for p in pcie]),
        "nvswitch": any(g.fabric_state is not None for g in readable) if readable else None,
    }


def learn(facts: Facts, config: Config) -> dict[str, Any]:
    """The site-config mapping (`expect:`, `checks:`) of the class `facts` is a good node of."""
    expect: dict[str, Any] = {}
    if facts.gpus is not None:
        expect.update(gpu_expectations(facts.gpus))
    elif facts.pci_gpu_count == 0:
        expect["gpu_count"] = 0  # a CPU-only node
    if facts.infiniband is not None:
        layers = config.checks.ib.link_layers
        up = [p for p in facts.infiniband if p.link_layer in layers and _active(p)]
        expect["ib_ports"] = len(up)
        rates = [p.rate_gbps for p in up if p.rate_gbps is not None]
        if rates:
            expect["ib_rate_gbps"] = min(rates)
    out: dict[str, Any] = {"expect": {k: v for k, v in expect.items() if v is not None}}
    if facts.driver_version:
        out["checks"] = {"gpu": {"driver_version": facts.driver_version}}
    return out


def as_class(learned: dict[str, Any], nodes: str) -> dict[str, Any]:
    """The profile as one node class of `nodes` (a Slurm hostlist), checked like the config's."""

    wrapped = {"classes": [{"nodes": nodes, **learned}]}
    split_classes(wrapped, "--nodes", ConfigError)  # a hostlist the loader would refuse
    return wrapped


def _active(p: object) -> bool:
    state, phys = getattr(p, "state", None) or "", getattr(p, "phys_state", None) or ""
    return state.upper() == "ACTIVE" and phys.lower() == "linkup"


def render(facts: Facts, learned: dict[str, Any], source: str) -> str:
    """The profile as YAML, with a header saying where it was learned and how to use it."""
    import yaml  # a block-style file for people to read and review

    widths = ", ".join(
        f"GPU{g.index} x{g.pcie.max_width or g.pcie.width}"
        for g in facts.gpus or ()
        if g.pcie is not None and (g.pcie.max_width or g.pcie.width)
    )
    head = [
        "# gpugate node-class profile, learned by `gpugate profile` from a known-good node:",
        f"#   node {facts.node or '?'}, snapshot {source}, collected {facts.collected_at or '?'}",
        "# A valid site config (gpugate check --config FILE); or paste its expect:/checks:",
        '# under a node class: classes: [{nodes: "gpu[001-128]", expect: {...}}].',
        "# Only ports that were ACTIVE/LinkUp are counted; review before deploying.",
    ]
    if widths:
        head.append(f"# PCIe width per GPU (trained maximum): {widths}")
    body = yaml.safe_dump(learned, default_flow_style=False, sort_keys=False)
    return "\n".join(head) + "\n" + body


def main(argv: list[str]) -> int:
    """Run `gpugate profile`."""
    args = parser().parse_args(argv)
    config = load_config(args.config)
    facts = load_snapshot(args.source)
    learned = learn(facts, config)
    if args.nodes:
        learned = as_class(learned, args.nodes)
    text = render(facts, learned, args.source)
    if args.output:
        atomic_write(args.output, text, mode=0o644)
    else:
        sys.stdout.write(text)
    return 0

"""`gpugate isolate`: the isolation step a hook starts, and whether this site can isolate."""

from __future__ import annotations

from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, make_parser
from gpugate.commands.ask import ask_slurm_for
from gpugate.isolate import apply
from gpugate.names import refuse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser


def parser() -> ArgumentParser:
    """Options of `gpugate isolate`."""
    p = make_parser(
        "gpugate isolate",
        "`apply NODE`: carry out the GPU isolation a hook requested on this node (the hook "
        "starts it in the background: drain held, device denied, slurm.conf and gres.conf "
        "rewritten, `scontrol reconfigure`, the count read back, resume; any failure leaves the "
        "node drained with the reason). `check NODE`: say whether this site can isolate a GPU "
        "of NODE, and why not. Exit 0, or 1 when the isolation failed or cannot be done.",
    )
    p.add_argument("action", choices=("apply", "check"))
    p.add_argument("node")
    p.add_argument("--config", metavar="FILE", help="site config")
    return p


def main(argv: list[str]) -> int:
    """Run `gpugate isolate`."""
    args = parser().parse_args(argv)
    found = ask_slurm_for(
        "gpugate isolate", "node", args.node, args.config, lambda slurm, node: slurm.node(node)
    )
    if isinstance(found, int):
        return found
    config, slurm, _info = found
    if args.action == "check":
        why = apply.site_problem(config, slurm, args.node)
        if why:
            return refuse("gpugate isolate", f"{args.node}: cannot isolate here: {why}",
                          EXIT_UNHEALTHY)  # fmt: skip
        unit = config.isolate.unit if config.isolate else "node"
        print(f"gpugate isolate: {args.node}: this site can isolate a GPU (isolate.unit: {unit})")
        return EXIT_OK
    if not apply.this_node_is(args.node):
        return refuse("gpugate isolate", f"apply runs on {args.node} itself (its cgroup)",
                      EXIT_UNHEALTHY)  # fmt: skip
    try:
        done = apply.apply(config, slurm, args.node)
    except apply.IsolationFailed as exc:
        return refuse("gpugate isolate", str(exc), EXIT_UNHEALTHY)
    gpus = ", ".join(f"GPU {g.gpu.index}" for g in done.gpus)
    if done.state != "applied":
        return refuse("gpugate isolate", f"{args.node}: {gpus} not isolated: {done.why}; "
                      "the node stays drained", EXIT_UNHEALTHY)  # fmt: skip
    print(f"gpugate isolate: {args.node}: {gpus} out of Slurm's service; the node is back")
    return EXIT_OK

"""`gpugate isolate`: the isolation step a hook starts, and whether this site can isolate."""

from __future__ import annotations

from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, make_parser
from gpugate.commands.ask import ask_slurm_for
from gpugate.isolate import apply, remote, state
from gpugate.names import refuse
from gpugate.store.locks import ISOLATE
from gpugate.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser
    from collections.abc import Callable

    from gpugate.config.schema import Config
    from gpugate.isolate.state import Isolation
    from gpugate.slurm.control import SlurmControl


def parser() -> ArgumentParser:
    """Options of `gpugate isolate`."""
    p = make_parser(
        "gpugate isolate",
        "`apply NODE`: carry out the GPU isolation a hook requested on this node (the hook "
        "starts it in the background: drain held, device denied, slurm.conf and gres.conf "
        "rewritten, `scontrol reconfigure`, the count read back, resume; any failure leaves the "
        "node drained with the reason); with --dry-run, say each of those changes (the device "
        "rule, the files' lines, the Slurm calls) and change nothing. `check NODE`: say whether "
        "this site can isolate a GPU of NODE, and why not. `put-back NODE`: put back the GPUs "
        "whose put-back `gpugate resume NODE` asked on another host (the node's health check "
        "starts it; the same path as `gpugate resume` on the node). Exit 0, or 1 when the "
        "isolation (or put-back) failed or cannot be done (or, dry, would fail).",
    )
    p.add_argument("action", choices=("apply", "check", "put-back"))
    p.add_argument("node")
    p.add_argument(
        "--dry-run", action="store_true", help="apply: say what it would do, change nothing"
    )
    p.add_argument("--config", metavar="FILE", help="site config")
    return p


def main(argv: list[str], make_slurm: Callable[[Config], SlurmControl] | None = None) -> int:
    """Run `gpugate isolate`; `make_slurm` makes the Slurm backend (default: the site's)."""
    args = parser().parse_args(argv)
    found = ask_slurm_for(
        "gpugate isolate",
        "node",
        args.node,
        args.config,
        lambda slurm, node: slurm.node(node),
        make_slurm,
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
        print(f"gpugate isolate: {args.node}: this site can isolate a GPU (isolate.unit: {unit}) "
              f"by {apply.route(config, args.node)}")  # fmt: skip
        return EXIT_OK
    if not apply.this_node_is(args.node):
        return refuse("gpugate isolate", f"{args.action} runs on {args.node} itself (its cgroup)",
                      EXIT_UNHEALTHY)  # fmt: skip
    if args.action == "put-back":
        return put_back(config, slurm, args.node)
    if args.dry_run:
        return dry_run(config, slurm, args.node)
    try:
        done = apply.apply(config, slurm, args.node)
    except apply.IsolationFailed as exc:
        return refuse("gpugate isolate", str(exc), EXIT_UNHEALTHY)
    back, said = outcome(args.node, done)
    if not back:
        return refuse("gpugate isolate", said, EXIT_UNHEALTHY)
    print(f"gpugate isolate: {said}")
    return EXIT_OK


def outcome(node: str, done: Isolation) -> tuple[bool, str]:
    """(whether the node is back in service, what to say) after `apply`. An isolation kept
    in place because its undo was not allowed (applied, with a why) left the node drained."""
    gpus = ", ".join(f"GPU {g.gpu.index}" for g in done.gpus)
    if done.state != "applied":
        return False, f"{node}: {gpus} not isolated: {done.why}; the node stays drained"
    if done.why:
        return (
            False,
            f"{node}: {gpus} out of Slurm's service, but the node stays drained: {done.why}",
        )
    return True, f"{node}: {gpus} out of Slurm's service; the node is back"


def dry_run(config: Config, slurm: SlurmControl, node: str) -> int:
    """`apply NODE --dry-run`: what apply would do now, each a `would` line; nothing changed."""
    try:
        lines = apply.preview(config, slurm, node)
    except apply.IsolationFailed as exc:
        return refuse("gpugate isolate", f"dry run: would fail: {exc}; the node would stay drained",
                      EXIT_UNHEALTHY)  # fmt: skip
    print(f"gpugate isolate: {printable(node)}: dry run, nothing changed; apply would:")
    for line in lines:
        print(f"  {'' if line.startswith('  ') else 'would '}{printable(line)}")
    return EXIT_OK


def put_back(config: Config, slurm: SlurmControl, node: str) -> int:
    """`put-back NODE` (started by the node's health check): the put-back asked on another host,
    through `gpugate resume`'s own path on the node (admin.resume.restore_isolated: the checks,
    the quiet controller, the files, the resume, the audit as who asked). A refusal ends the
    request and leaves the node drained saying why (isolate/remote.py)."""
    from gpugate.admin.resume import Request, restore_isolated
    from gpugate.fsutil import FileLock, lock_file

    record = state.load(state.shared_path(config, node))
    if record is None or record.state != state.APPLIED or record.put_back is None:
        return refuse("gpugate isolate", f"{node}: no put-back asked", EXIT_UNHEALTHY)
    who = f"{remote.who_asked(record)} (gpugate health on {node})"
    request = Request(node=node, why=record.put_back.why or "put-back asked", who=who)
    with FileLock(lock_file(config.state_dir, ISOLATE), wait_s=0) as lock:
        if not lock.held:
            return refuse("gpugate isolate", f"{node}: another `gpugate isolate` runs",
                          EXIT_UNHEALTHY)  # fmt: skip
        attempt = restore_isolated(config, slurm, slurm.node(node), request)
        if not attempt.resumed:
            remote.give_up(config, slurm, node, attempt.why)
            return refuse("gpugate isolate", f"{node}: not put back: {attempt.why}",
                          EXIT_UNHEALTHY)  # fmt: skip
    print(f"gpugate isolate: {node}: {remote.gpu_names(record)} back; resumed ({attempt.result})")
    return EXIT_OK

"""`gpugate resume NODE [--force] [--qualify [--level N]]`: check the node first, resume only
what passes (and, where `admin.resume_qualify` asks, what a qualification proved), audited."""

from __future__ import annotations

import os

from gpugate.admin.resume import Request, check_then_resume, held_notice, restore_isolated
from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, make_parser
from gpugate.commands.ask import ask_slurm_for
from gpugate.isolate.remote import Refused, ask_put_back
from gpugate.isolate.state import APPLIED, forget, load, local_path, shared_path
from gpugate.names import refuse
from gpugate.node import node_name
from gpugate.slurm.control import NotOurDrain
from gpugate.store.history import current_user, history_dir, read_dirs, record_resume
from gpugate.store.ledger import ADMIN
from gpugate.store.suspects import open_flags

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser
    from collections.abc import Callable

    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl


def parser() -> ArgumentParser:
    """Options of `gpugate resume`."""
    p = make_parser(
        "gpugate resume",
        "Run the checklist for NODE (on the node itself, from --facts taken there, or from the "
        "configured replay) and resume it only if it passes and only if gpugate drained it "
        "(--force for an admin's drain or a failing check). Every attempt is appended to the "
        "audit log with who, when, why and the check result. Exit 0 resumed, 1 refused (or "
        "Slurm does not know NODE), 2 when NODE is not one plain node name. Where "
        "admin.resume_qualify asks a qualification of the drain's fault class, the node goes "
        "back only once one of that level passed since the drain began; --qualify runs it. "
        "A node with isolated GPUs, asked from another host: the put-back is recorded and the "
        "node's own health check does it (refused where no HealthCheckProgram runs).",
    )
    p.add_argument("node", metavar="NODE")
    p.add_argument(
        "--why", default="", help="why the node can go back (e.g. 'GPU3 replaced, RMA 4711')"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="resume an admin's drain or a node that fails its checks",
    )
    p.add_argument(
        "--facts",
        metavar="FILE",
        help="a snapshot from `gpugate facts` run on NODE (at most an hour old)",
    )
    p.add_argument(
        "--qualify",
        action="store_true",
        help="after the checklist passes, run the qualification the drain calls for (unless "
        "one passed since the drain began) and resume only if it passes",
    )
    p.add_argument(
        "--level",
        type=int,
        choices=range(1, 5),
        metavar="N",
        help="qualification level 1-4 (dcgmi diag -r N); default: the drain's "
        "(admin.resume_qualify), else qualify.level",
    )
    p.add_argument("--config", metavar="FILE", help="site config")
    return p  # fmt: skip


def clear_suspicion(config: Config, node: str, why: str | None) -> str | None:
    """An admin's look at a suspect in service closes its flag and votes (audited); what was done."""

    flag = open_flags(read_dirs(config)).get(node)
    if flag is None:
        return None
    # The ledger's step is the admin's act (ADMIN): the node was in service, not resumed.
    record_resume(history_dir(config), node, why=why or "", reason=f"suspect: {flag.detail}",
                  result="suspicion cleared by an admin (the node was in service)",
                  step=ADMIN)  # fmt: skip
    return (
        f"{node} is in service; its suspicion ({flag.source}: {flag.detail}) is "
        "cleared: votes and application Xids before now no longer count (audited)"
    )


def isolation_of(config: Config, node: str) -> bool | str:
    """Whether `node` has GPUs isolated that a resume puts back (or why that cannot be read)."""
    try:
        record = load(shared_path(config, node))
    except ValueError as exc:
        return f"cannot read {node}'s isolation record: {exc}"
    return record is not None and record.state == APPLIED


def forget_failed_isolation(config: Config, node: str) -> None:
    """A resumed node's isolation that never took (its records) is over."""
    from gpugate.isolate.apply import this_node_is

    here = this_node_is(node)
    if os.path.exists(shared_path(config, node)) or (here and os.path.exists(local_path(config))):
        forget(config, node, here)


def on_node(node: str) -> bool:
    """Whether this runs on `node` (imports the isolation only for a node with GPUs out)."""
    from gpugate.isolate.apply import this_node_is

    return this_node_is(node)


def ask_node(config: Config, slurm: SlurmControl, node: str, why: str) -> int:
    """On another host: ask `node`'s health check to put its isolated GPUs back (recorded,
    the node drained meanwhile, audited), or refuse saying what to do instead."""
    who = current_user()
    try:
        said = ask_put_back(config, slurm, node, who, node_name(), why)
    except (Refused, NotOurDrain) as exc:
        record_resume(history_dir(config), node, why=why, result=f"refused: {exc}",
                      reason="isolated GPUs")  # fmt: skip
        return refuse("gpugate resume", f"{node}: not asked: {exc}", EXIT_UNHEALTHY)
    record_resume(history_dir(config), node, why=why, reason="isolated GPUs",
                  result=f"put-back asked: {said}")  # fmt: skip
    print(f"gpugate resume: {said}")
    return EXIT_OK


def main(argv: list[str], make_slurm: Callable[[Config], SlurmControl] | None = None) -> int:
    """Run `gpugate resume`; `make_slurm` makes the Slurm backend (default: the site's)."""
    args = parser().parse_args(argv)

    found = ask_slurm_for(
        "gpugate resume",
        "node",
        args.node,
        args.config,
        lambda slurm, node: slurm.node(node),
        make_slurm,
    )
    if isinstance(found, int):
        return found
    config, slurm, info = found
    isolated = isolation_of(config, args.node)
    if isinstance(isolated, str):
        return refuse("gpugate resume", isolated, EXIT_UNHEALTHY)
    if not info.drained and not isolated:
        held = held_notice(config, args.node)  # the budget held gpugate's drain back
        if held:
            print(f"gpugate resume: nothing to resume: {held}")
            return EXIT_OK
        cleared = clear_suspicion(config, args.node, args.why)
        if cleared:
            print(f"gpugate resume: {cleared}")
            return EXIT_OK
        print(f"gpugate resume: {args.node} is not drained ({info.state}); nothing to do")
        return EXIT_OK

    if isolated and not on_node(args.node):
        # The GPUs' device rules are on the node: its own health check puts them back.
        return ask_node(config, slurm, args.node, args.why)
    request = Request(node=args.node, why=args.why, force=args.force, facts_file=args.facts,
                      qualify=args.qualify, level=args.level)  # fmt: skip
    # GPUs out of Slurm's service: back in first, then the node resumed as any other.
    resume = restore_isolated if isolated else check_then_resume
    attempt = resume(config, slurm, info, request)
    for message in attempt.failing:
        print(f"  FAIL    {message}")
    if not attempt.resumed:
        return refuse("gpugate resume", f"refused: {attempt.why}", EXIT_UNHEALTHY)
    if isolated:
        print(f"gpugate resume: {args.node} resumed with every GPU ({attempt.result})")
        return EXIT_OK
    forget_failed_isolation(config, args.node)
    print(f"gpugate resume: {args.node} resumed (checks: {attempt.result}; was: {info.reason!r})")
    return EXIT_OK

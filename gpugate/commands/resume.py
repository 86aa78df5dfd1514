"""`gpugate resume NODE [--force]`: check the node first, resume only what passes, audited."""

from __future__ import annotations

import time

from gpugate.cli import EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, make_parser

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser

    from gpugate.checks.facts import Facts
    from gpugate.config.schema import Config

# A snapshot passed with --facts must be this fresh to vouch for a node.
FRESH_S = 3600


def parser() -> ArgumentParser:
    """Options of `gpugate resume`."""
    p = make_parser(
        "gpugate resume",
        "Run the checklist for NODE (on the node itself, from --facts taken there, or from the "
        "configured replay) and resume it only if it passes and only if gpugate drained it "
        "(--force for an admin's drain or a failing check). Every attempt is appended to the "
        "audit log with who, when, why and the check result. Exit 0 resumed, 1 refused (or "
        "Slurm does not know NODE), 2 when NODE is not one plain node name.",
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
    p.add_argument("--config", metavar="FILE", help="site config")
    return p  # fmt: skip


def node_facts(config: Config, node: str, facts_file: str | None) -> tuple[Facts | None, str]:
    """The node's facts, and where they came from (or None and why not)."""
    from gpugate.checks.facts import load_snapshot
    from gpugate.checks.sources import replay_path
    from gpugate.node import node_name

    if facts_file:
        facts = load_snapshot(facts_file)
        age = _age(facts.collected_at)
        if age is not None and age > FRESH_S:
            return None, f"{facts_file} was collected {age / 60:.0f} min ago; take a fresh one"
        return facts, facts_file
    replay = replay_path(config, node)
    if replay:
        return load_snapshot(replay), f"replayed {replay}"
    if node == node_name():
        from gpugate.checks.facts import facts_from_dict
        from gpugate.checks.sources import gather_dict
        from gpugate.slurm_hooks.prolog import kernel_log_since

        since = kernel_log_since(config)  # Xids the drain already acted on are not judged again
        kwargs = {"kernel_log": {"since_seq": since}} if since is not None else {}
        return facts_from_dict(gather_dict(config, node, source_kwargs=kwargs)), "this node"
    return (
        None,
        f"run `gpugate resume` on {node} itself, or pass --facts from `gpugate facts` run there",
    )


def _age(collected_at: str | None) -> float | None:
    import calendar

    try:
        return time.time() - calendar.timegm(
            time.strptime(collected_at or "", "%Y-%m-%dT%H:%M:%SZ")
        )
    except ValueError:
        return None


def main(argv: list[str]) -> int:
    """Run `gpugate resume`."""
    args = parser().parse_args(argv)
    from gpugate import names
    from gpugate.checks.run import run_checks
    from gpugate.config import load_config
    from gpugate.slurm_hooks.policy import decide
    from gpugate.slurm_hooks.slurm.control import NodeNotFound, NotOurDrain, SlurmError, backend
    from gpugate.store.history import record_resume

    try:
        names.node_name(args.node)
    except names.BadName as exc:
        return names.refuse("gpugate resume", exc, EXIT_USAGE)
    config = load_config(args.config)
    slurm = None

    def fetch() -> object:
        nonlocal slurm
        slurm = backend(config.slurm.backend, timeout=config.slurm.timeout_s)
        return slurm.node(args.node)

    info, code = names.ask_slurm(
        "gpugate resume", f"node {args.node}", fetch, NodeNotFound, (SlurmError, ValueError)
    )
    if code is not None:
        return code
    if not info.drained:
        print(f"gpugate resume: {args.node} is not drained ({info.state}); nothing to do")
        return EXIT_OK
    if not info.gpugate_owned and not args.force:
        return _refuse(config, args, info.reason, f"{args.node} was drained by someone else "
                       f"({info.reason_user or '?'}: {info.reason!r}); use --force to resume it anyway")  # fmt: skip
    facts, source = node_facts(config, args.node, args.facts)
    if facts is None:
        return _refuse(config, args, info.reason, source)
    findings = run_checks(facts, config)
    decision = decide(findings, config.policy)
    result = f"{decision.status} ({source})"
    if decision.status == "fail" and not args.force:
        for f in decision.failing:
            print(f"  FAIL    {f.message}")
        return _refuse(
            config,
            args,
            info.reason,
            f"{args.node} still fails its checks: {decision.failing[0].message}",
            result,
        )
    try:
        slurm.resume(args.node, force=args.force)
    except NotOurDrain as exc:
        return _refuse(config, args, info.reason, str(exc), result)
    except SlurmError as exc:
        return _refuse(config, args, info.reason, f"scontrol could not resume it: {exc}", result)
    record_resume(
        _audit_dir(config),
        args.node,
        why=args.why,
        result=result,
        forced=args.force,
        reason=info.reason,
    )
    print(f"gpugate resume: {args.node} resumed (checks: {result}; was: {info.reason!r})")
    return EXIT_OK


def _refuse(config: Config, args: object, reason: str, why: str, result: str | None = None) -> int:
    from gpugate.store.history import record_resume

    try:
        record_resume(_audit_dir(config), args.node, why=args.why, result=f"refused: {why}" + (f"; checks {result}" if result else ""),  # type: ignore[attr-defined]
                      forced=args.force, reason=reason, resumed=False)  # type: ignore[attr-defined]  # fmt: skip
    except OSError:
        pass
    from gpugate.names import refuse

    return refuse("gpugate resume", f"refused: {why}", EXIT_UNHEALTHY)


def _audit_dir(config: Config) -> str:
    from gpugate.store.history import history_dir

    return history_dir(config)

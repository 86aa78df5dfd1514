"""`gpugate config check`: is the site file one this release gates with as written?

Run by the packages' post-install scripts on every install and upgrade (packaging/deb/postinst,
the RPM's %post) and by admins after an edit. It prints each problem as `FILE: KEY: problem`
with what the hooks do about it meanwhile, and the fix.
"""

from __future__ import annotations

import sys

from gpugate.cli import EXIT_OK, EXIT_USAGE, make_parser
from gpugate.config import ConfigError, load_config_for_hook, load_config_warned, site_config_path
from gpugate.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Policy


def main(argv: list[str]) -> int:
    """Run `gpugate config`."""
    p = make_parser(
        "gpugate config",
        "check: validate the site config as the hooks read it. Exit 0 when it is used as "
        "written (warnings about migrated values allowed), 2 when a key is refused (the hooks "
        "then gate with the packaged default for it and say so in slurmd's log on every run).",
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="check")
    check = sub.add_parser("check", help="validate the site config; print what to fix")
    check.add_argument(
        "--config",
        metavar="FILE",
        help="site config (default: $GPUGATE_CONFIG, else /etc/gpugate/gpugate.yaml)",
    )
    args = p.parse_args(argv)
    return check_config(args.config)


def check_config(path: str | None) -> int:
    """Print the site file's problems and warnings; 0 usable as written, 2 refused keys."""
    site, _ = site_config_path(path)
    try:
        config, warnings = load_config_warned(path)
    except ConfigError:
        # What the hooks do with it: every refused key, each left out (the strict loader stops
        # at the first one; an admin wants the whole list at once).
        try:
            _, lines = load_config_for_hook(path)
        except ConfigError as exc:
            print(f"gpugate config: {exc}: the packaged defaults are unusable: reinstall gpugate",
                  file=sys.stderr)  # fmt: skip
            return EXIT_USAGE
        for line in lines:
            print(f"gpugate config: {line}")
        print(f"gpugate config: {site}: refused keys: the hooks still gate, with the packaged "
              "default for each refused key, and say so in slurmd's log on every run; fix the "
              f"keys above, then run `gpugate config check` again")  # fmt: skip
        return EXIT_USAGE
    for line in warnings:
        print(f"gpugate config: warning: {line}")
    for line in staged(config.policy):
        print(f"gpugate config: {line}")
    print(f"gpugate config: {site}: ok" + (" (with the warnings above)" if warnings else ""))
    return EXIT_OK


def staged(policy: Policy) -> list[str]:
    """What the policy keeps from acting (gate/policy.py: rollout), one line each; none when
    every check acts."""
    lines = []
    if policy.report_only:
        lines.append("policy.report_only: every check reports only, none drains or refuses a job")
    if policy.report_only_checks:
        names = printable(", ".join(policy.report_only_checks))
        lines.append(f"policy.report_only_checks: {names}: report only, never drain")
    if policy.canary.checks:
        names = printable(", ".join(policy.canary.checks))
        where = printable(", ".join(policy.canary.partitions))
        lines.append(f"policy.canary: {names}: act only in partitions {where}, report elsewhere")
    return lines

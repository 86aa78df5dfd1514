"""The `gpugate` command: a table of subcommands, each imported only when it runs.

Every subcommand lives in `gpugate.commands.<name>` with `main(argv) -> int` and its own
argparse parser (so `--help` works everywhere). Importing only the one that runs keeps the
prolog's start-up cost to what it uses.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

from gpugate import __version__
from gpugate.checks.facts import SnapshotError
from gpugate.config import ConfigError
from gpugate.startup import import_module, resume_gc
from gpugate.text import printable
from gpugate.yamlio import YamlError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

# name -> (module, one-line help). Order is the order of `gpugate --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("check", "run the preflight checklist on this node or a replayed snapshot"),
    "facts": ("facts", "gather this node's facts and write them as a YAML snapshot"),
    "profile": ("profile", "learn a node-class profile (expect:) from a known-good snapshot"),
    "diagnose": ("diagnose", "name why a job died from its logs (and kernel-log lines)"),
    "prolog": ("prolog", "Slurm Prolog: gate the node before the job starts"),
    "task-prolog": ("task_prolog", "Slurm TaskProlog: export NCCL settings into the job"),
    "epilog": ("epilog", "Slurm Epilog: collect evidence after an abnormal end"),
    "epilog-slurmctld": ("epilog_slurmctld", "Slurm EpilogSlurmctld: requeue decision"),
    "health": ("health", "Slurm HealthCheckProgram: vet the node between jobs, lift what healed"),
    "checkpoint": ("checkpoint", "find the newest complete checkpoint under a directory"),
    "requeue": ("requeue", "requeue a job from its latest complete checkpoint"),
    "nodes": ("nodes", "drained nodes, reasons and evidence at a glance"),
    "evidence": ("evidence", "evidence bundles of a node or a job"),
    "resume": ("resume", "check a node, then resume it (audited)"),
    "isolate": ("isolate", "take one faulty GPU out of Slurm's service (started by the hooks)"),
    "drill": ("drill", "inject a simulated fault on this node for a window, follow and record it"),
    "qualify": ("qualify", "qualify nodes with DCGM and bandwidth tests run as Slurm jobs"),
    "report": (
        "report",
        "one self-contained HTML page of drains, evidence and repeat offenders",
    ),
    "submit-policy": (
        "submit_policy",
        "the checkpoint policy at submission: write Slurm's job_submit.lua (--lua)",
    ),
    "config": ("config", "check the site config as the hooks read it (`gpugate config check`)"),
    "selftest": ("selftest", "run each installed hook as Slurm would: what would break, the fix"),
}

# Exit codes (the CLI contract): 0 healthy, 1 unhealthy, 2 usage or configuration error,
# 3 an internal error of gpugate itself.
EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def make_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An argparse parser for one subcommand.

    The help width is fixed up front: argparse otherwise imports `shutil` (and with it bz2,
    lzma, fnmatch) on every run just to measure the terminal, even when no help is printed.
    """
    import argparse  # late: see quick_options (gpugate/startup.py)

    try:
        width = min(100, os.get_terminal_size().columns) - 2
    except OSError:
        width = 98

    def formatter(prog: str) -> argparse.HelpFormatter:
        return argparse.HelpFormatter(prog, width=width)

    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=formatter)


def quick_options(
    argv: list[str],
    values: tuple[str, ...] = (),
    switches: tuple[str, ...] = (),
    lists: tuple[str, ...] = (),
) -> SimpleNamespace | None:
    """`argv` as argparse would parse it, when it holds only these long options in full; else None.

    `values` take one argument (`--config FILE`, `--config=FILE`; the last one counts),
    `switches` none (store_true), `lists` one each time (append). Anything else (help, an
    abbreviation, a positional, a value that looks like an option, a missing value) gives None,
    and the command's argparse parser decides, with its usual messages. Slurm runs the hooks
    with no arguments at all: importing argparse and building a parser costs them more than
    the checklist (gpugate/startup.py).
    """
    dest = {name: name[2:].replace("-", "_") for name in values + switches + lists}
    out: dict[str, object] = {dest[name]: None for name in values + lists}
    out.update({dest[name]: False for name in switches})
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in switches and not eq:
            out[dest[name]] = True
            i += 1
            continue
        if name not in values and name not in lists:
            return None
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                return None  # argparse's own rules for option-like values, and its error
            value = argv[i + 1]
            i += 1
        i += 1
        if name in lists:
            got = out[dest[name]]
            out[dest[name]] = [*got, value] if isinstance(got, list) else [value]
        else:
            out[dest[name]] = value
    return SimpleNamespace(**out)


def _usage() -> str:
    lines = [f"usage: gpugate COMMAND [options]   (gpugate {__version__})", "", "commands:"]
    width = max(len(n) for n in COMMANDS)
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run `gpugate COMMAND --help` for a command's options."]
    return "\n".join(lines)


def _version() -> str:
    """The build's version; run from a git checkout (no build wrote it), the commit's too."""
    if "+" in __version__:  # stamped by packaging/stage.sh: the package's own
        return __version__
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "packaging", "version.sh")  # fmt: skip
    if not os.path.isfile(script):
        return __version__
    from gpugate import runner

    done = runner.run(["bash", script], timeout=10)
    return done.stdout.strip() if done.ok and done.stdout.strip() else __version__


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `gpugate` console script."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return EXIT_OK if args else EXIT_USAGE
    if args[0] in ("-V", "--version"):
        print(f"gpugate {_version()}")
        return EXIT_OK
    name = args[0]
    if name not in COMMANDS:
        print(f"gpugate: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return EXIT_USAGE

    try:
        module = import_module(f"gpugate.commands.{COMMANDS[name][0]}")
    except ModuleNotFoundError as exc:
        if exc.name != f"gpugate.commands.{COMMANDS[name][0]}":
            raise
        print(f"gpugate {name}: not available in this version", file=sys.stderr)
        return EXIT_USAGE
    resume_gc()  # start-up is over (the launcher's pause_gc): the command runs collected
    return run_guarded(module.main, args[1:], name)


def run_guarded(fn: Callable[[list[str]], int], argv: list[str], name: str) -> int:
    """Run a subcommand, turning known errors into messages and exit codes (one table)."""

    try:
        return fn(argv)
    except (ConfigError, SnapshotError, YamlError) as exc:
        # a message may quote the file's bytes
        print(f"gpugate {name}: {printable(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # gpugate's own bug: one line for the admin, the traceback on request
        if os.environ.get("GPUGATE_TRACEBACK"):
            raise
        print(f"gpugate {name}: internal error: {type(exc).__name__}: {printable(exc)} "
              "(GPUGATE_TRACEBACK=1 shows the traceback)", file=sys.stderr)  # fmt: skip
        return EXIT_INTERNAL

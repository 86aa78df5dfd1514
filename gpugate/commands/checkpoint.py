"""`gpugate checkpoint`: the newest complete checkpoint under a directory (`latest`), or all (`list`)."""

from __future__ import annotations

import sys
import time

from gpugate.checkpoints.discover import SETTLE_S, CheckpointDirError, scan
from gpugate.cli import EXIT_OK, EXIT_USAGE, make_parser
from gpugate.names import refuse
from gpugate.names import show as quoted
from gpugate.text import dumps, is_printable, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser, Namespace
    from typing import Any

    from gpugate.checkpoints.discover import Checkpoint, Scan

EXIT_NONE = 1  # the contract: `latest` exits 1 when no checkpoint under DIR is complete


def parser() -> ArgumentParser:
    """Options of `gpugate checkpoint`."""
    p = make_parser(
        "gpugate checkpoint",
        "Find training checkpoints under a directory and tell complete ones from saves that "
        "were cut short or are still being written (torch.save files, torch.distributed.checkpoint, "
        "DeepSpeed, Megatron-LM, Hugging Face Trainer, Lightning). Only metadata and file ends "
        "are read.",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    latest = sub.add_parser(
        "latest",
        help="print the newest complete checkpoint's path",
        description="Print the path of the newest complete checkpoint under DIR (newest: highest "
        "step, then modification time) and exit 0; exit 1 naming what was skipped and why when "
        "none is complete; exit 2 when DIR is not a readable directory.",
        formatter_class=p.formatter_class,
    )
    listing = sub.add_parser(
        "list",
        help="show every candidate, complete or skipped, and why",
        description="Show every checkpoint candidate under DIR, newest first, complete or "
        "skipped, with the reason. Exit 0, or 2 when DIR is not a readable directory.",
        formatter_class=p.formatter_class,
    )
    for s in (latest, listing):
        s.add_argument("directory", metavar="DIR", help="the job's checkpoint directory")
        s.add_argument("--json", action="store_true", help="print one JSON object")
        s.add_argument(
            "--settle-s",
            type=float,
            default=SETTLE_S,
            metavar="N",
            help=f"a checkpoint whose format cannot prove it complete (a plain pickle) and "
            f"that was modified less than N seconds ago may still be being written and is "
            f"skipped (default {SETTLE_S:g}; 0 turns this off). A torch ZIP's end record, "
            f"DCP's .metadata, DeepSpeed's latest, Megatron's tracker and HF's "
            f"trainer_state.json prove it at once",
        )
    return p


def main(argv: list[str]) -> int:
    """Run `gpugate checkpoint`."""
    args = parser().parse_args(argv)

    if not args.settle_s >= 0:  # also NaN, which compares false with everything
        return refuse("gpugate checkpoint", "--settle-s must be 0 or more", EXIT_USAGE)
    if not args.directory:
        # An empty DIR would be read as the current directory: say so instead.
        return refuse("gpugate checkpoint", "DIR is empty: name the job's checkpoint directory",
                      EXIT_USAGE)  # fmt: skip
    if not args.directory.isprintable():
        # A newline or terminal control in DIR would break the one-path-per-line output that
        # job scripts read (and forge lines in it): refuse it whole.
        return refuse("gpugate checkpoint", f"DIR {quoted(args.directory)} holds control "
                      "characters (newline, escape, ...); refused", EXIT_USAGE)  # fmt: skip
    try:
        result = scan(args.directory, args.settle_s, stop_at_complete=args.action == "latest")
    except CheckpointDirError as exc:
        print(f"gpugate checkpoint: {printable(exc)}", file=sys.stderr)
        return EXIT_USAGE
    for note in result.notes:
        print(f"gpugate checkpoint: note: {printable(note)}", file=sys.stderr)
    return latest(args, result) if args.action == "latest" else show(args, result)


def latest(args: Namespace, result: Scan) -> int:
    """The newest complete one on stdout; those skipped on the way, and why, on stderr."""
    best = next((cp for cp in result.checkpoints if cp.complete), None)
    skipped = [cp for cp in result.checkpoints if not cp.complete]  # all newer than `best`
    if args.json:
        out: dict[str, object] = {
            "directory": result.directory,
            "path": None,
            "layout": None,
            "step": None,
        }
        if best:
            out.update(best.to_dict())
            del out["complete"]
        out["skipped"] = [_brief(cp) for cp in skipped]
        sys.stdout.write(dumps(out, indent=2) + "\n")
    elif best:
        # The user named the directories: a control or bidi character is printed escaped, and
        # said so, since a script reading this line would get another path (--json is exact).
        sys.stdout.write(printable(best.path) + "\n")
        if not is_printable(best.path):
            print("gpugate checkpoint: the path holds control or bidi characters, shown escaped; "
                  "--json gives it exactly", file=sys.stderr)  # fmt: skip
    if best is None:
        what = f"{len(skipped)} skipped:" if skipped else "nothing there looks like a checkpoint"
        print(f"gpugate checkpoint: no complete checkpoint under {printable(result.directory)}; {what}",
              file=sys.stderr)  # fmt: skip
    for cp in skipped:
        print(f"gpugate checkpoint: skipped {printable(cp.path)}: {printable(cp.why)}",
              file=sys.stderr)  # fmt: skip
    return EXIT_OK if best else EXIT_NONE


def show(args: Namespace, result: Scan) -> int:
    """Every candidate, newest first: verdict, layout, step, age, path and why."""
    if args.json:
        out = {"directory": result.directory, "notes": list(result.notes)}
        out["checkpoints"] = [cp.to_dict() for cp in result.checkpoints]
        sys.stdout.write(dumps(out, indent=2) + "\n")
        return EXIT_OK
    if not result.checkpoints:
        sys.stdout.write(f"{printable(result.directory)}: nothing here looks like a checkpoint\n")
        return EXIT_OK
    now = time.time()
    rows = [
        ("OK" if cp.complete else "SKIPPED", cp.layout, "-" if cp.step is None else str(cp.step),
         _age(now - cp.mtime), printable(cp.path), printable(cp.why))
        for cp in result.checkpoints
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        cells = "  ".join(c.ljust(w) for c, w in zip(row, widths))
        sys.stdout.write(f"{cells}  {row[4]}\n    {row[5]}\n")
    return EXIT_OK


def _brief(cp: Checkpoint) -> dict[str, Any]:
    return {"path": cp.path, "layout": cp.layout, "step": cp.step, "why": cp.why}


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{max(seconds, 0):.0f}s ago"

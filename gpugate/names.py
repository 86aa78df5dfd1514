"""What the CLI accepts as one Slurm node name or one job id, refused in one line otherwise.

Admins type these, and they end up in paths (`<evidence_dir>/<job>/<node>-r0`) and in
scontrol's argv: a list (`a,b`), a hostlist (`a[1-100000000]`), a path (`../../etc`) or an
option (`-5`) is refused before anything reads the disk or calls Slurm.
"""

from __future__ import annotations

import sys

from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    _T = TypeVar("_T")

# Slurm's plain node names: letters, digits, '-', '_', '.', not starting with '-' or '.'
# (an scontrol option, a relative path). 255: hostnames are at most 253 characters.
_NODE = lazy(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}")
# `123` or an array task `123_4`; Slurm's job and task ids are 32-bit (slurm.h: uint32_t).
_JOB = lazy(r"([0-9]{1,10})(?:_([0-9]{1,10}))?")
_MAX_ID = 2**32 - 1
_SHOWN = 60  # characters of a refused value echoed back


class BadName(ValueError):
    """A value that is not one node name or one job id; the message says which and why."""


def show(value: str) -> str:
    """The value as a short, printable quote (repr escapes control and bidi characters)."""
    text = value if len(value) <= _SHOWN else value[:_SHOWN] + "..."
    return ascii(text)


def node_name(value: str) -> str:
    """`value` if it is one plain Slurm node name, else BadName."""
    if not value:
        raise BadName("empty node name")
    if _NODE.fullmatch(value):
        return value
    if any(c in value for c in ",[]"):
        why = "one node name, not a list or hostlist expression"
    elif "/" in value or value.startswith("."):
        why = "a node name, not a path"
    elif value.startswith("-"):
        why = "a node name cannot start with '-'"
    elif len(value) > 255:
        why = "longer than 255 characters"
    else:
        why = "only letters, digits, '-', '_' and '.' are allowed"
    raise BadName(f"not a node name: {show(value)} ({why})")


def job_id(value: str) -> str:
    """`value` if it is one Slurm job id (`123`, or `123_4` for an array task), else BadName."""
    if not value:
        raise BadName("empty job id")
    m = _JOB.fullmatch(value)
    if m and all(int(g) <= _MAX_ID for g in m.groups() if g is not None) and int(m.group(1)):
        return value
    raise BadName(f"not a Slurm job id: {show(value)} (expected 123, or 123_4 for an array task)")


def is_job_id(value: str) -> bool:
    """Whether `value` is a well-formed job id."""
    try:
        job_id(value)
    except BadName:
        return False
    return True


def one_line(text: object) -> str:
    """`text` on one printable line: control and bidi characters and newlines become spaces."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())


def refuse(prog: str, problem: object, code: int) -> int:
    """Print `prog: problem` as one line on stderr and return `code`."""
    print(f"{prog}: {one_line(problem)}", file=sys.stderr)
    return code


def ask_slurm(
    prog: str,
    what: str,
    fetch: Callable[[], _T],
    not_found: type[BaseException],
    unreachable: tuple[type[BaseException], ...],
) -> tuple[_T | None, int | None]:
    """(fetch(), None), or (None, 1) after one line saying Slurm does not know `what` or failed."""
    try:
        return fetch(), None
    except not_found:
        return None, refuse(prog, f"Slurm does not know {what}", 1)
    except unreachable as exc:  # slurmctld unreachable, no scontrol, a bad backend name
        return None, refuse(prog, f"cannot read {what} from Slurm: {exc}", 1)

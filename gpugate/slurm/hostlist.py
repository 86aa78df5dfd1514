"""Slurm hostlists (`gpu-[01-03,07],other`) expanded in pure Python, without `scontrol`.

What the parser is unsure of raises HostlistError; SlurmControl.expand_hostlist then asks
`scontrol show hostnames`.
"""

from __future__ import annotations

from gpugate.regex import lazy

# What Slurm prints for "no value".
NULLS = frozenset({"", "(null)", "None"})


class HostlistError(ValueError):
    """A hostlist expression the pure parser does not understand."""


_RANGE = lazy(r"^(\d{1,18})(?:-(\d{1,18}))?$")
# More names than any cluster has, or more bracket groups than any naming scheme: a typo or
# hostile input, refused before it costs memory (or recursion depth).
_MAX_HOSTS = 100_000
_MAX_GROUPS = 8


def hostlist_expand(expr: str) -> list[str]:
    """Expand `gpu-[01-03,07],other` to names, in order; raise HostlistError when unsure."""
    expr = (expr or "").strip()
    if expr in NULLS:
        return []
    names: list[str] = []
    for item in _split_top_level(expr):
        if item.count("[") > _MAX_GROUPS:
            raise HostlistError(f"more than {_MAX_GROUPS} bracket groups in {item!r}")
        names.extend(_expand_item(item))
        if len(names) > _MAX_HOSTS:
            raise HostlistError(f"more than {_MAX_HOSTS} names in {expr!r}")
    return names


def _split_top_level(expr: str) -> list[str]:
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expr!r}")
        if depth == 0 and (ch == "," or ch.isspace()):
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise HostlistError(f"unbalanced '[' in {expr!r}")
    items.append("".join(current))
    return [i for i in items if i]


def _expand_item(item: str) -> list[str]:
    # "rack[1-2]-n[01-02]" expands as a product, like Slurm's multi-bracket hostlists.
    head, bracket, rest = item.partition("[")
    if not bracket:
        return [item]
    body, closing, tail = rest.partition("]")
    if not closing:
        raise HostlistError(f"unbalanced '[' in {item!r}")
    tails = _expand_item(tail)
    numbers = _expand_ranges(body, item)
    if len(numbers) * len(tails) > _MAX_HOSTS:
        raise HostlistError(f"more than {_MAX_HOSTS} names in {item!r}")
    return [f"{head}{n}{t}" for n in numbers for t in tails]


def _expand_ranges(body: str, item: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise HostlistError(f"cannot read range {part!r} in {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo) or len(out) + int(hi) - int(lo) > _MAX_HOSTS:
            raise HostlistError(f"bad range {part!r} in {item!r}")
        # Slurm pads to the width of the lower bound: [08-10] -> 08 09 10.
        out.extend(f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
    return out


def expand_lenient(expr: str) -> list[str]:
    """The names of `expr`; the expression itself as one name when the parser is unsure."""
    try:
        return hostlist_expand(expr)
    except HostlistError:
        return [expr]


# A name's last run of digits, with what comes before and after it: `gpu-a100-07` is
# ("gpu-a100-", "07", ""), `/dev/nvidia3` is ("/dev/nvidia", "3", "").
_LAST_NUMBER = lazy(r"^(.*\D)?(\d{1,18})(\D*)$")
_NOT_IN_A_NAME = frozenset("[],") | frozenset(" \t\r\n")


def hostlist_compress(names: list[str]) -> str:
    """A compact hostlist expression that expands to `names`, in the same order.

    Order is kept, never sorted: slurm.conf pairs NodeName[i] with NodeAddr[i], and gres.conf's
    File= order is the order of the node's GRES indices. Consecutive names that differ only in
    their last number become a bracket range (`gpu[01-16,18-64]`, `/dev/nvidia[0-2,4-7]`); the
    result is checked by expanding it again. HostlistError for a name a hostlist cannot hold.
    """
    groups: list[tuple[str, str, list[list[str]]]] = []  # (head, tail, [[lo, hi], ...])
    for name in names:
        if not name or _NOT_IN_A_NAME & set(name):
            raise HostlistError(f"{name!r} cannot be written in a hostlist")
        match = _LAST_NUMBER.match(name)
        if not match:
            groups.append((name, "", []))
            continue
        head, digits, tail = match.group(1) or "", match.group(2), match.group(3)
        last = groups[-1] if groups else None
        if last and last[2] and (last[0], last[1]) == (head, tail):
            lo, hi = last[2][-1]
            # Slurm pads a range to its lower bound's width: extend only what reads back.
            if int(digits) == int(hi) + 1 and f"{int(digits):0{len(lo)}d}" == digits:
                last[2][-1][1] = digits
                continue
            if len(digits) == len(last[2][0][0]):  # one width per bracket keeps it plain
                last[2].append([digits, digits])
                continue
        groups.append((head, tail, [[digits, digits]]))
    parts = []
    for head, tail, ranges in groups:
        if not ranges:
            parts.append(head)
        elif len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            parts.append(f"{head}{ranges[0][0]}{tail}")
        else:
            body = ",".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
            parts.append(f"{head}[{body}]{tail}")
    expr = ",".join(parts)
    if hostlist_expand(expr) != list(names):
        expr = ",".join(names)  # plain names always read back as themselves
        if hostlist_expand(expr) != list(names):
            raise HostlistError(f"cannot write {names!r} as a hostlist")
    return expr

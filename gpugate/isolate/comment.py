"""The node Comment that records isolated GPUs: written by the isolation, read by every view.

One entry per GPU, `; `-joined after the `gpugate-isolated:` marker:

    gpugate-isolated: gpu3 minor=3 serial=1654922010523 since=1764782400 why=gpu.ecc: GPU3 ...

`why` runs to the end of its entry (it may hold spaces and `=`); `;` in it is replaced, and it
is cut at WHY_MAX characters. SlurmControl.set_node_comment writes it after `gpugate: `, so the
marker is looked for anywhere in the Comment. The Comment is Slurm's, readable by every user
(`scontrol show node`): it holds nothing secret.
"""

from __future__ import annotations

from gpugate.record import Record
from gpugate.regex import lazy
from gpugate.slurm.reasons import ISOLATED_MARKER

MARKER = ISOLATED_MARKER  # reasons.own_comment reads it as gpugate's
WHY_MAX = 80  # per GPU: two entries stay within the Comment's cap (reasons.COMMENT_MAX)
_ENTRY = lazy(
    r"gpu(?P<index>\d+) minor=(?P<minor>\d+) serial=(?P<serial>\S*) since=(?P<since>\d+)"
    r" why=(?P<why>.*)"
)


class IsolatedGpu(Record):
    """One GPU taken out of a node's service: which (NVML index, device minor, serial),
    since when (epoch seconds), and why (the finding's message)."""

    index: int
    minor: int
    serial: str
    since: int
    why: str


def format_comment(gpus: list[IsolatedGpu]) -> str:
    """The node Comment for these isolated GPUs ("" for none)."""
    if not gpus:
        return ""
    entries = [
        f"gpu{g.index} minor={g.minor} serial={g.serial or ''} since={int(g.since)} "
        f"why={' '.join(g.why.replace(';', ',').split())[:WHY_MAX]}"
        for g in sorted(gpus, key=lambda g: g.index)
    ]
    return f"{MARKER} " + "; ".join(entries)


def parse_comment(comment: str | None) -> list[IsolatedGpu]:
    """The isolated GPUs a node Comment records ([] when it has no gpugate-isolated entry)."""
    at = (comment or "").find(MARKER)
    if at < 0:
        return []
    out = []
    for entry in (comment or "")[at + len(MARKER) :].split(";"):
        match = _ENTRY.fullmatch(entry.strip())
        if match:
            out.append(
                IsolatedGpu(
                    index=int(match["index"]),
                    minor=int(match["minor"]),
                    serial=match["serial"],
                    since=int(match["since"]),
                    why=match["why"],
                )
            )
    return out

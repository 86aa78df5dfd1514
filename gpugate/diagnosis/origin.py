"""Where a failure started: the rank (and node) the text names as the origin, and why.

rank.py decides *whether* a rank is named (a symptom's reporter is a victim); this module holds
the answer's shape (Origin: rank, reason, confidence, node, alternatives) and the small readers
of the origin shapes launchers print:
- torchrun's ChildFailedError table (torch/distributed/elastic/multiprocessing/errors/__init__.py,
  PyTorch 1.9 to 2.x): `host : NAME` and `rank : N (local_rank: M)` rows, also collapsed onto
  one line by a paste (`host: gpu-3rank2 (local rank: 2)exitcode: -9`);
- NCCL's line prefix `host:pid:tid [dev]` (src/debug.cc, NCCL 2.x) naming the node;
- NCCL errors that are a rank's own failure, not a symptom of another rank: an unhandled CUDA
  error inside NCCL (ncclUnhandledCudaError, e.g. "invalid device pointer") or "no
  algorithm/protocol available" for its collective, and, when a single
  rank prints it, an OFI/libfabric delivery error. "Remote process exited" is not one: its own
  words name another process as the origin (a labelled corpus log agrees: null).
"""

from __future__ import annotations

import re

from gpugate.record import Record
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HIGH, MEDIUM = "high", "medium"

# A torchrun table rank row, in full or collapsed (`rank2 (local rank: 2)`: a Markdown paste
# eats `_` and the spaces around the colon).
# The table's host row; collapsed, the host name runs into the next field (`host: gpu-3rank2`).
TABLE_HOST_RE = lazy(
    r"(?<![A-Za-z])host\s*:\s*(?P<host>[A-Za-z0-9][\w.-]*?)\s*(?:rank\s*:?\s*\d|$|\s)"
)
# NCCL's own prefix: `gpu-a1:191:219 [0] NCCL ...` (host, pid, thread, local device).
NCCL_HOST_RE = lazy(r"^(?P<host>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\]")
# NCCL failures that are the reporting rank's own: its CUDA call failed inside NCCL, or NCCL
# found no algorithm/protocol for its own collective (enqueue.cc, a local choice under
# NCCL_ALGO/NCCL_PROTO: no peer is involved; labels-43c 601; several ranks printing it name none).
OWN_RE = lazy(
    r"unhandled cuda error|ncclUnhandledCudaError|invalid device pointer|Cuda failure '"
    r"|no algorithm/protocol available",
    re.IGNORECASE,
)
# NCCL failures whose reporter is the origin only when it is the one rank printing them: the
# OFI/libfabric provider (aws-ofi-nccl's NET/OFI) failed or could not deliver.
ONE_REPORTER_RE = lazy(r"\bNET/OFI\b|\bOFI\b.*error|libfabric|\bfi_\w+ failed|undeliverable")


class Origin(Record):
    """The failing rank, why it is that rank, how sure, its node, and ranks another shape named."""

    rank: int | None = None
    reason: str | None = None
    confidence: str | None = None  # high: the origin line itself names the one rank
    node: str | None = None
    alternatives: tuple[Any, ...] = ()  # of {"rank", "reason"}

    def with_alternative(self, rank: int | None, reason: str) -> Origin:
        """The same origin with another shape's different rank kept as an alternative."""
        if rank is None or rank == self.rank or any(a["rank"] == rank for a in self.alternatives):
            return self
        return self.replace(alternatives=(*self.alternatives, {"rank": rank, "reason": reason}))


NONE = Origin()


def table_host(text: str) -> str | None:
    """The host of a torchrun table's `host :` row (full or collapsed), or None."""
    if "host" not in text:
        return None
    m = TABLE_HOST_RE.search(text)
    return m.group("host") if m else None


def line_host(text: str) -> str | None:
    """The node an NCCL-prefixed line names (`host:pid:tid [dev]`), or None."""
    m = NCCL_HOST_RE.match(text)
    return m.group("host") if m else None


def nccl_kind(text: str) -> str | None:
    """'own' for a rank's own failure inside NCCL (CUDA, no algorithm/protocol), 'one' for an
    error whose single reporter is the origin, None for the usual symptoms (timeouts, aborts,
    connection resets)."""
    if OWN_RE.search(text):
        return "own"
    if ONE_REPORTER_RE.search(text):
        return "one"
    return None

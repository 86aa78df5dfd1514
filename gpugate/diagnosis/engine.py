"""Why did the job die: the entry points that scan a job's logs and rank what they say.

`scan` finds the lines that match a signature (grep or Python, within budgets), `rank` picks
the root cause, `ending` settles a quiet log by how it ends (`no_failure` only on a success
line, else `other` or `unknown`), `verdict` holds the result and where each line came from,
`categories` says what each category means and whose fault it is. A log handed to `gpugate diagnose` by an admin
(`LOG_FILE`) is taken at its word; a job's own files (`JOB_FILE`) are never hardware evidence.
"""

from __future__ import annotations

import io

from gpugate.diagnosis.ending import EndingCollector, settle
from gpugate.diagnosis.rank import rank_signals
from gpugate.diagnosis.scan import TAIL_BYTES, Counting, scan_input, scan_stream
from gpugate.diagnosis.verdict import LOG_FILE, SOURCES, TRUSTED_SOURCES, Diagnosis, FileScan
from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO

    from gpugate.diagnosis.scan import ByteReader


def diagnose(
    paths: list[str],
    engine: str = "auto",
    stdin: BinaryIO | None = None,
    sources: list[str] | None = None,
) -> Diagnosis:
    """Diagnose logs (`-` is stdin); unreadable inputs are reported in `files`, not raised.

    `sources` gives each path's source (KERNEL_LOG, JOB_FILE, LOG_FILE; default LOG_FILE).
    """
    sources = list(sources) if sources is not None else [LOG_FILE] * len(paths)
    if len(sources) != len(paths) or not set(sources) <= set(SOURCES):
        raise ValueError(f"one source of {SOURCES} per input, got {sources!r}")
    col = EndingCollector(untrusted={i for i, s in enumerate(sources) if s not in TRUSTED_SOURCES})
    names = ["<stdin>" if p == "-" else p for p in paths]
    scans = tuple(
        scan_input(p, i, col, engine, stdin).replace(source=sources[i]) for i, p in enumerate(paths)
    )
    return settle(rank_signals(col, names, scans, sources), col, names, sources)


class Input(Record):
    """One input already open: its name, its source, and a stream whose limits bound the read."""

    name: str
    source: str
    stream: ByteReader  # a LimitedStream reports where it stopped
    offset: int = 0


def diagnose_streams(inputs: list[Input]) -> Diagnosis:
    """Diagnose streams that are already open (the epilog's capped reads of the job's files).

    Nothing here opens a path: what is diagnosed is exactly what the streams give, so each
    input's byte and time budget is the stream's own (see LimitedStream).
    """
    untrusted = {i for i, x in enumerate(inputs) if x.source not in TRUSTED_SOURCES}
    col = EndingCollector(untrusted=untrusted)
    scans = []
    for i, x in enumerate(inputs):
        counter = Counting(x.stream)
        try:
            n = scan_stream(counter, i, col)
            error = None
            col.tails[i] = counter.tail
        except OSError as exc:
            n, error = 0, exc.strerror or type(exc).__name__
        scans.append(FileScan(path=x.name, bytes=counter.total, hit_lines=n, engine="python",
                              error=error, source=x.source, offset=x.offset,
                              stopped=getattr(x.stream, "stopped", None)))  # fmt: skip
    names, sources = [x.name for x in inputs], [x.source for x in inputs]
    return settle(rank_signals(col, names, tuple(scans), sources), col, names, sources)


def diagnose_bytes(data: bytes) -> Diagnosis:
    """Diagnose an in-memory log (tests, callers that already hold the text)."""

    col = EndingCollector()
    n = scan_stream(io.BytesIO(data), 0, col)
    col.tails[0] = data[-TAIL_BYTES:]
    scans = (FileScan(path="<memory>", bytes=len(data), hit_lines=n, engine="python"),)
    return settle(rank_signals(col, ["<memory>"], scans), col, ["<memory>"], [LOG_FILE])

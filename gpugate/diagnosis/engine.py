"""Why did the job die: stream its logs, keep the lines that match a signature, rank them.

Scanning is the expensive part (logs of many GB are normal), so only lines containing one of
the signatures' anchor words are ever decoded and matched. Two engines find those lines:
- ``grep``: GNU grep over a regular file with the anchors as one `-E` alternation. It is the
  fastest multi-word search on a node (the benchmark in `bench/` compares against it), streams
  with a small fixed buffer, and its `-n` gives line numbers for free.
- ``python``: 1 MiB binary chunks, one `bytes.find` pass per anchor, newline counting per chunk.
  Used for stdin, gzip'd logs, small files, and wherever grep is missing or fails.
Both feed the same per-line matching (`signatures.match_line`) and give identical results.

Ranking is data: `TIERS` orders the categories from the most specific root cause to the most
generic symptom, `FALLOUT` says which categories are mere fallout once Slurm killed the job,
and each signature's strength says whether a line proves a failure (see `signatures`).

Every input has a source (`KERNEL_LOG`, `JOB_FILE`, `LOG_FILE`). Only what root read itself
is hardware evidence (DESIGN.md): a line in a job's own file that claims a hardware fault (an
`NVRM: Xid 79` line, an SXid, "uncorrectable ECC error") is text the job printed. Such lines
are set aside as `untrusted` claims and the category comes from what remains; a log handed to
`gpugate diagnose` by an admin (`LOG_FILE`) is taken at its word, as before.
"""

from __future__ import annotations

import os
import sys

from gpugate.checks import xid as X
from gpugate.diagnosis import signatures as S
from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import BinaryIO

CATEGORIES = (
    "nccl_timeout", "nccl_error", "cuda_oom", "host_oom", "gpu_xid_hardware", "gpu_xid_user_app",
    "ecc_error", "nvlink_error", "illegal_memory_access", "slurm_time_limit", "slurm_node_failure",
    "slurm_cancelled", "no_failure", "other",
)  # fmt: skip

# Root-cause order, most specific first (higher wins). Why this order:
# - GPU hardware (ECC, NVLink, hardware Xids) explains everything a job prints after it, node
#   failures included; the three share a tier and the *first* fatal one wins (Xid 79 before the
#   NVSwitch SXids it triggers is an Xid 79).
# - A node failure outranks the CUDA/NCCL errors that the dying node causes.
# - Host and GPU OOM, application Xids and illegal memory accesses happen on one rank; the other
#   ranks then fail their collectives, so they outrank every NCCL symptom.
# - An NCCL error is more specific than a timeout; a timeout is the most generic NCCL symptom.
# - Slurm's own kill lines (time limit, scancel, preemption) explain a job that hung quietly;
#   errors printed before them still win, errors after them are fallout (FALLOUT below).
# - MINOR_TIER: events that explain a failure only when nothing above is visible (a lone Xid 63,
#   a Lightning SIGTERM notice), then `other` (generic exceptions, signals, launcher summaries).
_HARDWARE = 100
TIERS: dict[str, int] = {
    "ecc_error": _HARDWARE,
    "nvlink_error": _HARDWARE,
    "gpu_xid_hardware": _HARDWARE,
    "slurm_node_failure": 90,
    "host_oom": 80,
    "cuda_oom": 70,
    "gpu_xid_user_app": 60,
    "illegal_memory_access": 50,
    "nccl_error": 40,
    "nccl_timeout": 30,
    "slurm_time_limit": 20,
    "slurm_cancelled": 15,
    "other": 5,
}
MINOR_TIER = 10
# Lines after Slurm's kill line (same file) in these categories are the kill's fallout.
FALLOUT = frozenset({"nccl_timeout", "nccl_error", "cuda_oom", "illegal_memory_access", "other"})
KILLS = frozenset({"slurm_time_limit", "slurm_cancelled"})
HARDWARE_CATEGORIES = frozenset(c for c, tier in TIERS.items() if tier == _HARDWARE)

# Where an input came from. Root read the kernel log itself; a job file is the job's own output
# (stdout, NCCL debug files: the user controls every byte); a log file is one an admin handed to
# `gpugate diagnose` without saying, taken at its word (the corpus labels rely on that).
KERNEL_LOG, JOB_FILE, LOG_FILE = "kernel log", "job file", "log file"
SOURCES = (KERNEL_LOG, JOB_FILE, LOG_FILE)
TRUSTED_SOURCES = frozenset({KERNEL_LOG, LOG_FILE})

# category -> (what it is, what to do): one sentence each, for people.
EXPLAIN: dict[str, tuple[str, str]] = {
    "nccl_timeout": ("an NCCL collective timed out (a rank stopped participating)",
                     "look for the rank or node that fell behind (Xid, IB link, OOM at that time); "
                     "resubmit, and drain the node if it repeats"),
    "nccl_error": ("NCCL failed (network, peer process or system error)",
                   "check the InfiniBand/RoCE links and NCCL environment of the nodes; resubmit"),
    "cuda_oom": ("the GPU ran out of memory", "reduce the batch or sequence size, or enable "
                 "activation checkpointing / sharding; the node is fine"),
    "host_oom": ("the host ran out of RAM and the kernel or Slurm killed a process",
                 "request more memory (--mem) or reduce data-loader workers and CPU offload"),
    "gpu_xid_hardware": ("a GPU hardware or driver fault (Xid)",
                         "drain the node and reset or reboot it before the next job; resubmit"),
    "gpu_xid_user_app": ("the application faulted on the GPU (Xid 13/31/43)",
                         "debug the code (CUDA_LAUNCH_BLOCKING=1); drain only if the same GPU repeats"),
    "ecc_error": ("an uncorrectable GPU memory (ECC) error",
                  "drain the node and reset the GPU (row remap) before the next job; resubmit"),
    "nvlink_error": ("an NVLink/NVSwitch fabric error",
                     "drain the node and reset the GPUs / restart the fabric manager; resubmit"),
    "illegal_memory_access": ("a CUDA illegal memory access (usually a bug in a kernel)",
                              "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; check for an Xid"),
    "slurm_time_limit": ("Slurm killed the job at its time limit",
                         "resubmit from the latest checkpoint or ask for a longer --time"),
    "slurm_node_failure": ("a node of the job failed (Slurm NODE_FAIL)",
                           "resubmit excluding the node; an admin should check it"),
    "slurm_cancelled": ("the job was cancelled, preempted or requeued by Slurm",
                        "resubmit or requeue if that was not intended"),
    "other": ("the job failed for a reason without a specific signature",
              "read the evidence lines and the traceback above them"),
    "no_failure": ("no failure signature was found", "nothing to do if the job was expected to end"),
}  # fmt: skip

CHUNK = 1 << 20  # Python engine read size
LINE_MAX = 4 << 20  # a longer line is matched in fragments, never held whole
KEEP_PER_GROUP = 200  # signals kept per (file, signature): enough for ranks, bounded memory
EVIDENCE_MAX = 8
GREP_MIN_BYTES = 1 << 20  # below this the Python engine is faster than starting grep
GREP_PIECE = 64 << 10  # grep output is read in pieces: a matching line may be huge
GREP_SECONDS_PER_GB = 120  # generous timeout: a healthy grep needs a few seconds per GB


class ScanError(Exception):
    """A log could not be read (missing, unreadable, or the scanner failed)."""


class Evidence(Record):
    """One decisive line and where it was."""

    file: str
    line: int
    text: str
    signature: str
    category: str | None
    source: str = LOG_FILE
    xid: int | None = None  # the line's root Xid, if it names one

    def location(self) -> dict:
        """Where the line was and whether its source can be hardware evidence."""
        return {"file": self.file, "line": self.line, "signature": self.signature,
                "category": self.category, "source": self.source,
                "trusted": self.source in TRUSTED_SOURCES}  # fmt: skip


class FileScan(Record):
    """What was read from one input."""

    path: str
    bytes: int | None = None
    hit_lines: int = 0
    engine: str | None = None
    error: str | None = None
    source: str = LOG_FILE
    offset: int = 0  # where the reading started (a tail: line numbers count from there)
    stopped: str | None = None  # "byte budget" / "time budget": the rest was not read


class Diagnosis(Record):
    """The verdict: category, root Xid, failing rank, and the lines that decided it."""

    category: str
    xid: int | None = None
    failing_rank: int | None = None
    summary: str = ""
    advice: str = ""
    evidence: tuple = ()  # of Evidence
    signals: dict = {}  # category -> matching lines
    files: tuple = ()  # of FileScan
    # The source of the line that decided the category (None for no_failure).
    decided_by: str | None = None
    # Lines of a job's own files that claim a hardware fault: reported, never ranked.
    untrusted: tuple = ()  # of Evidence
    # What the job's output says when taken at its word (set only when it claimed something).
    job_output_category: str | None = None
    job_output_xid: int | None = None

    @property
    def trusted(self) -> bool:
        """Whether the deciding line came from a source root read (or an admin vouched for)."""
        return self.decided_by in TRUSTED_SOURCES

    def to_json(self) -> dict:
        """The `--json` object (evidence as plain lines, their places and sources beside them)."""
        out = {
            "category": self.category,
            "xid": self.xid,
            "failing_rank": self.failing_rank,
            "summary": self.summary,
            "advice": self.advice,
            "decided_by": self.decided_by,
            "trusted": self.trusted,
            "evidence": [e.text for e in self.evidence],
            "evidence_locations": [e.location() for e in self.evidence],
            "untrusted": [
                dict(e.location(), text=e.text, claim=claim_text(e)) for e in self.untrusted
            ],
            "job_output_category": self.job_output_category or self.category,
            "job_output_xid": self.job_output_xid if self.untrusted else self.xid,
            "signals": dict(self.signals),
            "files": [f.to_dict() for f in self.files],
            "bytes_scanned": sum(f.bytes or 0 for f in self.files),
        }
        errors = [f"{f.path}: {f.error}" for f in self.files if f.error]
        if errors:
            out["errors"] = errors
        return out


# --- engines: (line number, raw line or fragment) for every line holding an anchor -----------


def python_hits(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """Lines of a binary stream that contain an anchor, read in chunks (bounded memory)."""
    keep = max(len(a) for a in S.ANCHOR_BYTES) - 1
    carry = b""
    line_no = 1
    while True:
        data = stream.read(CHUNK)
        if not data:
            break
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            if len(buf) <= LINE_MAX:
                carry = buf
                continue
            yield from _hit_lines(buf, len(buf), line_no)  # a fragment of one giant line
            carry = buf[-keep:]
            continue
        yield from _hit_lines(buf, cut, line_no)
        line_no += buf.count(b"\n", 0, cut)
        carry = buf[cut:]
    if carry:
        yield from _hit_lines(carry, len(carry), line_no)


def _hit_lines(buf: bytes, end: int, first_line: int) -> Iterator[tuple[int, bytes]]:
    """Lines of buf[:end] holding an anchor: one find pass per anchor, then line numbers."""
    spans: dict[int, int] = {}
    for anchor in S.ANCHOR_BYTES:
        i = buf.find(anchor, 0, end)
        while i >= 0:
            start = buf.rfind(b"\n", 0, i) + 1
            stop = buf.find(b"\n", i, end)
            stop = end if stop < 0 else stop
            spans[start] = stop
            i = buf.find(anchor, stop, end)
    line_no, counted = first_line, 0
    for start in sorted(spans):
        line_no += buf.count(b"\n", counted, start)
        counted = start
        yield line_no, buf[start : spans[start]]


def grep_hits(path: str, grep: str, size: int) -> Iterator[tuple[int, bytes]]:
    """Lines of a file holding an anchor, found by `grep -a -n -E` (argument list, timeout)."""
    import subprocess
    import threading

    argv = [grep, "-a", "-n", "-E", S.ALTERNATION, "--", path]
    env = dict(os.environ, LC_ALL="C")
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    timer = threading.Timer(60 + GREP_SECONDS_PER_GB * size / 1e9, proc.kill)
    timer.start()
    try:
        yield from _parse_grep(proc.stdout)
        err = proc.stderr.read(4096).decode("utf-8", "replace").strip()
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    if rc not in (0, 1):  # 1: no line matched
        raise ScanError(err or f"grep exited with {rc}")


def _parse_grep(out: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """`N:text` lines; a line longer than one piece continues without the `N:` prefix."""
    line_no, continued = 0, False
    while True:
        piece = out.readline(GREP_PIECE)
        if not piece:
            return
        whole = piece.endswith(b"\n")
        if not continued:
            number, _, piece = piece.partition(b":")
            line_no = int(number)
        if whole:
            piece = piece[:-1]
        if not continued or any(a in piece for a in S.ANCHOR_BYTES):
            yield line_no, piece
        continued = not whole


def _find_grep() -> str | None:
    """GNU grep on PATH, or None (then the Python engine scans)."""
    import shutil

    return shutil.which("grep")


# --- collecting and ranking ------------------------------------------------------------------


class Signal(Record):
    """A match at a place: (file index, line) plus what the line said."""

    file: int
    line: int
    match: S.Match

    @property
    def tier(self) -> int:
        """Where this signal ranks (see TIERS)."""
        if self.match.strength == S.MINOR:
            return MINOR_TIER
        return TIERS.get(self.match.category or "other", 0)


def is_claim(m: S.Match) -> bool:
    """Whether a line claims a hardware fault (an Xid, SXid, ECC or NVLink error, a lost GPU)."""
    return m.xid is not None or m.category in HARDWARE_CATEGORIES


def claim_text(e: Evidence) -> str:
    """What a claim is, in the words the reports use."""
    what = f"Xid {e.xid}" if e.xid is not None else (e.category or "a hardware fault")
    return f"job output claiming {what} (not trusted)"


class Collector:
    """Keeps a bounded sample of signals and the torchrun "Root Cause" ranks.

    Signals from the files in `untrusted` that claim a hardware fault are kept apart in
    `claims`: they are never ranked as evidence (see is_claim).
    """

    def __init__(self, untrusted: frozenset | set = frozenset()) -> None:
        self.untrusted = frozenset(untrusted)
        self.claims: list[Signal] = []
        self.signals: list[Signal] = []
        self.counts: dict[str, int] = {}
        self.roots: list[tuple[int, int, int]] = []  # (file, line, rank)
        self.completed: dict[int, int] = {}  # file -> last line saying the run finished
        self._kept: dict[tuple[int, str], int] = {}
        self._root_pending: set[int] = set()
        self._last: tuple[int, int, str] | None = None

    def add(self, file: int, line: int, m: S.Match) -> None:
        """Record one match (fragments of the same line repeating a match are ignored)."""
        key = (file, line, m.signature)
        if key == self._last:
            return
        self._last = key
        if m.strength == S.CONTEXT:
            self._context(file, line, m)
            return
        claim = file in self.untrusted and is_claim(m)
        if not claim:
            cat = m.category or "other"
            self.counts[cat] = self.counts.get(cat, 0) + 1
        group = (file, m.signature)
        if self._kept.get(group, 0) < KEEP_PER_GROUP:
            self._kept[group] = self._kept.get(group, 0) + 1
            (self.claims if claim else self.signals).append(Signal(file=file, line=line, match=m))

    def face_value(self) -> Collector:
        """The same signals with the claims taken at their word (what the job's output says)."""
        view = Collector()
        view.signals = self.signals + self.claims
        view.counts, view.roots, view.completed = self.counts, self.roots, self.completed
        return view

    def _context(self, file: int, line: int, m: S.Match) -> None:
        # torchrun prints "Root Cause (first observed failure):" and, a few lines below,
        # "rank : N (local_rank: M)" of that failure.
        if m.signature == "torchrun.root_cause":
            self._root_pending.add(file)
        elif m.signature == "torchrun.rank_field" and file in self._root_pending:
            self._root_pending.discard(file)
            self.roots.append((file, line, m.rank))
        elif m.signature == "run.completed":
            self.completed[file] = line


def rank_signals(
    col: Collector, names: list[str], files: tuple = (), sources: list[str] | None = None
) -> Diagnosis:
    """Pick the root cause from the collected signals (see TIERS, FALLOUT, strengths).

    `sources` names each input's source (default: all LOG_FILE); the claims that untrusted
    inputs made are reported beside the verdict, with what the verdict would be at their word.
    """
    sources = list(sources) if sources is not None else [LOG_FILE] * len(names)
    verdict = _rank(col, names, files, sources)
    if not col.claims:
        return verdict
    said = _rank(col.face_value(), names, files, sources)
    claims = [_to_evidence(s, names, sources)
              for s in sorted(col.claims, key=lambda s: (s.file, s.line))[:EVIDENCE_MAX]]  # fmt: skip
    said_what = sorted({claim_text(e) for e in claims})
    note = f" The job's own output has {len(col.claims)} line(s) that are not trusted: "
    return verdict.replace(
        summary=verdict.summary + note + "; ".join(said_what) + ".",
        untrusted=tuple(claims),
        job_output_category=said.category,
        job_output_xid=said.xid,
    )


def _rank(col: Collector, names: list[str], files: tuple, sources: list[str]) -> Diagnosis:
    kill = _first_line(col.signals, lambda s: s.match.category in KILLS and _fatal(s))
    live = [s for s in col.signals if not _is_fallout(s.file, s.line, s.match.category, kill)]
    roots = [r for r in col.roots if not _is_fallout(r[0], r[1], "other", kill)]
    decisive = [s for s in live if s.match.strength in (S.FATAL, S.MINOR)]
    if not decisive:
        return _no_failure(col, files)
    first_fatal = _first_line(decisive, _fatal)
    live = [s for s in live if s.match.strength != S.PRECURSOR or _before(s, first_fatal)]
    top = max(s.tier for s in live)
    if top <= MINOR_TIER and all(s.line < col.completed.get(s.file, 0) for s in live):
        return _no_failure(col, files)  # generic errors, then the run finished: handled
    tier = sorted(
        (s for s in live if s.tier == top), key=lambda s: (s.match.xid is None, s.file, s.line)
    )
    primary = tier[0]
    category = primary.match.category or "other"
    winners = [s for s in tier if s.match.category == primary.match.category]
    xid, xid_signal = _root_xid(live)
    rank, root_line = _failing_rank(winners, roots)
    evidence = _evidence(winners, xid_signal, root_line, names, sources)
    return Diagnosis(
        category=category,
        xid=xid,
        failing_rank=rank,
        summary=_summary(category, primary, winners, xid, rank),
        advice=EXPLAIN[category][1],
        evidence=tuple(evidence),
        signals=dict(col.counts),
        files=files,
        decided_by=sources[primary.file],
    )


def _fatal(s: Signal) -> bool:
    return s.match.strength == S.FATAL


def _first_line(signals: Iterable[Signal], pred: object) -> dict[int, int]:
    """file -> first line where pred(signal) holds."""
    out: dict[int, int] = {}
    for s in signals:
        if pred(s) and s.line < out.get(s.file, sys.maxsize):  # type: ignore[operator]
            out[s.file] = s.line
    return out


def _is_fallout(file: int, line: int, category: str | None, kill: dict[int, int]) -> bool:
    return (category or "other") in FALLOUT and line > kill.get(file, sys.maxsize)


def _before(s: Signal, first_fatal: dict[int, int]) -> bool:
    return s.line < first_fatal.get(s.file, sys.maxsize)


def _root_xid(live: list[Signal]) -> tuple[int | None, Signal | None]:
    """The first fatal Xid (by place), else the first Xid of any strength."""
    with_xid = sorted((s for s in live if s.match.xid is not None), key=lambda s: (s.file, s.line))
    for s in with_xid:
        if _fatal(s):
            return s.match.xid, s
    if with_xid:
        return with_xid[0].match.xid, with_xid[0]
    return None, None


def _failing_rank(winners: list[Signal], roots: list) -> tuple[int | None, tuple | None]:
    """The one rank the decisive lines name; if they name none, torchrun's Root Cause rank."""
    named = {s.match.rank for s in winners if s.match.rank is not None}
    if len(named) == 1:
        return named.pop(), None
    # Several ranks reporting the same thing (every rank's timeout): no origin is named, and
    # torchrun's Root Cause is then just the first victim its agent saw.
    if not named and len({r[2] for r in roots}) == 1:
        return roots[0][2], roots[0]
    return None, None


def _to_evidence(s: Signal, names: list[str], sources: list[str]) -> Evidence:
    return Evidence(file=names[s.file], line=s.line, text=s.match.text,
                    signature=s.match.signature, category=s.match.category,
                    source=sources[s.file], xid=s.match.xid)  # fmt: skip


def _evidence(winners: list[Signal], xid_signal: Signal | None, root: tuple | None,
              names: list[str], sources: list[str]) -> list[Evidence]:  # fmt: skip
    """Distinct decisive lines, most telling and earliest first, plus the root Xid; capped."""
    chosen: list[Signal] = []
    seen: set[str] = set()
    for s in sorted(winners, key=lambda s: (-s.match.specificity, s.file, s.line)):
        if s.match.text not in seen:
            seen.add(s.match.text)
            chosen.append(s)
    if xid_signal is not None and xid_signal not in chosen:
        chosen.insert(0, xid_signal)
    out = [_to_evidence(s, names, sources) for s in chosen[:EVIDENCE_MAX]]
    if root is not None:
        out.append(Evidence(file=names[root[0]], line=root[1], text=f"rank : {root[2]} (torchrun "
                            "Root Cause)", signature="torchrun.rank_field", category=None,
                            source=sources[root[0]]))  # fmt: skip
    return out


def _summary(category: str, primary: Signal, winners: list[Signal], xid: int | None,
             rank: int | None) -> str:  # fmt: skip
    """One sentence: what happened, where, how often."""
    text = EXPLAIN[category][0]
    if xid is not None:
        text += f"; root Xid {xid} ({X.lookup(xid).meaning})"
    if rank is not None:
        text += f"; failing rank {rank}"
    else:
        ranks = {s.match.rank for s in winners if s.match.rank is not None}
        if len(ranks) > 1:
            text += f"; reported by {len(ranks)} ranks"
    return text[0].upper() + text[1:] + "."


def _no_failure(col: Collector, files: tuple) -> Diagnosis:
    return Diagnosis(
        category="no_failure",
        summary=EXPLAIN["no_failure"][0].capitalize() + ".",
        advice=EXPLAIN["no_failure"][1],
        signals=dict(col.counts),
        files=files,
    )


# --- entry points ----------------------------------------------------------------------------


def scan_stream(stream: BinaryIO, file: int, col: Collector) -> int:
    """Feed one binary stream through the Python engine; returns the number of hit lines."""
    return _feed(python_hits(stream), file, col)


def _feed(hits: Iterable[tuple[int, bytes]], file: int, col: Collector) -> int:
    n = 0
    for line_no, raw in hits:
        n += 1
        for m in S.match_line(raw):
            col.add(file, line_no, m)
    return n


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
    col = Collector(untrusted={i for i, s in enumerate(sources) if s not in TRUSTED_SOURCES})
    names = ["<stdin>" if p == "-" else p for p in paths]
    scans = tuple(
        _scan_one(p, i, col, engine, stdin).replace(source=sources[i]) for i, p in enumerate(paths)
    )
    return rank_signals(col, names, scans, sources)


class Input(Record):
    """One input already open: its name, its source, and a stream whose limits bound the read."""

    name: str
    source: str
    stream: object  # BinaryIO; a LimitedStream reports where it stopped
    offset: int = 0


def diagnose_streams(inputs: list[Input]) -> Diagnosis:
    """Diagnose streams that are already open (the epilog's capped reads of the job's files).

    Nothing here opens a path: what is diagnosed is exactly what the streams give, so each
    input's byte and time budget is the stream's own (see LimitedStream).
    """
    col = Collector(untrusted={i for i, x in enumerate(inputs) if x.source not in TRUSTED_SOURCES})
    scans = []
    for i, x in enumerate(inputs):
        counter = _Counting(x.stream)  # type: ignore[arg-type]
        try:
            n = scan_stream(counter, i, col)
            error = None
        except OSError as exc:
            n, error = 0, exc.strerror or type(exc).__name__
        scans.append(FileScan(path=x.name, bytes=counter.total, hit_lines=n, engine="python",
                              error=error, source=x.source, offset=x.offset,
                              stopped=getattr(x.stream, "stopped", None)))  # fmt: skip
    return rank_signals(col, [x.name for x in inputs], tuple(scans), [x.source for x in inputs])


class LimitedStream:
    """Reads an open file descriptor from `offset`: at most `limit` bytes, for `seconds` at most.

    The budget is per input: a 50 GB sparse file gives its budget's worth of zeros and stops,
    and the next input still gets its own (`stopped` says which budget ended the reading).
    """

    def __init__(self, fd: int, offset: int, limit: int, seconds: float | None = None) -> None:
        self._fd, self._pos, self._left, self._seconds = fd, offset, limit, seconds
        self._deadline: float | None = None  # the clock starts at the first read
        self.stopped: str | None = None

    def read(self, n: int) -> bytes:
        """Up to n bytes, or b"" once a budget is spent."""
        import time

        now = time.monotonic()
        if self._deadline is None and self._seconds is not None:
            self._deadline = now + self._seconds
        if self._left <= 0:
            if self.stopped is None and os.pread(self._fd, 1, self._pos):
                self.stopped = "byte budget"  # more was there than the budget allowed
            return b""
        if self._deadline is not None and now >= self._deadline:
            self.stopped = "time budget"
            return b""
        data = os.pread(self._fd, min(n, self._left), self._pos)
        self._pos += len(data)
        self._left -= len(data)
        return data


def diagnose_bytes(data: bytes) -> Diagnosis:
    """Diagnose an in-memory log (tests, callers that already hold the text)."""
    import io

    col = Collector()
    n = scan_stream(io.BytesIO(data), 0, col)
    return rank_signals(col, ["<memory>"], (FileScan(path="<memory>", bytes=len(data), hit_lines=n,
                                                     engine="python"),))  # fmt: skip


def _scan_one(
    path: str, file: int, col: Collector, engine: str, stdin: BinaryIO | None
) -> FileScan:
    if path == "-":
        counter = _Counting(stdin if stdin is not None else sys.stdin.buffer)
        n = scan_stream(counter, file, col)
        return FileScan(path="<stdin>", bytes=counter.total, hit_lines=n, engine="python")
    try:
        return _scan_path(path, file, col, engine)
    except (OSError, ScanError, EOFError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return FileScan(path=path, error=reason or type(exc).__name__)


def _scan_path(path: str, file: int, col: Collector, engine: str) -> FileScan:
    size = os.stat(path).st_size
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
        if not gz:
            grep = _find_grep() if engine != "python" else None
            use_grep = grep is not None and (engine == "grep" or size >= GREP_MIN_BYTES)
            if use_grep and os.path.isfile(path):
                n = _feed(grep_hits(path, grep, size), file, col)  # type: ignore[arg-type]
                return FileScan(path=path, bytes=size, hit_lines=n, engine="grep")
            f.seek(0)
            n = scan_stream(f, file, col)
            return FileScan(path=path, bytes=size, hit_lines=n, engine="python")
    import gzip

    with gzip.open(path, "rb") as g:
        counter = _Counting(g)
        n = scan_stream(counter, file, col)
    return FileScan(path=path, bytes=counter.total, hit_lines=n, engine="python+gzip")


class _Counting:
    """A read-only stream wrapper that counts the bytes read (stdin and gzip sizes)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.total = 0

    def read(self, n: int) -> bytes:
        """Read up to n bytes."""
        data = self._stream.read(n)
        self.total += len(data)
        return data

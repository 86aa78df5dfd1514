"""Scanning logs: find the lines holding a signature's anchor word, within a byte and time budget.

Scanning is the expensive part (logs of many GB are normal), so only lines holding one of the
prefilter keys (`signatures.KEYS`: each anchor's tail from its rarest byte on) are ever decoded,
and only there are the anchors and the signatures' patterns tried. One pass finds those lines,
whatever the number of signatures, in one of two engines:
- ``grep``: GNU grep over a regular file with the keys as one `-E` alternation. It is the
  fastest multi-word search on a node (the benchmark in `bench/` compares against it), streams
  with a small fixed buffer, and its `-n` gives line numbers for free. A file of SPLIT_MIN or
  more goes to two greps at once, one per half.
- ``python``: 1 MiB binary chunks, one pass of the keys' compiled alternation per chunk,
  newline counting per chunk. Used for stdin, gzip'd logs, small files, and wherever grep is
  missing or fails.
Both feed the same per-line matching (`signatures.match_line`) into a `rank.Collector` and
give identical results.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time

from gpugate.diagnosis import signatures as S
from gpugate.diagnosis.verdict import FileScan
from gpugate.fsutil import open_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Generator, Iterable, Iterator
    from typing import IO, BinaryIO, Protocol

    from gpugate.diagnosis.rank import Collector

    class ByteReader(Protocol):
        """What a scan reads: a binary stream's `read(n)` (a file, gzip, Counting, LimitedStream)."""

        def read(self, n: int, /) -> bytes: ...


CHUNK = 1 << 20  # Python engine read size
# The last bytes of each input kept for ending.py, which reads a quiet log's last lines there
# (a benchmark table's end has no word a key could find); a pread at the end for grep.
TAIL_BYTES = 4096
LINE_MAX = 4 << 20  # a longer line is matched in fragments, never held whole
GREP_MIN_BYTES = 1 << 20  # below this the Python engine is faster than starting grep
GREP_PIECE = 64 << 10  # grep output is read in pieces: a matching line may be huge
GREP_SECONDS_PER_GB = 120  # generous timeout: a healthy grep needs a few seconds per GB


class ScanError(Exception):
    """A log could not be read (missing, unreadable, or the scanner failed)."""


# --- engines: (line number, raw line or fragment) for every line holding an anchor -----------


def python_hits(stream: ByteReader) -> Iterator[tuple[int, bytes]]:
    """Lines of a binary stream that contain a key, read in chunks (bounded memory)."""
    keep = max(len(a) for a in S.ANCHOR_BYTES) - 1  # a giant line's fragments overlap by this
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
    """Lines of buf[:end] holding a key: one pass of the keys' alternation, then line numbers."""
    search = S.KEY_RE.search
    line_no, counted = first_line, 0
    m = search(buf, 0, end)
    while m is not None:
        start = buf.rfind(b"\n", 0, m.start()) + 1
        stop = buf.find(b"\n", m.end(), end)
        stop = end if stop < 0 else stop
        line_no += buf.count(b"\n", counted, start)
        counted = start
        yield line_no, buf[start:stop]
        m = search(buf, stop, end)


def grep_hits(
    path: str, grep: str, size: int, stdin: BinaryIO | int | None = None
) -> Iterator[tuple[int, bytes]]:
    """Lines of a file holding a key, found by `grep -a -n -E` (argument list, timeout).

    One alternation of the keys with ERE metacharacters bracketed (`.cc:` is `[.]cc:`), so
    grep reads each key as Python's `in` does; GNU grep 3.8's `-E` alternation (a DFA) measured
    1.5x as fast as `-F -f` (Aho-Corasick) over these keys on the benchmark log. `path` "-"
    with `stdin`: grep reads a file already open (checked once, never opened again by name).
    """
    yield from _drain(_start_grep(path, grep, size, stdin))


def _start_grep(
    path: str, grep: str, size: int, stdin: BinaryIO | int | None
) -> tuple[subprocess.Popen[bytes], threading.Timer]:
    """grep started on the keys, with a timer that kills it past its time."""
    argv = [grep, "-a", "-n", "-E", S.GREP_ERE, "--", path]
    env = dict(os.environ, LC_ALL="C")
    proc = subprocess.Popen(
        argv, stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    timer = threading.Timer(60 + GREP_SECONDS_PER_GB * size / 1e9, proc.kill)
    timer.start()
    return proc, timer


def _drain(
    started: tuple[subprocess.Popen[bytes], threading.Timer],
) -> Generator[tuple[int, bytes], None, None]:
    """The hits of a started grep; its exit checked, nothing left running."""
    proc, timer = started
    assert proc.stdout is not None and proc.stderr is not None  # both are PIPEs
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


# --- a large file: two greps at once, one per half ----------------------------------------------
# The scan is grep's DFA, one core's work; a node has more. Two greps over the two halves took
# 1.4 s of wall time against 2.1 s for one on the 1 GiB benchmark log (2-core VM), the CPU the
# same. The first half reaches its grep through a pipe (sendfile), followed by one line of its
# own holding a key: grep numbers it, which gives the first half's line count, the offset of the
# second half's line numbers.
SPLIT_MIN = 256 << 20
_SENTINEL = b"gpugate-scan-split-sentinel "


def split_point(fd: int, size: int) -> int | None:
    """The offset just past the first newline from the middle of the file on, or None."""
    pos = start = size // 2
    while pos < size and pos - start <= LINE_MAX:
        chunk = os.pread(fd, 1 << 16, pos)
        if not chunk:
            return None
        i = chunk.find(b"\n")
        if i >= 0:
            return pos + i + 1 if pos + i + 1 < size else None
        pos += len(chunk)
    return None


def split_grep_hits(fd: int, grep: str, size: int, mid: int) -> Iterator[tuple[int, bytes]]:
    """The hits of two greps run at once over [0, mid) and [mid, end), numbered as one file."""
    sentinel = _SENTINEL + S.KEY_BYTES[0] + b"\n"
    # The second half: a description of its own, so the caller's descriptor offset is kept.
    second = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    read_end, write_end = os.pipe()
    try:
        os.lseek(second, mid, os.SEEK_SET)
        a = _start_grep("-", grep, mid, read_end)
        try:
            b = _start_grep("-", grep, size - mid, second)
        except BaseException:
            _stop(a)
            raise
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
        os.close(second)
    feeder = threading.Thread(target=_pump, args=(fd, write_end, mid, sentinel), daemon=True)
    feeder.start()
    first_lines = None
    drain_a, drain_b = _drain(a), _drain(b)
    try:
        held: tuple[int, bytes] | None = None
        for hit in drain_a:
            if held is not None:
                yield held
            held = hit
        if held is None or held[1] != sentinel[:-1]:
            raise ScanError("grep over the first half ended early")
        first_lines = held[0] - 1
        for line_no, raw in drain_b:
            yield line_no + first_lines, raw
    finally:
        # Stopped early: kill the first grep before waiting for its feeder (a grep blocked on
        # its output reads no more input), and the second, which may not have been drained.
        drain_a.close()
        drain_b.close()
        if first_lines is None:
            _stop(b)  # never started draining: its generator's cleanup never ran
        feeder.join()


def _stop(started: tuple[subprocess.Popen[bytes], threading.Timer]) -> None:
    """Kill a started grep that will not be drained, and close its pipes."""
    proc, timer = started
    timer.cancel()
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _split_at(fd: int, size: int) -> int | None:
    """Where to split a file between two greps: large files, two cores, /proc there."""
    if size < SPLIT_MIN or (os.cpu_count() or 1) < 2 or not os.path.isdir("/proc/self/fd"):
        return None
    return split_point(fd, size)


def _pump(fd: int, pipe: int, end: int, tail: bytes) -> None:
    """Copy [0, end) of fd into the pipe, then `tail`; a grep gone early ends it quietly."""
    try:
        off = 0
        while off < end:
            try:
                n = os.sendfile(pipe, fd, off, min(end - off, 1 << 20))
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                data = os.pread(fd, min(end - off, 1 << 20), off)  # no sendfile to a pipe here
                n = os.write(pipe, data) if data else 0
            if n == 0:
                break
            off += n
        os.write(pipe, tail)
    except OSError:
        pass  # grep exited (broken pipe): its exit status and missing sentinel tell
    finally:
        os.close(pipe)


def _parse_grep(out: IO[bytes]) -> Iterator[tuple[int, bytes]]:
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
        if not continued or any(k in piece for k in S.KEY_BYTES):
            yield line_no, piece
        continued = not whole


def _find_grep() -> str | None:
    """GNU grep on PATH, or None (then the Python engine scans)."""
    import shutil

    return shutil.which("grep")


def scan_stream(stream: ByteReader, file: int, col: Collector) -> int:
    """Feed one binary stream through the Python engine; returns the number of hit lines."""
    return _feed(python_hits(stream), file, col)


def _feed(hits: Iterable[tuple[int, bytes]], file: int, col: Collector) -> int:
    n = 0
    for line_no, raw in hits:
        n += 1
        for m in S.match_line(raw):
            col.add(file, line_no, m)
    return n


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


def scan_input(
    path: str, file: int, col: Collector, engine: str, stdin: BinaryIO | None
) -> FileScan:
    """Scan one path (`-` is stdin) into `col`; an unreadable input is a FileScan with its error."""
    if path == "-":
        counter = Counting(stdin if stdin is not None else sys.stdin.buffer)
        n = scan_stream(counter, file, col)
        col.tails[file] = counter.tail
        return FileScan(path="<stdin>", bytes=counter.total, hit_lines=n, engine="python")
    try:
        return _scan_path(path, file, col, engine)
    except (OSError, ScanError, EOFError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return FileScan(path=path, error=reason or type(exc).__name__)


def _scan_path(path: str, file: int, col: Collector, engine: str) -> FileScan:
    """Scan one named file: opened once, without blocking, and only if it is a regular file
    (a FIFO or `/dev/zero` named as a log is refused, never read until killed); grep and
    gzip read that same descriptor. No size cap: a log is streamed, never held in memory."""

    with os.fdopen(open_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        # pread: the descriptor's offset stays at 0 for grep, which reads it as its stdin.
        gz = os.pread(f.fileno(), 2, 0) == b"\x1f\x8b"
        if not gz:
            grep = _find_grep() if engine != "python" else None
            if grep is not None and (engine == "grep" or size >= GREP_MIN_BYTES):
                mid = _split_at(f.fileno(), size)
                hits = (
                    grep_hits("-", grep, size, stdin=f) if mid is None
                    else split_grep_hits(f.fileno(), grep, size, mid)
                )  # fmt: skip
                n = _feed(hits, file, col)
                col.tails[file] = os.pread(f.fileno(), TAIL_BYTES, max(0, size - TAIL_BYTES))
                return FileScan(path=path, bytes=size, hit_lines=n, engine="grep")
            plain = Counting(f)
            n = scan_stream(plain, file, col)
            col.tails[file] = plain.tail
            return FileScan(path=path, bytes=size, hit_lines=n, engine="python")
        import gzip

        with gzip.open(f, "rb") as g:
            counter = Counting(g)
            n = scan_stream(counter, file, col)
        col.tails[file] = counter.tail
        return FileScan(path=path, bytes=counter.total, hit_lines=n, engine="python+gzip")


class Counting:
    """A read-only stream wrapper that counts the bytes read (stdin and gzip sizes) and keeps
    the last TAIL_BYTES of them (`tail`)."""

    def __init__(self, stream: ByteReader) -> None:
        self._stream = stream
        self.total = 0
        self.tail = b""

    def read(self, n: int) -> bytes:
        """Read up to n bytes."""
        data = self._stream.read(n)
        self.total += len(data)
        if data:
            self.tail = (
                (self.tail + data)[-TAIL_BYTES:] if len(data) < TAIL_BYTES else data[-TAIL_BYTES:]
            )
        return data

"""Kernel-log lines that matter on a GPU node, from a file, /dev/kmsg, or `dmesg`.

Only relevant lines are kept (Xid, SXid, fallen off the bus, GPU init failures, reset
required, OOM killer, mlx5 link changes, PCIe AER errors, nvidia-peermem), printed the way
`dmesg` prints them: `[seconds.micro] message`, with the further lines of a multi-line message
indented below the first. Checks parse the message, not the prefix (docs/gpu-facts.md section 2).

/dev/kmsg (Documentation/ABI/testing/dev-kmsg) hands out one record per read():
`prio,seq,usec,flags[,...];message` and then zero or more dictionary lines that start with a
space (` SUBSYSTEM=pci`). Non-printable bytes in the message, newlines included, are escaped
as `\\xNN`. Opened O_NONBLOCK, read() fails with EAGAIN once no record is left; EPIPE means
the record at our position was overwritten, and the next read() carries on with the oldest
one still there. The 64-bit sequence numbers let a later reader skip what it has seen
(`since_seq`, from `kmsg_position()` at prolog time).
"""

from __future__ import annotations

import errno
import os

from gpugate import runner
from gpugate.record import Record
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any

    from gpugate.config.schema import Config

KMSG_PATH = "/dev/kmsg"
# A read() into a buffer smaller than the record fails with EINVAL; records are at most
# CONSOLE_EXT_LOG_MAX (8 KiB) in kernel/printk/printk.c.
_READ_SIZE = 16384
# The ring buffer holds at most a few hundred thousand records (log_buf_len <= 2^25 bytes);
# past this many reads the log is growing as fast as we read it, so stop.
_MAX_READS = 1 << 21
# A longer line is not one the kernel printed (its records are at most 8 KiB): only its start
# is kept, so that the patterns here and in the checks never scan megabytes per line.
_LINE_MAX = 8192

_RELEVANT = lazy(
    "(?i)"  # IGNORECASE, inline: see gpugate/regex.py
    + "|".join(
        [
            r"NVRM: Xid \(",
            r"\bSXid \(",
            r"fallen off the bus",
            r"NVRM: The NVIDIA GPU ",  # first line of the multi-line "fallen off the bus"
            r"NVIDIA probe routine failed",
            r"RmInitAdapter failed|rm_init_adapter failed",
            r"NV_ERR_RESET_REQUIRED",
            r"NVRM: GPU at PCI:",  # PCI address -> UUID, printed before a GPU's first Xid
            r"invoked oom-killer|oom-kill:|out of memory: Kill|oom_reaper: reaped|Killed process",
            r"mlx5.*\bLink (?:up|down|init|armed|active)\b|mlx5.*Port module event",
            r"AER: .*error|PCIe Bus Error|error status/mask=",
            r"nvidia[-_]peermem",
        ]
    ),
)
_ESCAPE_RE = lazy(rb"\\x([0-9a-fA-F]{2})")
# A record ends at a newline that is not followed by one of its own dictionary lines.
_RECORD_END_RE = lazy(rb"\n(?=[^ ])")


class KmsgRecord(Record):
    """One /dev/kmsg record."""

    prio: int  # syslog facility * 8 + level; facility 0 is the kernel itself
    seq: int
    usec: int  # CLOCK_MONOTONIC microseconds since boot
    message: str  # unescaped; may hold newlines
    properties: dict[str, Any]  # the dictionary lines: SUBSYSTEM, DEVICE, ...


def read_kernel_log(
    config: Config, since_seq: int | None = None, kmsg: str = KMSG_PATH
) -> dict[str, Any]:
    """Relevant kernel-log lines: `kernel_log_file`, else /dev/kmsg, else `dmesg`."""
    src = config.sources
    if src.kernel_log_file:
        return {"kernel_log": read_log_file(src.kernel_log_file, src.kernel_log_max_lines)}
    try:
        lines, last_seq = read_kmsg(kmsg, since_seq, src.kernel_log_max_lines)
    except OSError as exc:  # no /dev/kmsg (containers) or not allowed: ask `dmesg`
        lines = read_dmesg(src.timeout_s.kernel_log, src.kernel_log_max_lines, why=str(exc))
        return {"kernel_log": lines}
    # The position lets the next reader start after these records ("since the last check");
    # a sequence number only means something within one boot.
    return {"kernel_log": lines, "kernel_log_seq": last_seq, "boot_id": boot_id(config)}


def boot_id(config: Config) -> str | None:
    """This boot's random id (/proc/sys/kernel/random/boot_id), or None."""
    try:
        with open(os.path.join(config.sources.proc_root, "sys/kernel/random/boot_id")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def read_log_file(path: str, max_lines: int | None = None) -> list[str]:
    """Relevant lines of a saved kernel log (dmesg, journalctl -k, syslog), bad bytes replaced."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return filter_lines(f, max_lines)


def read_dmesg(timeout: float, max_lines: int | None = None, why: str = "") -> list[str]:
    """Relevant lines of `dmesg` output; raises RuntimeError when it does not run cleanly."""
    result = runner.run(["dmesg"], timeout)
    if not result.ok:
        raise RuntimeError(f"{why}; {result.describe()}" if why else result.describe())
    return filter_lines(result.stdout.splitlines(), max_lines)


def read_kmsg(
    path: str = KMSG_PATH, since_seq: int | None = None, max_lines: int | None = None
) -> tuple[list[str], int | None]:
    """Relevant lines of kernel records after `since_seq`, and the last sequence number read."""
    found: list[tuple[int, list[str]]] = []
    last_seq = None
    for record in iter_kmsg(path):
        last_seq = record.seq
        # Facility 0 only: the kernel stamps anything written to /dev/kmsg by user space with
        # LOG_USER (devkmsg_write), so an injected "NVRM: Xid" line cannot pass for a real one.
        if record.prio >> 3 == 0 and _RELEVANT.search(record.message):
            found.append((record.seq, format_record(record)))
    # A baseline beyond the newest record belongs to an earlier boot: everything is new.
    if since_seq is not None and last_seq is not None and since_seq <= last_seq:
        found = [item for item in found if item[0] > since_seq]
    return _newest([line for _, lines in found for line in lines], max_lines), last_seq


def kmsg_position(path: str = KMSG_PATH) -> int | None:
    """The sequence number of the newest kernel record, or None (empty or unreadable)."""
    last = None
    try:
        for record in iter_kmsg(path):
            last = record.seq
    except OSError:
        return None
    return last


def iter_kmsg(path: str = KMSG_PATH) -> Iterator[KmsgRecord]:
    """Every record of a kmsg device (or a file/FIFO in that format), without blocking."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _seek_data(fd)
        pending = b""
        for _ in range(_MAX_READS):
            try:
                chunk = os.read(fd, _READ_SIZE)
            except BlockingIOError:  # EAGAIN: no record left
                break
            except BrokenPipeError:  # EPIPE: overwritten under us; the next read goes on
                continue
            if not chunk:  # end of a regular file or FIFO standing in for the device
                break
            # The device gives one record per read; files and FIFOs give several or part of
            # one, so split on record boundaries and keep the last (possibly growing) one.
            *complete, pending = _RECORD_END_RE.split(pending + chunk)
            yield from _parsed(complete)
        yield from _parsed([pending])
    finally:
        os.close(fd)


def parse_kmsg_record(raw: bytes) -> KmsgRecord | None:
    """One raw record (`prio,seq,usec,flags;message` + ` KEY=value` lines); None if malformed."""
    head, sep, body = raw.partition(b";")
    fields = head.split(b",")
    if not sep or len(fields) < 4:
        return None
    try:
        prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    message, *extra = body.rstrip(b"\n").split(b"\n")
    properties = {}
    for line in extra:
        key, _, value = line[1:].partition(b"=")
        if line.startswith(b" ") and key:
            properties[_unescape(key)] = _unescape(value)
    return KmsgRecord(
        prio=prio, seq=seq, usec=usec, message=_unescape(message), properties=properties
    )


def format_record(record: KmsgRecord) -> list[str]:
    """A record as `dmesg` prints it: `[%5d.%06d] text`, further lines indented below."""
    secs, usec = divmod(record.usec, 1_000_000)
    prefix = f"[{secs:5d}.{usec:06d}] "
    first, *rest = record.message.split("\n")
    return [prefix + first] + [" " * len(prefix) + line for line in rest]


def filter_lines(lines: Iterable[str], max_lines: int | None = None) -> list[str]:
    """The relevant lines of dmesg-style text, newest `max_lines` kept.

    A line that starts with white space continues the line above (dmesg indents the further
    lines of a multi-line message), so a message is kept or dropped whole: the "fallen off
    the bus" form splits its GPU address and its verdict over three lines.
    """
    kept: list[str] = []
    for message in _messages(lines):
        if _RELEVANT.search(" ".join(message)):
            kept.extend(message)
    return _newest(kept, max_lines)


def _messages(lines: Iterable[str]) -> Iterator[list[str]]:
    message: list[str] = []
    for raw in lines:
        line = raw[:_LINE_MAX].rstrip("\r\n")
        if message and line[:1] in (" ", "\t"):
            message.append(line)
            continue
        if message:
            yield message
        message = [line] if line.strip() else []
    if message:
        yield message


def _newest(lines: list[str], max_lines: int | None) -> list[str]:
    if max_lines is None:
        return lines
    return lines[max(0, len(lines) - max_lines) :]


def _parsed(raws: list[bytes]) -> Iterator[KmsgRecord]:
    for raw in raws:
        record = parse_kmsg_record(raw) if raw.strip() else None
        if record is not None:
            yield record


def _unescape(data: bytes) -> str:
    if b"\\" in data:
        data = _ESCAPE_RE.sub(lambda m: bytes([int(m.group(1), 16)]), data)
    return data.decode("utf-8", "replace")


def _seek_data(fd: int) -> None:
    # SEEK_DATA: start after the last `dmesg --clear`, the same view `dmesg` gives, so an
    # admin who clears the log after a repair acknowledges the old lines. Files and FIFOs
    # standing in for the device may not seek (ESPIPE); they are read from where they are.
    try:
        os.lseek(fd, 0, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno not in (errno.ESPIPE, errno.EINVAL, errno.ENXIO):
            raise

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
(`since_seq`, the position the last check saved).

Records lost (issue 41, R9): the ring buffer is a few MiB, and a user's OOM-kill loop in its
own memory cgroup (about a thousand kills in half a minute, several records each) overwrites
it between two checks. An Xid logged before the flood is then gone unread. The device says so
exactly: a read() whose record was overwritten fails with EPIPE and the next one returns the
oldest record left, whose sequence number tells how many were lost (both kernel/printk/printk.c
devkmsg_read and Documentation/ABI/testing/dev-kmsg). Loss after `since_seq` is reported
(`kernel_log_lost`: kernel.xid says "unknown", never a silent pass); a record the reader does
not start at only because `dmesg --clear` moved the start (SEEK_DATA, below) is not loss.

The cap (`kernel_log_max_lines`, newest kept) counts the OOM killer's lines and the application
Xids (13, 31, 43) apart from the others: a flood of either, which any user can cause, never
pushes a GPU line (a hardware Xid, SXid, lost GPU, PCIe AER, NIC) out.
"""

from __future__ import annotations

import errno
import os
import stat

from gpugate import runner
from gpugate.checks.kerneltime import read_boot_epoch
from gpugate.clock import utc
from gpugate.record import Record
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any, Protocol

    from gpugate.config.schema import Config

    class KmsgSource(Protocol):
        """Where kmsg records come from: the device, a file or FIFO in its format, a fake."""

        # Whether the first record read is where `dmesg --clear` left the start (the device,
        # after SEEK_DATA): a later first record than expected is then no loss by itself.
        starts_at_clear: bool

        def read(self) -> bytes:
            """One record (the device) or a chunk (a file); b"" at the end. Raises
            BlockingIOError when no record is left, BrokenPipeError when the next record was
            overwritten (the read after it returns the oldest one left)."""

        def close(self) -> None:
            """Release the source."""


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

# The lines about the hardware: GPUs, NVSwitches, PCIe, the NICs.
_HARDWARE = [
    r"NVRM: Xid \(",
    r"\bSXid \(",
    r"fallen off the bus",
    r"NVRM: The NVIDIA GPU ",  # first line of the multi-line "fallen off the bus"
    r"NVIDIA probe routine failed",
    r"RmInitAdapter failed|rm_init_adapter failed",
    r"NV_ERR_RESET_REQUIRED",
    r"NVRM: GPU at PCI:",  # PCI address -> UUID, printed before a GPU's first Xid
    r"mlx5.*\bLink (?:up|down|init|armed|active)\b|mlx5.*Port module event",
    r"AER: .*error|PCIe Bus Error|error status/mask=",
    r"nvidia[-_]peermem",
]
# The OOM killer's lines (mm/oom_kill.c): any user can cause them by the thousand (a job's
# OOM-kill loop in its own memory cgroup), so they are capped apart from the hardware's.
_OOM = r"invoked oom-killer|oom-kill:|out of memory: Kill|oom_reaper: reaped|Killed process"
_RELEVANT = lazy("(?i)" + "|".join([*_HARDWARE, _OOM]))  # IGNORECASE inline: gpugate/regex.py
_HARDWARE_RE = lazy("(?i)" + "|".join(_HARDWARE))
_OOM_RE = lazy("(?i)" + _OOM)
# "<comm> invoked oom-killer: gfp_mask=...": the process name comes first and is the user's
# (up to 15 bytes, "NVRM: Xid (" fits), so this form is the OOM killer's wherever it stands.
_OOM_INVOKED = lazy(r" invoked oom-killer: gfp_mask=")
# Application Xids (gpugate/checks/xid.py APP_XIDS, NVIDIA's catalog: the application's fault):
# a user's code raises them at will, one line per fault, so they are capped apart too. The
# first "NVRM: Xid (...): N," is the kernel's own; a process name comes after the code.
APP_XID_CODES = frozenset({13, 31, 43})
_XID_CODE = lazy(r"NVRM: Xid \([^)]*\): (\d+),")
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
    after_loss: bool = False  # the read before it failed with EPIPE: records were overwritten


class KmsgScan(Record):
    """What one pass over the kernel records found."""

    lines: list[str]  # the relevant lines after `since_seq`, newest kept (see capped)
    last_seq: int | None  # the newest record's sequence number
    lost: dict[str, Any] | None = None  # records lost after `since_seq` (see Gaps)


def read_kernel_log(
    config: Config, since_seq: int | None = None, kmsg: str | KmsgSource = KMSG_PATH
) -> dict[str, Any]:
    """Relevant kernel-log lines: `kernel_log_file`, else /dev/kmsg, else `dmesg`."""
    src = config.sources
    if src.kernel_log_file:
        return {"kernel_log": read_log_file(src.kernel_log_file, src.kernel_log_max_lines)}
    try:
        scan = scan_kmsg(kmsg, since_seq, src.kernel_log_max_lines)
    except OSError as exc:  # no /dev/kmsg (containers) or not allowed: ask `dmesg`
        lines = read_dmesg(src.timeout_s.kernel_log, src.kernel_log_max_lines, why=str(exc))
        return {"kernel_log": lines}
    # The position lets the next reader start after these records ("since the last check");
    # a sequence number only means something within one boot.
    out: dict[str, Any] = {"kernel_log": scan.lines, "kernel_log_seq": scan.last_seq,
                           "boot_id": boot_id(config)}  # fmt: skip
    if scan.lost:
        out["kernel_log_lost"] = with_times(scan.lost, config.sources.proc_root)
    return out


def with_times(lost: dict[str, Any], proc_root: str) -> dict[str, Any]:
    """`lost` with its stamps (microseconds since boot) as UTC times, where the boot is known."""
    out = {k: v for k, v in lost.items() if not k.endswith("_usec")}
    try:
        booted = read_boot_epoch(proc_root)
    except (OSError, ValueError, IndexError):
        return out
    for key in ("after", "resumed"):
        usec = lost.get(f"{key}_usec")
        if isinstance(usec, int):
            out[f"{key}_at"] = utc(booted + usec / 1e6)
    return out


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
    path: str | KmsgSource = KMSG_PATH, since_seq: int | None = None, max_lines: int | None = None
) -> tuple[list[str], int | None]:
    """Relevant lines of kernel records after `since_seq`, and the last sequence number read."""
    scan = scan_kmsg(path, since_seq, max_lines)
    return scan.lines, scan.last_seq


def scan_kmsg(
    path: str | KmsgSource = KMSG_PATH, since_seq: int | None = None, max_lines: int | None = None
) -> KmsgScan:
    """Relevant lines of kernel records after `since_seq`, the last sequence number read, and
    the records lost after `since_seq` (overwritten before anyone read them)."""
    source = _FdSource(path) if isinstance(path, str) else path
    gaps = Gaps(since_seq, source.starts_at_clear)
    found: list[tuple[int, list[str]]] = []
    last_seq = None
    for record in iter_kmsg(source):
        last_seq = record.seq
        gaps.see(record)
        # Facility 0 only: the kernel stamps anything written to /dev/kmsg by user space with
        # LOG_USER (devkmsg_write), so an injected "NVRM: Xid" line cannot pass for a real one.
        if record.prio >> 3 == 0 and _RELEVANT.search(record.message):
            found.append((record.seq, format_record(record)))
    lost = gaps.lost()
    # A baseline beyond the newest record belongs to an earlier boot: everything is new.
    if since_seq is not None and (last_seq is None or since_seq > last_seq):
        since_seq, lost = None, None
    if since_seq is not None:
        found = [item for item in found if item[0] > since_seq]
    return KmsgScan(lines=capped([lines for _, lines in found], max_lines), last_seq=last_seq,
                    lost=lost)  # fmt: skip


class Gaps:
    """The records lost after `since_seq`, counted as the records are read (in read order).

    A record is lost where the next one read jumps over it: after an EPIPE (the device), or
    between two records read (a file standing in for it). The first record read may start
    late without loss only on the device, whose start `dmesg --clear` moves (SEEK_DATA). With
    no `since_seq` (no earlier check this boot) only loss while reading counts: what scrolled
    out before the first read was never promised.
    """

    def __init__(self, since_seq: int | None, starts_at_clear: bool) -> None:
        self.floor = since_seq  # the newest record known seen
        self.floor_usec: int | None = None  # its stamp, when it was read here
        self.starts_at_clear = starts_at_clear
        self.first = True
        self.count = 0
        self.where: dict[str, Any] = {}

    def see(self, record: KmsgRecord) -> None:
        """Count what was lost before `record`, if anything."""
        floor, first = self.floor, self.first
        self.first = False
        # The device's first record is where `dmesg --clear` left the start, unless EPIPE.
        cleared = first and self.starts_at_clear and not record.after_loss
        if floor is not None and record.seq > floor + 1 and not cleared:
            self.count += record.seq - floor - 1
            self.where.setdefault("after_seq", floor)
            self.where.setdefault("after_usec", self.floor_usec)
            self.where.update(resumed_seq=record.seq, resumed_usec=record.usec)
        if floor is None or record.seq > floor:
            self.floor, self.floor_usec = record.seq, record.usec

    def lost(self) -> dict[str, Any] | None:
        """{records, after_seq, after_usec, resumed_seq, resumed_usec}, or None: none lost."""
        return {"records": self.count, **self.where} if self.count else None


def iter_kmsg(path: str | KmsgSource = KMSG_PATH) -> Iterator[KmsgRecord]:
    """Every record of a kmsg device (or a file/FIFO in that format, or a source), without
    blocking; a record read after an EPIPE is marked `after_loss`."""
    source = _FdSource(path) if isinstance(path, str) else path
    try:
        pending = b""
        overwritten = False
        for _ in range(_MAX_READS):
            try:
                chunk = source.read()
            except BlockingIOError:  # EAGAIN: no record left
                break
            except BrokenPipeError:  # EPIPE: overwritten under us; the next read goes on
                overwritten = True
                continue
            if not chunk:  # end of a regular file or FIFO standing in for the device
                break
            # The device gives one record per read; files and FIFOs give several or part of
            # one, so split on record boundaries and keep the last (possibly growing) one.
            *complete, pending = _RECORD_END_RE.split(pending + chunk)
            for record in _parsed(complete):
                yield record.replace(after_loss=True) if overwritten else record
                overwritten = False
        for record in _parsed([pending]):
            yield record.replace(after_loss=True) if overwritten else record
    finally:
        source.close()


class _FdSource:
    """A kmsg device, file or FIFO opened without blocking, from where `dmesg` starts."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self.starts_at_clear = stat.S_ISCHR(os.fstat(self.fd).st_mode)
            _seek_data(self.fd)
        except BaseException:
            os.close(self.fd)
            raise

    def read(self) -> bytes:
        return os.read(self.fd, _READ_SIZE)

    def close(self) -> None:
        os.close(self.fd)


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
    """The relevant lines of dmesg-style text, newest `max_lines` kept (see capped).

    A line that starts with white space continues the line above (dmesg indents the further
    lines of a multi-line message), so a message is kept or dropped whole: the "fallen off
    the bus" form splits its GPU address and its verdict over three lines.
    """
    return capped([m for m in _messages(lines) if _RELEVANT.search(" ".join(m))], max_lines)


def newest_lines(lines: Iterable[str], max_lines: int | None) -> list[str]:
    """Of relevant dmesg-style lines, the newest `max_lines` kept as `capped` keeps them."""
    return capped(list(_messages(lines)), max_lines)


def capped(messages: list[list[str]], max_lines: int | None) -> list[str]:
    """The lines of `messages` (log order), the newest `max_lines` of each budget (BUDGETS):
    a flood a user can cause (OOM kills, application Xids) never pushes a GPU line out."""
    if max_lines is None:
        return [line for message in messages for line in message]
    left = dict.fromkeys(BUDGETS, max(0, max_lines))
    kept: list[list[str]] = []
    for message in reversed(messages):
        flood = budget_of(" ".join(message))
        take = message[max(0, len(message) - left[flood]) :]
        left[flood] -= len(take)
        if take:
            kept.append(take)
    return [line for message in reversed(kept) for line in message]


BUDGETS = ("oom", "app_xid", "hardware")  # capped apart, each to the whole cap


def budget_of(text: str) -> str:
    """Which cap a kernel message counts against: the OOM killer's, an application Xid's (both
    a user's to cause by the thousand), or the hardware's."""
    if is_oom(text):
        return "oom"
    code = _XID_CODE.search(text)
    # A user's line may carry thousands of digits: int() refuses those (CPython's 4,300-digit
    # limit), and no Xid is longer than a few digits anyway.
    digits = code.group(1) if code else ""
    return "app_xid" if 0 < len(digits) <= 6 and int(digits) in APP_XID_CODES else "hardware"


def is_oom(text: str) -> bool:
    """Whether a kernel message is the OOM killer's (which any user can cause), not the
    hardware's. The process name a line quotes is the user's choice, so what decides is the
    kernel's own text, which comes first: an Xid naming a process "Killed process" is an
    Xid, an OOM kill of a process "NVRM: Xid (" an OOM kill."""
    oom = _OOM_RE.search(text)
    if oom is None:
        return False
    hardware = _HARDWARE_RE.search(text)
    return hardware is None or oom.start() < hardware.start() or bool(_OOM_INVOKED.search(text))


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

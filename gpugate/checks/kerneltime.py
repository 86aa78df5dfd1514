"""The time stamps of kernel log lines, as the tools print them (docs/gpu-facts.md 2).

    [ 1843.308145] NVRM: Xid ...                  /dev/kmsg, dmesg: seconds since boot
    Nov 29 11:02:03 node kernel: [ 1843.308145] ... syslog around the same stamp
    [Sun Nov 29 11:02:03 2026] NVRM: Xid ...       dmesg -T: local time
    2026-11-29T11:02:03,308145+01:00 node kernel:  dmesg --time-format iso
    Nov 29 11:02:03 node kernel: NVRM: ...         journalctl -k: local time, no year

One parser for all of them: kernel.xid counts bursts by the gaps between lines (any scale will
do), the epilog orders the nodes of a job by when each saw its first error (UTC).
"""

from __future__ import annotations

import os
import time

from gpugate.clock import civil_days, utc
from gpugate.regex import lazy

_TS_BOOT = lazy(r"^(?:\w{3} +\d+ [\d:]{8} \S+ kernel: )?\[\s*(\d+\.\d+)\]")
_TS_CTIME = lazy(r"\[\w{3} (\w{3}) +(\d+) (\d\d):(\d\d):(\d\d) (\d{4})\]")  # dmesg -T
_TS_ISO = lazy(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)")  # --time-format iso
_TS_SYSLOG = lazy(r"^(\w{3}) +(\d+) (\d\d):(\d\d):(\d\d) ")  # journalctl -k, no year
_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
_ANY_YEAR = 2000  # for a stamp without one: a leap year, so that Feb 29 is a date

# The kinds of stamp: since boot; local time (dmesg -T); local time with its zone, which is not
# read (--time-format iso); local time without a year (syslog, journalctl).
BOOT, CTIME, ISO, SYSLOG = "boot", "ctime", "iso", "syslog"


def line_stamp(line: str) -> tuple[str, float] | None:
    """(kind, seconds) of the line's stamp; None without a readable one.

    BOOT: seconds since boot. The others: the wall-clock time printed, counted as if it were
    UTC epoch seconds (SYSLOG's in a year of no meaning).
    """
    m = _TS_BOOT.match(line)
    if m:
        return BOOT, float(m.group(1))
    m = _TS_CTIME.search(line)
    if m and m.group(1) in _MONTHS:
        month, day, hh, mm, ss, year = m.groups()
        return _wall(CTIME, year, _MONTHS.index(month) + 1, day, hh, mm, ss)
    m = _TS_ISO.search(line)
    if m:
        return _wall(ISO, *m.groups())
    m = _TS_SYSLOG.match(line)
    if m and m.group(1) in _MONTHS:
        month, day, hh, mm, ss = m.groups()
        return _wall(SYSLOG, _ANY_YEAR, _MONTHS.index(month) + 1, day, hh, mm, ss)
    return None


def _wall(kind: str, *parts: str | int) -> tuple[str, float] | None:
    """(kind, seconds) of (year, month, day, hour, minute, second); None for no real time."""
    try:
        year, month, day, hh, mm, ss = (int(p) for p in parts)
    except ValueError:  # a 5000-digit day: more than int() converts
        return None
    days = civil_days(year, month, day)
    if days is None or hh > 23 or mm > 59 or ss > 61:  # 60, 61: leap seconds, as strptime
        return None
    return kind, days * 86400.0 + hh * 3600 + mm * 60 + ss


def line_seconds(line: str) -> float | None:
    """The line's time in seconds on some fixed scale (for gaps), or None without a stamp."""
    stamp = line_stamp(line)
    return None if stamp is None else stamp[1]


def line_epoch(line: str, boot_epoch: float | None = None) -> float | None:
    """The line's time in epoch seconds, for a since-boot stamp (plus `boot_epoch`, read from
    /proc/uptime when None) or a `dmesg -T` one; None for any other."""

    stamp = line_stamp(line)
    if stamp is None or stamp[0] not in (BOOT, CTIME):
        return None  # ISO: its zone is not read; SYSLOG: no year
    kind, seconds = stamp
    try:
        if kind == BOOT:
            return (boot_epoch if boot_epoch is not None else read_boot_epoch()) + seconds
        # dmesg -T prints local time; the nodes of one cluster share a time zone.
        return time.mktime((*time.gmtime(seconds)[:6], 0, 0, -1))
    except (OSError, ValueError, IndexError, OverflowError):  # no /proc/uptime, or a bad one
        return None


def line_utc(line: str, boot_epoch: float | None = None) -> str | None:
    """`[Sun Nov 29 11:02:03 2026] ...` or `[ 1843.308145] ...` (since boot) -> ISO UTC."""
    epoch = line_epoch(line, boot_epoch)
    try:
        return None if epoch is None else utc(epoch, micro=True)
    except (OverflowError, OSError, ValueError):  # past year 9999
        return None


def read_boot_epoch(proc_root: str = "/proc") -> float:
    """When this node booted, in epoch seconds (now less /proc/uptime)."""

    with open(os.path.join(proc_root, "uptime")) as fh:
        return time.time() - float(fh.read().split()[0])

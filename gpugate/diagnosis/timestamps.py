"""The time stamp a log line starts with, in the formats training jobs and kernels print.

    2024-01-02T03:04:05.123456Z  2024-01-02T03:04:05+01:00   ISO 8601 (zone read when given)
    2024-01-02 03:04:05,678  [2024-01-02 03:04:05,678]      Python logging, PyTorch
    [Sun Nov 29 11:02:03 2026]                              dmesg -T
    E1129 10:11:12.123456  [rank3]:[E1129 10:11:12.123456]  glog (c10d, NCCL): no year
    Nov 29 10:11:12                                         syslog, journalctl: no year
    [ 1234.567890]                                          dmesg: seconds since boot

Used to order the nodes of one job by when each failed (gpugate.diagnosis.multinode). A stamp
without a year is compared with the others of the same inputs only, in one arbitrary year;
seconds since boot do not compare across nodes at all. Only `re` is imported: this may run on
the epilog's path, where `datetime` costs more than the work.
"""

from __future__ import annotations

import re

from gpugate.clock import civil_days, utc
from gpugate.record import Record
from gpugate.regex import lazy

# The kinds: a full date (WALL), a date without its year (NOYEAR), seconds since boot (BOOT).
WALL, NOYEAR, BOOT = "wall", "noyear", "boot"
ANY_YEAR = 2000  # a leap year, so that Feb 29 is a date
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MON = "(" + "|".join(_MONTHS) + ")"
# A stamp is looked for near the start only: a date in a message's text is not the line's time.
HEAD = 96

_ISO = lazy(
    r"(?<!\d)(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?"
    r"(Z|[+-]\d\d:?\d\d)?(?!\d)"
)
_CTIME = lazy(r"\[\w{3} " + _MON + r" +(\d\d?) (\d\d):(\d\d):(\d\d) (\d{4})\]")
_SYSLOG = lazy(r"(?<![A-Za-z])" + _MON + r" +(\d\d?) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?!\d)")
_GLOG = lazy(r"(?<![A-Za-z0-9])[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?!\d)")
_BOOT = lazy(r"\[\s*(\d+\.\d+)\]")


class Stamp(Record):
    """A line's time: its kind, seconds (epoch, in ANY_YEAR for NOYEAR), and the text read."""

    kind: str
    seconds: float
    text: str
    zoned: bool = False  # WALL only: the line said its zone (else it is local time, read as UTC)

    def iso(self) -> str | None:
        """The time as gpugate writes it (`...Z`), for a full date only; None otherwise."""
        return utc(self.seconds, micro=self.seconds % 1 != 0) if self.kind == WALL else None

    def without_year(self) -> float:
        """The seconds as if the stamp had no year: to compare a WALL with a NOYEAR stamp."""
        if self.kind != WALL:
            return self.seconds
        days = int(self.seconds // 86400)
        year = _year_of(days)
        start = civil_days(year, 1, 1) or 0
        base = civil_days(ANY_YEAR, 1, 1) or 0
        return self.seconds - start * 86400 + base * 86400


def _year_of(days: int) -> int:
    # The civil year holding a day count (days since 1970-01-01); dates in 1..9999 only.
    year = 1970 + days // 366
    while (civil_days(year + 1, 1, 1) or 0) <= days:
        year += 1
    return year


def _clock(date: int | None, hh: str, mm: str, ss: str, frac: str | None) -> float | None:
    # Epoch seconds of a date (days) and a time of day; None for an impossible one.
    h, m, s = int(hh), int(mm), int(ss)
    if date is None or h > 23 or m > 59 or s > 61:
        return None
    return date * 86400 + h * 3600 + m * 60 + s + (float("0." + frac) if frac else 0.0)


def _zone(text: str | None) -> float:
    # Seconds east of UTC that a `Z` / `+hh:mm` suffix says.
    if not text or text == "Z":
        return 0.0
    digits = text[1:].replace(":", "")
    offset = int(digits[:2]) * 3600 + int(digits[2:]) * 60
    return -offset if text[0] == "-" else offset


def _iso(m: re.Match[str]) -> Stamp | None:
    y, mo, d, hh, mm, ss, frac, zone = m.groups()
    at = _clock(civil_days(int(y), int(mo), int(d)), hh, mm, ss, frac)
    if at is None:
        return None
    return Stamp(kind=WALL, seconds=at - _zone(zone), text=m.group(0), zoned=zone is not None)


def _ctime(m: re.Match[str]) -> Stamp | None:
    mon, d, hh, mm, ss, y = m.groups()
    at = _clock(civil_days(int(y), _MONTHS.index(mon) + 1, int(d)), hh, mm, ss, None)
    return None if at is None else Stamp(kind=WALL, seconds=at, text=m.group(0))


def _syslog(m: re.Match[str]) -> Stamp | None:
    mon, d, hh, mm, ss, frac = m.groups()
    at = _clock(civil_days(ANY_YEAR, _MONTHS.index(mon) + 1, int(d)), hh, mm, ss, frac)
    return None if at is None else Stamp(kind=NOYEAR, seconds=at, text=m.group(0))


def _glog(m: re.Match[str]) -> Stamp | None:
    mo, d, hh, mm, ss, frac = m.groups()
    at = _clock(civil_days(ANY_YEAR, int(mo), int(d)), hh, mm, ss, frac)
    return None if at is None else Stamp(kind=NOYEAR, seconds=at, text=m.group(0))


# Tried in this order: a full date first, so that a syslog line carrying a boot stamp too
# (`Nov 29 10:11:12 node kernel: [ 1234.5] ...`) is read by its wall clock.
_READERS = ((_ISO, _iso), (_CTIME, _ctime), (_SYSLOG, _syslog), (_GLOG, _glog))


def line_stamp(line: str) -> Stamp | None:
    """The stamp near the start of `line` (the earliest-placed readable one); None without one."""
    head = line[:HEAD]
    found: list[tuple[int, Stamp]] = []
    for pattern, read in _READERS:
        m = pattern.search(head)
        stamp = read(m) if m else None
        if stamp is not None and m is not None:
            found.append((m.start(), stamp))
    if found:
        # The leftmost wins: `[rank3]:[E1129 ...]` before a date quoted later in the message.
        return min(found, key=lambda f: (f[0], f[1].kind != WALL))[1]
    m = _BOOT.search(head)
    return Stamp(kind=BOOT, seconds=float(m.group(1)), text=m.group(0)) if m else None

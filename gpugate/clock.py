"""UTC time as gpugate writes it everywhere: `2026-11-29T10:00:00Z` (ISO 8601, always UTC).

One format for the snapshot's `collected_at`, the event and history lines, evidence summaries
and listings, so that any two of them compare as text and as times. Only `time` is imported:
`datetime` and `calendar` cost more than the hook that writes the line.
"""

from __future__ import annotations

import time

from gpugate.regex import lazy

# What utc() writes; one- or two-digit fields are accepted as time.strptime did.
_UTC = lazy(r"(\d{4})-(\d\d?)-(\d\d?)T(\d\d?):(\d\d?):(\d\d?)(?:\.(\d{1,9}))?Z")
_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def utc(epoch: float | None = None, micro: bool = False) -> str:
    """Epoch seconds (now when None) as `2026-11-29T10:00:00Z`; `micro` adds `.250000`."""
    when = time.time() if epoch is None else epoch
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when))
    return text + (f".{int(when * 1e6) % 1000000:06d}Z" if micro else "Z")


def parse_utc(text: str | None) -> float | None:
    """A time utc() wrote, as epoch seconds; None when `text` is not one."""
    m = _UTC.fullmatch(text or "")
    if not m:
        return None
    year, month, day, hh, mm, ss = (int(g) for g in m.groups()[:6])
    days = civil_days(year, month, day)
    if days is None or hh > 23 or mm > 59 or ss > 61:  # 60, 61: leap seconds, as strptime
        return None
    fraction = float("0." + m.group(7)) if m.group(7) else 0.0
    return days * 86400 + hh * 3600 + mm * 60 + ss + fraction


def civil_days(year: int, month: int, day: int) -> int | None:
    """Days from 1970-01-01 to a (proleptic Gregorian) date; None for an impossible one."""
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if not 1 <= year <= 9999 or not 1 <= month <= 12:
        return None
    if not 1 <= day <= _MONTH_DAYS[month - 1] + (leap and month == 2):
        return None
    # Howard Hinnant's days_from_civil: years start in March, so the leap day comes last.
    y = year - (month <= 2)
    era, yoe = divmod(y, 400)
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468

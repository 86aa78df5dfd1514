"""One parser for kernel log time stamps: burst gaps (kernel.xid) and first-error times (epilog)."""

from __future__ import annotations

import pytest

from gpugate.checks import kerneltime as K

BOOT = 1_800_000_000.0


@pytest.mark.parametrize(
    "line, kind",
    [
        ("[ 1843.308145] NVRM: Xid (PCI:0000:38:00): 79", K.BOOT),
        ("Nov 29 11:02:03 node kernel: [ 1843.308145] NVRM: Xid", K.BOOT),
        ("[Sun Nov 29 11:02:03 2026] NVRM: Xid", K.CTIME),
        ("2026-11-29T11:02:03,308145+01:00 node kernel: NVRM: Xid", K.ISO),
        ("Nov 29 11:02:03 node kernel: NVRM: Xid", K.SYSLOG),
    ],
)
def test_every_format_the_tools_print_has_a_kind(line, kind):
    assert K.line_stamp(line)[0] == kind


@pytest.mark.parametrize(
    "line",
    ["no stamp", "[Sun Feb 30 11:02:03 2026] x", "[Sun Nov 29 25:02:03 2026] x",
     "[Sun Xyz 29 11:02:03 2026] x", "[Sun Nov " + "9" * 5000 + " 11:02:03 2026] x"],
)  # fmt: skip
def test_no_stamp_or_no_real_time_is_none(line):
    assert K.line_stamp(line) is None and K.line_seconds(line) is None
    assert K.line_utc(line, boot_epoch=BOOT) is None


def test_gaps_are_seconds_on_each_scale():
    a, b = "[Sun Nov 29 23:59:00 2026] x", "[Mon Nov 30 00:02:30 2026] x"
    assert K.line_seconds(b) - K.line_seconds(a) == 210
    assert K.line_seconds("[  10.5] x") == 10.5
    leap = "Feb 29 00:00:00 node kernel: x"  # a syslog stamp has no year: Feb 29 is still a date
    assert K.line_seconds(leap) is not None


def test_since_boot_and_dmesg_t_stamps_become_utc():
    assert K.line_utc("[  100.250000] NVRM: Xid", boot_epoch=BOOT) == "2027-01-15T08:01:40.250000Z"
    assert K.line_utc("[Sun Nov 29 11:02:03 2026] NVRM: Xid").startswith("2026-11-29T")
    # An ISO stamp's zone is not read, a syslog one has no year: no UTC time claimed for them.
    assert K.line_utc("2026-11-29T11:02:03,308145+01:00 node kernel: x") is None
    assert K.line_utc("Nov 29 11:02:03 node kernel: x") is None


def test_a_missing_proc_uptime_is_no_time(tmp_path, monkeypatch):
    read = K.read_boot_epoch
    monkeypatch.setattr(K, "read_boot_epoch", lambda: read(str(tmp_path)))
    assert K.line_utc("[  100.25] x") is None
    (tmp_path / "uptime").write_text("50.00 90.00\n")
    assert K.line_utc("[  100.25] x").endswith("Z")

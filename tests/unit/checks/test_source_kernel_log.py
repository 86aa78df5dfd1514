"""The kernel-log source: kmsg records, dmesg-style text, the file / kmsg / dmesg order."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import paths
import pytest
from factories import default_config

from gpugate import runner
from gpugate.checks.facts import facts_from_dict
from gpugate.checks.sources import kernel_log as kl
from gpugate.checks.xid import parse_xid

FIXTURES = paths.FIXTURES / "kernel-log"
DMESG = FIXTURES / "dmesg.txt"
KMSG = FIXTURES / "kmsg.txt"
REAL_DMESG = paths.SHARED / "reference/real-outputs/dmesg"


def config(**sources: object):
    cfg = default_config()
    return cfg.replace(sources=cfg.sources.replace(**sources))


def in_thread(fn, timeout: float = 5.0):
    """Run `fn` and fail (instead of hanging the run) if it blocks."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(value=fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "blocked"
    return out["value"]


# --- kmsg records ---------------------------------------------------------------------------


def test_parse_kmsg_record_fields_and_dictionary_lines():
    rec = kl.parse_kmsg_record(
        b"4,1001,1843308152,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"
        b" SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n"
    )
    assert (rec.prio, rec.seq, rec.usec) == (4, 1001, 1843308152)
    assert rec.message == "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."
    assert rec.properties == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:18:00.0"}


def test_parse_kmsg_record_unescapes_newlines_and_utf8():
    rec = kl.parse_kmsg_record(b"6,7,8,-;a\\x0ab \\xc2\\xb5s \\x5c\n")
    assert rec.message == "a\nb \u00b5s \\"


def test_parse_kmsg_record_extra_header_fields():
    # CONFIG_PRINTK_CALLER adds `,caller=T412` after the flags.
    rec = kl.parse_kmsg_record(b"6,840,35902311,-,caller=T412;mlx5_core: Link up\n")
    assert (rec.seq, rec.message) == (840, "mlx5_core: Link up")


@pytest.mark.parametrize("raw", [b"no header here", b"6,1;short", b"x,1,2,-;bad prio", b""])
def test_parse_kmsg_record_malformed(raw):
    assert kl.parse_kmsg_record(raw) is None


def test_format_record_like_dmesg():
    rec = kl.parse_kmsg_record(b"3,812,19004112,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: x\n")
    assert kl.format_record(rec) == [
        "[   19.004112] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: x",
    ]


# --- dmesg-style text -----------------------------------------------------------------------


def test_filter_lines_keeps_relevant_and_drops_noise():
    kept = kl.filter_lines(DMESG.read_text().splitlines())
    text = "\n".join(kept)
    for wanted in (
        "Xid (PCI:0000:18:00): 79",
        "GPU 0000:18:00.0: GPU has fallen off the bus",
        "NVIDIA probe routine failed",
        "SXid (PCI:0000:06:00.0): 20034",
        "RmInitAdapter failed",
        "rm_init_adapter failed",
        "NV_ERR_RESET_REQUIRED",
        "invoked oom-killer",
        "oom-kill:constraint=CONSTRAINT_MEMCG",
        "Memory cgroup out of memory: Killed process 412233",
        "oom_reaper: reaped process",
        "mlx5_0: Port: 1 Link ACTIVE",
        "enp59s0f0np0: Link down",
        "enp59s0f0np0: Link up",
        "AER: Uncorrected (Fatal) error received",
        "PCIe Bus Error: severity=Uncorrected (Fatal)",
        "error status/mask=",
        "nvidia-peermem nv_get_p2p_free_callback",
        "NVRM: GPU at PCI:0000:18:00: GPU-8f2c",
    ):
        assert wanted in text, wanted
    for noise in ("Linux version", "AER: enabled with IRQ", "firmware version", "Comm: python3",
                  "systemd-journald", "loading NVIDIA UNIX"):  # fmt: skip
        assert noise not in text, noise
    assert len(kept) == 22


def test_filter_lines_keeps_the_multiline_fallen_off_the_bus_whole():
    kept = kl.filter_lines(DMESG.read_text().splitlines())
    i = kept.index("[   19.004112] NVRM: The NVIDIA GPU 0000:b3:00.0")
    assert kept[i + 2].strip() == "NVRM: fallen off the bus and is not responding to commands."


def test_filter_lines_keeps_the_newest():
    lines = [f"[{i:5d}.000000] NVRM: Xid (PCI:0000:18:00): 13, n{i}" for i in range(10)]
    assert kl.filter_lines(lines, max_lines=3) == lines[-3:]
    assert kl.filter_lines(lines, max_lines=0) == []


def test_filter_lines_accepts_a_stream_with_newlines():
    with open(DMESG, encoding="utf-8") as f:
        assert kl.filter_lines(f) == kl.filter_lines(DMESG.read_text().splitlines())


# --- /dev/kmsg reader -----------------------------------------------------------------------


def test_read_kmsg_from_a_file_in_kmsg_format():
    lines, last = kl.read_kmsg(str(KMSG))
    assert last == 1006
    assert lines == [
        "[   19.004112] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands.",
        "[   35.902311] mlx5_core 0000:29:00.0 mlx5_0: Port: 1 Link ACTIVE",
        "[ 1843.308152] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has"
        " fallen off the bus.",
        "[ 3001.122334] python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|"
        "__GFP_COMP), order=0, oom_score_adj=0",
        "[ 3001.123001] Memory cgroup out of memory: Killed process 412233 (python3) total-vm:"
        "123456789kB, anon-rss:98765432kB, file-rss:123456kB, shmem-rss:0kB, UID:1001 "
        "pgtables:200000kB oom_score_adj:0",
    ]
    assert parse_xid(lines[4]).code == 79


def test_read_kmsg_ignores_lines_user_space_wrote():
    lines, _ = kl.read_kmsg(str(KMSG))
    assert not any("from user space" in line for line in lines)  # facility LOG_USER


def test_read_kmsg_records_split_across_reads(monkeypatch):
    whole = kl.read_kmsg(str(KMSG))
    monkeypatch.setattr(kl, "_READ_SIZE", 7)
    assert kl.read_kmsg(str(KMSG)) == whole


def test_read_kmsg_since_seq():
    lines, last = kl.read_kmsg(str(KMSG), since_seq=1001)
    assert last == 1006
    assert [line[:14] for line in lines] == ["[ 3001.122334]", "[ 3001.123001]"]
    assert kl.read_kmsg(str(KMSG), since_seq=1006) == ([], 1006)


def test_read_kmsg_since_seq_from_an_earlier_boot_reads_everything():
    assert kl.read_kmsg(str(KMSG), since_seq=99999) == kl.read_kmsg(str(KMSG))


def test_read_kmsg_max_lines():
    # The newest 2 of the OOM killer's lines, and apart the newest 2 of the others.
    lines, _ = kl.read_kmsg(str(KMSG), max_lines=2)
    assert [line[:14] for line in lines] == [
        "[   35.902311]",
        "[ 1843.308152]",
        "[ 3001.122334]",
        "[ 3001.123001]",
    ]


def test_read_kmsg_stops_at_eagain_instead_of_blocking(tmp_path):
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    # A writer that stays open: reading an empty FIFO then gives EAGAIN, not end of file.
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(writer, b"4,5,1000000,-;NVRM: Xid (PCI:0000:18:00): 48, DBE\n")
        os.write(writer, b"6,6,2000000,-;noise\n SUBSYSTEM=pci\n")
        lines, last = in_thread(lambda: kl.read_kmsg(str(fifo)))
    finally:
        os.close(writer)
    assert lines == ["[    1.000000] NVRM: Xid (PCI:0000:18:00): 48, DBE"]
    assert last == 6


def test_read_kmsg_skips_an_overwritten_record(monkeypatch):
    real_read = os.read
    calls = {"n": 0}

    def read(fd, size):
        calls["n"] += 1
        if calls["n"] == 1:
            raise BrokenPipeError(32, "Broken pipe")  # EPIPE: the record went under us
        return real_read(fd, size)

    monkeypatch.setattr(kl.os, "read", read)
    lines, last = kl.read_kmsg(str(KMSG))
    assert last == 1006 and len(lines) == 7


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg not readable here")
def test_read_the_real_dev_kmsg_without_blocking():
    lines, last = in_thread(lambda: kl.read_kmsg(kl.KMSG_PATH))
    assert isinstance(lines, list)
    later = [r.seq for r in kl.iter_kmsg(kl.KMSG_PATH)]  # the log only grows past `last`
    assert last is None or (later and later[-1] >= last)


# --- read_kernel_log: sources in order ------------------------------------------------------


def test_read_kernel_log_from_the_configured_file():
    data = kl.read_kernel_log(config(kernel_log_file=str(DMESG)), kmsg="/nonexistent")
    assert len(data["kernel_log"]) == 22
    assert facts_from_dict(data).kernel_log[0].endswith("NVRM: The NVIDIA GPU 0000:b3:00.0")


def test_read_kernel_log_file_tolerates_bad_bytes(tmp_path):
    log = tmp_path / "kern.log"
    log.write_bytes(b"[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, \xff\xfe bad\n[ 2.0] noise\n")
    data = kl.read_kernel_log(config(kernel_log_file=str(log), kernel_log_max_lines=10))
    assert data["kernel_log"] == ["[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, \ufffd\ufffd bad"]


def test_read_kernel_log_respects_max_lines():
    data = kl.read_kernel_log(config(kernel_log_file=str(DMESG), kernel_log_max_lines=2))
    assert data["kernel_log"][-1].endswith("skipping further processing")
    # 2 of the OOM killer's (the newest), 2 others: the Link up and the peermem line.
    assert [line[:14] for line in data["kernel_log"]] == [
        "[ 3001.123001]",
        "[ 3001.301442]",
        "[ 3101.412117]",
        "[ 3200.912000]",
    ]


def test_read_kernel_log_from_kmsg():
    data = kl.read_kernel_log(config(), kmsg=str(KMSG))
    assert len(facts_from_dict(data).kernel_log) == 7


def test_read_kernel_log_falls_back_to_dmesg(monkeypatch):
    seen = []

    def fake_run(argv, timeout, env=None, stdin=None):
        seen.append((tuple(argv), timeout))
        return runner.CommandResult(argv=tuple(argv), status=runner.OK, returncode=0,
                                    stdout=DMESG.read_text())  # fmt: skip

    monkeypatch.setattr(runner, "run", fake_run)
    data = kl.read_kernel_log(config(), kmsg="/nonexistent/kmsg")
    assert seen == [(("dmesg",), default_config().sources.timeout_s.kernel_log)]
    assert data["kernel_log"] == kl.filter_lines(DMESG.read_text().splitlines(), 2000)
    facts_from_dict(data)


def test_read_kernel_log_dmesg_failure_names_both_sources(monkeypatch):
    def fake_run(argv, timeout, env=None, stdin=None):
        return runner.CommandResult(argv=tuple(argv), status=runner.NONZERO, returncode=1,
                                    stderr="dmesg: read kernel buffer failed: Operation not "
                                    "permitted")  # fmt: skip

    monkeypatch.setattr(runner, "run", fake_run)
    with pytest.raises(RuntimeError) as err:
        kl.read_kernel_log(config(), kmsg="/nonexistent/kmsg")
    assert "/nonexistent/kmsg" in str(err.value) and "dmesg: exit 1" in str(err.value)


# --- real captures (shared/reference), when this checkout has them --------------------------


def real(name: str) -> Path:
    path = REAL_DMESG / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


@pytest.mark.shared("captures")
def test_real_xid_48_63_94_iso_time():
    kept = kl.read_log_file(str(real("xid-48-63-94.iso-time.log")))
    xids = [parse_xid(line).code for line in kept if parse_xid(line)]
    assert xids == [48, 63] + [94] * 9
    assert sum("nvidia-peermem" in line for line in kept) == len(kept) - 11


@pytest.mark.shared("captures")
def test_real_xid_119_keeps_xids_and_drops_the_rpc_dump_and_stack():
    kept = kl.read_log_file(str(real("xid-119-gsp-timeout.log")))
    assert [parse_xid(line).code for line in kept if parse_xid(line)] == [119] * 5
    assert kept[0].endswith("NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d")
    assert not any("GSP_RM_ALLOC" in line and "Xid" not in line for line in kept)
    assert not any("Call Trace" in line or "clocksource" in line for line in kept)


@pytest.mark.shared("captures")
def test_real_xid_13_43_decode_iso():
    path = real("xid-13-43.decode-iso.log")
    kept = kl.read_log_file(str(path), max_lines=2000)
    codes = [parse_xid(line).code for line in kept]
    assert codes.count(13) == 629 and codes.count(43) == 7
    assert kl.read_log_file(str(path), max_lines=5) == kept[-5:]

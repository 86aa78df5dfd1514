"""Red team (issue 41, R9): kernel records lost between two reads, and an OOM flood under the cap.

A user's OOM-kill loop in its own memory cgroup (about a thousand kills in 27 s) overwrites the
kernel's ring buffer between two checks: an Xid logged before it is gone unread. /dev/kmsg says
so (EPIPE, then the oldest record left, whose sequence number jumps): the reader reports the
loss, and kernel.xid is unknown, never a silent ok. And the newest-N cap counts the OOM
killer's lines apart, so that they never push an Xid out.

The device is faked at the reader's source seam (FakeKmsg): never the host's /dev/kmsg.
"""

from __future__ import annotations

from factories import default_config, findings_of, make_facts

from gpugate.checks.facts import facts_from_dict
from gpugate.checks.sources import kernel_log as kl
from gpugate.store.state import Baseline

XID79 = (
    "NVRM: Xid (PCI:0000:68:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)


class FakeKmsg:
    """/dev/kmsg as the kernel serves it: one record per read(); EPIPE where the record at the
    reader's position was overwritten; EAGAIN when none is left."""

    def __init__(self, items: list[bytes | type[OSError]], starts_at_clear: bool = True) -> None:
        self.items = list(items)
        self.starts_at_clear = starts_at_clear
        self.closed = False

    def read(self) -> bytes:
        if not self.items:
            raise BlockingIOError
        item = self.items.pop(0)
        if isinstance(item, type):
            raise item
        return item

    def close(self) -> None:
        self.closed = True


def rec(seq: int, message: str, prio: int = 3, usec: int | None = None) -> bytes:
    """One raw kmsg record (facility 0, the kernel's own)."""
    return f"{prio},{seq},{usec if usec is not None else seq * 1000},-;{message}\n".encode()


def oom(seq: int, pid: int = 4242) -> bytes:
    return rec(seq, f"Memory cgroup out of memory: Killed process {pid} (python3) total-vm:1kB")


def config(tmp_path, **sources: object):
    cfg = default_config()
    return cfg.replace(sources=cfg.sources.replace(proc_root=str(tmp_path), **sources))


# --- records lost between two reads ------------------------------------------------------------


def test_an_epipe_after_the_saved_position_is_a_loss():
    # The last check stopped at record 10; an OOM flood then overwrote 11..1199 (an Xid among
    # them, never seen): the device answers EPIPE, then the oldest record left, 1200.
    source = FakeKmsg([BrokenPipeError, oom(1200), oom(1201)])
    scan = kl.scan_kmsg(source, since_seq=10)
    assert scan.lost == {"records": 1189, "after_seq": 10, "after_usec": None,
                         "resumed_seq": 1200, "resumed_usec": 1_200_000}  # fmt: skip
    assert scan.last_seq == 1201 and source.closed


def test_a_loss_while_reading_is_counted_from_the_last_record_read():
    source = FakeKmsg([rec(11, "a"), rec(12, "b", usec=5_000_000), BrokenPipeError, oom(500)])
    lost = kl.scan_kmsg(source, since_seq=10).lost
    assert lost is not None
    assert (lost["records"], lost["after_seq"], lost["after_usec"]) == (487, 12, 5_000_000)
    assert lost["resumed_seq"] == 500


def test_no_loss_when_the_records_follow_on():
    source = FakeKmsg([rec(9, "old"), rec(10, "old"), rec(11, XID79), rec(12, "x")])
    assert kl.scan_kmsg(source, since_seq=10).lost is None


def test_a_start_moved_by_dmesg_clear_is_no_loss():
    # SEEK_DATA puts the device's reader where `dmesg --clear` left it: a first record later
    # than the position, read without EPIPE, was acknowledged by an admin, not overwritten.
    assert kl.scan_kmsg(FakeKmsg([rec(50, "x"), rec(51, "y")]), since_seq=10).lost is None


def test_without_a_position_only_a_loss_while_reading_counts():
    # No earlier check this boot: what scrolled out before the first read was never promised.
    assert kl.scan_kmsg(FakeKmsg([BrokenPipeError, rec(900, "x")])).lost is None
    lost = kl.scan_kmsg(FakeKmsg([rec(900, "x"), BrokenPipeError, rec(950, "y")])).lost
    assert lost is not None and lost["records"] == 49


def test_a_position_of_an_earlier_boot_is_no_loss():
    assert kl.scan_kmsg(FakeKmsg([BrokenPipeError, rec(5, "x")]), since_seq=99999).lost is None


def test_a_file_standing_in_for_the_device_shows_a_gap_by_its_numbers(tmp_path):
    # A file cannot say EPIPE, nor has it a `dmesg --clear` start: a jump is a loss.
    path = tmp_path / "kmsg"
    path.write_bytes(rec(1200, "x") + rec(1201, "y"))
    lost = kl.scan_kmsg(str(path), since_seq=10).lost
    assert lost is not None and lost["records"] == 1189


def test_the_loss_reaches_the_snapshot_with_its_times_and_kernel_xid_is_unknown(tmp_path):
    (tmp_path / "uptime").write_text("100.00 50.00\n")  # the fake boot: 100 s ago
    source = FakeKmsg([BrokenPipeError, oom(1200), oom(1201)])
    data = kl.read_kernel_log(config(tmp_path), since_seq=10, kmsg=source)
    lost = data["kernel_log_lost"]
    assert lost["records"] == 1189 and lost["resumed_at"].endswith("Z")
    assert "after_usec" not in lost and "after_at" not in lost  # the record at 10 is gone
    parsed = facts_from_dict(data)
    facts = make_facts().replace(
        kernel_log=parsed.kernel_log, kernel_log_lost=parsed.kernel_log_lost
    )
    (f,) = findings_of("kernel.xid", facts)
    assert f.status == "unknown" and f.value is None, f
    assert f.message.startswith("kernel.xid: kernel records lost between the last check (record "
                                "10) and 20")  # fmt: skip
    assert f.message.endswith(": an Xid may be unseen") and "1189 overwritten" in f.message


def test_the_old_code_s_silent_pass_is_gone():
    """The report's exact case: the Xid is gone, the rest of the log is OOM kills; before, the
    check said ok ("no Xid needing action")."""
    source = FakeKmsg([BrokenPipeError, *[oom(2000 + i, i) for i in range(50)]])
    data = kl.read_kernel_log(default_config(), since_seq=1000, kmsg=source)
    facts = make_facts().replace(kernel_log=tuple(data["kernel_log"]),
                                 kernel_log_lost=facts_from_dict(data).kernel_log_lost)  # fmt: skip
    assert [f.status for f in findings_of("kernel.xid", facts)] == ["unknown"]


def test_a_failing_xid_still_fails_beside_the_loss():
    facts = facts_from_dict({"kernel_log": [f"[ 10.000000] {XID79}"],
                             "kernel_log_lost": {"records": 3, "after_seq": 1, "resumed_seq": 5}})  # fmt: skip
    facts = make_facts().replace(kernel_log=facts.kernel_log, kernel_log_lost=facts.kernel_log_lost)
    assert sorted(f.status for f in findings_of("kernel.xid", facts)) == ["fail", "unknown"]


def test_the_epilog_names_the_prolog_as_the_start_of_a_loss_at_its_position():
    from gpugate.hooks.epilog import lost_since_prolog

    facts = facts_from_dict({"kernel_log": [],
                             "kernel_log_lost": {"records": 3, "after_seq": 7, "resumed_seq": 11}})  # fmt: skip
    baseline = Baseline(job_id="7", kernel_log_seq=7, started_at=1_800_000_000.0)
    loss = lost_since_prolog(facts, baseline).kernel_log_lost
    assert loss is not None and loss.after_at == "the job's prolog (2027-01-15T08:00:00Z)"
    assert lost_since_prolog(facts, baseline.replace(kernel_log_seq=6)) is facts


# --- the cap: an OOM flood never pushes a GPU line out ----------------------------------------


def test_an_xid_older_than_2000_oom_lines_is_still_read():
    source = FakeKmsg([rec(1, XID79), *[oom(2 + i, i) for i in range(3000)]])
    lines, _ = kl.read_kmsg(source, max_lines=2000)
    assert sum(XID79 in line for line in lines) == 1 and len(lines) == 2001
    facts = make_facts(kernel_log=tuple(lines))
    assert "fail" in [f.status for f in findings_of("kernel.xid", facts)]


def test_an_xid_older_than_2000_oom_lines_is_kept_from_a_saved_log(tmp_path):
    text = [f"[   10.000000] {XID79}"]
    for i in range(1000):  # three lines a kill, as mm/oom_kill.c prints them
        text += [
            f"[ {100 + i}.000000] python3 invoked oom-killer: gfp_mask=0x140cca, order=0",
            f"[ {100 + i}.000100] oom-kill:constraint=CONSTRAINT_MEMCG,task=python3,pid={i}",
            f"[ {100 + i}.000200] Memory cgroup out of memory: Killed process {i} (python3)",
        ]
    kept = kl.filter_lines(text, 2000)
    assert kept[0].endswith(XID79) and len(kept) == 2001
    assert kl.newest_lines(text, 500)[0].endswith(XID79)  # the bundle's kernel.log cap


def test_a_process_name_does_not_move_a_line_to_the_other_budget():
    # The process name a line quotes is the user's (15 bytes): the kernel's own text decides.
    assert kl.is_oom("[ 1.0] Memory cgroup out of memory: Killed process 7 (NVRM: Xid ()")
    assert kl.is_oom("[ 1.0] NVRM: Xid ( invoked oom-killer: gfp_mask=0x140cca, order=0")
    assert not kl.is_oom(
        "[ 1.0] NVRM: Xid (PCI:0000:68:00): 48, pid=7, name=Killed process, DBE (0x1)"
    )
    assert not kl.is_oom(f"[ 1.0] {XID79}")


def test_an_xid_79_older_than_3000_application_xids_is_still_read():
    """A user's code raises Xid 13 at will, one line per fault: its own budget, like OOM kills."""
    app = "NVRM: Xid (PCI:0000:3b:00): 13, pid={}, name=python, Graphics SM Warp Exception"
    source = FakeKmsg([rec(1, XID79), *[rec(2 + i, app.format(i)) for i in range(3000)]])
    lines, _ = kl.read_kmsg(source, max_lines=2000)
    assert sum(XID79 in line for line in lines) == 1 and len(lines) == 2001
    assert kl.newest_lines([f"[ 1.0] {XID79}", *(f"[ 2.0] {app.format(i)}" for i in range(900))],
                           500)[0].endswith(XID79)  # fmt: skip


def test_the_budgets_read_the_kernels_own_text():
    assert (
        kl.budget_of("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=7, name=x, MMU Fault") == "app_xid"
    )
    assert kl.budget_of(f"[ 1.0] {XID79}") == "hardware"
    # A process named after an application Xid does not move a hardware Xid to that budget.
    line = "[ 1.0] NVRM: Xid (PCI:0000:68:00): 48, pid=7, name=): 13,, DBE (0x1)"
    assert kl.budget_of(line) == "hardware"


def test_the_application_xids_are_the_catalogs():
    from gpugate.checks.xid import APP_XIDS

    assert kl.APP_XID_CODES == APP_XIDS

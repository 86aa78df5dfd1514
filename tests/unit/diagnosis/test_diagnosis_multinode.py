"""`gpugate diagnose` over several nodes: time stamps, which node failed first, bundles, the CLI.

The fixtures are the project's own lines, in the formats the jobs print (ISO, glog, syslog,
kernel): one node's fault some seconds before the other nodes' collective timeouts.
"""

from __future__ import annotations

import json
import os

import pytest

from gpugate.commands import diagnose as cmd_diagnose
from gpugate.diagnosis import multinode
from gpugate.diagnosis.engine import diagnose
from gpugate.diagnosis.timestamps import ANY_YEAR, BOOT, NOYEAR, WALL, line_stamp
from gpugate.diagnosis.verdict import JOB_FILE, KERNEL_LOG, LOG_FILE, Diagnosis, Evidence

EPOCH_2024_01_02_030405 = 1704164645  # 2024-01-02T03:04:05Z


def timeout(rank: int, stamp: str) -> str:
    """A watchdog timeout line as PyTorch 2.x prints it, rank-prefixed, glog-stamped."""
    return (f"[rank{rank}]:[E{stamp} 4242 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=8, "
            "NumelOut=8, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n")  # fmt: skip


def iso_timeout(rank: int, stamp: str) -> str:
    """The same timeout behind an ISO stamp the job's logger wrote."""
    return f"{stamp} " + timeout(rank, "0102 03:14:00.000000")


XID = "{} NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n"
OOM = "{} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB.\n"


def write(path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("step 10 loss 2.5\n" + text)
    return str(path)


def run_json(argv: list[str], capsys) -> tuple[int, dict]:
    rc = cmd_diagnose.main(["--json", *argv])
    return rc, json.loads(capsys.readouterr().out)


# --- time stamps -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line,kind,seconds",
    [
        ("2024-01-02T03:04:05Z x", WALL, EPOCH_2024_01_02_030405),
        ("2024-01-02T03:04:05.250000Z x", WALL, EPOCH_2024_01_02_030405 + 0.25),
        ("2024-01-02T04:04:05+01:00 x", WALL, EPOCH_2024_01_02_030405),
        ("2024-01-01T22:04:05-05:00 x", WALL, EPOCH_2024_01_02_030405),
        ("2024-01-02 03:04:05,678 INFO x", WALL, EPOCH_2024_01_02_030405 + 0.678),
        ("[2024-01-02 03:04:05,678] [INFO] x", WALL, EPOCH_2024_01_02_030405 + 0.678),
        ("[Tue Jan  2 03:04:05 2024] NVRM: Xid", WALL, EPOCH_2024_01_02_030405),
        ("node3: 2024-01-02T03:04:05Z x", WALL, EPOCH_2024_01_02_030405),
    ],
)
def test_wall_clock_stamps(line, kind, seconds):
    s = line_stamp(line)
    assert s is not None and s.kind == kind
    assert s.seconds == pytest.approx(seconds)


def test_stamps_without_a_year_compare_with_full_dates_by_month_and_time():
    glog = line_stamp("[rank3]:[E0102 03:04:05.500000 1 x.cpp:1] timeout")
    syslog = line_stamp("Jan  2 03:04:05 node7 kernel: [ 812.5] NVRM: Xid 79")
    full = line_stamp("2024-01-02T03:04:05Z x")
    assert glog.kind == NOYEAR and syslog.kind == NOYEAR  # syslog read before its boot stamp
    assert glog.seconds - syslog.seconds == pytest.approx(0.5)
    assert full.without_year() == pytest.approx(syslog.seconds)
    assert glog.iso() is None and full.iso() == "2024-01-02T03:04:05Z"
    assert line_stamp("Feb 29 00:00:00 x").kind == NOYEAR  # ANY_YEAR is a leap year
    assert ANY_YEAR % 4 == 0


def test_boot_stamps_and_lines_without_one():
    s = line_stamp("[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79")
    assert s.kind == BOOT and s.seconds == pytest.approx(1234.56789)
    assert line_stamp("RuntimeError: NCCL error") is None
    assert line_stamp("2024-13-02T03:04:05Z impossible month") is None
    # A date far into the message is the message's, not the line's.
    assert line_stamp("x" * 120 + " 2024-01-02T03:04:05Z") is None


# --- which node failed first -------------------------------------------------------------


def three_nodes(
    tmp_path, b_line: str, a_stamp="0102 03:04:25.000000", c_stamp="0102 03:04:26.000000"
):
    """Nodes A and C time out (glog stamps); node B has its own fault (`b_line`)."""
    return [write(tmp_path / "nodeA" / "rank0.log", timeout(0, a_stamp)),
            write(tmp_path / "nodeB" / "rank8.log", b_line),
            write(tmp_path / "nodeC" / "rank16.log", timeout(16, c_stamp))]  # fmt: skip


def test_xid_on_b_twenty_seconds_before_the_timeouts_names_b(tmp_path, capsys):
    files = three_nodes(tmp_path, XID.format("2024-01-02T03:04:05Z"))
    rc, out = run_json(files, capsys)
    assert rc == 0
    assert out["first_node"] == "nodeB" and out["first_uncertain"] is None
    assert out["category"] == "gpu_xid_hardware" and out["xid"] == 79
    assert out["summary"].startswith("node nodeB failed first")
    nodes = {n["node"]: n for n in out["nodes"]}
    assert set(nodes) == {"nodeA", "nodeB", "nodeC"}
    assert nodes["nodeA"]["category"] == "nccl_timeout"
    for name, path in zip(("nodeA", "nodeB", "nodeC"), files):  # each node's own diagnosis
        assert nodes[name]["failing_rank"] == diagnose([path]).failing_rank
    assert nodes["nodeB"]["first_failure_at"] == "2024-01-02T03:04:05Z"
    assert nodes["nodeA"]["first_failure_at"] is None  # glog has no year
    assert nodes["nodeC"]["first_failure_stamp"].startswith("E0102 03:04:26")
    assert out["suspect_nodes"] == ["nodeB"] and nodes["nodeB"]["suspect"]
    assert len(out["files"]) == 3 and out["bytes_scanned"] == sum(os.path.getsize(f) for f in files)


def test_oom_with_iso_stamp_before_glog_timeouts(tmp_path, capsys):
    files = three_nodes(tmp_path, OOM.format("2024-01-02 03:04:05,100"))
    _, out = run_json(files, capsys)
    assert out["first_node"] == "nodeB" and out["category"] == "cuda_oom"
    assert out["first_uncertain"] is None


def test_the_failing_rank_read_from_the_first_nodes_logs_ran_on_that_node(tmp_path, capsys):
    oom = "2024-01-02 03:04:05,100 [rank9]: " + OOM.format("").lstrip()
    _, out = run_json(three_nodes(tmp_path, oom), capsys)
    assert (out["first_node"], out["failing_rank"], out["failing_node"]) == ("nodeB", 9, "nodeB")


def test_timeout_first_when_it_really_came_first(tmp_path, capsys):
    # No hard-coded favourite: a node whose timeout came 20 s before B's OOM is named first.
    files = three_nodes(tmp_path, OOM.format("2024-01-02T03:04:45Z"), a_stamp="0102 03:04:25.0")
    _, out = run_json(files, capsys)
    assert out["first_node"] == "nodeA" and out["category"] == "nccl_timeout"


def test_hardware_on_a_later_node_is_still_reported_as_suspect(tmp_path, capsys):
    a = write(tmp_path / "nodeA" / "r0.log", OOM.format("2024-01-02T03:04:05Z"))
    b = write(tmp_path / "nodeB" / "r8.log", XID.format("2024-01-02T03:04:30Z"))
    _, out = run_json([a, b], capsys)
    assert out["first_node"] == "nodeA" and out["category"] == "cuda_oom"
    assert out["suspect_nodes"] == ["nodeB"]
    assert "hardware evidence also on nodeB" in out["summary"]


def test_equal_times_are_uncertain_and_lower_the_confidence(tmp_path, capsys):
    files = three_nodes(tmp_path, XID.format("2024-01-02T03:04:25.500000Z"))
    _, single = run_json([files[1]], capsys)
    _, out = run_json(files, capsys)
    assert out["first_uncertain"] and "within 2 s" in out["first_uncertain"]
    assert "nodeA" in out["first_uncertain"] and "nodeB" in out["first_uncertain"]
    assert "uncertain:" in out["summary"]
    # Too close to order: the node with its own hardware fault before the timed-out ones.
    assert out["first_node"] == "nodeB"
    lower = {"high": "medium", "medium": "low", "low": "low"}
    assert out["confidence"] == lower[single.get("confidence") or "high"]


def test_missing_time_stamps_make_the_order_uncertain(tmp_path, capsys):
    a = write(tmp_path / "nodeA" / "r0.log", timeout(0, "0102 03:04:25.0"))
    b = write(tmp_path / "nodeB" / "r8.log", XID.format("").lstrip())
    _, out = run_json([a, b], capsys)
    assert out["first_node"] == "nodeA"
    assert out["first_uncertain"] == "no comparable time stamp on nodeB"
    assert next(n for n in out["nodes"] if n["node"] == "nodeB")["first_failure_at"] is None


def test_boot_stamps_do_not_compare_across_nodes(tmp_path, capsys):
    a = write(tmp_path / "nodeA" / "k.log", XID.format("[  100.000000]"))
    b = write(tmp_path / "nodeB" / "k.log", XID.format("[ 9000.000000]"))
    _, out = run_json([a, b], capsys)
    assert "seconds-since-boot" in out["first_uncertain"]
    c = write(tmp_path / "nodeC" / "r.log", OOM.format("2024-01-02T03:04:05Z"))
    _, out = run_json([a, c], capsys)  # a wall clock beats a boot stamp, which is left out
    assert (
        out["first_node"] == "nodeC"
        and "no comparable time stamp on nodeA" in out["first_uncertain"]
    )


def test_a_node_without_failure_is_listed_not_ordered(tmp_path, capsys):
    a = write(tmp_path / "nodeA" / "r0.log", "all good\n{'train_runtime': 81.2}\n")
    b = write(tmp_path / "nodeB" / "r8.log", OOM.format("2024-01-02T03:04:05Z"))
    _, out = run_json([a, b], capsys)
    assert out["first_node"] == "nodeB" and out["first_uncertain"] is None
    assert [n["category"] for n in out["nodes"]] == ["no_failure", "cuda_oom"]
    _, none = run_json([a, write(tmp_path / "nodeC" / "r.log", "fine\n")], capsys)
    assert none["first_node"] is None and none["category"] == "no_failure"
    assert [n["category"] for n in none["nodes"]] == ["no_failure", "unknown"]
    # Only rank 0's node prints the success line: the job ended well whatever the order.
    _, quiet_first = run_json([write(tmp_path / "nodeD" / "r.log", "fine\n"), a], capsys)
    assert (quiet_first["category"], quiet_first["first_node"]) == ("no_failure", None)


def test_a_stamp_the_cleaned_text_lost_is_read_again_from_the_file(tmp_path):
    path = write(tmp_path / "r.log", "2024-01-02T03:04:05Z \x1b[31mRuntimeError: boom\n")
    ev = Evidence(file=path, line=2, text="RuntimeError: boom", signature="x", category="other")
    s = multinode.first_stamp(Diagnosis(category="other", evidence=(ev,)))
    assert s is not None and s.iso() == "2024-01-02T03:04:05Z"
    os.symlink(path, tmp_path / "link.log")  # never followed
    ev = ev.replace(file=str(tmp_path / "link.log"))
    assert multinode.first_stamp(Diagnosis(category="other", evidence=(ev,))) is None


# --- mapping files to nodes --------------------------------------------------------------


def test_one_directory_is_todays_single_node_diagnosis(tmp_path, capsys):
    a = write(tmp_path / "n" / "r0.log", timeout(0, "0102 03:04:25.0"))
    b = write(tmp_path / "n" / "r1.log", OOM.format("2024-01-02T03:04:05Z"))
    assert multinode.group_inputs([(a, LOG_FILE), (b, LOG_FILE)], []) is None
    _, out = run_json([a, b], capsys)
    assert "nodes" not in out and "first_node" not in out


def test_node_option_maps_files_of_one_directory(tmp_path, capsys):
    a = write(tmp_path / "job-gpu01-r0.log", timeout(0, "0102 03:04:25.0"))
    b = write(tmp_path / "job-gpu02-r8.log", OOM.format("2024-01-02T03:04:05Z"))
    rc, out = run_json(["--node", "gpu01=*gpu01*", "--node", "gpu02=*gpu02*", a, b], capsys)
    assert rc == 0 and out["first_node"] == "gpu02"
    assert sorted(n["node"] for n in out["nodes"]) == ["gpu01", "gpu02"]


@pytest.mark.parametrize("bad", ["gpu01", "=x", "gpu01="])
def test_bad_node_option_is_a_usage_error(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exc:
        cmd_diagnose.main(["--node", bad, write(tmp_path / "a.log", "x\n")])
    assert exc.value.code == 2 and "--node wants NAME=GLOB" in capsys.readouterr().err


def test_stdin_cannot_be_one_of_several_nodes(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cmd_diagnose.main(
            [write(tmp_path / "a" / "x.log", "x\n"), write(tmp_path / "b" / "y.log", "y\n"), "-"]
        )
    assert "stdin" in capsys.readouterr().err


def bundle(root, dirname: str, node: str, kernel: str, tail: str) -> str:
    """An evidence bundle as the epilog writes it (gpugate.store.evidence layout)."""
    d = root / "4711" / dirname
    (d / "logs").mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"job_id": "4711", "node": node, "category": None}))
    (d / "kernel.log").write_text(kernel)
    (d / "logs" / "00-slurm-4711.out.tail").write_text("# tail of /home/u/slurm-4711.out\n" + tail)
    return str(d)


def test_a_bundle_directory_per_node(tmp_path, capsys):
    a = bundle(tmp_path, "gpu01-r0", "gpu01", "", timeout(0, "0102 03:04:25.0"))
    b = bundle(tmp_path, "gpu02-r0", "gpu02", XID.format("Jan  2 03:04:05 gpu02 kernel:"), "")
    groups = {g.node: g for g in multinode.group_inputs([(a, LOG_FILE), (b, LOG_FILE)], [])}
    assert groups["gpu02"].sources == (KERNEL_LOG, JOB_FILE)  # root's kernel lines, the job's tail
    assert groups["gpu01"].sources == (JOB_FILE,)  # an empty kernel.log is left out
    rc, out = run_json([a, b], capsys)
    assert rc == 0 and out["first_node"] == "gpu02" and out["trusted"] is True
    assert next(n for n in out["nodes"] if n["node"] == "gpu02")["bundle"] == b


def test_a_bundle_names_its_node_and_a_bad_one_is_an_error(tmp_path, capsys):
    d = bundle(tmp_path, "renamed-dir", "gpu07", "", OOM.format("2024-01-02T03:04:05Z"))
    assert multinode.group_inputs([(d, LOG_FILE)], [])[0].node == "gpu07"
    os.symlink("/etc/passwd", os.path.join(d, "logs", "01-evil.tail"))  # not followed
    assert len(multinode.group_inputs([(d, LOG_FILE)], [])[0].paths) == 1
    with open(os.path.join(d, "summary.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(SystemExit) as exc:
        cmd_diagnose.main([d])
    assert exc.value.code == 2 and "summary.json" in capsys.readouterr().err


def test_human_report_marks_the_first_node(tmp_path, capsys):
    files = three_nodes(tmp_path, XID.format("2024-01-02T03:04:05Z"))
    assert cmd_diagnose.main(files) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("  ") and ": " in ln and "rank" in ln]
    assert [ln.split(":")[0].strip() for ln in lines[:3]] == ["nodeA", "* nodeB", "nodeC"]
    assert "node nodeB (first to fail):" in out and "[suspect]" in out


def test_unreadable_file_of_one_node_is_reported_and_others_read(tmp_path, capsys):
    a = write(tmp_path / "nodeA" / "r0.log", OOM.format("2024-01-02T03:04:05Z"))
    rc = cmd_diagnose.main(["--json", a, str(tmp_path / "nodeB" / "missing.log")])
    captured = capsys.readouterr()
    assert rc == 2 and "missing.log" in captured.err
    assert json.loads(captured.out)["first_node"] == "nodeA"


def test_only_a_few_unstamped_lines_are_read_again(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(multinode, "_reread", lambda path, line: calls.append(line) or "")
    evidence = tuple(
        Evidence(file="x.log", line=i, text="boom", signature="x", category="other")
        for i in range(1, 9)
    )
    assert multinode.first_stamp(Diagnosis(category="other", evidence=evidence)) is None
    assert calls == list(range(1, multinode.REREAD_LINES + 1))

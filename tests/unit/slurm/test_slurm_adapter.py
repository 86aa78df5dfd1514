"""The Slurm adapter on recorded output: parsers for every version's shape, the drain/resume
ownership rules, reason sanitising, typed errors, both backends, and backend selection.

Slurm is faked at the runner (`FakeRunner`, keyed by argv, serving files recorded from real
clusters in `fixtures/slurm/`) and pyslurm by a fake module (it cannot be built here).
"""

from __future__ import annotations

import calendar
import json
import os
import sys
import time
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm_recorded import FIXTURES, FakeRunner, fake_pyslurm, fixture

from gpugate.slurm import choose as C
from gpugate.slurm import cli as slurm_cli
from gpugate.slurm import control as S
from gpugate.slurm import pyslurm as pyslurm_backend
from gpugate.slurm import reasons as R
from gpugate.slurm import records
from gpugate.slurm.hostlist import HostlistError, hostlist_expand
from gpugate.slurm.parse_json import parse_jobs_json, parse_nodes_json, parse_sinfo_json
from gpugate.slurm.parse_text import (
    parse_kv,
    parse_show_job_text,
    parse_show_jobs_text,
    parse_show_node_text,
)
from gpugate.slurm.records import NodeInfo, split_state


def utc(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


@pytest.fixture(autouse=True)
def _utc_and_clean_env(monkeypatch: pytest.MonkeyPatch):
    """scontrol prints local times; pin TZ so `[user@time]` parses to a known epoch."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    monkeypatch.delenv(C.ENV_BACKEND, raising=False)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    yield
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


# ------------------------------------------------------------------------------ fakes


# ----------------------------------------------------------- every recorded node output

# fmt: off
# file -> (parser, node count, {name: (state, flags, reason, reason_user, reason_time, drained)})
NODE_FILES = {
    "21.08/sinfo.json": (parse_sinfo_json, 4, {
        "cs2.example.company.com": ("MIXED", (), "", "", None, False),
        "cs4.example.company.com": ("ALLOCATED", (), "", "", None, False),
        # DOWN with no reason: out of service, and nobody's reason to protect.
        "cs5.example.company.com": ("DOWN", (), "", "", None, True),
    }),
    "22.05/sinfo.json": (parse_sinfo_json, 1, {"vm": ("MIXED", (), "", "", None, False)}),
    "22.05/sinfo.drained.json": (parse_sinfo_json, 1, {
        "vm": ("IDLE", ("DRAIN",), "test: custom reason", "root", 1795943444, True),
    }),
    "22.05/scontrol-show-node-o.drained.txt": (parse_show_node_text, 1, {
        "vm": ("IDLE", ("DRAIN",), "test: custom reason", "root", utc("2026-11-29T09:10:44"), True),
    }),
    "22.05/scontrol-show-node-o.prolog-scontrol-drain-then-exit1.txt": (parse_show_node_text, 1, {
        "vm": ("IDLE", ("DRAIN",), "test: custom reason", "root", utc("2026-11-29T09:09:38"), True),
    }),
    "22.05/scontrol-show-node.drained.txt": (parse_show_node_text, 1, {  # multi-line form
        "vm": ("IDLE", ("DRAIN",), "test: custom reason", "root", utc("2026-11-29T09:10:44"), True),
    }),
    # *.isolated-comment.*: copies with gpugate's isolation Comment (tests/unit/isolate/test_isolate_views.py).
    "22.05/scontrol-show-node-o.isolated-comment.txt": (parse_show_node_text, 1, {
        "vm": ("IDLE", (), "test: custom reason", "root", utc("2026-11-29T09:10:44"), False),
    }),
    "22.05/scontrol-show-node.isolated-comment.txt": (parse_show_node_text, 1, {
        "vm": ("IDLE", (), "test: custom reason", "root", utc("2026-11-29T09:10:44"), False),
    }),
    "22.05/sinfo.isolated-comment.json": (parse_sinfo_json, 1, {
        "vm": ("MIXED", (), "", "", None, False),
    }),
    "23.02/sinfo.allocated-drain-excerpt.json": (parse_sinfo_json, 10, {
        "cs62": ("ALLOCATED", ("DRAIN",), "IT-4461", "root", 1705613872, True),
        "cs204": ("ALLOCATED", ("DRAIN",), "IT-4461", "root", 1705613872, True),
    }),
    "23.11/slurmrestd-nodes.drain-down.trimmed.json": (parse_nodes_json, 5, {
        "dtn1": ("DOWN", ("NOT_RESPONDING",), "Not responding", "slurm", 1710797454, True),
        "n0160": ("ALLOCATED", (), "", "", None, False),
        "n0162": ("MIXED", (), "", "", None, False),
        "n0164": ("IDLE", ("DRAIN",), "Kill task failed", "root", 1722018902, True),
        "n0999": ("IDLE", ("DRAIN",), "gpu_board", "root", 1722024275, True),
    }),
    "24.05/slurmrestd-node.down.json": (parse_nodes_json, 1, {
        "cn026": ("DOWN", (), "CPU dead", "root", 1747754463, True),
    }),
    "24.05/slurmrestd-node.mixed-drain.json": (parse_nodes_json, 1, {
        "cn1": ("MIXED", ("DRAIN",), "ECC memory error", "root", 1762858462, True),
    }),
    "24.11/sinfo.trimmed-drain-down.json": (parse_sinfo_json, 15, {
        "bryan1": ("MIXED", ("PLANNED",), "", "", None, False),
        "john52": ("IDLE", ("RESERVED",), "", "", None, False),
        "trevor1": ("IDLE", ("RESERVED", "DRAIN"), "SW_build", "root", 1770542258, True),
        "dave30": ("DOWN", ("RESERVED", "DRAIN", "NOT_RESPONDING"), "HW_cpu2", "root",
                   1770795180, True),
    }),
    "24.11/slurmrestd-nodes.drain-down-gpu.json": (parse_nodes_json, 6, {
        "cn1": ("IDLE", (), "", "", None, False),
        "cn3": ("DOWN", (), "CPU dead", "slurm", 1763370725, True),
        "cn4": ("IDLE", ("DRAIN",), "ECC memory error", "slurm", 1763370725, True),
        "ia1": ("IDLE", ("COMPLETING",), "", "", None, False),
    }),
    "24.11-debian13/scontrol-show-node-o.drained.txt": (parse_show_node_text, 1, {
        "vm": ("IDLE", ("DRAIN",), "Prolog error", "root", utc("2026-11-29T09:51:54"), True),
    }),
    "24.11-debian13/scontrol-show-node-o.prolog-scontrol-drain-then-exit1.txt": (
        parse_show_node_text, 1, {
            "vm": ("IDLE", ("DRAIN",), "test: custom reason", "root", utc("2026-11-29T09:52:28"),
                   True),
        }),
    "24.11-debian13/scontrol-show-node.drained.txt": (parse_show_node_text, 1, {
        "vm": ("IDLE", ("DRAIN",), "Prolog error", "root", utc("2026-11-29T09:51:54"), True),
    }),
    "24.11-debian13/scontrol-show-node.drained.json": (parse_nodes_json, 1, {
        "vm": ("IDLE", ("DRAIN",), "Prolog error", "root", 1795945914, True),
    }),
    # 24.11 keeps the reason after a resume: idle, reason set, NOT drained.
    "24.11-debian13/scontrol-show-node.idle-after-resume.json": (parse_nodes_json, 1, {
        "vm": ("IDLE", (), "r F", "root", 1795946246, False),
    }),
    "24.11-debian13/scontrol-show-node-o.isolated-comment.txt": (parse_show_node_text, 1, {
        "vm": ("IDLE", ("DRAIN",), "Prolog error", "root", utc("2026-11-29T09:51:54"), True),
    }),
    "24.11-debian13/scontrol-show-node.isolated-comment.json": (parse_nodes_json, 1, {
        "vm": ("IDLE", (), "r F", "root", 1795946246, False),
    }),
    "24.11-debian13/sinfo.isolated-comment.json": (parse_sinfo_json, 3, {
        "gpu-node-01": ("IDLE", ("DRAIN",), "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC "
                        "120 > 100", "root", 1796275332, True),
        "gpu-node-03": ("IDLE", (), "", "", None, False),
    }),
    "24.11-debian13/sinfo.drained.json": (parse_sinfo_json, 1, {
        "vm": ("IDLE", ("DRAIN",), "Prolog error", "root", 1795945914, True),
    }),
    # Two nodes drained for different reasons, in one `sinfo` record with the first's reason
    # (gpu-node-02's is the record's, not its own: gpugate nodes asks scontrol, test_admin.py).
    "24.11-debian13/sinfo.two-drain-reasons.json": (parse_sinfo_json, 3, {
        "gpu-node-01": ("IDLE", ("DRAIN",), "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC "
                        "120 > 100", "root", 1796275332, True),
        # sinfo says root set no reason; scontrol's text of the same node says nobody.
        "gpu-node-03": ("IDLE", (), "", "", None, False),
    }),
    "24.11-debian13/scontrol-show-node-o.two-drain-reasons.txt": (parse_show_node_text, 3, {
        "gpu-node-01": ("IDLE", ("DRAIN",), "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC "
                        "120 > 100", "root", utc("2026-12-03T05:22:12"), True),
        "gpu-node-02": ("IDLE", ("DRAIN",), "gpugate: kernel.xid: GPU0 Xid 79 (reboot the node)",
                        "root", utc("2026-12-03T05:22:12"), True),
        "gpu-node-03": ("IDLE", (), "", "", None, False),
    }),
    "25.05/slurmrestd-nodes.drain-down-gpu.json": (parse_nodes_json, 6, {
        "cn3": ("IDLE", ("DRAIN",), "ECC memory error", "slurm", 1763370757, True),
        "cn4": ("DOWN", (), "CPU dead", "slurm", 1763370757, True),
        "gpu1": ("IDLE", ("COMPLETING",), "", "", None, False),
    }),
    "25.11/scontrol-show-node.down-not-responding.json": (parse_nodes_json, 1, {
        "compute-0": ("DOWN", ("DYNAMIC_NORM",), "Not responding", "slurm", 1769096589, True),
    }),
    "25.11/slurmrestd-nodes.drain-down-gpu.json": (parse_nodes_json, 8, {
        "cn1": ("IDLE", ("DRAIN",), "ECC memory error", "slurm", 1763321769, True),
        "cn2": ("DOWN", (), "CPU dead", "slurm", 1763321769, True),
        "cn3": ("ALLOCATED", (), "", "", None, False),
        "cn4": ("MIXED", (), "", "", None, False),
    }),
    "25.11/scontrol-show-nodes-o.drain-maint-resv.txt": (parse_show_node_text, 7, {
        # Reason is followed by ReservationName= here (25.11): the value must stop at it.
        "c1": ("MIXED", ("DRAIN", "DYNAMIC_NORM", "MAINTENANCE", "RESERVED"),
               "planned_maintenance", "root", utc("2026-07-22T23:31:17"), True),
        "c2": ("MIXED", ("DYNAMIC_NORM", "MAINTENANCE", "RESERVED", "PLANNED"), "", "", None,
               False),
        "c4": ("IDLE", ("DRAIN", "DYNAMIC_NORM", "MAINTENANCE", "RESERVED"),
               "planned_maintenance", "root", utc("2026-07-22T23:31:17"), True),
        "c6": ("IDLE", ("DYNAMIC_NORM",), "", "", None, False),
    }),
    # 26.05.5 (Debian sid), project CI: n1 drained, n2 with a gpugate-isolate Comment.
    "26.05-debian-sid/scontrol-show-node-o.drained-and-comment.txt": (parse_show_node_text, 2, {
        "n1": ("IDLE", ("DRAIN",), "gpugate: gpu.ecc: GPU3 x=1", "root",
               utc("2026-12-06T02:57:32"), True),
        "n2": ("IDLE", (), "", "", None, False),
    }),
    "26.05-debian-sid/scontrol-show-node.drained-and-comment.json": (parse_nodes_json, 2, {
        "n1": ("IDLE", ("DRAIN",), "gpugate: gpu.ecc: GPU3 x=1", "root",
               utc("2026-12-06T02:57:32"), True),
        "n2": ("IDLE", (), "", "", None, False),
    }),
}

# file -> (parser, job count, {job_id: {field: value}})
JOB_FILES = {
    "22.05/scontrol-show-job.held.txt": (parse_show_jobs_text, 1, {
        4: dict(user="root", uid=0, state="PENDING", reason="launch_failed_requeued_held",
                nodes=(), stdout="/tmp/slurm-ci/out/slurm-4.out", work_dir="/tmp/slurm-ci/out",
                exit_code=0, exit_signal=0, restarts=1, requeue=True, partition="debug",
                excluded_nodes=()),
    }),
    "22.05/squeue.json": (parse_jobs_json, 3, {
        1: dict(state="COMPLETED", nodes=("vm",), batch_host="vm", restarts=1),
        3: dict(state="RUNNING", nodes=("vm",), reason="", uid=0),  # JSON says "None": no reason
    }),
    "22.05/squeue.held-job.json": (parse_jobs_json, 4, {
        4: dict(state="PENDING", reason="launch_failed_requeued_held", nodes=(), restarts=1,
                exit_code=0, exit_signal=0, requeue=True),
    }),
    # What EpilogSlurmctld sees (scontrol show job from inside the hook, 22.05.8, two slurmd):
    # a prolog refused the job on n1 (held, then nohold_on_prolog_fail); jobs that ended.
    "22.05/scontrol-show-job.epilog-slurmctld.prolog-refused-held.txt": (parse_show_jobs_text, 1, {
        1: dict(state="COMPLETING", reason="launch_failed_requeued_held", end_time=None,
                restarts=1, exit_code=0, exit_signal=0, back_in_queue=True, launch_failed=True,
                admin_comment="gpugate: node n1 refused: gpu.ecc: test", batch_host="n1"),
    }),
    "22.05/scontrol-show-job.epilog-slurmctld.prolog-refused-nohold.txt": (parse_show_jobs_text, 1, {
        1: dict(state="COMPLETING", reason="", end_time=None, restarts=1,
                back_in_queue=True, launch_failed=False,
                admin_comment="gpugate: node n1 refused: gpu.ecc: test"),
    }),
    "22.05/scontrol-show-job.epilog-slurmctld.ended-ok.txt": (parse_show_jobs_text, 1, {
        1: dict(state="COMPLETING", exit_code=0, end_time=utc("2026-12-01T06:54:39"),
                back_in_queue=False, launch_failed=False, required_nodes=("n2",),
                admin_comment=""),
    }),
    "22.05/scontrol-show-job.epilog-slurmctld.ended-exit3.txt": (parse_show_jobs_text, 1, {
        2: dict(state="COMPLETING", reason="NonZeroExitCode", exit_code=3,
                end_time=utc("2026-12-01T06:54:39"), back_in_queue=False, launch_failed=False,
                required_nodes=("n2",), excluded_nodes=()),
    }),
    "24.11-debian13/scontrol-show-job.held.txt": (parse_show_jobs_text, 1, {
        1: dict(state="PENDING", reason="launch_failed_requeued_held", exit_code=0,
                exit_signal=54, restarts=1, stderr="/tmp/slurm-ci/out/slurm-1.out",
                back_in_queue=True, launch_failed=True),
    }),
    "24.11-debian13/scontrol-show-job.held.json": (parse_jobs_json, 1, {
        1: dict(state="PENDING", reason="launch_failed_requeued_held", exit_signal=54),
    }),
    "24.11-debian13/squeue.held-job.json": (parse_jobs_json, 1, {
        1: dict(state="PENDING", exit_signal=54, stdout="/tmp/slurm-ci/out/slurm-1.out",
                launch_failed=True),  # 0:54: ESLURMD_PROLOG_FAILED (4022)
    }),
    "24.11/slurmrestd-job.gpu-pending.json": (parse_jobs_json, 1, {
        6376: dict(user="progers", uid=10002, state="PENDING", reason="BeginTime",
                   partition="ia", stdout="/home/progers/slurm-6376.out", nodes=()),
    }),
    "25.11/slurmrestd-jobs.trimmed.json": (parse_jobs_json, 3, {
        5736: dict(state="CANCELLED", exit_code=0, exit_signal=15, nodes=("gpu1",),
                   stdout="/home/rcarson/slurm-5736.out"),  # stdout_expanded, not slurm-%j.out
        5739: dict(state="FAILED", reason="NonZeroExitCode", exit_code=1, exit_signal=0),
        5750: dict(state="PENDING", reason="BeginTime", nodes=(), batch_host=""),
    }),
    # 26.05.5: SubmitLine= (the sbatch command line, with `--comment=... Word=x`) before WorkDir=.
    "26.05-debian-sid/scontrol-show-job-o.held.txt": (parse_show_jobs_text, 1, {
        1: dict(state="PENDING", reason="JobHeldUser", comment="gpugate:ckpt=/tmp/a Word=x  two",
                admin_comment="gpugate: node n1 refused: gpu.ecc x=1",
                work_dir="/home/alice/run1",
                stdout="/home/alice/run1/slurm-1.out", stderr=""),
    }),
    "26.05-debian-sid/scontrol-show-job.held.txt": (parse_show_jobs_text, 1, {
        1: dict(comment="gpugate:ckpt=/tmp/a Word=x  two", user="gpugate-e2e", uid=999),
    }),
    "26.05-debian-sid/scontrol-show-job.held.json": (parse_jobs_json, 1, {
        1: dict(comment="gpugate:ckpt=/tmp/a Word=x  two",
                stdout="/home/alice/run1/slurm-1.out"),
    }),
}
# fmt: on


def test_every_fixture_file_is_parsed_by_a_test() -> None:
    on_disk = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*") if p.is_file()}
    assert on_disk - {"README.md"} == set(NODE_FILES) | set(JOB_FILES)


@pytest.mark.parametrize("rel", sorted(NODE_FILES))
def test_node_outputs_parse_exactly(rel: str) -> None:
    parser, count, expected = NODE_FILES[rel]
    nodes = {n.name: n for n in parser(fixture(rel))}
    assert len(nodes) == count
    for name, (state, flags, reason, user, when, drained) in expected.items():
        n = nodes[name]
        got = (n.state, n.flags, n.reason, n.reason_user, n.reason_time, n.drained)
        assert got == (state, flags, reason, user, when, drained), name
        assert n.gpugate_owned == reason.startswith("gpugate:")  # the recorded drains are not


@pytest.mark.parametrize("rel", sorted(JOB_FILES))
def test_job_outputs_parse_exactly(rel: str) -> None:
    parser, count, expected = JOB_FILES[rel]
    jobs = {j.job_id: j for j in parser(fixture(rel))}
    assert len(jobs) == count
    for job_id, fields in expected.items():
        assert {k: getattr(jobs[job_id], k) for k in fields} == fields, job_id


def test_text_and_json_of_the_same_job_agree() -> None:
    text = parse_show_job_text(fixture("24.11-debian13/scontrol-show-job.held.txt"))
    for rel in (
        "24.11-debian13/scontrol-show-job.held.json",
        "24.11-debian13/squeue.held-job.json",
    ):
        assert parse_jobs_json(fixture(rel)) == [text]


def test_26_05_text_one_line_multi_line_and_json_of_the_same_job_agree() -> None:
    one_line = parse_show_jobs_text(fixture("26.05-debian-sid/scontrol-show-job-o.held.txt"))
    assert one_line == parse_show_jobs_text(fixture("26.05-debian-sid/scontrol-show-job.held.txt"))
    assert one_line == parse_jobs_json(fixture("26.05-debian-sid/scontrol-show-job.held.json"))
    nodes = parse_show_node_text(
        fixture("26.05-debian-sid/scontrol-show-node-o.drained-and-comment.txt")
    )
    assert nodes == parse_nodes_json(
        fixture("26.05-debian-sid/scontrol-show-node.drained-and-comment.json")
    )
    assert nodes[1].comment == "gpugate-isolate: GPU2 a=b"


def test_26_05_submit_line_keys_typed_by_the_user_are_not_fields() -> None:
    # The user's command line is printed before WorkDir=, AdminComment=, Comment= and StdOut=:
    # a `Key=` in it (a wrapped command's argument, a comment's words) must not become one.
    line = fixture("26.05-debian-sid/scontrol-show-job-o.held.txt").strip()
    typed = "--wrap=train.py Partition=big Comment=not-this AdminComment=nor StdOut=/etc/x"
    forged = line.replace("--wrap=true", typed)
    assert typed in forged
    assert parse_show_jobs_text(forged) == parse_show_jobs_text(line)


def test_text_and_json_of_the_same_node_agree() -> None:
    text = parse_show_node_text(fixture("24.11-debian13/scontrol-show-node-o.drained.txt"))
    assert text == parse_nodes_json(fixture("24.11-debian13/scontrol-show-node.drained.json"))
    assert text == parse_sinfo_json(fixture("24.11-debian13/sinfo.drained.json"))


# ------------------------------------------------------------------- key=value edge cases

NODE_LINE_2511 = fixture("25.11/scontrol-show-nodes-o.drain-maint-resv.txt").splitlines()[0]


def with_reason(line: str, reason: str, suffix: str = " [root@2026-07-22T23:31:17]") -> str:
    head, _, tail = line.partition(" Reason=")
    return f"{head} Reason={reason}{suffix} ReservationName={tail.rsplit('ReservationName=', 1)[1]}"


@pytest.mark.parametrize(
    "reason",
    [
        "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100",
        "admin typed State=IDLE Weight=1 here",  # known keys inside an admin's reason
        "brackets [x] and [a@b] inside",
        "Foo=bar trailing",
    ],
)
def test_reason_with_key_lookalikes_stops_at_the_user_time_anchor(reason: str) -> None:
    kv = parse_kv(with_reason(NODE_LINE_2511, reason))
    assert kv["ReservationName"] == "maintenance-2026"
    (node,) = parse_show_node_text(with_reason(NODE_LINE_2511, reason))
    assert (node.reason, node.reason_user, node.state) == (reason, "root", "MIXED")


def test_free_text_job_fields_keep_spaces_and_unknown_key_lookalikes() -> None:
    line = " ".join(fixture("22.05/scontrol-show-job.held.txt").split("\n"))
    line = line.replace("JobName=heldjob", "JobName=my job lr=3e-4 Foo=1")
    line = line.replace(
        "WorkDir=/tmp/slurm-ci/out",
        "WorkDir=/tmp/slurm ci/out AdminComment=gpugate: node vm refused  Comment=see Run=7 log ",
    )
    line = line.replace("StdOut=/tmp/slurm-ci/out/slurm-4.out", "StdOut=/tmp/a b/out 4.log")
    kv = parse_kv(line)
    assert kv["JobName"] == "my job lr=3e-4 Foo=1"
    job = parse_show_job_text(line)
    assert job.work_dir == "/tmp/slurm ci/out"
    assert job.admin_comment == "gpugate: node vm refused"
    assert job.comment == "see Run=7 log"
    assert job.stdout == "/tmp/a b/out 4.log"
    assert job.stderr == "/tmp/slurm-ci/out/slurm-4.out"


def test_unknown_new_keys_after_plain_values_are_their_own_fields() -> None:
    kv = parse_kv(
        "NodeName=n1 State=IDLE+DRAIN NewKey2027=x Weight=1 Reason=r [root@2026-01-01T00:00:00]"
    )
    assert (kv["State"], kv["NewKey2027"], kv["Weight"]) == ("IDLE+DRAIN", "x", "1")


def test_reason_without_time_suffix_and_multiline_reason() -> None:
    (plain,) = parse_show_node_text("NodeName=n1 State=DOWN* Reason=Not responding")
    assert (plain.state, plain.flags, plain.reason, plain.reason_time) == (
        "DOWN",
        ("NOT_RESPONDING",),
        "Not responding",
        None,
    )
    # scontrol prints a reason's second line on its own indented line (node_info.c).
    text = (
        "NodeName=n2 Arch=x86_64\n   State=IDLE+DRAIN\n"
        "   Reason=first [root@2026-01-01T00:00:00]\n          second\n"
    )
    (multi,) = parse_show_node_text(text)
    assert (multi.reason, multi.reason_user) == ("first second", "root")


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("IDLE+DRAIN", ("IDLE", ("DRAIN",))),
        (
            ["DOWN", "RESERVED", "DRAIN", "NOT_RESPONDING"],
            ("DOWN", ("RESERVED", "DRAIN", "NOT_RESPONDING")),
        ),
        ("idle*", ("IDLE", ("NOT_RESPONDING",))),
        ("drained", ("DRAINED", ())),
        ("", ("UNKNOWN", ())),
    ],
)
def test_split_state(state: object, expected: tuple) -> None:
    assert split_state(state) == expected


def test_drained_comes_from_flags_never_from_the_reason() -> None:
    assert not NodeInfo(name="n", state="IDLE", reason="r F").drained
    for state, flags in [("IDLE", ("DRAIN",)), ("DOWN", ()), ("IDLE", ("FAIL",)), ("DRAINING", ())]:
        assert NodeInfo(name="n", state=state, flags=flags).drained


# -------------------------------------------------------------------------------- hostlists


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            "gpu-node-[01-03,07],other",
            ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-07", "other"],
        ),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("vm", ["vm"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_hostlist_expand(expr: str, names: list[str]) -> None:
    assert hostlist_expand(expr) == names


@pytest.mark.parametrize("expr", ["n[1-[2]]", "n[3-1]", "n[a-b]", "n[1-2", "n]1["])
def test_hostlist_refuses_what_it_cannot_read_and_the_backend_asks_scontrol(expr: str) -> None:
    with pytest.raises(HostlistError):
        hostlist_expand(expr)
    runner = FakeRunner().ok(("scontrol", "show", "hostnames", expr), "x1\nx2\n")
    assert slurm_cli.CliBackend(runner=runner).expand_hostlist(expr) == ["x1", "x2"]


def test_pure_hostlists_never_call_scontrol() -> None:
    assert slurm_cli.CliBackend(runner=FakeRunner()).expand_hostlist("g[1-2]") == ["g1", "g2"]
    assert slurm_cli.expand_hostlist("gpu-node-[16-17]") == ["gpu-node-16", "gpu-node-17"]
    runner = FakeRunner()
    with pytest.raises(HostlistError):  # "-..." would be an scontrol option
        slurm_cli.CliBackend(runner=runner).expand_hostlist("--help[")
    assert runner.argvs == []


# ------------------------------------------------------------------------- reason strings


def test_drain_reason_format() -> None:
    assert R.drain_reason("gpu.ecc", "GPU3 aggregate uncorrected ECC 120 > 100") == (
        "gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100"
    )
    assert R.drain_reason("gpu.count", "") == "gpugate: gpu.count"
    assert R.drain_reason("bad id; rm", "x") == "gpugate: bad_id__rm: x"


def test_drain_reason_sanitises_hostile_detail() -> None:
    hostile = 'line one\nline two\r\n\x1b[31mred\x00\x07 "quoted" `tick` k=v \u202eevil\u200b'
    reason = R.drain_reason("kernel.xid", hostile)
    assert reason == "gpugate: kernel.xid: line one line two [31mred 'quoted' 'tick' k=v ?evil?"
    assert reason.isascii() and reason.isprintable()


def test_drain_reason_caps_a_10kb_detail() -> None:
    reason = R.drain_reason("kernel.xid", "Xid 79 " * 1500)
    assert len(reason) <= R.REASON_MAX and reason.endswith("...")
    assert reason.startswith("gpugate: kernel.xid: Xid 79 Xid 79")
    assert R.clean_text(reason, R.REASON_MAX) == reason  # idempotent: drain() may re-clean


def test_admin_comment_gets_the_prefix_once() -> None:
    assert R.admin_comment("node gpu-node-17 refused: gpu.ecc") == (
        "gpugate: node gpu-node-17 refused: gpu.ecc"
    )
    assert R.admin_comment("gpugate: x\ny") == "gpugate: x y"
    assert len(R.admin_comment("z" * 10_000)) == R.COMMENT_MAX


def test_gpugate_syntax_keeps_its_equals_sign() -> None:
    # The sanitiser turned `gpugate:ckpt=DIR` into `gpugate:ckpt:DIR`, which no parser reads.
    from gpugate.slurm.hookenv import comment_tokens

    text = "no requeue: the job did not opt in (gpugate:ckpt= or gpugate:requeue)"
    assert "(gpugate:ckpt= or gpugate:requeue)" in R.admin_comment(text)
    tokens = "gpugate:ckpt=/data/run=1/ckpt gpugate:restarts=2 gpugate:requeue"
    assert (
        comment_tokens(R.admin_comment(tokens))
        == comment_tokens(tokens)
        == {
            "ckpt": "/data/run=1/ckpt",
            "restarts": "2",
            "requeue": "",
        }
    )


def test_key_lookalikes_lose_their_equals_sign() -> None:
    # ` StdOut=/etc/shadow` in a log line must not read back as the job's StdOut.
    comment = R.admin_comment("x StdOut=/etc/shadow Reason=a=b ok=1")
    assert comment == "gpugate: x StdOut:/etc/shadow Reason:a:b ok=1"
    line = JOB_4_TEXT_ONE_LINE.replace("Command=(null)", f"AdminComment={comment} Command=(null)")
    job = parse_show_job_text(line)
    assert (job.admin_comment, job.stdout) == (comment, "/tmp/slurm-ci/out/slurm-4.out")


@pytest.mark.parametrize(
    ("existing", "piece", "merged"),
    [
        ("", "requeue: x", "gpugate: requeue: x"),
        ("gpugate: node n1 refused: gpu.ecc: test", "requeue: x",
         "gpugate: node n1 refused: gpu.ecc: test | gpugate: requeue: x"),
        ("ticket 4711 (admin)", "gpugate: requeue: x", "ticket 4711 (admin) | gpugate: requeue: x"),
        ("a | gpugate: requeue: x", "requeue: x", None),  # already there
        ("ÿ odd=1 admin text", "y", "ÿ odd=1 admin text | gpugate: y"),  # others' text as is
    ],
)  # fmt: skip
def test_admin_comment_is_appended_not_replaced(existing: str, piece: str, merged) -> None:
    assert R.merge_admin_comment(existing, piece) == merged


def test_admin_comment_stays_within_slurms_bound() -> None:
    old = [f"gpugate: requeue: restart {i} " + "x" * 300 for i in range(3)]
    merged = R.merge_admin_comment(" | ".join(["admin note", *old]), "requeue: restart 4")
    # gpugate's oldest pieces go first; the admin's note and the newest pieces stay.
    assert merged.split(" | ") == ["admin note", old[1], old[2], "gpugate: requeue: restart 4"]
    assert len(merged) <= R.ADMIN_COMMENT_MAX
    assert R.merge_admin_comment("a" * 1020, "requeue: x") is None  # no room: write nothing
    cut = R.merge_admin_comment("a" * 900, "requeue: " + "y" * 300)
    assert len(cut) == R.ADMIN_COMMENT_MAX and cut.startswith("a" * 900) and cut.endswith("...")


REFUSED_HELD = fixture("22.05/scontrol-show-job.epilog-slurmctld.prolog-refused-held.txt")
ENDED_EXIT3 = fixture("22.05/scontrol-show-job.epilog-slurmctld.ended-exit3.txt")


def test_add_admin_comment_keeps_the_prologs_refusal() -> None:
    kept = "gpugate: node n1 refused: gpu.ecc: test | gpugate: no requeue: x"
    runner = FakeRunner().ok(("scontrol", "-o", "show", "job", "1"), REFUSED_HELD)
    runner.ok(("scontrol", "update", "JobId=1", f"AdminComment={kept}"))
    assert slurm_cli.CliBackend(runner=runner).add_admin_comment(1, "no requeue: x") == kept
    assert runner.writes() == [("comment", "1", kept)]


def test_exclude_nodes_adds_to_the_jobs_own_list() -> None:
    text = ENDED_EXIT3.replace(
        "ReqNodeList=n2 ExcNodeList=(null)", "ReqNodeList=(null) ExcNodeList=n[3-4]"
    )
    runner = FakeRunner().ok(("scontrol", "-o", "show", "job", "2"), text)
    runner.ok(("scontrol", "update", "JobId=2", "ExcNodeList=n3,n4,n1"))
    assert slurm_cli.CliBackend(runner=runner).exclude_nodes(2, ["n1", "n3"]) == (
        ("n3", "n4", "n1"),
        (),
    )
    assert runner.writes() == [("exclude", "2", ("n3", "n4", "n1"))]  # fmt: skip


def test_exclude_nodes_keeps_a_pin_rather_than_strand_the_job() -> None:
    # Slurm takes ReqNodeList=n2 ExcNodeList=n2 and never runs the job (seen on 22.05.8).
    runner = FakeRunner().ok(("scontrol", "-o", "show", "job", "2"), ENDED_EXIT3)
    runner.ok(("scontrol", "update", "JobId=2", "ExcNodeList=n1"))
    assert slurm_cli.CliBackend(runner=runner).exclude_nodes(2, ["n2", "n1"]) == (("n1",), ("n2",))
    assert runner.writes() == [("exclude", "2", ("n1",))]
    runner = FakeRunner().ok(("scontrol", "-o", "show", "job", "2"), ENDED_EXIT3)
    assert slurm_cli.CliBackend(runner=runner).exclude_nodes(2, ["n2"]) == ((), ("n2",))
    assert runner.writes() == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_detail_reads_back_unchanged_from_scontrol_text(detail: str) -> None:
    reason = R.drain_reason("gpu.ecc", detail)
    (node,) = parse_show_node_text(with_reason(NODE_LINE_2511, reason))
    assert node.reason == reason and node.gpugate_owned
    assert parse_kv(with_reason(NODE_LINE_2511, reason))["ReservationName"] == "maintenance-2026"


# ------------------------------------------------------------- drain and resume (CLI argv)

SHOW_VM = ("scontrol", "-o", "show", "node", "vm")
ADMIN_LINE = fixture("22.05/scontrol-show-node-o.drained.txt")  # "test: custom reason", root
OURS_LINE = ADMIN_LINE.replace("test: custom reason", "gpugate: gpu.ecc: GPU3 ECC 120 > 100")
IDLE_LINE = ADMIN_LINE.replace("State=IDLE+DRAIN", "State=IDLE").replace(
    " Reason=test: custom reason [root@2026-11-29T09:10:44]", ""
)
# 24.11: the reason survives a resume on an idle node; that node is not drained.
STALE_LINE = ADMIN_LINE.replace("State=IDLE+DRAIN", "State=IDLE")
DOWN_NO_REASON = IDLE_LINE.replace("State=IDLE", "State=DOWN+NOT_RESPONDING")
REASON = R.drain_reason("gpu.ecc", "GPU3 aggregate uncorrected ECC 120 > 100")


def cli_with(line: str, *extra: tuple) -> tuple[slurm_cli.CliBackend, FakeRunner]:
    runner = FakeRunner().ok(SHOW_VM, line)
    for argv in extra:
        runner.ok(argv)
    return slurm_cli.CliBackend(runner=runner), runner


def drain_argv(reason: str = REASON) -> tuple:
    return ("scontrol", "update", "NodeName=vm", "State=DRAIN", f"Reason={reason}")


RESUME_ARGV = ("scontrol", "update", "NodeName=vm", "State=RESUME")


def test_drain_refuses_an_admins_drain_and_writes_nothing() -> None:
    cli, runner = cli_with(ADMIN_LINE)
    with pytest.raises(S.NotOurDrain) as err:
        cli.drain("vm", REASON)
    assert err.value.change.action == S.REFUSED
    assert err.value.change.before.reason == "test: custom reason"
    assert "test: custom reason" in str(err.value) and "root" in str(err.value)
    assert runner.argvs == [SHOW_VM]


@pytest.mark.parametrize(
    "line",
    [OURS_LINE, IDLE_LINE, STALE_LINE, DOWN_NO_REASON],
    ids=["gpugate-drain", "undrained", "stale-24.11-reason", "down-no-reason"],
)
def test_drain_proceeds_over_our_drain_or_an_undrained_node(line: str) -> None:
    cli, runner = cli_with(line, drain_argv())
    change = cli.drain("vm", REASON)
    assert (change.action, change.reason) == (S.DRAINED, REASON)
    assert runner.argvs == [SHOW_VM, drain_argv()]


def test_drain_with_force_takes_over_an_admins_drain() -> None:
    cli, runner = cli_with(ADMIN_LINE, drain_argv())
    assert cli.drain("vm", REASON, force=True).action == S.DRAINED
    assert runner.argvs[-1] == drain_argv()


def test_drain_cleans_the_reason_and_requires_the_prefix() -> None:
    dirty = REASON + "\nsecond line"
    cli, runner = cli_with(IDLE_LINE, drain_argv(REASON + " second line"))
    cli.drain("vm", dirty)
    assert runner.argvs[-1] == drain_argv(REASON + " second line")
    with pytest.raises(ValueError, match="drain_reason"):
        cli.drain("vm", "maintenance")


# ResumeAfter (docs/slurm-facts.md, "ResumeAfter"): `scontrol --version` read once per adapter.
VERSION = ("scontrol", "--version")
DRILL_REASON = R.drain_reason("kernel.xid", "Xid 79").replace("gpugate: ", "gpugate: DRILL d1: ")
DRILL_LINE = ADMIN_LINE.replace("test: custom reason", DRILL_REASON)


@pytest.mark.parametrize("version", ["slurm-wlm 23.02.7", "slurm-wlm 24.11.5", "slurm 26.05.5"])
def test_a_timed_drain_carries_resume_after_where_slurm_has_it(monkeypatch, version: str) -> None:
    monkeypatch.setattr(S.time, "time", lambda: 1000.0)
    timed = (*drain_argv(), "ResumeAfter=90")
    cli, runner = cli_with(IDLE_LINE, timed)
    runner.ok(VERSION, version)
    assert cli.drain("vm", REASON, resume_at=1089.2).action == S.DRAINED
    assert runner.argvs == [SHOW_VM, VERSION, timed]
    cli.drain("vm", REASON, resume_at=1090.0)
    assert runner.argvs.count(VERSION) == 1  # read once per adapter
    runner.ok((*drain_argv(), "ResumeAfter=1"))
    assert cli.drain("vm", REASON, resume_at=900.0).action == S.DRAINED  # past: at once (1 s)
    assert runner.argvs[-1] == (*drain_argv(), "ResumeAfter=1")


def test_22_05_and_an_unknown_version_keep_the_plain_drain() -> None:
    for said in ("slurm-wlm 22.05.8", None):
        cli, runner = cli_with(IDLE_LINE, drain_argv())
        if said is None:
            runner.fail(VERSION, status="missing", rc=None)
        else:
            runner.ok(VERSION, said)
        assert cli.drain("vm", REASON, resume_at=time.time() + 60).action == S.DRAINED
        assert runner.argvs == [SHOW_VM, VERSION, drain_argv()]


def test_an_untimed_drain_over_a_drills_drain_cancels_slurms_timer() -> None:
    # slurmctld keeps a drained node's ResumeAfter when it is drained again with another
    # reason (_equivalent_node_state): gpugate's real drain must not be lifted blindly.
    cancel = (*drain_argv(), "ResumeAfter=-1")
    cli, runner = cli_with(DRILL_LINE, cancel)
    runner.ok(VERSION, "slurm-wlm 24.11.5")
    assert cli.drain("vm", REASON).action == S.DRAINED
    assert runner.argvs == [SHOW_VM, VERSION, cancel]
    # Over any other drain of gpugate's, or on 22.05: the plain drain, no version read needed.
    cli, runner = cli_with(OURS_LINE, drain_argv())
    cli.drain("vm", REASON)
    assert runner.argvs == [SHOW_VM, drain_argv()]
    cli, runner = cli_with(DRILL_LINE, drain_argv())
    runner.ok(VERSION, "slurm-wlm 22.05.8")
    cli.drain("vm", REASON)
    assert runner.argvs[-1] == drain_argv()


def test_a_timed_drain_never_touches_an_admins_drain() -> None:
    cli, runner = cli_with(ADMIN_LINE)
    with pytest.raises(S.NotOurDrain):
        cli.drain("vm", REASON, resume_at=time.time() + 60)
    assert runner.argvs == [SHOW_VM]


@pytest.mark.parametrize("name", ["-vm", "vm --help", "a=b", ""])
def test_node_names_that_would_be_options_never_reach_argv(name: str) -> None:
    cli, runner = cli_with(IDLE_LINE)
    with pytest.raises(ValueError):
        cli.drain(name, REASON)
    assert runner.argvs == []


def test_resume_only_our_drain_unless_forced() -> None:
    cli, runner = cli_with(OURS_LINE, RESUME_ARGV)
    assert cli.resume("vm").action == S.RESUMED
    assert runner.argvs == [SHOW_VM, RESUME_ARGV]

    cli, runner = cli_with(ADMIN_LINE, RESUME_ARGV)
    with pytest.raises(S.NotOurDrain, match="force"):
        cli.resume("vm")
    assert runner.argvs == [SHOW_VM]
    assert cli.resume("vm", force=True).action == S.RESUMED
    assert runner.argvs[-1] == RESUME_ARGV


@pytest.mark.parametrize("line", [IDLE_LINE, STALE_LINE])
def test_resume_of_an_undrained_node_changes_nothing(line: str) -> None:
    # scontrol would fail with rc 1 ("Invalid node state specified"): do not even try.
    cli, runner = cli_with(line)
    assert cli.resume("vm").action == S.UNCHANGED
    assert runner.argvs == [SHOW_VM]


# ------------------------------------------------------------------ errors, env, timeouts


def test_timeout_is_a_typed_error_naming_the_command() -> None:
    runner = FakeRunner().fail(SHOW_VM, status="timeout", rc=None)
    with pytest.raises(S.SlurmTimeout) as err:
        slurm_cli.CliBackend(runner=runner, timeout=3).node("vm")
    assert "scontrol -o show node vm" in str(err.value) and "timed out" in str(err.value)
    assert isinstance(err.value, S.SlurmError) and err.value.result.status == "timeout"
    assert runner.calls[0][1] == 3


def test_missing_scontrol_and_failures_are_typed() -> None:
    runner = FakeRunner().fail(SHOW_VM, status="missing", rc=None)
    with pytest.raises(S.SlurmMissing):
        slurm_cli.CliBackend(runner=runner).node("vm")
    runner = (
        FakeRunner()
        .ok(SHOW_VM, IDLE_LINE)
        .fail(drain_argv(), stderr="slurm_update error: Access/permission denied")
    )
    with pytest.raises(S.SlurmCommandError, match="permission denied"):
        slurm_cli.CliBackend(runner=runner).drain("vm", REASON)


def test_unknown_node_and_job() -> None:
    runner = FakeRunner().fail(
        ("scontrol", "-o", "show", "node", "nosuch"), stdout="Node nosuch not found\n"
    )
    runner.fail(
        ("scontrol", "-o", "show", "job", "99"),
        stderr="slurm_load_jobs error: Invalid job id specified\n",
    )
    cli = slurm_cli.CliBackend(runner=runner)
    with pytest.raises(S.NodeNotFound):
        cli.node("nosuch")
    with pytest.raises(S.JobNotFound):
        cli.job(99)


def test_every_call_gets_the_timeout_iso_times_and_slurm_conf(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm-test/slurm.conf")
    cli, runner = cli_with(IDLE_LINE)
    cli.node("vm")
    (_, timeout, env) = runner.calls[0]
    assert timeout == S.DEFAULT_TIMEOUT == 10.0
    assert env == {"SLURM_TIME_FORMAT": "standard", "SLURM_CONF": "/etc/slurm-test/slurm.conf"}
    explicit = slurm_cli.CliBackend(runner=runner, slurm_conf="/other/slurm.conf")
    assert explicit.env()["SLURM_CONF"] == "/other/slurm.conf"


# --------------------------------------------------------------------------- jobs (CLI)

SHOW_JOB_4 = ("scontrol", "-o", "show", "job", "4")
JOB_4_TEXT = fixture("22.05/scontrol-show-job.held.txt")
JOB_4_TEXT_ONE_LINE = " ".join(JOB_4_TEXT.split())


def test_job_reads_scontrol_text() -> None:
    cli = slurm_cli.CliBackend(runner=FakeRunner().ok(SHOW_JOB_4, JOB_4_TEXT))
    job = cli.job(4)
    assert (job.job_id, job.state, job.restarts, job.stdout) == (
        4,
        "PENDING",
        1,
        "/tmp/slurm-ci/out/slurm-4.out",
    )


def test_job_writes_issue_exactly_these_commands() -> None:
    runner = FakeRunner()
    expected = [
        ("scontrol", "requeuehold", "4"),
        ("scontrol", "requeue", "4"),
        ("scontrol", "update", "JobId=4", "ExcNodeList=gpu-node-17,gpu-node-18"),
        ("scontrol", "update", "JobId=4", "ExcNodeList="),
        SHOW_JOB_4,  # release() first waits out a requeue under way: JOB_4_TEXT is PENDING
        ("scontrol", "release", "4"),
        ("scontrol", "update", "JobId=4", "StartTime=now"),
        (
            "scontrol",
            "update",
            "JobId=4",
            "AdminComment=gpugate: node gpu-node-17 refused: gpu.ecc: x=1 y",
        ),
    ]
    for argv in expected:
        runner.ok(argv, JOB_4_TEXT if argv == SHOW_JOB_4 else "")
    cli = slurm_cli.CliBackend(runner=runner)
    cli.requeue(4, hold=True)
    cli.requeue("4")
    cli.set_excluded(4, ["gpu-node-17", "gpu-node-18"])
    cli.set_excluded(4, [])
    cli.release(4)
    cli.set_admin_comment(4, "node gpu-node-17 refused: gpu.ecc: x=1\ny")
    assert runner.argvs == expected


class StatesThenPending:
    """A job that reads COMPLETING (a requeue under way) `busy` times, then PENDING."""

    def __init__(self, busy: int, state: str = "COMPLETING") -> None:
        self.busy, self.state, self.reads, self.released = busy, state, 0, []
        self.slept: list[float] = []

    def job(self, job_id: object) -> records.JobInfo:
        self.reads += 1
        state = self.state if self.reads <= self.busy else "PENDING"
        return records.JobInfo(job_id=int(str(job_id)), state=state)


@pytest.mark.parametrize("state", ["COMPLETING", "REQUEUED"])
def test_release_waits_out_a_requeue_under_way_then_the_second(
    monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    seen = StatesThenPending(busy=3, state=state)
    monkeypatch.setattr(S.time, "sleep", seen.slept.append)
    monkeypatch.setattr(S.time, "time", lambda: 1000.25)
    runner = (
        FakeRunner()
        .ok(("scontrol", "release", "4"))
        .ok(("scontrol", "update", "JobId=4", "StartTime=now"))
    )
    cli = slurm_cli.CliBackend(runner=runner)
    monkeypatch.setattr(cli, "job", seen.job)
    cli.release(4)
    assert seen.reads == 4  # three under way, then pending
    assert seen.slept == [S.REQUEUE_POLL_S] * 3 + [0.75]  # then into the next whole second
    assert runner.argvs == [("scontrol", "release", "4"),
                            ("scontrol", "update", "JobId=4", "StartTime=now")]  # fmt: skip


def test_wait_requeued_gives_up_after_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = StatesThenPending(busy=10**6)
    clock = iter(range(0, 10**6, 10))
    monkeypatch.setattr(S.time, "sleep", seen.slept.append)
    monkeypatch.setattr(S.time, "monotonic", lambda: next(clock))
    cli = slurm_cli.CliBackend(runner=FakeRunner())
    monkeypatch.setattr(cli, "job", seen.job)
    assert cli.wait_requeued(4, wait_s=30) is False
    assert seen.reads == 4  # t=10, 20, 30 within; 40 past the 30 s


@pytest.mark.parametrize("job_id", ["-1", "4 5", "4;reboot", ""])
def test_bad_job_ids_never_reach_argv(job_id: str) -> None:
    runner = FakeRunner()
    with pytest.raises(ValueError):
        slurm_cli.CliBackend(runner=runner).requeue(job_id)
    assert runner.argvs == []


def test_nodes_listing_from_scontrol_text_and_from_sinfo_json() -> None:
    text = fixture("25.11/scontrol-show-nodes-o.drain-maint-resv.txt")
    runner = FakeRunner().ok(("scontrol", "-o", "show", "node"), text)
    nodes = slurm_cli.CliBackend(runner=runner).nodes()
    assert sorted(nodes) == [f"c{i}" for i in range(1, 8)]
    assert [n for n in nodes.values() if n.drained] == [nodes["c1"], nodes["c4"]]
    assert list(slurm_cli.CliBackend(runner=runner).nodes(["c4", "nosuch"])) == ["c4"]

    runner = FakeRunner().ok(("sinfo", "--json"), fixture("24.11/sinfo.trimmed-drain-down.json"))
    listed = slurm_cli.CliBackend(runner=runner, listing="sinfo-json").nodes(["dave30", "trevor1"])
    assert {n: v.reason for n, v in listed.items()} == {"trevor1": "SW_build", "dave30": "HW_cpu2"}


# ------------------------------------------------- conformance: both backends, same answers

NODE_LINES = {"admin": ADMIN_LINE, "ours": OURS_LINE, "idle": IDLE_LINE, "stale": STALE_LINE}
JOB_1_TEXT = fixture("24.11-debian13/scontrol-show-job.held.txt")


def make_backend(kind: str, line: str) -> tuple[S.SlurmControl, callable]:
    """A backend over node `vm` as `line` describes it and job 1 (24.11 held), plus writes()."""
    runner = FakeRunner().ok(SHOW_VM, line).ok(("scontrol", "-o", "show", "job", "1"), JOB_1_TEXT)
    for argv in [
        drain_argv(),
        RESUME_ARGV,
        ("scontrol", "update", "JobId=1", "ExcNodeList="),
        ("scontrol", "update", "JobId=1", "ExcNodeList=vm"),
        ("scontrol", "requeuehold", "1"),
        ("scontrol", "release", "1"),
        ("scontrol", "update", "JobId=1", "StartTime=now"),
        ("scontrol", "update", "JobId=1", "AdminComment=gpugate: requeue: x"),
    ]:
        runner.ok(argv)
    cli = slurm_cli.CliBackend(runner=runner)
    if kind == "cli":
        return cli, runner.writes
    (node,) = parse_show_node_text(line)
    module = fake_pyslurm({"vm": node}, {1: parse_show_job_text(JOB_1_TEXT)})
    return pyslurm_backend.PyslurmBackend(
        cli=cli, module=module
    ), lambda: module.log + runner.writes()


BOTH = pytest.mark.parametrize("kind", ["cli", "pyslurm"])


@BOTH
def test_conformance_node_reads(kind: str) -> None:
    backend, _ = make_backend(kind, ADMIN_LINE)
    node = backend.node("vm")
    assert (node.state, node.flags, node.reason, node.reason_user, node.drained) == (
        "IDLE",
        ("DRAIN",),
        "test: custom reason",
        "root",
        True,
    )


@BOTH
@pytest.mark.parametrize(
    ("line", "writes"),
    [
        ("admin", []),
        ("ours", [("drain", "vm", REASON)]),
        ("idle", [("drain", "vm", REASON)]),
        ("stale", [("drain", "vm", REASON)]),
    ],
)
def test_conformance_drain(kind: str, line: str, writes: list) -> None:
    backend, written = make_backend(kind, NODE_LINES[line])
    if line == "admin":
        with pytest.raises(S.NotOurDrain):
            backend.drain("vm", REASON)
    else:
        assert backend.drain("vm", REASON).action == S.DRAINED
    assert written() == writes


@BOTH
@pytest.mark.parametrize(
    ("line", "force", "action", "writes"),
    [
        ("ours", False, S.RESUMED, [("resume", "vm")]),
        ("admin", False, S.REFUSED, []),
        ("admin", True, S.RESUMED, [("resume", "vm")]),
        ("stale", False, S.UNCHANGED, []),
    ],
)
def test_conformance_resume(kind: str, line: str, force: bool, action: str, writes: list) -> None:
    backend, written = make_backend(kind, NODE_LINES[line])
    if action == S.REFUSED:
        with pytest.raises(S.NotOurDrain):
            backend.resume("vm", force=force)
    else:
        assert backend.resume("vm", force=force).action == action
    assert written() == writes


@pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`
@BOTH
def test_conformance_job_and_requeue_flow(kind: str) -> None:
    backend, written = make_backend(kind, IDLE_LINE)
    assert backend.job(1) == parse_show_job_text(JOB_1_TEXT)
    backend.requeue(1, hold=True)
    backend.set_excluded(1, ["vm"])
    backend.release(1)
    backend.set_excluded(1, [])  # pyslurm cannot clear: goes through scontrol in both
    expected = [
        ("requeue", "1", True),
        ("exclude", "1", ("vm",)),
        ("release", "1"),
        ("start_now", "1"),
        ("exclude", "1", ()),
    ]
    assert sorted(written()) == sorted(expected)


@BOTH
def test_conformance_exclusion_and_comment_keep_what_is_there(kind: str) -> None:
    backend, written = make_backend(kind, IDLE_LINE)
    assert backend.exclude_nodes(1, ["vm"]) == (("vm",), ())
    assert backend.add_admin_comment(1, "requeue: x") == "gpugate: requeue: x"
    assert written() == [("exclude", "1", ("vm",)), ("comment", "1", "gpugate: requeue: x")]


@BOTH
def test_conformance_unknown_node(kind: str) -> None:
    backend, _ = make_backend(kind, ADMIN_LINE)
    if kind == "cli":
        backend.cli._run.fail(
            ("scontrol", "-o", "show", "node", "nosuch"), stdout="Node nosuch not found\n"
        )
    with pytest.raises(S.NodeNotFound):
        backend.node("nosuch")


def test_pyslurm_backend_maps_fields_and_comment() -> None:
    backend, written = make_backend("pyslurm", IDLE_LINE)
    assert backend.job(1).reason == "launch_failed_requeued_held"  # state_desc had spaces
    backend.set_admin_comment(1, "node vm refused: gpu.ecc")
    assert written() == [("comment", "1", "gpugate: node vm refused: gpu.ecc")]
    assert sorted(backend.nodes()) == ["vm"]
    with pytest.raises(S.JobNotFound):
        backend.job(2)


# ------------------------------------- job ids: exactly the job named, whatever the backend

# Job 14 is running with no reason and an expected end; 141 and 142 exist to catch an id read
# as `int("14_1")`. scontrol prints an array task or het component under its own JobId.
JOB_14_TEXT = (
    JOB_1_TEXT.replace("JobId=1 ", "JobId=14 ")
    .replace("JobState=PENDING Reason=launch_failed_requeued_held", "JobState=RUNNING Reason=None")
    .replace("ExitCode=0:54", "ExitCode=0:0")
    .replace("EndTime=Unknown", "EndTime=2999-01-01T00:00:00")
    .replace("   NodeList=\n", "   NodeList=vm\n")
)
TASK_TEXT = {
    "14_1": JOB_14_TEXT.replace("JobId=14 ", "JobId=15 ArrayJobId=14 ArrayTaskId=1 "),
    "14+1": JOB_14_TEXT.replace("JobId=14 ", "JobId=16 HetJobId=14 HetJobOffset=1 "),
    "14": JOB_14_TEXT,
}
EXPECTED_END = calendar.timegm((2999, 1, 1, 0, 0, 0))
UNKNOWN_JOB = "slurm_update error: Invalid job id specified\n"


def job_writes_argv(job: str) -> list[tuple]:
    return [
        ("scontrol", "requeuehold", job),
        ("scontrol", "update", f"JobId={job}", "ExcNodeList=vm"),
        ("scontrol", "update", f"JobId={job}", "ExcNodeList="),
        ("scontrol", "release", job),
        ("scontrol", "update", f"JobId={job}", "StartTime=now"),
        ("scontrol", "update", f"JobId={job}", "AdminComment=gpugate: x"),
    ]


def id_backend(
    kind: str, node_line: str = IDLE_LINE, version: str = "22.5"
) -> tuple[S.SlurmControl, FakeRunner, types.ModuleType | None]:
    """Node `vm` as `node_line` says; jobs 14, 141, 142 (pyslurm) and 14_1, 14+1, 14 (scontrol)."""
    runner = FakeRunner().ok(SHOW_VM, node_line)
    for job, text in TASK_TEXT.items():
        runner.ok(("scontrol", "-o", "show", "job", job), text)
        for argv in job_writes_argv(job):
            runner.ok(argv)
    cli = slurm_cli.CliBackend(runner=runner)
    if kind == "cli":
        return cli, runner, None
    (node,) = parse_show_node_text(node_line)
    job14 = parse_show_job_text(JOB_14_TEXT)
    jobs = {i: job14.replace(job_id=i) for i in (14, 141, 142)}
    raw = {14: {"end_time": EXPECTED_END}}  # pyslurm gives a running job's expected end
    module = fake_pyslurm({"vm": node}, jobs, version=version, raw=raw)
    return pyslurm_backend.PyslurmBackend(cli=cli, module=module), runner, module


def all_job_calls(backend: S.SlurmControl, job: str) -> None:
    backend.requeue(job, hold=True)
    backend.set_excluded(job, ["vm"])
    backend.set_excluded(job, [])
    backend.release(job)
    backend.set_admin_comment(job, "x")


@pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`
@BOTH
@pytest.mark.parametrize("job", ["14_1", "14+1", "14"])
def test_conformance_every_job_call_acts_on_exactly_that_job(kind: str, job: str) -> None:
    backend, runner, module = id_backend(kind)
    assert backend.job(job) == parse_show_job_text(TASK_TEXT[job])
    all_job_calls(backend, job)
    written = runner.writes() + (module.log if module else [])
    assert sorted(written) == sorted(
        [
            ("requeue", job, True),
            ("exclude", job, ("vm",)),
            ("exclude", job, ()),
            ("release", job),
            ("start_now", job),
            ("comment", job, "gpugate: x"),
        ]
    )
    if module is not None:
        # pyslurm is asked about plain job 14 only, never 141, 142 or 14 for a task.
        assert module.ids == ([14] * len(module.ids) if job == "14" else [])
        # load, requeue, exclude, release (after reading the job: no requeue under way), comment
        assert job != "14" or len(module.ids) == 6
    for argv in runner.argvs:
        assert not any(a in ("141", "142", "JobId=141", "JobId=142") for a in argv), argv


@pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`
@pytest.mark.parametrize("job", ["14_1", "14+1"])
def test_scontrol_gets_an_array_task_or_het_component_verbatim(job: str) -> None:
    backend, runner, _ = id_backend("pyslurm")
    all_job_calls(backend, job)
    assert [a for a in runner.argvs if a[1] != "-o"] == job_writes_argv(job)


@BOTH
def test_conformance_a_running_job_without_reason_or_end(kind: str) -> None:
    backend, _, _ = id_backend(kind)
    job = backend.job(14)
    assert (job.reason, job.state, job.end_time, job.back_in_queue) == ("", "RUNNING", None, False)
    assert job == parse_show_job_text(JOB_14_TEXT)


def test_a_completing_job_reads_back_in_queue_only_without_a_past_end() -> None:
    ended = JOB_14_TEXT.replace("JobState=RUNNING", "JobState=COMPLETING")
    requeued = ended.replace("EndTime=2999-01-01T00:00:00", "EndTime=Unknown")
    done = ended.replace("EndTime=2999-01-01T00:00:00", "EndTime=2026-11-29T10:00:00")
    assert parse_show_job_text(requeued).back_in_queue
    assert not parse_show_job_text(done).back_in_queue
    assert parse_show_job_text(done).end_time == utc("2026-11-29T10:00:00")


MIXED_LINE = IDLE_LINE.replace("State=IDLE", "State=MIXED").replace("CPUAlloc=0", "CPUAlloc=1")
ALLOC_LINE = IDLE_LINE.replace("State=IDLE", "State=ALLOCATED").replace("CPUAlloc=0", "CPUAlloc=2")


@BOTH
@pytest.mark.parametrize("version", ["22.5", "24.11"])
@pytest.mark.parametrize(
    ("line", "state"),
    [(MIXED_LINE, "MIXED"), (ALLOC_LINE, "ALLOCATED"), (IDLE_LINE, "IDLE"), (ADMIN_LINE, "IDLE")],
    ids=["mixed", "allocated", "idle-no-reason", "drained"],
)
def test_conformance_same_node_record(kind: str, version: str, line: str, state: str) -> None:
    backend, _, module = id_backend(kind, line, version)
    if module is not None and line is MIXED_LINE:  # the fake mirrors the real pyslurm
        raw = module.Node.load("vm")
        assert (raw.state, raw.allocated_cpus, raw.idle_cpus) == (
            ("ALLOCATED", 1, 1) if version == "22.5" else ("MIXED", 1, 1)
        )
    if module is not None and line is IDLE_LINE and version == "24.11":
        assert module.Node.load("vm").reason_user == "root"
    node = backend.node("vm")
    assert node == parse_show_node_text(line)[0]
    assert node.state == state
    assert node.reason_user == ("root" if line is ADMIN_LINE else "")


@pytest.mark.parametrize(
    ("state", "allocated", "idle", "expected"),
    [
        ("ALLOCATED", 1, 1, "MIXED"),
        ("ALLOCATED", 2, None, "ALLOCATED"),  # unknown counts change nothing
        ("ALLOCATED", None, 2, "ALLOCATED"),
        ("ALLOCATED", 2, 0, "ALLOCATED"),
        ("IDLE", 0, 2, "IDLE"),
        ("DOWN", 1, 1, "DOWN"),
    ],
)
def test_mixed_only_when_the_counts_say_so(state, allocated, idle, expected) -> None:
    assert records.mixed_if_partly_allocated(state, allocated, idle) == expected


@pytest.mark.parametrize("reason", ["None", "none", "NONE", "(null)", "", None, "  None "])
def test_no_job_reason_reads_empty(reason) -> None:
    assert records.job_reason(reason) == ""
    assert records.job_reason("launch failed requeued held") == "launch_failed_requeued_held"


UNKNOWN_WRITES = {
    "requeue": lambda b, j: b.requeue(j),
    "requeuehold": lambda b, j: b.requeue(j, hold=True),
    "release": lambda b, j: b.release(j),
    "exclude": lambda b, j: b.set_excluded(j, ["vm"]),
    "clear": lambda b, j: b.set_excluded(j, []),
    "comment": lambda b, j: b.set_admin_comment(j, "x"),
    "read": lambda b, j: b.job(j),
}


@BOTH
@pytest.mark.parametrize("write", sorted(UNKNOWN_WRITES))
@pytest.mark.parametrize("job", ["99", "14_9"])
def test_conformance_unknown_job_is_job_not_found(kind: str, write: str, job: str) -> None:
    backend, runner, _ = id_backend(kind)
    # scontrol's words: "Invalid job id specified" for a plain id, "Job 14_9 not found" for a
    # task; pyslurm raises RPCError("Invalid job id specified").
    says = UNKNOWN_JOB if "_" not in job else f"Job {job} not found\n"
    for argv in [*job_writes_argv(job), ("scontrol", "requeue", job)]:
        runner.fail(argv, stderr=says)
    runner.fail(("scontrol", "-o", "show", "job", job), stderr=says)
    with pytest.raises(S.JobNotFound):
        UNKNOWN_WRITES[write](backend, job)


def test_cli_start_now_on_an_unknown_job_is_job_not_found() -> None:
    runner = FakeRunner().fail(
        ("scontrol", "update", "JobId=99", "StartTime=now"), stderr=UNKNOWN_JOB
    )
    with pytest.raises(S.JobNotFound, match="99"):
        slurm_cli.CliBackend(runner=runner).start_now(99)


def test_cli_other_failures_stay_command_errors() -> None:
    runner = FakeRunner().fail(
        ("scontrol", "requeue", "14"), stderr="Requeue of JobId=14 failed: Access denied\n"
    )
    runner.fail(
        ("scontrol", "update", "JobId=14", "ExcNodeList=nosuch"),
        stderr="Node nosuch not found\n",  # an unknown node is no unknown job
    )
    cli = slurm_cli.CliBackend(runner=runner)
    with pytest.raises(S.SlurmCommandError) as err:
        cli.requeue(14)
    assert not isinstance(err.value, S.JobNotFound)
    with pytest.raises(S.SlurmCommandError) as err:
        cli.set_excluded(14, ["nosuch"])
    assert not isinstance(err.value, S.JobNotFound)


@BOTH
def test_conformance_node_comment_is_written_by_each_backend_itself(kind: str) -> None:
    backend, runner, module = id_backend(kind)
    runner.ok(("scontrol", "update", "NodeName=vm", "Comment=gpugate: gpu.ecc: x"))
    backend.set_node_comment("vm", "gpu.ecc: x")
    expected = [("node_comment", "vm", "gpugate: gpu.ecc: x")]
    assert (module.log if module else runner.writes()) == expected
    assert module is None or runner.writes() == []  # pyslurm did not need scontrol


def test_pyslurm_backend_imports_lazily_from_sys_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    (node,) = parse_show_node_text(OURS_LINE)
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm({"vm": node}, {}))
    assert (
        pyslurm_backend.PyslurmBackend(cli=slurm_cli.CliBackend(runner=FakeRunner())).node("vm")
        == node
    )


# --------------------------------------------------------------------- backend selection

VERSION = ("scontrol", "--version")


def probe() -> tuple[str, ...]:
    """The import probe's argv: this process's sys.path as it is now (test modules add to it)."""
    return (sys.executable, "-I", "-c", C._PROBE,
            json.dumps([p for p in sys.path if os.path.isabs(p)]))  # fmt: skip


def installed(version: str):
    return lambda name: version


def not_installed(name: str) -> str:
    from importlib.metadata import PackageNotFoundError

    raise PackageNotFoundError(name)


def test_select_cli_when_pyslurm_is_not_installed() -> None:
    runner = FakeRunner()
    choice = C.select_backend("auto", runner=runner, version_of=not_installed)
    assert (choice.kind, choice.why) == (
        "cli",
        "pyslurm is not installed: the scontrol/sinfo command line is used",
    )
    assert runner.argvs == []


def test_select_cli_on_version_mismatch_without_probing() -> None:
    runner = FakeRunner().ok(VERSION, "slurm-wlm 22.05.8\n")
    choice = C.select_backend("auto", runner=runner, version_of=installed("25.11.2"))
    assert choice.kind == "cli" and "25.11.2 does not match" in choice.why
    assert runner.argvs == [VERSION]


def test_select_pyslurm_when_versions_match_as_integers_and_the_probe_passes() -> None:
    runner = FakeRunner().ok(VERSION, "slurm-wlm 22.05.8\n").ok(probe())
    choice = C.select_backend("auto", runner=runner, version_of=installed("22.5.3"))
    assert choice.kind == "pyslurm"
    assert runner.argvs == [VERSION, probe()]
    assert runner.calls[1][1] == C.PROBE_TIMEOUT
    assert "pyslurm" not in sys.modules  # never imported in-process to probe


@pytest.mark.parametrize("status", ["nonzero", "timeout", "killed"])
def test_select_cli_when_the_import_probe_fails(status: str) -> None:
    runner = FakeRunner().ok(VERSION, "slurm 22.05.8").fail(probe(), status=status, rc=1)
    choice = C.select_backend("auto", runner=runner, version_of=installed("22.5.3"))
    assert choice.kind == "cli" and "import pyslurm" in choice.why


def test_the_probe_finds_pyslurm_where_this_process_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The packaged launcher puts /opt/gpugate/lib first on sys.path; a pyslurm there (found by
    # `auto`'s version check) must import in the probe's child too, whatever PYTHONPATH says.
    (tmp_path / "pyslurm").mkdir()
    (tmp_path / "pyslurm" / "__init__.py").write_text("import sys; sys.exit(7) if 0 else None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", "/nonexistent")
    assert C._probe_import(slurm_cli.CliBackend()) is None
    (tmp_path / "pyslurm" / "__init__.py").write_text("raise SystemExit(3)\n")
    assert "exit 3" in (C._probe_import(slurm_cli.CliBackend()) or "")


def test_select_cli_when_scontrol_cannot_say_its_version() -> None:
    runner = FakeRunner().fail(VERSION, stderr="error: s_p_parse_file: unable to read slurm.conf")
    choice = C.select_backend("auto", runner=runner, version_of=installed("22.5.3"))
    assert choice.kind == "cli" and "Slurm's version" in choice.why


def test_explicit_pyslurm_that_cannot_work_raises() -> None:
    runner = FakeRunner().ok(VERSION, "slurm 24.11.5")
    with pytest.raises(S.BackendUnavailable, match="does not match"):
        C.select_backend("pyslurm", runner=runner, version_of=installed("22.5.3"))


def test_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = FakeRunner()
    monkeypatch.setenv(C.ENV_BACKEND, "cli")
    assert C.select_backend("pyslurm", runner=runner, version_of=installed("22.5.3")).kind == "cli"
    assert runner.argvs == []
    monkeypatch.setenv(C.ENV_BACKEND, "PySlurm")
    runner.ok(VERSION, "slurm 22.05.8").ok(probe())
    assert C.select_backend("cli", runner=runner, version_of=installed("22.5.3")).kind == "pyslurm"
    monkeypatch.setenv(C.ENV_BACKEND, "rest")
    with pytest.raises(ValueError, match=C.ENV_BACKEND):
        C.select_backend(runner=runner)


def test_backend_builds_the_chosen_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", installed("22.5.3"))
    runner = FakeRunner().ok(VERSION, "slurm 22.05.8").ok(probe())
    chosen = C.backend(runner=runner, timeout=4)
    assert isinstance(chosen, pyslurm_backend.PyslurmBackend) and chosen.cli.timeout == 4
    assert chosen.why
    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    chosen = C.backend(runner=runner)
    assert isinstance(chosen, slurm_cli.CliBackend) and chosen.why.startswith(
        "pyslurm is not installed: "
    )


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("slurm-wlm 22.05.8\n", (22, 5)),
        ("slurm 24.11.5", (24, 11)),
        ("22.5.3", (22, 5)),
        ("25.11.2", (25, 11)),
        ("nonsense", None),
    ],
)
def test_parse_version(text: str, version: tuple | None) -> None:
    assert slurm_cli.parse_version(text) == version


def test_a_jobs_start_time_is_read_and_a_forecast_is_not():
    text = fixture("22.05/scontrol-show-job.epilog-slurmctld.prolog-refused-held.txt")
    started = int(time.mktime(time.strptime("2026-12-01T06:57:13", "%Y-%m-%dT%H:%M:%S")))
    assert parse_show_job_text(text).start_time == started
    forecast = text.replace("StartTime=2026-12-01T06:57:13", "StartTime=2999-01-01T00:00:00")
    assert parse_show_job_text(forecast).start_time is None


def test_scontrol_text_numbers_are_ascii_digits_only() -> None:
    # int() reads "1_0" as 10; a JobId= that is no plain id is no record of ours.
    odd = JOB_1_TEXT.replace("Restarts=1 ", "Restarts=1_0 ").replace(
        "ExitCode=0:54", "ExitCode=0:5_4"
    )
    job = parse_show_job_text(odd)
    assert (job.restarts, job.exit_signal) == (0, 0)
    with pytest.raises(ValueError, match="14_1"):
        parse_show_job_text(JOB_1_TEXT.replace("JobId=1 ", "JobId=14_1 "))


@BOTH
def test_conformance_node_comment_is_emptied_through_scontrol(kind: str) -> None:
    # pyslurm's Node.modify takes an empty comment as "no change" (seen on 24.11.0).
    backend, runner, module = id_backend(kind)
    runner.ok(("scontrol", "update", "NodeName=vm", "Comment="))
    backend.clear_node_comment("vm")
    assert runner.writes() == [("node_comment", "vm", "")]
    assert module is None or module.log == []


SCRIPT_JOBS = ("squeue", "--all", "--noheader", "--states=CONFIGURING,COMPLETING",
               "--format=%i %T")  # fmt: skip


def test_script_jobs_lists_every_configuring_or_completing_job_in_one_bounded_squeue() -> None:
    out = "14 COMPLETING\n15_2 CONFIGURING\n\n  16 COMPLETING  \n"
    runner = FakeRunner().ok(SCRIPT_JOBS, out)
    backend = slurm_cli.CliBackend(timeout=3.5, runner=runner)
    assert backend.script_jobs() == [("14", "COMPLETING"), ("15_2", "CONFIGURING"),
                                     ("16", "COMPLETING")]  # fmt: skip
    assert [(argv, timeout) for argv, timeout, _ in runner.calls] == [(SCRIPT_JOBS, 3.5)]
    assert slurm_cli.CliBackend(runner=FakeRunner().ok(SCRIPT_JOBS, "")).script_jobs() == []


def test_script_jobs_says_when_squeue_cannot_answer() -> None:
    timed_out = FakeRunner().fail(SCRIPT_JOBS, status="timeout", rc=None)
    with pytest.raises(S.SlurmTimeout):
        slurm_cli.CliBackend(runner=timed_out).script_jobs()
    down = FakeRunner().fail(SCRIPT_JOBS, stderr="slurm_load_jobs error: Unable to contact")
    with pytest.raises(S.SlurmCommandError):
        slurm_cli.CliBackend(runner=down).script_jobs()

"""The controller's requeue decision: infrastructure faults only, opted in, restarts left."""

from __future__ import annotations

import os
import zipfile

import paths
import pytest
from factories import default_config, views
from fakes import FakeSlurm

from gpugate.gate import requeue as _requeue
from gpugate.gate.requeue import JobEnd, RequeueDecision, requested
from gpugate.hooks.epilog_slurmctld import job_from_env, run_requeue


def decide_requeue(job: JobEnd, summaries: list, *rest) -> RequeueDecision:
    """The decision over records read from these JSON shapes (factories.view)."""
    return _requeue.decide_requeue(job, views(summaries), *rest)


HW = {
    "node": "n1",
    "hardware_fault": True,
    "category": "gpu_xid_hardware",
    "first_hardware_error_at": "2026-11-29T10:00:00.000000Z",
}
TIMEOUT = {"node": "n2", "hardware_fault": False, "category": "nccl_timeout"}


def job(**changes) -> JobEnd:
    values = {"job_id": "5", "uid": os.getuid(), "gid": os.getgid(), "comment": "gpugate:ckpt=/ckpt",
              "restarts": 0, "state": "FAILED", "nodes": ("n1", "n2")}  # fmt: skip
    values.update(changes)
    return JobEnd(**values)


@pytest.mark.parametrize(
    ("changes", "summaries", "requeue", "why"),
    [
        ({}, [HW, TIMEOUT], True, "infrastructure failure (gpu_xid_hardware)"),
        (
            {},
            [TIMEOUT, {"node": "n1", "category": "ecc_error", "category_trusted": True}],
            True,
            "infrastructure failure (ecc_error)",
        ),
        # A job that printed an Xid 79 line: its bundle's category is not root's verdict.
        (
            {},
            [TIMEOUT, {"node": "n1", "category": "gpu_xid_hardware", "category_trusted": False}],
            False,
            "not an infrastructure failure (nccl_timeout)",
        ),
        (
            {},
            [{"node": "n1", "category": "ecc_error"}],
            False,
            "not an infrastructure failure (no evidence of an infrastructure fault)",
        ),
        ({"state": "NODE_FAIL"}, [], True, "infrastructure failure (slurm_node_failure)"),
        (
            {},
            [TIMEOUT, {"node": "n1", "category": "nccl_timeout"}],
            False,
            "not an infrastructure failure (nccl_timeout)",
        ),
        (
            {},
            [{"node": "n1", "category": "cuda_oom"}],
            False,
            "not an infrastructure failure (cuda_oom)",
        ),
        ({"state": "TIMEOUT"}, [HW], False, "not an infrastructure failure (timeout)"),
        ({"state": "CANCELLED"}, [HW], False, "not an infrastructure failure (cancelled)"),
        (
            {"comment": "my run"},
            [HW],
            False,
            "the job did not opt in (gpugate:ckpt= or gpugate:requeue)",
        ),
        ({"restarts": 3}, [HW], False, "gpu_xid_hardware, but no restarts left (3/3)"),
        (
            {"comment": "gpugate:requeue gpugate:restarts=5", "restarts": 4},
            [HW],
            True,
            "infrastructure failure (gpu_xid_hardware)",
        ),
        ({}, [], False, "not an infrastructure failure (no evidence of an infrastructure fault)"),
        # unknown (logs with neither a failure nor an end, issue 43) is nobody's fault: never
        # a cause to requeue for, even when trusted and sure, and never a clean end.
        (
            {},
            [{"node": "n1", "category": "unknown", "category_trusted": True, "confidence": "high"}],
            False,
            "not an infrastructure failure (unknown)",
        ),
    ],
)
def test_decisions(changes, summaries, requeue, why):
    decision = decide_requeue(job(**changes), summaries, default_config())
    assert (decision.requeue, decision.why) == (requeue, why)


def test_a_job_slurm_already_requeued_is_left_alone():
    decision = decide_requeue(job(state="PENDING"), [HW], default_config())
    assert not decision.requeue and "Slurm requeued the job already" in decision.why


# EpilogSlurmctld reads COMPLETING while the node epilogs run (see records.back_in_queue).
@pytest.mark.parametrize(
    "states", [("COMPLETED", "0:0"), ("completed", "0:0"), ("COMPLETING", "0:0")]
)
def test_a_job_that_ended_well_is_never_requeued_whatever_the_bundles_say(states):
    state, code = states
    # A GPU the prolog already found lost, outside the job's GPUs, marked in an older bundle.
    decision = decide_requeue(job(state=state, exit_code2=code), [HW, HW], default_config())
    assert (decision.requeue, decision.tell) == (False, False)
    assert decision.why == "the job ended well (exit 0:0)"


@pytest.mark.parametrize(
    ("state", "code"), [("COMPLETED", "1:0"), ("FAILED", "0:0"), ("COMPLETING", "0:9")]
)
def test_only_completed_with_exit_0_counts_as_ended_well(state, code):
    decision = decide_requeue(job(state=state, exit_code2=code), [HW], default_config())
    assert decision.requeue is True


@pytest.mark.parametrize(
    ("changes", "wait"),
    [
        ({"exit_code2": "1:0"}, True),
        ({"exit_code2": "0:9"}, True),
        ({"exit_code2": "0:0", "state": "NODE_FAIL"}, True),
        ({"exit_code2": "0:0", "state": "COMPLETING"}, False),
        ({"exit_code2": "1:0", "comment": "no tokens"}, False),
        ({"exit_code2": "1:0", "state": "PENDING"}, False),
    ],
)
def test_the_controller_waits_for_bundles_only_when_they_can_matter(changes, wait):
    from gpugate.gate.requeue import needs_evidence

    assert needs_evidence(job(**changes), default_config()) is wait


def test_suspects_are_the_nodes_with_hardware_evidence_first_fault_first():
    later = dict(HW, node="n3", first_hardware_error_at="2026-11-29T10:00:05.000000Z")
    decision = decide_requeue(job(nodes=("n1", "n2", "n3")), [later, TIMEOUT, HW], default_config())
    assert decision.suspects == ("n1", "n3")


def test_restart_request_is_capped_by_the_site():
    config = default_config()
    assert requested({"restarts": "99"}, config)[1] == config.requeue.max_restarts_limit
    assert requested({}, config) == (False, config.requeue.max_restarts, None)
    assert requested({}, config.replace(requeue=config.requeue.replace(opt_in=False)))[0] is True


def test_controller_environment_gives_the_job():
    end = job_from_env({"SLURM_JOB_ID": "9", "SLURM_JOB_COMMENT": "gpugate:requeue", "SLURM_JOB_NODELIST": "n[1-2]",
                        "SLURM_JOB_RESTART_COUNT": "1", "SLURM_JOB_UID": "1000"})  # fmt: skip
    assert (end.job_id, end.nodes, end.restarts, end.uid) == ("9", ("n1", "n2"), 1, 1000)


def slurm_for(nodes: dict | None = None, pinned: tuple = ()) -> FakeSlurm:
    """Slurm holding job 5 (`pinned`: its ReqNodeList, `-w`) and `nodes` (name -> NodeInfo)."""
    from gpugate.slurm.records import JobInfo

    return FakeSlurm(nodes=(nodes or {}).values(), jobs=[JobInfo(job_id=5, required_nodes=pinned)])


def test_run_requeue_reads_the_records_and_records_the_checkpoint(tmp_path):
    from gpugate.store.controller_view import done, write_record

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for step in (100, 200):
        with zipfile.ZipFile(ckpt / f"ckpt_{step}.pt", "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    (ckpt / "ckpt_300.pt").write_bytes(b"PK\x03\x04 cut short")
    config = default_config().replace(evidence_dir=str(tmp_path / "ev"), state_dir=str(tmp_path))
    config = config.replace(requeue=config.requeue.replace(start_now=False))
    write_record(config.evidence_dir, "5", "n1", 0, done(HW))
    write_record(config.evidence_dir, "5", "n2", 0, done(TIMEOUT))
    slurm = slurm_for()
    decision, done = run_requeue(config, job(comment=f"gpugate:ckpt={ckpt}"), slurm, wait_s=0)
    assert decision.requeue and decision.checkpoint == str(ckpt / "ckpt_200.pt")
    assert slurm.calls[:2] == [("requeue", "5"), ("exclude", "5", ("n1",))]
    assert "resume from" in slurm.calls[2][2] and done == [
        "scontrol requeue 5",
        "exclude n1 (ExcNodeList now n1)",
        "admin comment",
    ]


def test_dry_run_changes_nothing(tmp_path):
    config = default_config().replace(evidence_dir=str(tmp_path), state_dir=str(tmp_path / "state"))
    slurm = slurm_for()
    decision, done = run_requeue(
        config, job(state="NODE_FAIL", comment="gpugate:requeue"), slurm, wait_s=0, dry_run=True
    )
    assert decision.requeue and slurm.calls == [] and all(d.startswith("would ") for d in done)


def test_the_background_start_now_does_not_hold_the_hooks_output():
    # slurmscriptd waits for EOF on EpilogSlurmctld's output pipe, not for its exit: the
    # detached child must not keep that pipe, or the job stays COMPLETING until the hook
    # times out (seen on Slurm 22.05 and 24.11: 60 s per requeue). It must outlive the hook.
    import signal
    import subprocess
    import sys
    import time

    script = (
        "from gpugate.child import detach\n"
        "pid = detach('gpugate.child:selftest', {'action': 'sleep', 'seconds': 30}, timeout=40)\n"
        "print(pid, flush=True)\n"
    )
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=20)  # fmt: skip  # EOF only once nothing holds the pipe
    took = time.monotonic() - started
    pid = int(proc.stdout.strip())
    try:
        assert took < 10, "the detached child kept the hook's output pipe open"
        os.kill(pid, 0)  # still running after its parent is gone: no parent-death signal
    finally:
        os.kill(pid, signal.SIGKILL)


class Detached:
    """child.detach's stand-in: records each (task, kwargs, timeout) and starts nothing."""

    def __init__(self) -> None:
        self.started: list[tuple] = []

    def __call__(self, task, kwargs, timeout):
        self.started.append((task, kwargs, timeout))
        return 4242

    def job_ids(self) -> list[str]:
        """The jobs a start-when-pending poller was detached for."""
        return [kwargs["job_id"] for task, kwargs, _ in self.started
                if task == "gpugate.gate.requeue:start_now_when_pending"]  # fmt: skip


def test_start_when_pending_detaches_a_clean_child_never_a_fork(monkeypatch):
    from gpugate.gate import requeue

    config = default_config()

    def no_fork():
        raise AssertionError("os.fork() in the hook process")

    detached = Detached()
    monkeypatch.setattr(os, "fork", no_fork)
    requeue.start_when_pending(config, "42", wait_s=5, detach=detached)
    assert detached.started == [("gpugate.gate.requeue:start_now_when_pending",
                                 {"job_id": "42", "backend": config.slurm.backend,
                                  "timeout": config.slurm.timeout_s, "wait_s": 5}, 35)]  # fmt: skip


def test_the_detached_poller_starts_the_job_once_pending():
    from gpugate.gate import requeue
    from gpugate.slurm.records import JobInfo

    slurm = FakeSlurm(jobs=[JobInfo(job_id=7, state="COMPLETING")])
    naps = []

    def sleep(seconds):  # Slurm moves the job on while the poller waits
        naps.append(seconds)
        slurm.jobs["7"] = slurm.jobs["7"].replace(state="PENDING")

    assert requeue.start_now_when_pending("7", "cli", 5.0, wait_s=30, slurm=slurm, sleep=sleep)
    assert naps == [1] and slurm.calls == [("start_now", "7")]


# ------------------------------------------------- what Slurm says; what others wrote


@pytest.mark.parametrize(
    "changes",
    [
        {"state": "PENDING"},
        {"state": "COMPLETING", "requeued": True},  # 22.05, nohold_on_prolog_fail
        {"state": "COMPLETING", "requeued": True, "launch_failed": True},  # 22.05, held
        {"state": "COMPLETING", "exit_code2": "0:54"},  # 24.11: ESLURMD_PROLOG_FAILED
    ],
)
def test_a_job_slurm_requeued_itself_is_left_alone_and_told_nothing(changes):
    decision = decide_requeue(job(**changes), [HW], default_config())
    assert not decision.requeue and decision.slurm_requeued and not decision.tell
    assert decision.why.startswith("Slurm requeued the job already")


@pytest.mark.parametrize(
    ("changes", "tell"),
    [
        ({"exit_code2": "0:0", "state": "COMPLETED"}, False),  # ended well
        ({"exit_code2": "0:0", "state": "COMPLETING"}, False),
        ({"exit_code2": "1:0", "comment": "my run"}, False),  # did not opt in
        ({"exit_code2": "1:0"}, True),  # opted in, failed, not requeued: says why
        ({"exit_code2": "1:0", "restarts": 3}, True),
    ],
)
def test_the_admin_comment_is_written_only_where_it_tells_something(changes, tell):
    summaries = [HW] if changes.get("restarts") else []
    decision = decide_requeue(job(**changes), summaries, default_config())
    assert not decision.requeue and decision.tell is tell


def test_a_job_that_ended_well_or_did_not_opt_in_gets_no_write_at_all(tmp_path):
    config = default_config().replace(evidence_dir=str(tmp_path), state_dir=str(tmp_path / "state"))
    for end in (job(exit_code2="0:0", state="COMPLETING"), job(exit_code2="1:0", comment="x")):
        slurm = slurm_for()
        _, done = run_requeue(config, end, slurm, wait_s=0)
        assert slurm.calls == [] and done == []


def test_a_pinned_suspect_is_not_excluded_and_the_comment_says_so(tmp_path):
    from gpugate.store.controller_view import done, write_record

    config = default_config().replace(evidence_dir=str(tmp_path), state_dir=str(tmp_path / "state"))
    config = config.replace(requeue=config.requeue.replace(start_now=False))
    write_record(config.evidence_dir, "5", "n1", 0, done(HW))
    write_record(config.evidence_dir, "5", "n2", 0, done(TIMEOUT))
    slurm = slurm_for(pinned=("n1",))  # sbatch -w n1
    decision, done = run_requeue(config, job(comment="gpugate:requeue"), slurm, wait_s=0)
    assert decision.requeue and decision.suspects == ("n1",)
    assert done[1] == "exclude n1 (ExcNodeList now (none); kept the -w pin on n1)"
    (comment,) = [c[2] for c in slurm.calls if c[0] == "comment"]
    assert "kept the -w pin on n1 (not excluded: the job waits for n1)" in comment
    assert "excluded n1" not in comment.replace("not excluded", "")


def test_pinned_suspects_are_named_in_the_description():
    from gpugate.gate.requeue import RequeueDecision

    d = RequeueDecision(
        requeue=True, why="x", suspects=("n1", "n2"), pinned=("n1",), max_restarts=3
    )
    text = d.describe()
    assert "; excluded n2;" in text + ";" and "kept the -w pin on n1 (not excluded" in text


def drained(name: str, reason: str = "gpugate: gpu.ecc: test"):
    from gpugate.slurm.records import NodeInfo

    return NodeInfo(name=name, state="IDLE", flags=("DRAIN",), reason=reason)


REFUSAL = "gpugate: node n1 refused: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100"


@pytest.mark.parametrize(
    ("changes", "nodes", "refused_on"),
    [
        ({"admin_comment": REFUSAL}, {"n1": drained("n1")}, ("n1",)),
        ({"admin_comment": f"ticket 7 | {REFUSAL}"}, {"n1": drained("n1")}, ("n1",)),
        # Not told by the AdminComment (the prolog could not write it): Slurm's requeue and
        # gpugate's drain reason on the job's node say the same.
        ({}, {"n1": drained("n1"), "n2": drained("n2", "admin: fan")}, ("n1",)),
        # The prolog refused but its drain failed: the job could land there again at once.
        ({"admin_comment": REFUSAL}, {"n1": drained("n1").replace(flags=())}, ()),
        ({"admin_comment": REFUSAL}, {}, ()),  # the node cannot be read
    ],
)
def test_a_job_gpugate_refused_skips_the_requeue_delay(tmp_path, changes, nodes, refused_on):
    detached = Detached()
    config = default_config().replace(evidence_dir=str(tmp_path), state_dir=str(tmp_path / "state"))
    end = job(state="COMPLETING", requeued=True, exit_code2="0:0", **changes)
    slurm = slurm_for(nodes=nodes)
    decision, _ = run_requeue(config, end, slurm, wait_s=0, detach=detached)
    assert decision.refused_on == refused_on and not decision.requeue
    assert detached.job_ids() == (["5"] if refused_on else [])
    assert not [c for c in slurm.calls if c[0] == "comment"], "the prolog's refusal was replaced"


class Runner:
    """gpugate.runner.run answering from recorded scontrol output (argv -> stdout)."""

    def __init__(self, answers: dict) -> None:
        self.answers, self.argvs = answers, []

    def __call__(self, argv, timeout, env=None, stdin=None):
        from gpugate.runner import CommandResult

        self.argvs.append(tuple(argv))
        out = self.answers.get(tuple(argv))
        if out is None:
            raise AssertionError(f"unexpected command: {argv}")
        return CommandResult(argv=tuple(argv), status="ok", returncode=0, stdout=out,
                             stderr="", duration_s=0.01)  # fmt: skip


FIXTURES = os.path.join(paths.FIXTURES, "slurm", "22.05")
NODE_N1 = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=2 State=IDLE+DRAIN Partitions=debug "
    "Reason=gpugate: gpu.ecc: test [root@2026-12-01T06:51:22]\n"
)


@pytest.mark.parametrize(
    ("recorded", "env", "started"),
    [
        ("prolog-refused-held", {"SLURM_JOB_COMMENT": "gpugate:requeue"}, True),
        ("prolog-refused-nohold", {}, True),
        ("ended-ok", {"SLURM_JOB_COMMENT": "gpugate:requeue"}, False),
    ],
)
def test_epilog_slurmctld_on_recorded_slurm_writes_nothing_to_the_job(
    monkeypatch, tmp_path, recorded, env, started
):
    # The job as 22.05.8's EpilogSlurmctld saw it: today's body overwrote the prolog's
    # AdminComment ("no requeue: the job did not opt in") 100 ms after the prolog wrote it.
    from gpugate.hooks.epilog_slurmctld import run_epilog_slurmctld
    from gpugate.slurm.cli import CliBackend

    with open(os.path.join(FIXTURES, f"scontrol-show-job.epilog-slurmctld.{recorded}.txt")) as fh:
        text = fh.read()
    job_id = text.split()[0].split("=")[1]
    runner = Runner({("scontrol", "-o", "show", "job", job_id): text,
                     ("scontrol", "-o", "show", "node", "n1"): NODE_N1})  # fmt: skip
    detached = Detached()
    nodes = "n1" if "refused" in recorded else "n2"
    monkeypatch.delenv("SLURM_JOB_COMMENT", raising=False)
    for name, value in {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": nodes,
                        "SLURM_JOB_EXIT_CODE2": "0:0", **env}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    config = default_config().replace(evidence_dir=str(tmp_path / "ev"), state_dir=str(tmp_path))
    slurm = CliBackend(runner=runner)  # the real CLI backend over recorded scontrol output
    assert run_epilog_slurmctld(config, make_slurm=lambda c: slurm, detach=detached) == 0
    assert [a for a in runner.argvs if a[1] == "update"] == []
    assert detached.job_ids() == ([job_id] if started else [])
    # `gpugate report` matches a decision to its run (and checkpoint) by the run's number.
    import json

    # In the controller's own directory (controller_dir, default <state_dir>/controller).
    event = json.loads((tmp_path / "controller" / "events.jsonl").read_text().splitlines()[-1])
    assert event["job"] == job_id and isinstance(event["restarts"], int)
    # Where the run ended and how (admin/reliability.py: failed here, completed elsewhere).
    # 22.05 shows the job COMPLETING to EpilogSlurmctld: `ended_well` says how it ended.
    assert (event["nodes"], event["state"]) == (nodes, "COMPLETING")
    assert event["ended_well"] is (recorded == "ended-ok")


def test_a_failed_job_not_requeued_gets_no_admin_comment_slurm_would_refuse(tmp_path):
    # slurmctld refuses an AdminComment on a finished job: the reason goes beside its output.
    config = default_config().replace(evidence_dir=str(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    slurm = slurm_for()
    end = job(exit_code2="1:0", nodes=(), stdout=str(out / "slurm-5.out"))
    decision, done = run_requeue(config, end, slurm, wait_s=0)
    assert not decision.requeue and decision.tell
    assert [c for c in slurm.calls if c[0] == "comment"] == []
    assert any(d.startswith("note beside the job's output") for d in done), done
    if os.geteuid() == 0:  # written as the job's user (here: ourselves)
        assert "was not requeued" in (out / "gpugate-5.requeue.txt").read_text()


def test_a_detached_child_keeps_the_sites_cache_and_fallback_dirs(tmp_path):
    """hook.env's GPUGATE_CACHE_DIR and fallback state dir reach a detached qualification, or
    it would write the default /var/cache/gpugate whatever the site set."""
    import signal
    import subprocess
    import sys

    from gpugate.gate.guard import FALLBACK_ENV

    script = (
        "import os\n"
        f"os.environ['GPUGATE_CACHE_DIR'] = {str(tmp_path / 'cache')!r}\n"
        f"os.environ[{FALLBACK_ENV!r}] = {str(tmp_path / 'fallback')!r}\n"
        "os.environ['SOMETHING_ELSE'] = 'x'\n"
        "from gpugate.child import detach\n"
        "print(detach('gpugate.child:selftest', {'action': 'sleep', 'seconds': 30}, timeout=40))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=20, check=True)  # fmt: skip
    pid = int(proc.stdout.strip())
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = dict(item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item)
        assert env[b"GPUGATE_CACHE_DIR"] == str(tmp_path / "cache").encode()
        assert env[FALLBACK_ENV.encode()] == str(tmp_path / "fallback").encode()
        assert b"SOMETHING_ELSE" not in env  # still a clean environment otherwise
    finally:
        os.kill(pid, signal.SIGKILL)

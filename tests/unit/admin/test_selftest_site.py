"""`gpugate selftest`'s checks of the site: what would lose a requeue on a default site (issue 26).

Each check with gathered facts that pass and facts that fail; the exit code of the command.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import paths
import pytest

from gpugate.admin import selftest as S
from gpugate.admin import sitecheck as C
from gpugate.admin.access import Account, Caution
from gpugate.commands import selftest as selftest_command
from gpugate.config import load_config
from gpugate.runner import CommandResult
from gpugate.slurm.records import NodeInfo

FIXTURES = paths.FIXTURES / "slurm"
STRANGER = Account("stranger", 54321, (54321,))  # no such user is needed: bits are judged
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another owner")

# `scontrol show config` of 22.05.8 (the project's CI cluster), cut to the lines read and a few
# around them, with its header and trailer lines, which are no settings.
SHOW_CONFIG = """Configuration data as of 2026-12-03T05:09:41
AccountingStorageBackupHost = (null)
EpilogSlurmctld         = (null)
JobRequeue              = 1
SchedulerParameters     = batch_sched_delay=0
SlurmUser               = slurm(64030)
SLURM_CONF              = /srv/slurm/etc/slurm.conf
SLURM_VERSION           = 22.05.8
SuspendRate             = 60 nodes/min

Slurmctld(primary) at vm is UP
"""
SHOW_PARTITION = (
    "PartitionName=debug AllowGroups=ALL Default=YES QoS=N/A Nodes=n[1-2] State=UP TotalNodes=2\n"
    "PartitionName=big AllowGroups=ALL Default=NO QoS=N/A Nodes=n1 State=UP TotalNodes=1\n"
)


# open_tmp: tests/conftest.py; slow: over 5 s alone (pytest --durations), out of `make test-fast`
pytestmark = [pytest.mark.usefixtures("open_tmp"), pytest.mark.slow]


def _conf(**changes: str) -> dict[str, str]:
    return {**C.parse_show_config(SHOW_CONFIG), **changes}


def _facts(**changes: object) -> C.SlurmFacts:
    base = C.SlurmFacts(
        conf=_conf(SchedulerParameters="nohold_on_prolog_fail"),
        bare_path="/srv/slurm/etc/slurm.conf",
        nodes=(
            NodeInfo(name="n1", state="IDLE", partitions=("debug", "big"), gres_gpus=8),
            NodeInfo(name="n2", state="IDLE", partitions=("debug",), gres_gpus=4),
        ),
        partitions=("debug", "big"),
        default_partition="debug",
    )
    return C.SlurmFacts(**{**base.__dict__, **changes})


# --- gathering -------------------------------------------------------------------------------


class FakeRunner:
    """gpugate.runner.run for the gathering: recorded output keyed by argv, every call kept."""

    def __init__(self, outputs: dict[tuple, str | None]) -> None:
        self.outputs = outputs
        self.calls: list[tuple[tuple, dict | None]] = []

    def __call__(self, argv, timeout, env=None, stdin=None) -> CommandResult:
        argv = tuple(argv)
        self.calls.append((argv, env))
        out = self.outputs[argv]
        if out is None:
            return CommandResult(argv=argv, status="nonzero", returncode=1,
                                 stderr="scontrol: fatal: Could not establish a configuration "
                                 "source")  # fmt: skip
        return CommandResult(argv=argv, status="ok", returncode=0, stdout=out)


NODES_TEXT = (FIXTURES / "22.05" / "scontrol-show-node-o.drained.txt").read_text()
SHOW = ("scontrol", "show", "config")
BARE = ("env", "-u", "SLURM_CONF", *SHOW)


def test_show_config_lines():
    conf = C.parse_show_config(SHOW_CONFIG)
    assert conf["JobRequeue"] == "1" and conf["SLURM_CONF"] == "/srv/slurm/etc/slurm.conf"
    assert conf["SuspendRate"] == "60 nodes/min" and conf["EpilogSlurmctld"] == "(null)"
    assert "Slurmctld(primary) at vm is UP" not in conf and C.SlurmFacts(conf).slurm_user == "slurm"


def test_gathering_with_hook_envs_slurm_conf_and_without_any(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    runner = FakeRunner({SHOW: SHOW_CONFIG, BARE: None, ("scontrol", "-o", "show", "node"):
                         NODES_TEXT, ("scontrol", "-o", "show", "partition"): SHOW_PARTITION})  # fmt: skip
    facts = C.gather_slurm("/srv/slurm/etc/slurm.conf", runner=runner)
    assert runner.calls[0] == (SHOW, {"SLURM_TIME_FORMAT": "standard",
                                      "SLURM_CONF": "/srv/slurm/etc/slurm.conf"})  # fmt: skip
    assert facts.error == "" and facts.conf["JobRequeue"] == "1"
    assert "Could not establish a configuration source" in facts.bare_error
    assert facts.bare_path is None
    assert facts.partitions == ("debug", "big") and facts.default_partition == "debug"
    (node,) = facts.nodes
    assert (node.name, node.partitions, node.gres_gpus) == ("vm", ("debug",), 8)
    assert facts.cpus == {"vm": 2}


def test_gathering_without_any_slurm_conf_runs_scontrol_once_for_both(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    runner = FakeRunner({SHOW: None})
    facts = C.gather_slurm(None, runner=runner)
    assert [c[0] for c in runner.calls] == [SHOW]  # no nodes asked of a Slurm that is not there
    assert facts.error and facts.bare_error == facts.error and facts.conf == {}
    (problem,) = C.check_slurm_read(facts)
    assert "cannot read Slurm's config" in problem.what and "JobRequeue" in problem.what
    assert "SLURM_CONF=/path/to/slurm.conf in /etc/gpugate/hook.env" in problem.fix
    assert C.check_slurm_read(_facts()) == []


# --- Slurm's settings ------------------------------------------------------------------------


def test_job_requeue_off():
    (problem,) = C.check_job_requeue(_conf(JobRequeue="0"))
    assert "JobRequeue = 0" in problem.what and "presently disabled" in problem.what
    assert "set JobRequeue=1 in slurm.conf" in problem.fix and "sbatch --requeue" in problem.fix
    assert C.check_job_requeue(_conf()) == []
    assert C.check_job_requeue({}) == []  # not said: Slurm's default, 1


@pytest.mark.parametrize(
    ("now", "wanted"),
    [
        ("(null)", "SchedulerParameters=nohold_on_prolog_fail"),
        ("batch_sched_delay=0", "SchedulerParameters=batch_sched_delay=0,nohold_on_prolog_fail"),
    ],
)
def test_without_nohold_on_prolog_fail_a_refused_job_is_held(now, wanted):
    (problem,) = C.check_prolog_hold(_conf(SchedulerParameters=now))
    assert "held" in problem.what and f"set {wanted} in slurm.conf" in problem.fix


def test_nohold_on_prolog_fail_among_others():
    conf = _conf(SchedulerParameters="batch_sched_delay=0, nohold_on_prolog_fail,defer")
    assert C.check_prolog_hold(conf) == []
    conf = _conf(SchedulerParameters="nohold_on_prolog_fail_not")
    assert len(C.check_prolog_hold(conf)) == 1  # a whole word, not a prefix


@pytest.mark.parametrize("hook", ["health", "epilog-slurmctld"])
def test_slurm_conf_that_scontrol_cannot_find_without_hook_env(hook):
    """The acceptance site: slurm.conf outside /etc/slurm, hook.env without SLURM_CONF."""
    facts = _facts(bare_path=None, bare_error="scontrol: fatal: Could not establish ...")
    (problem,) = C.check_slurm_conf_reaches(hook, {}, facts)
    assert C.NO_SLURM_CONF[hook] in problem.what and "hook.env sets none" in problem.what
    assert problem.fix == (
        "add the line SLURM_CONF=/srv/slurm/etc/slurm.conf to /etc/gpugate/hook.env"
    )
    assert C.check_slurm_conf_reaches(hook, {"SLURM_CONF": "/srv/x.conf"}, facts) == []


def test_slurm_conf_found_without_hook_env_but_another_one():
    """A stale /etc/slurm/slurm.conf beside the real one elsewhere: scontrol reads the stale."""
    facts = _facts(bare_path="/etc/slurm/slurm.conf")
    (problem,) = C.check_slurm_conf_reaches("health", {}, facts)
    assert "reads /etc/slurm/slurm.conf, not this cluster's /srv/slurm/etc/slurm.conf" in (
        problem.what
    )
    assert C.check_slurm_conf_reaches("health", {}, _facts()) == []  # the same file


def test_slurm_conf_only_matters_for_the_hooks_slurm_gives_none():
    facts = _facts(bare_path=None, bare_error="fatal")
    for hook in ("prolog", "epilog", "task-prolog"):  # slurmd gives these SLURM_CONF
        assert C.check_slurm_conf_reaches(hook, {}, facts) == []
    unread = _facts(error="scontrol: command not found", bare_error="x")
    assert C.check_slurm_conf_reaches("health", {}, unread) == []  # check_slurm_read says it


# --- the qualify geometry --------------------------------------------------------------------


@pytest.fixture
def qualify(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("{}\n")
    return load_config(str(site)).qualify  # the packaged defaults, not this host's file


def test_the_default_qualify_runs_in_the_default_partition(qualify):
    assert qualify.partition is None and qualify.ntasks_per_node is None
    assert C.check_qualify_geometry(qualify, _facts()) == []
    assert C.check_qualify_geometry(None, _facts()) == []


def test_a_qualify_partition_that_is_not_there(qualify):
    (problem,) = C.check_qualify_geometry(qualify.replace(partition="gpu"), _facts())
    assert "qualify.partition 'gpu' is no partition" in problem.what
    assert problem.fix == "set qualify.partition to one of: debug, big"
    assert C.check_qualify_geometry(qualify.replace(partition="big"), _facts()) == []


def test_no_partition_and_no_default(qualify):
    (problem,) = C.check_qualify_geometry(qualify, _facts(default_partition=None))
    assert "no default partition" in problem.what and "debug, big" in problem.fix


def test_a_partition_without_nodes(qualify):
    facts = _facts(partitions=("debug", "big", "empty"))
    (problem,) = C.check_qualify_geometry(qualify.replace(partition="empty"), facts)
    assert "holds no nodes" in problem.what


def test_more_ranks_per_node_than_gpus(qualify):
    (problem,) = C.check_qualify_geometry(qualify.replace(ntasks_per_node=8), _facts())
    assert "ntasks_per_node 8 is more than the GPUs Slurm gives n2 (4 from Gres)" in problem.what
    assert "at most 4" in problem.fix
    assert C.check_qualify_geometry(qualify.replace(ntasks_per_node=4), _facts()) == []
    big = qualify.replace(ntasks_per_node=8, partition="big")  # n1 alone: 8 GPUs
    assert C.check_qualify_geometry(big, _facts()) == []


def test_more_ranks_per_node_than_cpus(qualify):
    """One rank per Gres GPU (8 and 4) on 2-CPU nodes: the job would stay PENDING."""
    facts = _facts(cpus={"n1": 2, "n2": 2})
    (problem,) = C.check_qualify_geometry(qualify, facts)
    assert "one rank per Gres GPU asks 8 tasks of n1, n2, which has 2 CPUs" in problem.what
    assert "qualify runs 2 ranks, testing 2 of the node's GPUs" in problem.what
    assert problem.fix.startswith("set qualify.ntasks_per_node: 2 ")
    assert isinstance(problem, Caution)  # capped at the CPUs, qualify still runs: a warning
    assert C.check_qualify_geometry(qualify.replace(ntasks_per_node=2), facts) == []
    (problem,) = C.check_qualify_geometry(qualify.replace(ntasks_per_node=3), facts)
    assert "qualify.ntasks_per_node 3 asks 3 tasks" in problem.what
    assert not isinstance(problem, Caution)  # a set value qualify refuses: still a problem


# --- what SlurmUser must reach ---------------------------------------------------------------


def test_controller_dir_defaults_under_state_dir():
    class Old:  # a config from before controller_dir
        state_dir = "/srv/gpugate"

    assert C.controller_dir_of(Old()) == "/srv/gpugate/controller"

    class New(Old):
        controller_dir = "/srv/ctl"

    assert C.controller_dir_of(New()) == "/srv/ctl"


def test_records_behind_a_closed_directory(tmp_path):
    """The issue's site: evidence root-only, so the controller sees nothing."""
    evidence = tmp_path / "evidence"
    (evidence / "controller-view" / "17").mkdir(parents=True)
    evidence.chmod(0o700)
    (problem,) = C.check_records(str(evidence), STRANGER)
    assert f"cannot reach the nodes' decision records in {evidence}/controller-view" in (
        problem.what
    )
    assert f"{evidence} closed to stranger" in problem.what
    assert problem.fix == f"chmod o+x {evidence}" and "traversal only" in problem.what
    evidence.chmod(0o711)
    assert C.check_records(str(evidence), STRANGER) == []
    assert C.check_records(str(tmp_path / "none-yet"), STRANGER) == []  # the epilog makes it


FIX_VIEW = "chgrp -R 54321 {v} && find {v} -type d -exec chmod 0750 {{}} + -o -type f -exec chmod 0640 {{}} +"


@as_root
def test_records_the_controller_may_not_read(tmp_path):
    """The records are SlurmUser's group's (0750/0640): the fix gives them that, never others."""
    view = tmp_path / "evidence" / "controller-view"
    job = view / "17"
    job.mkdir(parents=True, mode=0o750)
    (tmp_path / "evidence").chmod(0o711)
    view.chmod(0o750)
    record = job / "n1-r0.json"
    record.write_text("{}")
    record.chmod(0o640)
    # root's group: closed to SlurmUser; the fix names its group and keeps others out.
    (problem,) = C.check_records(str(tmp_path / "evidence"), STRANGER)
    assert f"{view} closed to stranger" in problem.what and "view_group: 54321" in problem.what
    assert problem.fix == FIX_VIEW.format(v=view)
    for path in (view, job, record):
        os.chown(path, -1, 54321)
    assert C.check_records(str(tmp_path / "evidence"), STRANGER) == []
    record.chmod(0o600)
    (problem,) = C.check_records(str(tmp_path / "evidence"), STRANGER)
    assert f"{record}: mode 0600" in problem.what and problem.fix == FIX_VIEW.format(v=view)
    record.chmod(0o640)
    job.chmod(0o700)
    (problem,) = C.check_records(str(tmp_path / "evidence"), STRANGER)
    assert f"{job}: mode 0700" in problem.what


def test_a_controller_dir_slurm_cannot_create(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o751)
    ctl = state / "controller"
    (problem,) = C.check_controller_dir(str(ctl), STRANGER)
    assert f"controller_dir {ctl} does not exist" in problem.what
    assert problem.fix == f"install -d -o stranger -g 54321 -m 0750 {ctl}"
    state.chmod(0o700)
    (problem,) = C.check_controller_dir(str(ctl), STRANGER)
    assert problem.fix == f"chmod o+x {state} && install -d -o stranger -g 54321 -m 0750 {ctl}"
    root = Account("root", 0, (0,))
    assert C.check_controller_dir(str(ctl), root) == []  # SlurmUser=root: it creates it


@as_root
def test_a_controller_dir_slurm_cannot_write(tmp_path):
    ctl = tmp_path / "controller"
    ctl.mkdir(mode=0o755)  # root's: what a root SlurmUser left behind
    (problem,) = C.check_controller_dir(str(ctl), STRANGER)
    assert "cannot record its decisions" in problem.what and "gpugate report" in problem.what
    assert problem.fix == f"install -d -o stranger -g 54321 -m 0750 {ctl}"
    os.chown(ctl, STRANGER.uid, STRANGER.gids[0])
    assert C.check_controller_dir(str(ctl), STRANGER) == []
    (ctl / "events.jsonl").write_text("")  # root's, 0644
    (problem,) = C.check_controller_dir(str(ctl), STRANGER)
    assert f"not writable by stranger (e.g. {ctl}/events.jsonl)" in problem.what
    assert problem.fix == f"chown -R stranger:54321 {ctl}"
    os.chown(ctl / "events.jsonl", STRANGER.uid, -1)
    assert C.check_controller_access(str(tmp_path / "evidence"), str(ctl), STRANGER) == []


# --- the command -----------------------------------------------------------------------------


@pytest.fixture
def no_hooks(tmp_path, monkeypatch):
    """An empty hooks directory and no system files of this host: only the site is judged."""
    monkeypatch.setenv("GPUGATE_CONFIG", str(tmp_path / "site.yaml"))
    (tmp_path / "site.yaml").write_text("{}\n")
    hooks = tmp_path / "libexec"
    hooks.mkdir()
    return hooks


def selftest(no_hooks: Path, facts: C.SlurmFacts, *args: str) -> int:
    """`gpugate selftest ARGS` with these Slurm facts and no system files of this host."""
    host = S.Host(hook_env=str(no_hooks.parent / "absent.env"),
                  config=str(no_hooks.parent / "absent.yaml"),
                  gather_slurm=lambda slurm_conf: facts)  # fmt: skip
    return selftest_command.main(list(args), host=host)


@pytest.mark.parametrize(
    ("facts", "code"),
    [
        (_facts(), 0),
        (_facts(conf=_conf(SchedulerParameters="nohold_on_prolog_fail", JobRequeue="0")), 1),
        (_facts(conf=_conf()), 1),  # no nohold_on_prolog_fail
        (_facts(conf={}, error="scontrol show config: command not found"), 1),
    ],
)
def test_a_site_that_would_lose_requeues_exits_non_zero(no_hooks, capsys, facts, code):
    args = ["--hooks-dir", str(no_hooks), "--slurm-user", "root", "--json", "--node", "n1"]
    assert selftest(no_hooks, facts, *args) == code
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is (code == 0)
    assert {h["status"] for h in report["hooks"]} == {"skipped"}  # no wrapper installed
    site = report["site"]
    assert site["hook"] == "site" and site["status"] == ("ok" if code == 0 else "broken")
    assert all(p["fix"] for p in site["problems"]) and len(site["problems"]) == code


def test_the_text_report_names_the_fix(no_hooks, capsys):
    facts = _facts(conf=_conf(JobRequeue="0"))
    args = ["--hooks-dir", str(no_hooks), "--slurm-user", "root", "--node", "n1"]
    assert selftest(no_hooks, facts, *args) == 1
    out = capsys.readouterr().out
    assert "fix: set JobRequeue=1 in slurm.conf" in out
    assert "fix: set SchedulerParameters=batch_sched_delay=0,nohold_on_prolog_fail" in out
    assert out.rstrip().endswith("would break: site")


def test_slurmctld_down_says_start_it_not_hook_env():
    # scontrol found slurm.conf, and nobody answered at SlurmctldHost.
    down = C.SlurmFacts(conf={}, error="scontrol show config: exit 1: slurm_load_ctl_conf "
                        "error: Unable to contact slurm controller (connect failure)")  # fmt: skip
    (problem,) = C.check_slurm_read(down)
    assert problem.fix.startswith("start slurmctld") and "hook.env" not in problem.fix
    (problem,) = C.check_slurm_read(C.SlurmFacts(conf={}, error="Could not establish a "
                                                 "configuration source"))  # fmt: skip
    assert "SLURM_CONF=/path/to/slurm.conf in /etc/gpugate/hook.env" in problem.fix


def test_a_node_name_slurm_does_not_know_names_the_way_out(no_hooks, monkeypatch, capsys):
    monkeypatch.setenv("SLURMD_NODENAME", "vm-host")
    args = ["--hooks-dir", str(no_hooks), "--slurm-user", "root", "--json"]
    assert selftest(no_hooks, _facts(), *args) == 1
    (problem,) = json.loads(capsys.readouterr().out)["site"]["problems"]
    assert problem["what"].startswith("vm-host (SLURMD_NODENAME, else this host's name) is no "
                                      "Slurm node (n1, n2)")  # fmt: skip
    assert "--node NAME" in problem["fix"] and "SLURMD_NODENAME=NAME" in problem["fix"]
    assert selftest(no_hooks, _facts(), *args, "--node", "n2") == 0


def test_a_geometry_the_nodes_cannot_run_is_a_warning(no_hooks, capsys):
    # One rank per Gres GPU (8) on nodes of 2 CPUs: qualify runs 2 ranks; nothing breaks.
    facts = _facts(cpus={"n1": 2, "n2": 2})
    args = ["--hooks-dir", str(no_hooks), "--slurm-user", "root", "--node", "n1"]
    assert selftest(no_hooks, facts, *args, "--json") == 0
    site = json.loads(capsys.readouterr().out)["site"]
    assert site["status"] == "warning" and site["problems"] == []
    assert "one rank per Gres GPU asks 8 tasks of n1" in site["warnings"][0]["what"]
    assert selftest(no_hooks, facts, *args) == 0
    out = capsys.readouterr().out
    assert "- warning: one rank per Gres GPU" in out and "would break:" not in out


# --- HealthCheckNodeState (docs/slurm-facts.md, "HealthCheckNodeState=REBOOT_ONLY") -----------

HEALTH = {"HealthCheckProgram": "/usr/libexec/gpugate/gpugate-health",
          "HealthCheckInterval": "300 sec", "HealthCheckNodeState": "ANY,CYCLE"}  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"HealthCheckNodeState": "REBOOT_ONLY"}, "only when a node comes back from a reboot Slurm issued"),
        ({"HealthCheckNodeState": "START_ONLY", "HealthCheckInterval": "0 sec"}, "only when slurmd starts"),
        ({"HealthCheckInterval": "0 sec"}, "HealthCheckInterval = 0: slurmd never runs"),
    ],
    ids=["reboot-only", "start-only", "interval-0"],
)  # fmt: skip
def test_a_health_check_slurm_never_runs_periodically_is_a_warning(changes, said):
    (caution,) = C.check_health_periodic(_conf(**{**HEALTH, **changes}))
    assert isinstance(caution, Caution) and said in caution.what, caution.what
    assert "transient drains are not lifted by passing runs" in caution.what
    assert "HealthCheckNodeState=ANY,CYCLE and HealthCheckInterval=300" in caution.fix


def test_a_periodic_health_check_or_none_says_nothing():
    assert C.check_health_periodic(_conf(**HEALTH)) == []
    assert C.check_health_periodic(_conf(**{**HEALTH, "HealthCheckNodeState": "IDLE"})) == []
    none = {**HEALTH, "HealthCheckProgram": "(null)", "HealthCheckNodeState": "REBOOT_ONLY"}
    assert C.check_health_periodic(_conf(**none)) == []
    assert C.check_health_periodic(_conf()) == []  # 22.05's lines without a program


def test_reboot_only_is_a_site_warning_not_a_break(no_hooks, capsys):
    facts = _facts(conf={**_facts().conf, **HEALTH, "HealthCheckNodeState": "REBOOT_ONLY"})
    args = ["--hooks-dir", str(no_hooks), "--slurm-user", "root", "--node", "n1", "--json"]
    assert selftest(no_hooks, facts, *args) == 0
    site = json.loads(capsys.readouterr().out)["site"]
    assert site["status"] == "warning" and site["problems"] == []
    assert site["warnings"][0]["what"].startswith("HealthCheckNodeState = REBOOT_ONLY")

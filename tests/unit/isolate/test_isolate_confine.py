"""A site whose jobs are not confined to their devices is refused isolation (issue 44).

`TaskPlugin=task/none`: gpugate's deny sat on a devices group no job was in, and a 7-GPU job
opened the "isolated" GPU. The refusal must name each missing setting and its fix, and
`gpugate isolate check` and selftest must say it, never that the site can isolate.

`scontrol show config` texts below follow src/api/config_info.c's printing (`%-23s = %s`, the
"Cgroup Support Configuration:" section only when a plugin names cgroup, proc_req.c); no
recorded output of that command with these lines is in the reference (see the report of
issue 44), so they are written in that shape, one per version layout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeSlurm
from isolate_site import fake_devices, gpu_config

from gpugate.admin import isolatecheck
from gpugate.checks.facts import Gpu
from gpugate.checks.findings import fail
from gpugate.commands import isolate as command
from gpugate.isolate import apply, confine, state
from gpugate.slurm.records import NodeInfo

NODE = "n1"
# 22.05.8: task/none as in the site of issue 44 (and the project's CI cluster); proctrack is
# cgroup, so the controller prints its cgroup.conf, with ConstrainDevices.
SHOW_22_05_TASK_NONE = """Configuration data as of 2026-12-03T05:09:41
ProctrackType           = proctrack/cgroup
SlurmctldParameters     = (null)
SLURM_VERSION           = 22.05.8
TaskPlugin              = task/none
TaskPluginParam         = (null type)

Cgroup Support Configuration:
CgroupAutomount         = yes
CgroupMountpoint        = /sys/fs/cgroup
ConstrainCores          = no
ConstrainDevices        = no
ConstrainRAMSpace       = no

Slurmctld(primary) at vm is UP
"""
# 24.11: task/cgroup beside task/affinity, ConstrainDevices=yes on the controller.
SHOW_24_11_CONFINED = """Configuration data as of 2026-12-03T06:00:00
ProctrackType           = proctrack/cgroup
SlurmctldParameters     = (null)
SLURM_VERSION           = 24.11.5
TaskPlugin              = task/cgroup,task/affinity
TaskPluginParam         = (null type)

Cgroup Support Configuration:
CgroupMountpoint        = /sys/fs/cgroup
ConstrainCores          = yes
ConstrainDevices        = yes
CgroupPlugin            = cgroup/v1

MPI Plugins Configuration:
PMIxCliTmpDirBase       = (null)
"""
# 25.11 with no cgroup plugin at all: no "Cgroup Support Configuration" section is printed.
SHOW_25_11_NO_CGROUP = """Configuration data as of 2026-12-03T07:00:00
ProctrackType           = proctrack/linuxproc
SLURM_VERSION           = 25.11.0
TaskPlugin              = task/affinity
"""
CONFINED_CGROUP_CONF = "CgroupPlugin=cgroup/v1\nConstrainCores=yes\nConstrainDevices=yes\n"


def _problem(tmp_path: Path, shown: str, cgroup_conf: str | None) -> str | None:
    (tmp_path / "slurm.conf").write_text("ClusterName=c\n")
    if cgroup_conf is not None:
        (tmp_path / "cgroup.conf").write_text(cgroup_conf)
    return confine.problem(shown, str(tmp_path / "slurm.conf"))


def test_task_none_and_no_constrain_devices_names_both_and_the_fix(tmp_path: Path) -> None:
    why = _problem(tmp_path, SHOW_22_05_TASK_NONE, None)
    assert why is not None
    assert why.startswith("jobs here are not confined to their devices (TaskPlugin is task/none")
    assert f"no {tmp_path}/cgroup.conf, so ConstrainDevices is no" in why
    assert "add TaskPlugin=task/cgroup" in why and "ConstrainDevices=yes" in why
    assert "restart slurmd and slurmctld" in why


def test_a_confined_site_passes(tmp_path: Path) -> None:
    assert _problem(tmp_path, SHOW_24_11_CONFINED, CONFINED_CGROUP_CONF) is None


def test_task_plugin_without_cgroup_section_is_refused(tmp_path: Path) -> None:
    why = _problem(tmp_path, SHOW_25_11_NO_CGROUP, CONFINED_CGROUP_CONF)
    assert why and "TaskPlugin is task/affinity, not task/cgroup" in why
    assert "add TaskPlugin=task/cgroup" in why and "ConstrainDevices=yes (" not in why


def test_only_constrain_devices_missing_asks_only_for_it(tmp_path: Path) -> None:
    why = _problem(tmp_path, SHOW_24_11_CONFINED, "ConstrainCores=yes\n")
    assert why and "does not set ConstrainDevices (Slurm's default: no)" in why
    assert "TaskPlugin" not in why
    assert f"add ConstrainDevices=yes (cgroup.conf beside slurm.conf, here {tmp_path}" in why


@pytest.mark.parametrize(
    ("text", "confined"),
    [
        ("ConstrainDevices=yes\n", True),
        ("constraindevices = YES\n", True),  # keys and booleans: any case; spaces around =
        ("ConstrainDevices=true\n", True),
        ("ConstrainDevices=1\n", True),
        ('ConstrainDevices="yes"\n', True),
        ("ConstrainCores=yes ConstrainDevices=yes  # two pairs, then a comment\n", True),
        ("ConstrainDevices=no\n", False),
        ("ConstrainDevices=maybe\n", False),  # Slurm rejects it; no claim on it
        ("#ConstrainDevices=yes\n", False),
        ("ConstrainCores=yes # ConstrainDevices=yes\n", False),
        ("ConstrainDevices=yes\nConstrainDevices=no\n", False),  # the last one wins
        ("ConstrainDevices=no\nConstrainDevices=yes\n", True),
        ("ConstrainDevicesX=yes\n", False),
        ("", False),
    ],
)
def test_cgroup_conf_read_as_slurm_reads_it(tmp_path: Path, text: str, confined: bool) -> None:
    why = _problem(tmp_path, SHOW_24_11_CONFINED, text)
    assert (why is None) is confined, why


def test_a_controller_that_says_no_is_not_trusted_away(tmp_path: Path) -> None:
    shown = SHOW_24_11_CONFINED.replace("ConstrainDevices        = yes", "ConstrainDevices = no")
    why = _problem(tmp_path, shown, CONFINED_CGROUP_CONF)
    assert why and "slurmctld's cgroup.conf has ConstrainDevices=no" in why


@pytest.mark.parametrize(
    ("value", "has"),
    [("task/cgroup", True), ("cgroup,affinity", True), ("task/affinity, task/cgroup", True),
     ("task/none", False), ("", False), (None, False), ("task/cgroupx", False)],
)  # fmt: skip
def test_task_plugin_names(value: str | None, has: bool) -> None:
    assert confine.has_task_cgroup(value) is has


# --- the site: request, `gpugate isolate check`, selftest ---------------------------------


class ShowConfigCli:
    """The two scontrol answers site_problem asks for."""

    def __init__(self, shown: str) -> None:
        self.shown = shown

    def version(self) -> tuple[int, int]:
        return (24, 11)

    def scontrol(self, *args: str) -> str:
        assert args == ("show", "config")
        return self.shown


class Slurm(FakeSlurm):
    """FakeSlurm whose CLI answers `scontrol show config` with `shown`."""

    fake_cli: ShowConfigCli

    @property
    def cli(self) -> ShowConfigCli:  # type: ignore[override]  # the calls site_problem makes
        return self.fake_cli


@pytest.fixture
def site(tmp_path: Path):
    """A 24.11 node gpugate drained, its files writable, device cgroups there; task/none."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text(
        "ClusterName=c\nGresTypes=gpu\nNodeName=n1 CPUs=2 RealMemory=1000 Gres=gpu:8\n"
    )
    (etc / "gres.conf").write_text(f"AutoDetect=off\nNodeName=n1 Name=gpu File={tmp_path}/nvidia[0-7]\n")  # fmt: skip
    config = gpu_config(tmp_path, etc / "slurm.conf", fake_devices(tmp_path))
    slurm = Slurm([NodeInfo(name=NODE, state="IDLE", flags=("DRAIN",), gres_gpus=8)])
    slurm.fake_cli = ShowConfigCli(SHOW_22_05_TASK_NONE.replace("22.05.8", "24.11.5"))
    return config, slurm, etc


def test_site_problem_refuses_an_unconfined_site_by_name(site) -> None:
    config, slurm, etc = site
    why = apply.site_problem(config, slurm, NODE)
    assert why and "TaskPlugin is task/none" in why and "ConstrainDevices" in why
    (etc / "cgroup.conf").write_text(CONFINED_CGROUP_CONF)
    slurm.fake_cli.shown = SHOW_24_11_CONFINED
    assert apply.site_problem(config, slurm, NODE) is None  # (root here: cgroup.problem passes)


def test_the_hooks_request_keeps_the_drain_and_says_why(site) -> None:
    config, slurm, _etc = site
    ecc = fail("gpu.ecc", "GPU3 volatile uncorrectable ECC 2 (limit 0)", gpu=3)
    gpus = tuple(Gpu(index=i, serial=f"S{i}", minor_number=i) for i in range(8))
    said = apply.request(config, slurm, NODE, [ecc], gpus)
    assert said.startswith("node drained, not isolated: jobs here are not confined")
    assert "TaskPlugin=task/cgroup" in said
    assert state.load_local(config) is None  # nothing requested, nothing started
    assert slurm.resumed == [] and slurm.node(NODE).drained


def test_isolate_check_prints_the_refusal_not_ready(site, monkeypatch, capsys) -> None:
    config, slurm, _etc = site
    monkeypatch.setattr(command, "ask_slurm_for", lambda *a: (config, slurm, slurm.node(NODE)))
    assert command.main(["check", NODE]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "can isolate" not in err
    assert f"{NODE}: cannot isolate here: jobs here are not confined to their devices" in err
    assert "TaskPlugin=task/cgroup" in err and "ConstrainDevices=yes" in err


def test_selftest_reports_the_refusal_as_a_problem(site, monkeypatch) -> None:
    config, slurm, _etc = site
    monkeypatch.setattr(isolatecheck, "CliBackend", lambda *a, **k: slurm)
    note, problems = isolatecheck.check_isolation(config, None, NODE)
    assert note == ""  # never "can take a faulty GPU out of Slurm's service"
    (problem,) = problems
    assert problem.what.startswith(f"isolate.unit is gpu, but {NODE} cannot isolate a GPU: "
                                   "jobs here are not confined to their devices")  # fmt: skip
    assert "TaskPlugin is task/none" in problem.what and "its GPU faults drain the node" in (
        problem.what
    )

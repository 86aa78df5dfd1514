"""`gpugate selftest`: each hook wrapper judged and run as its Slurm user (issue 16)."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import sys
from pathlib import Path

import paths
import pytest

from gpugate.admin import selftest as S
from gpugate.admin.sitecheck import SlurmFacts
from gpugate.cli import main as cli_main
from gpugate.commands import selftest as selftest_command
from gpugate.slurm.records import NodeInfo

sys.path.insert(0, str(paths.SLURM_HARNESS))
from gpugate_site import own_hook_env_only

REPO = paths.ROOT
WRAPPER = REPO / "slurm_hooks" / "gpugate-hook"
GPUGATE = Path(sys.executable).parent / "gpugate"
HEALTHY_FACTS = REPO / "config" / "snapshots" / "h100-healthy.yaml"
STRANGER = S.Account("stranger", 54321, (54321,))  # no such user is needed: bits are judged
ME = getpass.getuser()
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs hooks as another user")


# open_tmp: tests/conftest.py; slow: over 5 s alone (pytest --durations), out of `make test-fast`
pytestmark = [pytest.mark.usefixtures("open_tmp"), pytest.mark.slow]


def _launcher(path: Path, shebang: str) -> Path:
    path.write_text(f"{shebang}\nprint('hi')\n")
    path.chmod(0o755)
    return path


def _site(tmp_path: Path, bin_path: Path | str = GPUGATE, config: str | None = None) -> Path:
    """An installed layout: the five wrappers, hook.env beside them, a config, a slurm.conf."""
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    for hook in S.HOOK_USERS:
        shutil.copy(WRAPPER, libexec / f"gpugate-{hook}")
        (libexec / f"gpugate-{hook}").chmod(0o755)
        own_hook_env_only(libexec / f"gpugate-{hook}")  # never the host's /etc/gpugate/hook.env
    site = tmp_path / "gpugate.yaml"
    default = f"state_dir: {tmp_path / 'state'}\nfacts_file: {HEALTHY_FACTS}\n"
    site.write_text(config if config is not None else default)
    site.chmod(0o644)
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("ClusterName=selftest\n")
    slurm_conf.chmod(0o644)
    (libexec / "hook.env").write_text(
        f"GPUGATE_BIN={bin_path}\nGPUGATE_CONFIG={site}\nSLURM_CONF={slurm_conf}\n"
        f"GPUGATE_CACHE_DIR={tmp_path / 'cache'}\n"  # the hooks' env is clean: not the host's cache
    )
    return libexec


# A running Slurm that gives gpugate what it needs: the site checks pass.
HEALTHY = SlurmFacts(
    conf={
        "SlurmUser": f"{ME}(0)",
        "JobRequeue": "1",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SchedulerParameters": "nohold_on_prolog_fail",
    },
    bare_path="/etc/slurm/slurm.conf",
    nodes=(NodeInfo(name="n1", state="IDLE", partitions=("gpu",), gres_gpus=8),),
    partitions=("gpu",),
    default_partition="gpu",
)


def _host(tmp_path: Path) -> S.Host:
    """Neither this host's Slurm nor its /etc/gpugate: the tests give the facts and files."""
    return S.Host(hook_env=str(tmp_path / "no-system-hook.env"),
                  config=str(tmp_path / "no-system-gpugate.yaml"),
                  gather_slurm=lambda slurm_conf: HEALTHY)  # fmt: skip


def _command(tmp_path: Path, *args: str) -> int:
    """`gpugate selftest ARGS` on this test's host (_host)."""
    return selftest_command.main(list(args), host=_host(tmp_path))


def _selftest(
    libexec: Path, tmp_path: Path, slurm: SlurmFacts = HEALTHY, **users: str
) -> dict[str, S.HookReport]:
    roles = {"root": ME, "job": ME, "slurm": ME, **users}
    reports = S.selftest(str(libexec), roles, node="n1", slurm=slurm, host=_host(tmp_path))
    return {r.hook: r for r in reports}


def _whats(report: S.HookReport) -> str:
    return "\n".join(p.what for p in report.problems)


# --- the facts ---------------------------------------------------------------------------


def test_denied_judges_the_bits_of_the_users_class(tmp_path):
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    inside = private / "python3"
    inside.write_text("")
    inside.chmod(0o755)
    assert "is closed to stranger" in S.denied(str(inside), STRANGER, 1)
    private.chmod(0o701)
    assert S.denied(str(inside), STRANGER, 1) is None
    inside.chmod(0o750)
    assert "mode 0750" in S.denied(str(inside), STRANGER, 1)
    if os.geteuid() == 0:  # a group of its own for the file, to judge the group's bits
        os.chown(private, -1, 54322)
        os.chown(inside, -1, 54322)
        member = S.Account("member", 54321, (54321, 54322))
        assert "home is closed to member" in S.denied(str(inside), member, 1)
        private.chmod(0o710)
        assert S.denied(str(inside), member, 1) is None
    assert "no such file" in S.denied(str(tmp_path / "gone"), STRANGER, 4)


def test_denied_follows_a_link_into_a_closed_directory(tmp_path):
    private = tmp_path / "root-home"
    private.mkdir(mode=0o700)
    (private / "python3").write_text("")
    (private / "python3").chmod(0o755)
    link = tmp_path / "python3"
    link.symlink_to(private / "python3")
    assert f"{private} is closed to stranger" in S.denied(str(link), STRANGER, 1)


@pytest.mark.parametrize(
    ("first", "program"),
    [
        ("#!/opt/gpugate/venv/bin/python3 -Es", "/opt/gpugate/venv/bin/python3"),
        ("#! /usr/bin/python3", "/usr/bin/python3"),
        ("#!/usr/bin/env python3", "python3"),
        ("#!/usr/bin/env -S python3 -Es", "python3"),
        ("import sys", None),
    ],
)
def test_the_interpreter_of_a_launcher(tmp_path, first, program):
    assert S.interpreter(str(_launcher(tmp_path / "gpugate", first))) == program


def _env_file(path: Path, text: str, mode: int = 0o644) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_hook_env_is_read_as_the_wrapper_reads_it(tmp_path):
    """Plain and `export` lines, quotes, `case $hook`: the values gpugate would get."""
    env = _env_file(
        tmp_path / "hook.env",
        "# a comment\nGPUGATE_BIN='/opt/x/gpugate'\nexport GPUGATE_CACHE_DIR=/c\n"
        'SITE_NOTE="two words"\n'
        "case $hook in health | epilog-slurmctld) SLURM_CONF=/ctl/slurm.conf ;; esac\n",
    )
    values, error = S.read_hook_env([env], "health")
    assert error == ""
    assert values == {
        "GPUGATE_BIN": "/opt/x/gpugate",
        "GPUGATE_CACHE_DIR": "/c",
        "SITE_NOTE": "two words",
        "SLURM_CONF": "/ctl/slurm.conf",
    }
    assert "SLURM_CONF" not in S.read_hook_env([env], "prolog")[0]


def test_hook_env_beside_the_wrappers_wins(tmp_path):
    system = _env_file(tmp_path / "system.env", "SLURM_CONF=/a\nGPUGATE_BIN=/bin/a\n")
    beside = _env_file(tmp_path / "hook.env", "SLURM_CONF=/b\n")
    values, _ = S.read_hook_env([system, str(tmp_path / "absent.env"), beside])
    assert values == {"SLURM_CONF": "/b", "GPUGATE_BIN": "/bin/a"}


def test_hook_env_is_read_with_a_clean_environment(tmp_path, monkeypatch):
    """No Slurm variable of the admin's shell leaks in: the hooks get none from it either."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.setenv("SLURM_CONF", "/from/the/shell")
    env = _env_file(
        tmp_path / "hook.env", "case $SLURMD_NODENAME in n1) X=n1 ;; *) X=none ;; esac\n"
    )
    assert S.read_hook_env([env]) == ({"X": "none"}, "")


def test_a_hook_env_that_stops_the_shell(tmp_path):
    env = _env_file(tmp_path / "hook.env", "SLURM_CONF=/x\nif then fi (\n")
    values, error = S.read_hook_env([env])
    assert values == {} and error  # the shell's own word for it


def test_a_hook_env_others_may_write_is_never_run(tmp_path):
    ran = tmp_path / "ran"
    env = _env_file(tmp_path / "hook.env", f"touch {ran}\nX=1\n", 0o666)
    assert S.read_hook_env([env]) == ({}, "")
    assert not ran.exists()


# --- the checks --------------------------------------------------------------------------


def test_a_launcher_whose_interpreter_the_user_may_not_run(tmp_path):
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    python = _launcher(private / "python3", "#!/bin/sh")
    launcher = _launcher(tmp_path / "gpugate", f"#!{python} -Es")
    (problem,) = S.check_launcher(str(launcher), STRANGER)
    assert f"interpreter {python} is not executable for stranger" in problem.what
    assert "virtualenv" in problem.fix
    private.chmod(0o701)
    assert S.check_launcher(str(launcher), STRANGER) == []


def test_a_launcher_whose_interpreter_is_missing(tmp_path):
    launcher = _launcher(tmp_path / "gpugate", "#!/usr/bin/env gpugate-no-such-python3")
    (problem,) = S.check_launcher(str(launcher), STRANGER)
    assert "gpugate-no-such-python3 is not on the hooks' PATH" in problem.what


def test_a_hook_env_others_may_write(tmp_path):
    env = tmp_path / "hook.env"
    env.write_text("GPUGATE_BIN=/x\n")
    env.chmod(0o664)
    (problem,) = S.check_hook_env([str(env), str(tmp_path / "absent.env")])
    assert "is not root's own" in problem.what and f"chmod 0644 {env}" in problem.fix
    env.chmod(0o644)
    assert len(S.check_hook_env([str(env)])) == (0 if os.geteuid() == 0 else 1)  # root's own?


def test_a_state_dir_closed_to_the_job_user(tmp_path):
    state = tmp_path / "state"
    assert S.check_state_dir(str(state), "task-prolog", STRANGER) == []  # not there yet
    state.mkdir(mode=0o750)
    (problem,) = S.check_state_dir(str(state), "task-prolog", STRANGER)
    assert "not traversable by the job user stranger" in problem.what
    assert f"chmod o+x {state}" in problem.fix
    state.chmod(0o751)
    assert S.check_state_dir(str(state), "task-prolog", STRANGER) == []


class _Config:
    def __init__(self, group: str | None) -> None:
        self.epilog = type("E", (), {"evidence_group": group})()


def test_epilog_slurmctld_needs_slurm_conf(tmp_path):
    env = {"SLURM_CONF": str(tmp_path / "slurm.conf")}
    (problem,) = S.check_slurmctld(env, _Config(None), STRANGER, HEALTHY)
    assert f"cannot read SLURM_CONF={tmp_path / 'slurm.conf'} in hook.env" in problem.what
    assert "SLURM_CONF=/path/to/slurm.conf (the one slurmctld reads) in /etc/gpugate/hook.env" in (
        problem.fix
    )
    assert "export" not in problem.fix  # the one documented spelling
    (tmp_path / "slurm.conf").write_text("")
    (tmp_path / "slurm.conf").chmod(0o644)
    assert S.check_slurmctld(env, _Config(None), STRANGER, HEALTHY) == []


def test_epilog_slurmctld_reads_the_slurm_conf_found_without_slurm_conf(tmp_path):
    """No SLURM_CONF in hook.env: the file scontrol finds without one must be readable."""
    conf = tmp_path / "private" / "slurm.conf"
    conf.parent.mkdir(mode=0o700)
    conf.write_text("")
    facts = SlurmFacts(conf=HEALTHY.conf, bare_path=str(conf))
    (problem,) = S.check_slurmctld({}, _Config(None), STRANGER, facts)
    assert f"cannot read {conf}, which scontrol reads without SLURM_CONF" in problem.what
    conf.parent.chmod(0o711)
    conf.chmod(0o644)
    assert S.check_slurmctld({}, _Config(None), STRANGER, facts) == []


def test_evidence_group_must_exist(tmp_path):
    """The controller reads only the decision records: the group is the node epilog's chgrp."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    conf.chmod(0o644)
    env = {"SLURM_CONF": str(conf)}
    (problem,) = S.check_slurmctld(env, _Config("gpugate-no-such-group"), STRANGER, HEALTHY)
    assert "is no group on this host" in problem.what
    assert S.check_slurmctld(env, _Config("root"), STRANGER, HEALTHY) == []  # not a member


# --- the hooks in selftest mode, and the whole run ------------------------------------------


@pytest.mark.parametrize("hook", ["prolog", "epilog", "health", "epilog-slurmctld", "task-prolog"])
def test_a_hook_in_selftest_mode_takes_no_action(tmp_path, monkeypatch, capsys, hook):
    site = tmp_path / "site.yaml"
    site.write_text(f"state_dir: {tmp_path / 'state'}\nfacts_file: {HEALTHY_FACTS}\n")
    monkeypatch.setenv("GPUGATE_SELFTEST", "1")
    monkeypatch.setenv("SLURM_JOB_ID", S.FAKE_JOB_ID)
    assert cli_main([hook, "--config", str(site)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and f"gpugate {hook}: selftest ok" in err
    assert not (tmp_path / "state").exists()  # nothing written, nothing drained


@pytest.mark.parametrize("hook", ["prolog", "epilog", "health"])
def test_a_hook_in_selftest_mode_gathers_as_it_would(tmp_path, monkeypatch, capsys, hook):
    # The first hour: facts_file names {node}, and no file is there for Slurm's node name.
    # The real prolog fails inside gpugate and (prolog.on_error: allow) runs every job.
    site = tmp_path / "site.yaml"
    site.write_text(f"state_dir: {tmp_path / 'state'}\nfacts_file: {tmp_path}/{{node}}.yaml\n")
    monkeypatch.setenv("GPUGATE_SELFTEST", "1")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-07")
    assert cli_main([hook, "--config", str(site)]) == 1
    err = capsys.readouterr().err
    assert "selftest ok" not in err
    assert f"cannot gather node gpu-07's facts (facts_file {tmp_path}/gpu-07.yaml" in err
    shutil.copy(HEALTHY_FACTS, tmp_path / "gpu-07.yaml")
    assert cli_main([hook, "--config", str(site)]) == 0


def test_a_failed_facts_source_is_no_ok(tmp_path):
    from gpugate.commands import guarded

    (tmp_path / "site.yaml").write_text(f"state_dir: {tmp_path / 'state'}\n")
    config = guarded.load_config(str(tmp_path / "site.yaml"))
    said = guarded.facts_problem(config, gather=lambda *a, **k: _Failed()) or ""
    assert "facts source(s) failed on node" in said and "nvml: NvmlUnavailable" in said


class _Failed:
    source_errors = {"nvml": "NvmlUnavailable: libnvidia-ml.so.1 not found"}


def test_selftest_reports_the_missing_facts_file_with_its_fix(tmp_path):
    libexec = _site(tmp_path, config=f"state_dir: {tmp_path / 'state'}\n"
                    f"facts_file: {tmp_path}/{{node}}.yaml\n")  # fmt: skip
    reports = S.selftest(str(libexec), {"root": ME, "job": ME, "slurm": ME},
                         slurm=HEALTHY, node="n1", host=_host(tmp_path))  # fmt: skip
    for hook in ("prolog", "epilog", "health"):
        assert reports[list(S.HOOK_USERS).index(hook)].status == "broken"
        problem = reports[list(S.HOOK_USERS).index(hook)].problems[-1]
        assert f"{tmp_path}/n1.yaml" in problem.what and "selftest --node NAME" in problem.fix
    assert {r.hook: r.status for r in reports}["task-prolog"] == "ok"


def test_a_hook_in_selftest_mode_reports_a_broken_config(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site.yaml"
    site.write_text("no_such_key: 1\n")
    monkeypatch.setenv("GPUGATE_SELFTEST", "1")
    assert cli_main(["epilog", "--config", str(site)]) == 2
    assert "selftest: config unusable" in capsys.readouterr().err


def test_a_healthy_install_is_all_ok(tmp_path):
    reports = _selftest(_site(tmp_path), tmp_path)
    assert {h: (r.status, r.problems) for h, r in reports.items()} == {
        h: ("ok", []) for h in [*S.HOOK_USERS, "site"]
    }
    assert not (tmp_path / "state").exists()


def test_a_missing_interpreter_breaks_every_hook(tmp_path):
    launcher = _launcher(tmp_path / "gpugate", f"#!{tmp_path}/venv/bin/python3 -Es")
    reports = _selftest(_site(tmp_path, launcher), tmp_path)
    assert reports.pop("site").status == "ok"  # Slurm's settings are not the launcher's
    for report in reports.values():
        assert report.status == "broken"
        whats = _whats(report)
        assert f"interpreter {tmp_path}/venv/bin/python3 is not executable" in whats
        assert "job allowed" in whats  # the wrapper's own word, from the run


def test_an_unusable_config_and_a_missing_wrapper(tmp_path):
    libexec = _site(tmp_path, config="no_such_key: 1\n")
    (libexec / "gpugate-health").unlink()
    reports = _selftest(libexec, tmp_path)
    assert reports["health"].status == "skipped" and "not installed" in reports["health"].note
    assert "config unusable" in _whats(reports["prolog"])
    assert "selftest: config unusable" in _whats(reports["prolog"])  # the hook said so too


def test_the_command_json_and_exit_codes(tmp_path, capsys):
    libexec = _site(tmp_path)
    args = ["--hooks-dir", str(libexec), "--user", ME, "--slurm-user", ME, "--json", "--node",
            "n1"]  # fmt: skip
    assert _command(tmp_path, *args) == 0
    report = json.loads(capsys.readouterr().out)
    assert [h["hook"] for h in report["hooks"]] == list(S.HOOK_USERS)
    assert _command(tmp_path, "--hooks-dir", str(tmp_path / "nowhere")) == 2
    assert "is no directory" in capsys.readouterr().err


def test_the_text_report_names_problem_and_fix(tmp_path, capsys):
    launcher = _launcher(tmp_path / "gpugate", "#!/nonexistent/python3")
    libexec = _site(tmp_path, launcher)
    assert _command(tmp_path, "--hooks-dir", str(libexec), "--user", ME, "--slurm-user", ME) == 1
    out = capsys.readouterr().out
    assert "prolog" in out and "broken" in out and "fix: " in out and "would break" in out


# --- as the job's user (root only) ---------------------------------------------------------


@as_root
def test_the_task_prolog_as_an_ordinary_user(tmp_path):
    """The bug of issue 16: an interpreter inside a home only root may enter."""
    from e2e import gpugate_for_job_user
    from localslurm import JOB_USER, ensure_user, open_path

    ensure_user()
    open_path(tmp_path)
    private = tmp_path / "root-home"
    private.mkdir(mode=0o700)
    python = private / "python3"
    # A Python the job user can run and a copy of gpugate it can read: this checkout and its
    # interpreter may be out of that user's reach themselves (issue 40).
    reachable, env = gpugate_for_job_user()
    python.symlink_to(reachable)
    launcher = tmp_path / "gpugate"  # gpugate, run by that python from the readable copy
    body = f"import sys\nsys.path.insert(0, {env['PYTHONPATH']!r})\n"
    launcher.write_text(f"#!{python}\n{body}from gpugate.cli import main\nsys.exit(main())\n")
    launcher.chmod(0o755)
    libexec = _site(tmp_path, launcher)
    reports = _selftest(libexec, tmp_path, root="root", job=JOB_USER)
    assert reports["prolog"].status == "ok", reports["prolog"].problems
    task = reports["task-prolog"]
    assert task.status == "broken" and task.user == JOB_USER
    assert f"interpreter {python} is not executable for {JOB_USER}" in _whats(task)
    ran = task.problems[-1].what  # the wrapper's own word, run as the user
    assert f"task-prolog: {python} is not executable for {JOB_USER}" in ran
    private.chmod(0o701)
    again = _selftest(libexec, tmp_path, root="root", job=JOB_USER)
    assert again["task-prolog"].status == "ok", again["task-prolog"].problems


def test_a_hook_env_the_job_user_cannot_read(tmp_path):
    """An admin's `chmod 0600 hook.env`: the TaskProlog's `.` stops the wrapper, the job fails."""
    env = _env_file(tmp_path / "hook.env", "GPUGATE_BIN=/x\n", 0o600)
    (problem,) = S.check_hook_env_readable([env, str(tmp_path / "absent.env")], "task-prolog",
                                           STRANGER)  # fmt: skip
    assert f"{env} is not readable by stranger, who runs task-prolog" in problem.what
    assert problem.fix.startswith(f"chmod 0644 {env}")
    os.chmod(env, 0o644)
    assert S.check_hook_env_readable([env], "task-prolog", STRANGER) == []

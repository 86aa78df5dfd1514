"""`gpugate selftest`: each hook wrapper judged and run as its Slurm user (issue 16)."""

from __future__ import annotations

import functools
import getpass
import json
import os
import shutil
import site
import sys
from pathlib import Path

import pytest

from gpugate.admin import selftest as S
from gpugate.cli import main as cli_main
from gpugate.runner import CommandResult

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))
from gpugate_site import own_hook_env_only

REPO = Path(__file__).resolve().parent.parent
WRAPPER = REPO / "slurm_hooks" / "gpugate-hook"
GPUGATE = Path(sys.executable).parent / "gpugate"
STRANGER = S.Account("stranger", 54321, (54321,))  # no such user is needed: bits are judged
ME = getpass.getuser()
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs hooks as another user")


@pytest.fixture(autouse=True)
def _open_tmp(tmp_path):
    """pytest's tmp dirs are 0700: open them to be traversed, as an install's directories are."""
    for directory in (tmp_path, *tmp_path.parents):
        mode = directory.stat().st_mode
        if not mode & 0o001 and directory.stat().st_uid == os.geteuid():
            directory.chmod((mode & 0o7777) | 0o001)


def _launcher(path: Path, shebang: str) -> Path:
    path.write_text(f"{shebang}\nprint('hi')\n")
    path.chmod(0o755)
    return path


@pytest.fixture(autouse=True)
def _nothing_of_the_hosts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`gpugate selftest` reads /etc/gpugate/hook.env and gpugate.yaml: not the host's here."""
    none = str(tmp_path / "no-system-files")
    monkeypatch.setattr(S, "selftest", functools.partial(S.selftest, system_hook_env=none))
    monkeypatch.setattr(S, "DEFAULT_CONFIG", none)


def _site(tmp_path: Path, bin_path: Path | str = GPUGATE, config: str | None = None) -> Path:
    """An installed layout: the five wrappers, hook.env beside them, a config, a slurm.conf."""
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    for hook in S.HOOK_USERS:
        shutil.copy(WRAPPER, libexec / f"gpugate-{hook}")
        (libexec / f"gpugate-{hook}").chmod(0o755)
        own_hook_env_only(libexec / f"gpugate-{hook}")  # never the host's /etc/gpugate/hook.env
    site = tmp_path / "gpugate.yaml"
    site.write_text(config if config is not None else f"state_dir: {tmp_path / 'state'}\n")
    site.chmod(0o644)
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("ClusterName=selftest\n")
    slurm_conf.chmod(0o644)
    (libexec / "hook.env").write_text(
        f"GPUGATE_BIN={bin_path}\nGPUGATE_CONFIG={site}\nSLURM_CONF={slurm_conf}\n"
        f"GPUGATE_CACHE_DIR={tmp_path / 'cache'}\n"  # the hooks' env is clean: not the host's cache
    )
    return libexec


def _selftest(libexec: Path, tmp_path: Path, **users: str) -> dict[str, S.HookReport]:
    roles = {"root": ME, "job": ME, "slurm": ME, **users}
    reports = S.selftest(str(libexec), roles, system_hook_env=str(tmp_path / "none.env"))
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


def test_hook_env_lines(tmp_path):
    env = tmp_path / "hook.env"
    env.write_text(
        "# a comment\nGPUGATE_BIN='/opt/x/gpugate'\nexport SLURM_CONF=/etc/s.conf\nnonsense\n"
    )
    assert S.read_hook_env(str(env)) == {
        "GPUGATE_BIN": "/opt/x/gpugate",
        "SLURM_CONF": "/etc/s.conf",
    }


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
    (problem,) = S.check_slurmctld(env, _Config(None), STRANGER)
    assert f"cannot read SLURM_CONF={tmp_path / 'slurm.conf'} in hook.env" in problem.what
    assert "SLURM_CONF=/path/to/slurm.conf in /etc/gpugate/hook.env" in problem.fix
    (tmp_path / "slurm.conf").write_text("")
    (tmp_path / "slurm.conf").chmod(0o644)
    assert S.check_slurmctld(env, _Config(None), STRANGER) == []


def test_evidence_group_must_hold_slurm_user(tmp_path):
    import grp

    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    conf.chmod(0o644)
    env = {"SLURM_CONF": str(conf)}
    # A group that owns none of the directories on the way (their group bits would apply).
    theirs = {os.stat(p).st_gid for p in (conf, *conf.parents)}
    group, gid = next((g.gr_name, g.gr_gid) for g in grp.getgrall() if g.gr_gid not in theirs)
    (problem,) = S.check_slurmctld(env, _Config(group), STRANGER)
    assert f"not in epilog.evidence_group {group!r}" in problem.what
    assert problem.fix == f"usermod -aG {group} stranger"
    member = S.Account("slurm", 54321, (54321, gid))
    assert S.check_slurmctld(env, _Config(group), member) == []
    (problem,) = S.check_slurmctld(env, _Config("gpugate-no-such-group"), member)
    assert "is no group on this host" in problem.what


def test_slurm_user_from_scontrol(monkeypatch):
    out = "Configuration data as of ...\nSlurmctldPort = 6817\nSlurmUser               = slurm(64030)\n"
    done = CommandResult(argv=("scontrol",), status="ok", returncode=0, stdout=out)
    monkeypatch.setattr(S, "run", lambda argv, timeout: done)
    assert S.slurm_user() == "slurm"
    monkeypatch.setattr(S, "run", lambda argv, timeout: CommandResult(argv=(), status="missing"))
    assert S.slurm_user() is None


# --- the hooks in selftest mode, and the whole run ------------------------------------------


@pytest.mark.parametrize("hook", ["prolog", "epilog", "health", "epilog-slurmctld", "task-prolog"])
def test_a_hook_in_selftest_mode_takes_no_action(tmp_path, monkeypatch, capsys, hook):
    site = tmp_path / "site.yaml"
    site.write_text(f"state_dir: {tmp_path / 'state'}\n")
    monkeypatch.setenv("GPUGATE_SELFTEST", "1")
    monkeypatch.setenv("SLURM_JOB_ID", S.FAKE_JOB_ID)
    assert cli_main([hook, "--config", str(site)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and f"gpugate {hook}: selftest ok" in err
    assert not (tmp_path / "state").exists()  # nothing written, nothing drained


def test_a_hook_in_selftest_mode_reports_a_broken_config(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site.yaml"
    site.write_text("no_such_key: 1\n")
    monkeypatch.setenv("GPUGATE_SELFTEST", "1")
    assert cli_main(["epilog", "--config", str(site)]) == 2
    assert "selftest: config unusable" in capsys.readouterr().err


def test_a_healthy_install_is_all_ok(tmp_path):
    reports = _selftest(_site(tmp_path), tmp_path)
    assert {h: (r.status, r.problems) for h, r in reports.items()} == {
        h: ("ok", []) for h in S.HOOK_USERS
    }
    assert not (tmp_path / "state").exists()


def test_a_missing_interpreter_breaks_every_hook(tmp_path):
    launcher = _launcher(tmp_path / "gpugate", f"#!{tmp_path}/venv/bin/python3 -Es")
    reports = _selftest(_site(tmp_path, launcher), tmp_path)
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
    args = ["selftest", "--hooks-dir", str(libexec), "--user", ME, "--slurm-user", ME, "--json"]
    assert cli_main(args) in (0, 1)  # 0 as root; without root, hook files are not root's own
    report = json.loads(capsys.readouterr().out)
    assert [h["hook"] for h in report["hooks"]] == list(S.HOOK_USERS)
    assert cli_main(["selftest", "--hooks-dir", str(tmp_path / "nowhere")]) == 2
    assert "is no directory" in capsys.readouterr().err


def test_the_text_report_names_problem_and_fix(tmp_path, capsys):
    launcher = _launcher(tmp_path / "gpugate", "#!/nonexistent/python3")
    libexec = _site(tmp_path, launcher)
    assert (
        cli_main(["selftest", "--hooks-dir", str(libexec), "--user", ME, "--slurm-user", ME]) == 1
    )
    out = capsys.readouterr().out
    assert "prolog" in out and "broken" in out and "fix: " in out and "would break" in out


# --- as the job's user (root only) ---------------------------------------------------------


@as_root
def test_the_task_prolog_as_an_ordinary_user(tmp_path):
    """The bug of issue 16: an interpreter inside a home only root may enter."""
    sys.path.insert(0, str(REPO / "tests" / "slurm"))
    from localslurm import JOB_USER, ensure_user, open_path

    ensure_user()
    open_path(tmp_path)
    private = tmp_path / "root-home"
    private.mkdir(mode=0o700)
    python = private / "python3"
    python.symlink_to(os.path.realpath(sys.executable))
    launcher = tmp_path / "gpugate"  # gpugate, run by that python from this checkout
    # The venv's .pth files map gpugate's packages (addsitedir reads them).
    body = f"import site, sys\nfor d in {site.getsitepackages()!r}:\n    site.addsitedir(d)\n"
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

"""selftest names the Slurm backend the hooks' `slurm.backend` gives, or why it cannot (issue 29)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError

from gpugate.admin.backendcheck import check_backend
from gpugate.runner import CommandResult


class Runner:
    """scontrol --version says 22.05.8; `import pyslurm` in the child exits `probe_rc`."""

    def __init__(self, probe_rc: int = 0) -> None:
        self.probe_rc = probe_rc
        self.envs: list[dict | None] = []

    def __call__(self, argv, timeout, env=None, stdin=None) -> CommandResult:
        self.envs.append(env)
        if argv[:2] == ["scontrol", "--version"]:
            return CommandResult(
                argv=tuple(argv), status="ok", returncode=0, stdout="slurm-wlm 22.05.8\n"
            )
        rc = self.probe_rc
        status = "ok" if rc == 0 else "nonzero"
        return CommandResult(
            argv=tuple(argv), status=status, returncode=rc, stderr="fatal: no conf"
        )


def missing(name: str) -> str:
    raise PackageNotFoundError(name)


def test_cli_is_named_and_nothing_probed() -> None:
    runner = Runner()
    note, problems = check_backend("cli", "/etc/slurm/slurm.conf", runner, missing)
    assert (note, problems, runner.envs) == ("slurm backend: cli (the command-line backend was "
                                             "asked for)", [], [])  # fmt: skip


def test_auto_takes_a_matching_pyslurm_probed_with_the_hooks_slurm_conf() -> None:
    runner = Runner()
    note, problems = check_backend("auto", "/site/slurm.conf", runner, lambda _: "22.5.3")
    assert problems == [] and note.startswith("slurm backend: pyslurm (")
    assert all(env and env["SLURM_CONF"] == "/site/slurm.conf" for env in runner.envs)


def test_auto_falls_back_and_says_why() -> None:
    note, problems = check_backend("auto", None, Runner(), lambda _: "24.11.0")
    assert problems == []
    assert (
        note
        == "slurm backend: cli (pyslurm 24.11.0 does not match Slurm (22, 5) (X.Y must be equal))"
    )


def test_pyslurm_asked_for_but_unusable_is_a_problem_with_the_fix() -> None:
    note, problems = check_backend("pyslurm", None, Runner(probe_rc=1), lambda _: "22.5.3")
    assert note == ""
    (problem,) = problems
    assert "slurm.backend pyslurm: the hooks cannot use it here" in problem.what
    assert "`import pyslurm` failed" in problem.what and "slurm.backend: auto" in problem.fix

"""selftest names the Slurm backend the hooks' `slurm.backend` gives, or why it cannot (issue 29)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError

from gpugate.admin.backendcheck import check_backend
from gpugate.runner import CommandResult


class Runner:
    """scontrol --version says 22.05.8; `import pyslurm` in the child exits `probe_rc`."""

    def __init__(
        self, probe_rc: int = 0, version: str = "slurm-wlm 22.05.8\n", version_rc: int = 0
    ) -> None:
        self.probe_rc = probe_rc
        self.version = version
        self.version_rc = version_rc
        self.envs: list[dict | None] = []

    def __call__(self, argv, timeout, env=None, stdin=None) -> CommandResult:
        self.envs.append(env)
        if argv[:2] == ["scontrol", "--version"]:
            if self.version_rc:
                return CommandResult(argv=tuple(argv), status="nonzero",
                                     returncode=self.version_rc, stderr="no slurm.conf")  # fmt: skip
            return CommandResult(argv=tuple(argv), status="ok", returncode=0, stdout=self.version)
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
        == "slurm backend: cli (pyslurm 24.11.0 does not match Slurm 22.05 (X.Y must be equal): "
        "the scontrol/sinfo command line is used)"
    )


def test_auto_on_a_slurm_newer_than_any_pyslurm_says_so_and_uses_the_cli() -> None:
    # Slurm 26.05 (Debian sid): no pyslurm release exists to build, so selftest must not read
    # as "install pyslurm"; the hooks' own choice asked Slurm nothing.
    runner = Runner(version="slurm-wlm 26.05.5\n")
    note, problems = check_backend("auto", "/site/slurm.conf", runner, missing)
    assert problems == []
    assert note == (
        "slurm backend: cli (pyslurm is not installed: the scontrol/sinfo command line is used; "
        "pyslurm has no release for Slurm 26.05 (the newest gpugate knows of is 25.11))"
    )
    (env,) = runner.envs  # one `scontrol --version`, with the hooks' slurm.conf
    assert env and env["SLURM_CONF"] == "/site/slurm.conf"


def test_auto_without_pyslurm_on_a_slurm_that_has_one_names_the_release() -> None:
    note, _ = check_backend("auto", None, Runner(), missing)
    assert note.endswith("; pyslurm 22.5.x is the release for this Slurm)")


def test_auto_without_pyslurm_when_slurm_cannot_say_its_version() -> None:
    note, _ = check_backend("auto", None, Runner(version_rc=1), missing)
    assert note.endswith("is used; Slurm's version is unknown)")


def test_pyslurm_asked_for_but_unusable_is_a_problem_with_the_fix() -> None:
    note, problems = check_backend("pyslurm", None, Runner(probe_rc=1), lambda _: "22.5.3")
    assert note == ""
    (problem,) = problems
    assert "slurm.backend pyslurm: the hooks cannot use it here" in problem.what
    assert "`import pyslurm` failed" in problem.what and "slurm.backend: auto" in problem.fix

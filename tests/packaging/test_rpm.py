"""The RPM (packaging/rpm): built once by build.sh, then queried and unpacked into a scratch root.

The unpacked launcher runs with the system python3 and an environment that knows nothing of
this checkout, as slurmd would run it on a RHEL node. Skipped where rpmbuild, rpm2cpio or
cpio are missing (Debian packages `rpm`, `rpm2cpio`, `cpio`); the build needs PyPI.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import paths
import pytest
from versions import VERSION_RE

from gpugate.config import load_config

pytestmark = pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`

REPO = str(paths.ROOT)
BUILD_SH = os.path.join(REPO, "packaging", "rpm", "build.sh")
SYSTEM_PYTHON = "/usr/bin/python3"  # the launcher's #!: what the nodes run
HOOKS = (
    "gpugate-prolog",
    "gpugate-epilog",
    "gpugate-task-prolog",
    "gpugate-epilog-slurmctld",
    "gpugate-health",
)
CONFIG_FILES = {"/etc/gpugate/gpugate.yaml", "/etc/gpugate/hook.env"}


def run(argv: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Run a command (argument list, timeout), capturing its output as text."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def rpm_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Build the RPM once for this module, in a private build and dist directory."""
    missing = [tool for tool in ("rpmbuild", "rpm", "rpm2cpio", "cpio") if not shutil.which(tool)]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed (Debian: apt-get install rpm rpm2cpio cpio)"
        )
    base = tmp_path_factory.mktemp("rpm")
    env = dict(
        os.environ,
        PYTHON=sys.executable,  # has pip: the running test environment
        BUILD_DIR=str(base / "build"),
        DIST_DIR=str(base / "dist"),
    )
    result = run([BUILD_SH], timeout=600, env=env, cwd=REPO)
    if result.returncode != 0:
        pytest.fail(f"build.sh failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    path = result.stdout.strip().splitlines()[-1]  # build.sh prints the package last
    assert os.path.isfile(path) and path.endswith(".noarch.rpm"), result.stdout
    return path


@pytest.fixture(scope="module")
def root(rpm_file: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The package unpacked into a scratch root: rpm2cpio PKG | cpio -idm."""
    target = str(tmp_path_factory.mktemp("root"))
    pipe = subprocess.PIPE
    with subprocess.Popen(["rpm2cpio", rpm_file], stdout=pipe) as rpm2cpio:
        with subprocess.Popen(
            ["cpio", "-idm", "--quiet"], stdin=rpm2cpio.stdout, stderr=pipe, cwd=target
        ) as cpio:
            # Only cpio reads the pipe now: if it dies, rpm2cpio gets SIGPIPE instead of blocking.
            rpm2cpio.stdout.close()
            try:
                _, err = cpio.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                cpio.kill()
                rpm2cpio.kill()
                raise
        assert cpio.returncode == 0, err
        assert rpm2cpio.wait(timeout=60) == 0
    return target


def query(rpm_file: str, *args: str) -> str:
    """`rpm -qp ARGS PKG`'s output."""
    result = run(["rpm", "-qp", *args, rpm_file])
    assert result.returncode == 0, result.stderr
    return result.stdout


def clean_env(tmp_path, **extra: str) -> dict[str, str]:
    """What slurmd gives a hook, more or less: no trace of this checkout or its virtualenv."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C"}
    env["GPUGATE_CACHE_DIR"] = ""  # no parsed-YAML cache: never /var/cache/gpugate from a test
    env.update(extra)
    return env


# --- the package's metadata ---------------------------------------------------------------


def test_noarch_and_the_builds_version(rpm_file):
    name, version, arch = query(rpm_file, "--queryformat", "%{NAME} %{VERSION} %{ARCH}").split()
    assert (name, arch) == ("gpugate", "noarch") and re.fullmatch(VERSION_RE, version), version
    assert "gpugate config check" in run(["rpm", "-qp", "--scripts", rpm_file]).stdout


def test_file_list(rpm_file):
    files = set(query(rpm_file, "-l").splitlines())
    expected = {
        "/opt/gpugate/bin/gpugate",
        "/usr/bin/gpugate",
        "/opt/gpugate/lib/gpugate/cli.py",
        "/opt/gpugate/lib/gpugate/config/gpugate.yaml",
        "/opt/gpugate/lib/gpugate/config/snapshots/h100-healthy.yaml",
        "/opt/gpugate/lib/yaml/__init__.py",
        "/opt/gpugate/lib/loguru/__init__.py",
        "/opt/gpugate/lib/pynvml.py",
        *CONFIG_FILES,
        "/var/lib/gpugate",
        "/var/lib/gpugate/evidence",
        "/var/lib/gpugate/controller",
        "/var/lib/gpugate/nccl",
        "/usr/share/doc/gpugate/README.md",
        "/usr/share/doc/gpugate/slurm.conf.example",
        "/usr/share/gpugate/job_submit.lua",
        "/usr/share/gpugate/grafana/gpugate.json",
        *(f"/usr/libexec/gpugate/{hook}" for hook in HOOKS),
    }
    if os.path.exists(os.path.join(REPO, "config", "gpugate-alerts.yml")):
        expected.add("/usr/share/doc/gpugate/gpugate-alerts.yml")
    for sbatch in os.listdir(os.path.join(REPO, "examples")):
        if sbatch.endswith(".sbatch"):
            expected.add(f"/usr/share/doc/gpugate/examples/{sbatch}")
    assert expected <= files, sorted(expected - files)
    # noarch: nothing compiled; no bytecode of the build host's Python.
    assert not [f for f in files if re.search(r"\.(so|pyd|pyc)$|\.so\.|__pycache__", f)]


def test_config_files_are_exactly_the_etc_files(rpm_file):
    assert set(query(rpm_file, "-c").splitlines()) == CONFIG_FILES
    # %config(noreplace): bit 4 of FILEFLAGS, on both.
    lines = query(rpm_file, "--queryformat", "[%{FILEFLAGS} %{FILENAMES}\n]").splitlines()
    flags = {name: int(flag) for flag, name in (line.split(" ", 1) for line in lines)}
    noreplace = 1 << 4
    assert all(flags[f] & noreplace for f in CONFIG_FILES)


def test_modes_owners_and_the_relative_symlink(rpm_file):
    lines = query(
        rpm_file,
        "--queryformat",
        "[%{FILEMODES:perms} %{FILEUSERNAME} %{FILENAMES} %{FILELINKTOS}\n]",
    ).splitlines()
    entries = {}
    for line in lines:
        mode, user, name, *link = line.split(" ")
        entries[name] = (mode, user, "".join(link))
    assert all(user == "root" for _, user, _ in entries.values())
    for hook in HOOKS:
        assert entries[f"/usr/libexec/gpugate/{hook}"][0] == "-rwxr-xr-x"
    assert entries["/opt/gpugate/bin/gpugate"][0] == "-rwxr-xr-x"
    assert entries["/var/lib/gpugate"][0] == "drwxr-x--x"  # others only pass through to task/
    # SlurmUser passes through to the decision records (evidence/controller-view/).
    assert entries["/var/lib/gpugate/evidence"][0] == "drwxr-x--x"
    # EpilogSlurmctld's own directory: root's in the package, the slurm user's after install.
    assert entries["/var/lib/gpugate/controller"][0] == "drwxr-x--x"
    assert entries["/var/lib/gpugate/nccl"][0] == "drwxr-xr-x"  # root's: no user squats it
    assert entries["/etc/gpugate/hook.env"][0] == "-rw-r--r--"  # sourced by root
    # Relative, so it also resolves inside an unpacked or image root.
    assert entries["/usr/bin/gpugate"] == ("lrwxrwxrwx", "root", "../../opt/gpugate/bin/gpugate")


def test_requires_and_scripts(rpm_file):
    requires = query(rpm_file, "--requires").splitlines()
    assert "python3 >= 3.9" in requires
    assert "/usr/bin/python3" in requires  # from the launcher's #!
    assert not [r for r in requires if "/tmp" in r or "venv" in r or "python(abi)" in r]
    # Installing never touches Slurm: no scriptlet calls scontrol or restarts a daemon.
    scripts = query(rpm_file, "--scripts")
    # The `slurm` account may be named (controller_dir is its own); Slurm is never run or restarted.
    assert not re.search(r"scontrol|slurmctld|slurmd|systemctl", scripts)


# --- the unpacked payload ------------------------------------------------------------------


def test_site_config_is_all_comments_and_its_examples_are_valid(root, tmp_path):
    """The shipped /etc file means "the packaged defaults"; each commented setting is valid."""
    site = os.path.join(root, "etc", "gpugate", "gpugate.yaml")
    assert load_config(site) == load_config("/dev/null")
    # Commented settings are "#key" (no space after the "#"), nested lines included, up to the
    # next blank line; uncommented together they must pass the schema.
    blocks, current = [], None
    with open(site, encoding="utf-8") as fh:
        for line in fh:
            if re.match(r"#[a-z_]+:", line):
                current = []
                blocks.append(current)
            if current is not None and not line.strip():
                current = None
            if current is not None:
                current.append(line[1:])
    assert len(blocks) >= 5
    uncommented = tmp_path / "site.yaml"
    uncommented.write_text("".join("".join(block) for block in blocks))
    config = load_config(str(uncommented))
    assert config.policy.report_only is True
    assert config.evidence_dir == "/shared/gpugate/evidence"


def test_bundle_is_pure_python_and_first_on_the_path(root, tmp_path):
    """The system python3 imports every module from the bundle; PyYAML without libyaml."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON}")
    lib = os.path.join(root, "opt", "gpugate", "lib")
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import yaml, loguru, pynvml, gpugate; "
        "print(yaml.__with_libyaml__); "
        "print(all(m.__file__.startswith(sys.argv[1]) for m in (yaml, loguru, pynvml, gpugate)))"
    )
    result = run([SYSTEM_PYTHON, "-s", "-E", "-B", "-c", probe, lib], env=clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]
    # What %post does on a node: compile the bundle for its python3.
    result = run([SYSTEM_PYTHON, "-s", "-E", "-m", "compileall", "-q", lib], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("snapshot", "code", "status"), [("h100-healthy", 0, "ok"), ("h100-ecc", 1, "fail")]
)
def test_unpacked_launcher_checks_a_snapshot(root, tmp_path, snapshot, code, status):
    """`<root>/opt/gpugate/bin/gpugate check` through its #! (the system python3)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON}")
    launcher = os.path.join(root, "opt", "gpugate", "bin", "gpugate")
    facts = os.path.join(
        root, "opt", "gpugate", "lib", "gpugate", "config", "snapshots", f"{snapshot}.yaml"
    )
    argv = [launcher, "check", "--facts", facts, "--config", "/dev/null", "--json"]
    result = run(argv, env=clean_env(tmp_path))
    assert result.returncode == code, result.stderr
    assert json.loads(result.stdout)["status"] == status


def test_launcher_ignores_the_jobs_python_environment(root, rpm_file, tmp_path):
    """-E: a job's PYTHONPATH (here a decoy gpugate) and PYTHONHOME change nothing."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON}")
    decoy = tmp_path / "decoy" / "gpugate"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise SystemExit(99)\n")
    env = clean_env(tmp_path, PYTHONPATH=str(decoy.parent), PYTHONHOME=str(tmp_path / "nowhere"))
    result = run([os.path.join(root, "usr", "bin", "gpugate"), "--version"], env=env)
    assert result.returncode == 0, result.stderr
    version = run(["rpm", "-qp", "--queryformat", "%{VERSION}", rpm_file]).stdout
    assert result.stdout.strip() == f"gpugate {version}"


def test_launcher_runs_on_the_oldest_supported_python(root, tmp_path):
    """RHEL 9's Python 3.9, where one is installed here (pyenv, deadsnakes)."""
    # A pyenv shim only answers when its version is selected: try the installed versions too.
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which("python3.9"), *glob.glob(f"{pyenv}/versions/3.9*/bin/python3.9")]
    python39 = next((p for p in candidates if p and run([p, "-c", "pass"]).returncode == 0), None)
    if not python39:
        pytest.skip("no python3.9 here")
    launcher = os.path.join(root, "opt", "gpugate", "bin", "gpugate")
    facts = os.path.join(
        root, "opt", "gpugate", "lib", "gpugate", "config", "snapshots", "h100-ecc.yaml"
    )
    result = run(
        [python39, "-s", "-E", "-B", launcher, "check", "--facts", facts, "--config", "/dev/null"],
        env=clean_env(tmp_path, PATH=os.environ.get("PATH", "/usr/bin:/bin")),
    )
    assert result.returncode == 1, result.stderr
    assert "gpu.ecc: GPU3" in result.stdout


def write_hook_env(root: str, **settings: str) -> None:
    """A hook.env beside the unpacked wrappers, the only one they read: the test's copies never
    read the host's /etc/gpugate/hook.env (gpugate_site.own_hook_env_only)."""
    sys.path.insert(0, os.path.join(REPO, "tests", "slurm"))
    from gpugate_site import own_hook_env_only

    libexec = os.path.join(root, "usr", "libexec", "gpugate")
    for name in os.listdir(libexec):
        if name.startswith("gpugate-"):
            own_hook_env_only(Path(libexec, name))
    text = "".join(f"{name}={value}\n" for name, value in settings.items())
    with open(os.path.join(libexec, "hook.env"), "w") as fh:
        fh.write(text)


def test_wrapper_without_gpugate_lets_the_job_run(root, tmp_path):
    write_hook_env(
        root, GPUGATE_BIN=str(tmp_path / "missing" / "gpugate"), GPUGATE_CONFIG="/dev/null"
    )
    result = run(
        [os.path.join(root, "usr", "libexec", "gpugate", "gpugate-prolog")], env=clean_env(tmp_path)
    )
    assert result.returncode == 0
    assert "not found; prolog skipped, job allowed" in result.stderr


def test_wrapper_runs_the_unpacked_launcher(root, tmp_path):
    """gpugate-task-prolog -> GPUGATE_BIN (the unpacked launcher) -> `export` lines."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON}")
    launcher = os.path.join(root, "opt", "gpugate", "bin", "gpugate")
    write_hook_env(root, GPUGATE_BIN=launcher, GPUGATE_CONFIG="/dev/null")
    wrapper = os.path.join(root, "usr", "libexec", "gpugate", "gpugate-task-prolog")
    result = run([wrapper], env=clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "export NCCL_DEBUG=WARN" in result.stdout.splitlines()

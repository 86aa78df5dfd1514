"""The .deb (packaging/deb): built once by build.sh, inspected with dpkg-deb, then installed.

The inspection needs only dpkg-deb (Debian's dpkg) and PyPI for the bundled dependencies. The
install tests need root and run only in a throwaway root (tests/support/throwaway_root.py), never on
the host: they `dpkg -i` it, run `gpugate check` and every hook wrapper as an ordinary user with
the system python3, as slurmd runs the TaskProlog, then `dpkg --purge` it. Where no throwaway
root can be made (not root, no overlayfs), they skip and touch nothing.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
from debs import (
    PACKAGE_PATHS,
    REPO,
    RUN_TIME_PATHS,
    deb_file,
    host_package_state,
    installed,
    installing_here,
    purge,
    run,
    run_in_throwaway_root,
)
from versions import VERSION_RE

__all__ = ["deb_file", "installed"]  # fixtures, from tests/support/debs.py

pytestmark = pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`

SYSTEM_PYTHON = "/usr/bin/python3"
HOOKS = ("prolog", "epilog", "task-prolog", "epilog-slurmctld", "health")
CONFFILES = ["/etc/gpugate/gpugate.yaml", "/etc/gpugate/hook.env"]
SNAPSHOTS = "/opt/gpugate/lib/gpugate/config/snapshots"


def contents(deb_file: str) -> dict[str, tuple[str, str, str]]:
    """`dpkg-deb -c`: {absolute path: (mode, owner/group, link target)}."""
    result = run(["dpkg-deb", "-c", deb_file])
    assert result.returncode == 0, result.stderr
    entries = {}
    for line in result.stdout.splitlines():
        mode, owner, _size, _date, _time, name, *link = line.split()
        path = "/" + name.lstrip("./").rstrip("/") if name != "./" else "/"
        entries[path] = (mode, owner, link[1] if link else "")
    return entries


def control_file(deb_file: str, name: str) -> str:
    """One file of the package's DEBIAN/ (control, conffiles, postinst...)."""
    result = run(["dpkg-deb", "-I", deb_file, name])
    assert result.returncode == 0, result.stderr
    return result.stdout


# --- the package, inspected ----------------------------------------------------------------


def test_control_fields(deb_file):
    result = run(["dpkg-deb", "-f", deb_file, "Package", "Version", "Architecture", "Depends"])
    assert result.returncode == 0, result.stderr
    fields = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert re.fullmatch(VERSION_RE, fields["Version"]), fields
    assert fields == {
        "Package": "gpugate",
        "Version": fields["Version"],
        "Architecture": "all",
        "Depends": "python3 (>= 3.9)",
    }
    # The bundled copies are named, with versions, for security trackers.
    description = run(["dpkg-deb", "-f", deb_file, "Description"]).stdout
    assert re.search(r"pyyaml=\d", description) and re.search(r"loguru=\d", description)


def test_layout_is_the_rpms(deb_file):
    entries = contents(deb_file)
    expected = {
        "/opt/gpugate/bin/gpugate",
        "/opt/gpugate/lib/gpugate/cli.py",
        "/opt/gpugate/lib/gpugate/config/gpugate.yaml",
        f"{SNAPSHOTS}/h100-healthy.yaml",
        "/opt/gpugate/lib/yaml/__init__.py",
        "/opt/gpugate/lib/loguru/__init__.py",
        "/opt/gpugate/lib/pynvml.py",
        *CONFFILES,
        "/usr/share/doc/gpugate/README.md",
        "/usr/share/doc/gpugate/slurm.conf.example",
        "/usr/share/doc/gpugate/copyright",
        "/usr/share/gpugate/job_submit.lua",
        "/usr/share/gpugate/grafana/gpugate.json",
        *(f"/usr/libexec/gpugate/gpugate-{hook}" for hook in HOOKS),
    }
    assert expected <= set(entries), sorted(expected - set(entries))
    # Only the five hook names: the wrapper's source name (gpugate-hook) is no hook.
    assert sorted(p for p in entries if p.startswith("/usr/libexec/gpugate/")) == sorted(
        f"/usr/libexec/gpugate/gpugate-{hook}" for hook in HOOKS
    )
    # Pure Python, no bytecode of the build host's Python.
    assert not [p for p in entries if re.search(r"\.(so|pyd|pyc)$|\.so\.|__pycache__", p)]


def test_the_readmes_links_hold_in_the_package(deb_file):
    """README.md links to docs/guide/... pages: they ship beside it in /usr/share/doc/gpugate."""
    entries = set(contents(deb_file))
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    links = {m.split("#")[0] for m in re.findall(r"\]\((docs/[^)\s]+)\)", readme)}
    assert links, "the README links to no page under docs/"
    missing = sorted(f"/usr/share/doc/gpugate/{link}" for link in links
                     if f"/usr/share/doc/gpugate/{link}" not in entries)  # fmt: skip
    assert not missing, missing


def test_every_module_of_the_project_is_bundled(deb_file):
    """A subpackage missing from pyproject's list would fail only when its hook runs."""
    entries = contents(deb_file)
    sources = {"gpugate": "gpugate"}
    missing = []
    for top, installed in sources.items():  # noqa: F402 - a path, not the fixture
        for dirpath, dirnames, filenames in os.walk(os.path.join(REPO, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, os.path.join(REPO, top))
            for name in filenames:
                if name.endswith(".py"):
                    path = os.path.normpath(f"/opt/gpugate/lib/{installed}/{rel}/{name}")
                    if path not in entries:
                        missing.append(path)
    assert not missing


def test_modes_owners_and_the_relative_symlink(deb_file):
    entries = contents(deb_file)
    assert {owner for _, owner, _ in entries.values()} == {"root/root"}
    for hook in HOOKS:
        assert entries[f"/usr/libexec/gpugate/gpugate-{hook}"][0] == "-rwxr-xr-x"
    assert entries["/opt/gpugate/bin/gpugate"][0] == "-rwxr-xr-x"
    assert entries["/var/lib/gpugate"][0] == "drwxr-x--x"  # others only pass through to task/
    # SlurmUser passes through to the decision records (evidence/controller-view/).
    assert entries["/var/lib/gpugate/evidence"][0] == "drwxr-x--x"
    # EpilogSlurmctld's own directory: root's in the package, the slurm user's after install.
    assert entries["/var/lib/gpugate/controller"][0] == "drwxr-x--x"
    assert entries["/var/lib/gpugate/nccl"][0] == "drwxr-xr-x"  # root's: no user squats it
    assert entries["/var/cache/gpugate"][0] == "drwx------"
    assert entries["/etc/gpugate/hook.env"][0] == "-rw-r--r--"  # sourced by root
    assert entries["/usr/bin/gpugate"] == (
        "lrwxrwxrwx",
        "root/root",
        "../../opt/gpugate/bin/gpugate",
    )


def test_opt_itself_is_not_the_packages(deb_file):
    """Only /opt/gpugate and below: with /opt listed, dpkg took it for gpugate's alone (no
    package owns it) and warned at every removal that it was not empty."""
    entries = contents(deb_file)
    assert "/opt" not in entries
    assert entries["/opt/gpugate"][0] == "drwxr-xr-x"
    outside = [p for p in entries if p.startswith("/opt") and not p.startswith("/opt/gpugate/")]
    assert outside == ["/opt/gpugate"], outside
    # The rewritten archive is whole: tar reads it to its end without a complaint.
    payload = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", deb_file], capture_output=True, timeout=60, check=True
    )
    tar = subprocess.run(["tar", "-t"], input=payload.stdout, capture_output=True, timeout=60)
    assert tar.returncode == 0 and not tar.stderr, tar.stderr


def test_unown_dirs_cuts_only_plain_directory_entries():
    """unown_dirs.py drops the named directory entries and refuses anything else."""
    spec = importlib.util.spec_from_file_location(
        "unown_dirs", os.path.join(REPO, "packaging", "deb", "unown_dirs.py")
    )
    unown_dirs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unown_dirs)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name in ("./", "./opt/", "./opt/gpugate/"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
        data = b"#!/usr/bin/python3\n"
        info = tarfile.TarInfo("./opt/gpugate/gpugate")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    tar = buf.getvalue()
    cut = unown_dirs.drop_entries(tar, {"./opt/"})
    assert len(cut) == len(tar)
    with tarfile.open(fileobj=io.BytesIO(cut), mode="r:") as archive:
        assert archive.getnames() == [".", "./opt/gpugate", "./opt/gpugate/gpugate"]
        assert archive.extractfile("./opt/gpugate/gpugate").read() == data
    for names in ({"./opt/gpugate/gpugate"}, {"./usr/"}):  # a file; an entry not there
        with pytest.raises(ValueError):
            unown_dirs.drop_entries(tar, names)


def test_launcher_is_the_system_python3(deb_file, tmp_path):
    run(["dpkg-deb", "-x", deb_file, str(tmp_path)])
    with open(tmp_path / "opt" / "gpugate" / "bin" / "gpugate") as fh:
        assert fh.readline() == "#!/usr/bin/python3 -Es\n"


def test_gpugate_reports_the_packages_version(deb_file, tmp_path):
    """`gpugate --version` of the packaged code is the package's Version (issue 40)."""
    run(["dpkg-deb", "-x", deb_file, str(tmp_path)])
    version = run(["dpkg-deb", "-f", deb_file, "Version"]).stdout.strip()
    launcher = tmp_path / "opt" / "gpugate" / "bin" / "gpugate"
    result = run(
        [SYSTEM_PYTHON, "-s", "-E", str(launcher), "--version"], env={"PATH": "/usr/bin:/bin"}
    )
    assert result.stdout.strip() == f"gpugate {version}", result.stderr


def test_conffiles_and_scripts(deb_file):
    assert control_file(deb_file, "conffiles").split() == CONFFILES
    postinst = control_file(deb_file, "postinst")
    assert "/usr/bin/python3 -s -E -m compileall -q /opt/gpugate/lib" in postinst
    assert "__pycache__" in control_file(deb_file, "prerm")
    # The site config checked on every install and upgrade, never failing it (issue 40).
    assert "exec timeout 60 /opt/gpugate/bin/gpugate config check" in postinst
    assert ') 2>&1 || echo "gpugate: fix what is said above' in postinst
    # Installing never touches Slurm: no script calls scontrol or restarts a daemon.
    scripts = postinst + control_file(deb_file, "prerm") + control_file(deb_file, "postrm")
    code = "\n".join(line.split("#", 1)[0] for line in scripts.splitlines())  # not the comments
    # The `slurm` account may be named (controller_dir is its own); Slurm is never run or restarted.
    assert not re.search(r"scontrol|slurmctld|slurmd|systemctl", code)


# --- the package, installed (root, in a throwaway root) ------------------------------------


def test_the_install_tests_pass_in_a_throwaway_root(deb_file, tmp_path):
    """This module's install tests, in a throwaway root: the host's package is never touched."""
    if installing_here():
        pytest.skip("the run inside the throwaway root")
    before = host_package_state()
    run_in_throwaway_root(__file__, deb_file, str(tmp_path / "inside"), timeout=900)
    assert host_package_state() == before


def as_user(argv: list[str], env: dict[str, str], timeout: float = 60):
    """Run ARGV as the ordinary test user (runuser -u), with ENV alone."""
    sys.path.insert(0, os.path.join(REPO, "tests", "slurm"))
    from localslurm import JOB_USER, ensure_user

    ensure_user()
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"  # ENV's PATH has no sbin
    return run([runuser, "-u", JOB_USER, "--", *argv], timeout=timeout, env=env)


def user_config(tmp_path) -> tuple[str, dict[str, str]]:
    """A config replaying a healthy snapshot, with state the user owns, and a slurmd-like env."""
    sys.path.insert(0, os.path.join(REPO, "tests", "slurm"))
    from localslurm import ensure_user, open_path

    uid, gid = ensure_user()
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, uid, gid)
    open_path(tmp_path)
    config = tmp_path / "gpugate.yaml"
    config.write_text(
        f"facts_file: {SNAPSHOTS}/h100-healthy.yaml\n"
        f"state_dir: {state}\nevidence_dir: {state / 'evidence'}\n"
    )
    config.chmod(0o644)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C", "GPUGATE_CONFIG": str(config)}
    env.update(SLURM_JOB_ID="4242", SLURMD_NODENAME="gpu-node-01", SLURM_JOB_USER="gpugate-e2e")
    return str(config), env


def test_installed_check_runs_as_an_ordinary_user(installed, tmp_path):
    """/usr/bin/gpugate through its #! (the system python3), as a user who is not root."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C"}
    for snapshot, code, status in (("h100-healthy", 0, "ok"), ("h100-ecc", 1, "fail")):
        argv = ["gpugate", "check", "--facts", f"{SNAPSHOTS}/{snapshot}.yaml", "--json"]
        result = as_user(argv, env)
        assert result.returncode == code, result.stderr
        assert json.loads(result.stdout)["status"] == status
    # postinst compiled the bundle for this python3.
    assert os.path.isdir("/opt/gpugate/lib/gpugate/__pycache__")


@pytest.mark.parametrize("hook", HOOKS)
def test_installed_hook_runs_as_an_ordinary_user(installed, tmp_path, hook):
    """Each wrapper reaches the launcher and gpugate's code as the user (status 126 was the bug)."""
    _, env = user_config(tmp_path)
    result = as_user([f"/usr/libexec/gpugate/gpugate-{hook}"], env)
    assert result.returncode == 0, result.stderr
    assert not re.search(r"not found|internal error|Permission denied|Traceback", result.stderr)
    if hook == "task-prolog":
        assert "export NCCL_DEBUG=WARN" in result.stdout.splitlines()
    if hook == "prolog":
        assert "ok" in result.stderr


def test_purge_leaves_nothing(installed):
    """Runs last: what the hooks and an admin wrote at run time goes with the purge, too."""
    made = {
        "/var/lib/gpugate/evidence/42/n1-r0/summary.json": "{}\n",  # a bundle
        "/var/lib/gpugate/events.jsonl": "{}\n",
        "/var/lib/gpugate/controller/events.jsonl": "{}\n",
        "/var/lib/gpugate/nccl/42/nccl.n1.1.log": "x\n",  # a job's, the user's own
        "/var/lib/gpugate/locks/history.lock": "",
        "/var/cache/gpugate/config.marshal": "x",
        "/usr/libexec/gpugate/hook.env": "SLURM_CONF=/etc/slurm/slurm.conf\n",  # beside the wrappers
        "/var/lib/node_exporter/textfile_collector/gpugate.prom": "gpugate_up 1\n",
        "/var/tmp/gpugate-nccl/7/nccl.log": "x\n",  # an older release's, root's
    }
    for path, text in made.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
    os.chown("/var/lib/gpugate/nccl/42", 65534, 65534)
    os.chown("/var/lib/gpugate/nccl/42/nccl.n1.1.log", 65534, 65534)
    with open("/etc/gpugate/gpugate.yaml", "a") as fh:  # an edited conffile
        fh.write("# edited by the admin\n")
    purge()
    left = [path for path in (*PACKAGE_PATHS, *RUN_TIME_PATHS) if os.path.lexists(path)]
    assert left == []
    assert os.path.isdir("/var/lib/node_exporter/textfile_collector")  # node_exporter's, kept
    assert run(["dpkg-query", "-W", "gpugate"]).returncode != 0

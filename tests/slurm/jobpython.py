"""A Python the ordinary job user can run, chosen by the harness (issue 40, deliver 1).

On a fresh machine of the kind CI runs on, `python3` is pyenv's, under /root, which is 0700,
and a clone sits in a 0700 `mktemp -d`. The job user (localslurm.JOB_USER) can then run neither
a virtualenv's interpreter (a symlink into /root) nor import anything from the checkout. Nothing
outside the checkout may be opened to fix that (no `chmod 711 /root`): the harness picks an
interpreter that user can reach (this one where it can, else the system's of the same version)
and gives it copies it can read. Stdlib only, like localslurm.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from localslurm import JOB_USER, ensure_user

# Where a system's own Python lives: every user can run these on Debian and RHEL.
SYSTEM_DIRS = ("/usr/bin", "/usr/local/bin")


class JobUserCannotRun(RuntimeError):
    """The ordinary job user cannot run what a test needs (the message says why and what to do)."""


def as_job_user(argv: Sequence[str], env: dict[str, str] | None = None) -> str | None:
    """Run ARGV as the job user; None if it exits 0, else what went wrong."""
    uid, gid = ensure_user()
    try:
        done = subprocess.run(list(argv), user=uid, group=gid, extra_groups=[], capture_output=True,
                              text=True, timeout=120, cwd="/",
                              env=env or {"PATH": "/usr/bin:/bin"})  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return (
        None if done.returncode == 0 else (done.stderr.strip()[-500:] or f"exit {done.returncode}")
    )


def candidates(version: tuple[int, int] | None = None) -> list[str]:
    """The interpreters to try: this one first, then the system's (of VERSION where given)."""
    names = ([f"python{version[0]}.{version[1]}"] if version else []) + ["python3"]
    found = [os.path.realpath(sys.executable), *(f"{d}/{n}" for n in names for d in SYSTEM_DIRS)]
    return list(dict.fromkeys(found))


@functools.cache
def job_interpreter(
    version: tuple[int, int] | None = None, tried: tuple[str, ...] | None = None
) -> str:
    """The first of TRIED (default: candidates(VERSION)) the job user can run, of VERSION if
    given (else 3.9 or newer); JobUserCannotRun naming each one tried and why not."""
    want = version or (3, 9)
    compare = "==" if version else ">="
    check = f"import sys; assert sys.version_info[:2] {compare} {want!r}, sys.version"
    problems = []
    for python in tried if tried is not None else candidates(version):
        if not os.path.exists(python):
            problems.append(f"{python}: absent")
            continue
        problem = as_job_user([python, "-Es", "-c", check])
        if not problem:
            return python
        problems.append(f"{python}: {problem.splitlines()[-1]}")
    which = f"Python {want[0]}.{want[1]}" if version else "Python 3.9+"
    raise JobUserCannotRun(
        f"the job user {JOB_USER} can run no {which} ({'; '.join(problems)}): install the "
        f"system's python3 (Debian: apt-get install python3 python3-venv), or build the "
        f"virtualenvs from a Python outside private directories (make PYTHON=/usr/bin/python3)"
    )


def venv_version(venv: Path) -> tuple[int, int]:
    """(major, minor) of the Python a virtualenv was made with, from its pyvenv.cfg."""
    cfg = venv / "pyvenv.cfg"
    text = cfg.read_text()
    match = re.search(r"^(?:version|version_info)\s*=\s*(\d+)\.(\d+)", text, re.MULTILINE)
    if match is None:
        raise JobUserCannotRun(f"{cfg}: no version line; not a virtualenv made by `python -m venv`")
    return int(match.group(1)), int(match.group(2))


def repoint_venv(venv: Path, python: str) -> Path:
    """Make the virtualenv at VENV start PYTHON (a Python of its own version) instead of the
    one it was made with: new bin/ links and a new pyvenv.cfg, never the files themselves
    (a hard-linked copy shares them with the original). Its bin/python."""
    cfg = venv / "pyvenv.cfg"
    lines = [line for line in cfg.read_text().splitlines()
             if not re.match(r"(home|executable|command)\s*=", line)]  # fmt: skip
    fresh = cfg.with_name(".pyvenv.cfg.new")
    fresh.write_text("\n".join([f"home = {os.path.dirname(python)}", *lines]) + "\n")
    fresh.chmod(0o644)
    os.replace(fresh, cfg)
    major, minor = venv_version(venv)
    bindir = venv / "bin"
    for name in ("python", "python3", f"python{major}.{minor}"):
        link = bindir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(python)
    return bindir / "python"


def venv_for_job_user(venv: Path, check: Sequence[str] = ("-c", "pass")) -> str:
    """An interpreter of the virtualenv VENV that the job user can run with CHECK (e.g.
    `-c "import torch"`): its own bin/python where that works, else a hard-linked copy's in a
    0755 directory under /tmp (removed at exit), pointed at a Python the user can run."""
    own = venv / "bin" / "python"
    if as_job_user([str(own), *check]) is None:
        return str(own)
    copy = Path(tempfile.mkdtemp(prefix=f"gpugate-{venv.name.lstrip('.')}-"))  # 0700 until filled
    atexit.register(shutil.rmtree, copy, True)
    # Hard links: a copy of 1 GB in a second, the same read-only files; a virtualenv finds its
    # site-packages from the python it was started as, so the copy's bin/python uses its own.
    linked = subprocess.run(["cp", "-al", f"{venv}/.", str(copy)], capture_output=True,
                            text=True, timeout=300, check=False)  # fmt: skip
    if linked.returncode:
        raise JobUserCannotRun(f"cannot copy {venv} to {copy}: {linked.stderr.strip()[-300:]}")
    copy.chmod(0o755)
    python = copy / "bin" / "python"
    if as_job_user([str(python), "-c", "pass"]) is not None:  # its interpreter is out of reach
        python = repoint_venv(copy, job_interpreter(venv_version(venv)))
    problem = as_job_user([str(python), *check])
    if problem:
        raise JobUserCannotRun(
            f"the job user {JOB_USER} cannot run {' '.join(check)} with {own}, nor with a copy "
            f"in {copy} ({os.path.realpath(python)}): {problem}"
        )
    return str(python)

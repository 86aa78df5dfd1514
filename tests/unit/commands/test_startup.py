"""The start-up budget: what a warm hook run may import (it runs before every job and task).

Each of these modules costs 5-150 ms to import on the CI machine (loguru 150, pynvml 40,
yaml 20, typing/dataclasses 5-25, shutil/tempfile 5-10: docs/performance.md), more than the
whole checklist of a healthy node. A replayed healthy prolog, a TaskProlog, a replayed
`gpugate check` (with and without --json), an epilog and a health check run in fresh
interpreters, warm (the parsed-YAML cache filled by a first run), and list what they imported.

The late imports that remain are listed in one place, gpugate/startup.py (LAZY), with what each
saves; these tests hold that list true: every import inside a function is listed, every entry
is used, and an entry that claims to save time is skipped by at least one of these runs.
"""

from __future__ import annotations

import ast
import gc
import os
import site
import subprocess
import sys
from pathlib import Path

import paths
import pytest

from gpugate.startup import LAZY, resume_gc

ROOT = paths.ROOT
PACKAGE = ROOT / "gpugate"
HEALTHY = ROOT / "config" / "snapshots" / "h100-healthy.yaml"
FORBIDDEN = ("yaml", "loguru", "pynvml", "shutil", "tempfile", "dataclasses", "typing")
# What the benchmark's command (`gpugate check --facts`, docs/performance.md) keeps out on
# top of FORBIDDEN; each is a LAZY entry, and this run is the one the start-up target measures.
NOT_IN_A_REPLAYED_CHECK = (
    "re",
    "enum",
    "argparse",
    "json",
    "threading",
    "signal",
    "subprocess",
    "gpugate.slurm.choose",
    "gpugate.slurm.control",
)
RUNS: dict[str, list[str]] = {
    "prolog": ["prolog"],
    "task-prolog": ["task-prolog"],
    "check": ["check", "--facts", str(HEALTHY), "--json"],
    "check-table": ["check", "--facts", str(HEALTHY)],
    "epilog": ["epilog"],
    "health": ["health"],
}
LIST_MODULES = (
    "import sys\n"
    "sys.path[:0] = sys.argv.pop(1).split(':')\n"
    "from gpugate.cli import main\n"
    "main(sys.argv[1:])\n"
    "sys.stdout.write('\\n@@modules@@\\n' + '\\n'.join(sorted(sys.modules)) + '\\n')\n"
)
# As the packaged launcher runs gpugate: the code and its dependencies as plain directories on
# sys.path, no .pth files. A virtualenv's editable-install finder (a .pth) imports re, enum and
# importlib into every interpreter, which would hide what gpugate itself imports.
PLAIN = (sys.executable, "-S")
PATHS = [str(ROOT), *site.getsitepackages()]


def hook_env(tmp: str | Path) -> dict[str, str]:
    """The environment of a hook run on a node whose site file replays the healthy snapshot."""
    tmp = Path(tmp)
    config = tmp / "gpugate.yaml"
    config.write_text(
        f"facts_file: {HEALTHY}\n"
        f"state_dir: {tmp / 'state'}\n"
        f"evidence_dir: {tmp / 'evidence'}\n"
        f"task_prolog:\n  nccl_debug_dir: {tmp / 'nccl'}\n"
        f"admin:\n  metrics_file: {tmp / 'metrics' / 'gpugate.prom'}\n"
    )
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GPUGATE_CONFIG": str(config),
        "GPUGATE_CACHE_DIR": str(tmp / "cache"),
        "SLURMD_NODENAME": "gpu-node-01",
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
    }


def imported(
    argv: list[str],
    env: dict[str, str],
    job: int,
    warm_first: bool = False,
    python: tuple[str, ...] = PLAIN,
    paths: list[str] = PATHS,
) -> set[str]:
    """The modules a fresh `gpugate ARGV` run imported (after a first run when `warm_first`).

    `python` runs it with `paths` first on sys.path (bench/bench_lazy.py: `/usr/bin/python3
    -Es` and the source tree, as the packaged launcher runs its lib).
    """
    if warm_first:
        imported(argv, env, job - 1, python=python, paths=paths)  # cold: fills the cache
    proc = subprocess.run(
        [*python, "-c", LIST_MODULES, ":".join(paths), *argv],
        cwd=ROOT,
        env={**env, "SLURM_JOB_ID": str(job)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: a check's verdict, not a crash
    assert "@@modules@@" in proc.stdout, proc.stderr
    return set(proc.stdout.split("@@modules@@", 1)[1].split())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Each run's modules, warm; one site for all of them, as one node would be."""
    env = hook_env(tmp_path_factory.mktemp("site"))
    return {name: imported(argv, env, job=102, warm_first=True) for name, argv in RUNS.items()}


# The hooks on a job's path (HealthCheckProgram runs between jobs, and imports more).
@pytest.mark.parametrize("run", [name for name in RUNS if name != "health"])
def test_a_warm_hook_run_stays_within_the_import_budget(run: str, runs: dict[str, set[str]]):
    modules = runs[run]
    assert "gpugate.cli" in modules  # the run happened in this interpreter
    heavy = sorted(m for m in modules if m.split(".")[0] in FORBIDDEN)
    assert not heavy, f"`gpugate {run}` imported {heavy}"


def test_a_replayed_check_imports_only_what_it_uses(runs: dict[str, set[str]]):
    there = sorted(m for m in NOT_IN_A_REPLAYED_CHECK if m in runs["check-table"])
    assert not there, f"`gpugate check --facts` imported {there} (gpugate/startup.py)"


def late_imports() -> list[tuple[str, int, list[str]]]:
    """(module, line, the names it may import) for every import inside a function in gpugate/."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        out.append((module, node.lineno, [alias.name]))
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        up = package[: len(package) - node.level + 1]
                        base = ".".join([*up, base] if base else up)
                    names = [base] + [f"{base}.{alias.name}" for alias in node.names]
                    out.append((module, node.lineno, names))
    return out


def test_every_late_import_is_listed_with_what_it_saves():
    unlisted = [f"{module}:{line} imports {names[0]}" for module, line, names in late_imports()
                if not any(name in LAZY for name in names)]  # fmt: skip
    assert not unlisted, (
        "imports inside functions that gpugate/startup.py (LAZY) does not list; move them to "
        f"the top of the module, or list them with what they save: {unlisted}"
    )


def test_every_entry_of_the_list_is_a_late_import():
    used = {name for _, _, names in late_imports() for name in names}
    stale = sorted(set(LAZY) - used)
    assert not stale, f"LAZY lists modules no function imports any more: {stale}"
    assert all(why for _, why in LAZY.values())


def test_what_the_list_says_saves_time_is_skipped_by_a_hook_run(runs: dict[str, set[str]]):
    """An entry imported by every run saves nothing: its import belongs at the top."""
    everywhere = sorted(m for m, (ms, _) in LAZY.items()
                        if ms > 0 and all(m in mods for mods in runs.values()))  # fmt: skip
    assert not everywhere, f"every hook run imports {everywhere}: no start-up to save"


def test_no_pattern_is_compiled_at_import():
    """Module-level patterns go through gpugate.regex.lazy (compiled when first used)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        todo = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        while todo:
            node = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            func = getattr(node, "func", None)
            if (isinstance(node, ast.Call) and isinstance(func, ast.Attribute)
                    and func.attr == "compile" and getattr(func.value, "id", "") == "re"):  # fmt: skip
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            todo.extend(ast.iter_child_nodes(node))
    assert not found, f"re.compile at import (use gpugate.regex.lazy): {found}"


GC_RUN = (
    "import gc, sys\n"
    "sys.path[:0] = sys.argv.pop(1).split(':')\n"
    "from gpugate.startup import pause_gc\n"
    "pause_gc()\n"
    "from gpugate.cli import main\n"
    "paused = not gc.isenabled()\n"
    "import gpugate.commands.check as C\n"
    "body = C.main\n"
    "seen = []\n"
    "C.main = lambda argv: seen.append(gc.isenabled()) or body(argv)\n"
    "code = main(sys.argv[1:])\n"
    "print('@@gc@@', paused, seen, gc.isenabled(), gc.get_freeze_count() > 0, code)\n"
)


def test_the_launcher_holds_the_collector_off_until_the_command_runs(tmp_path: Path):
    """pause_gc (the packaged launcher) before gpugate.cli; cli.main resumes it before the
    command's own work, so only start-up runs uncollected (gpugate/startup.py)."""
    launcher = (ROOT / "packaging" / "rpm" / "gpugate").read_text()
    assert launcher.index("pause_gc()") < launcher.index("from gpugate.cli import main")
    argv = ["check", "--facts", str(HEALTHY), "--config", os.devnull]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GPUGATE_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([*PLAIN, "-c", GC_RUN, ":".join(PATHS), *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert "@@gc@@" in proc.stdout, proc.stderr
    # paused through the imports; on (start-up's objects frozen) while the check ran; exit 0
    assert proc.stdout.split("@@gc@@", 1)[1].split() == ["True", "[True]", "True", "True", "0"]


def test_without_the_launcher_the_collector_is_left_as_it_was():
    """cli.main run by the pip-installed script, `python -m gpugate` or a test: nothing frozen."""
    frozen = gc.get_freeze_count()
    resume_gc()
    assert gc.isenabled() and gc.get_freeze_count() == frozen

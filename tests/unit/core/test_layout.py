"""The house's layout: imports point down the flow (gather, check, decide, act), no circles.

Every module's imports are read with ast, wherever they stand (module level, inside a function,
under `if TYPE_CHECKING:`), and checked against ALLOWED, the one table of which part of the
package may import which (docs/flow.md draws it). A new import that runs back up the house, or
a new circle between modules, fails here with the file and the line.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import paths
import pytest

PACKAGE = paths.ROOT / "gpugate"

# gpugate's base modules: what everything may import; they import only one another.
BASE = frozenset(
    f"gpugate.{name}"
    for name in (
        "child", "clock", "fstree", "fsutil", "jsonl", "jsonrecord", "names", "node", "record", "regex",
        "runner", "startup", "text", "userfiles", "yamlio",
    )
) | {"gpugate"}  # fmt: skip

# Part -> the parts it may import (besides itself and the base), listed bottom up: a part
# never imports one listed after it (test_the_table_is_layered). docs/flow.md draws it.
_TABLE = {
    "drill": "",
    "slurm": "",
    "log": "slurm",
    "checks": "drill slurm",  # the sources only: the drill's window, the reasons' drill mark
    "config": "checks slurm",
    "flightrec": "",
    "diagnosis": "checks flightrec",
    "checkpoints": "slurm",
    "store": "checks config diagnosis drill log slurm",
    "isolate": "checks config log slurm store",
    "gate": "checks config diagnosis drill flightrec isolate log slurm store",  # drill: its drain's end
    "act": "checks config gate isolate log slurm store",
    "health": "config store",
    "qualify": "act checks config gate log slurm store",
    "admin": "act checkpoints checks config diagnosis gate isolate log qualify slurm store",
    "hooks": "act admin checkpoints checks config diagnosis drill flightrec gate health isolate log slurm store",
    "cli": "checks config",
    "commands": "act admin checkpoints checks cli config diagnosis drill flightrec gate hooks isolate log qualify slurm store",
    "__main__": "cli",
}  # fmt: skip
ALLOWED: dict[str, frozenset[str]] = {
    f"gpugate.{part}": frozenset(f"gpugate.{name}" for name in names.split())
    for part, names in _TABLE.items()
}
# Names for type annotations only (`if TYPE_CHECKING:`, nothing runs): the configuration's
# dataclasses are what every part is configured with, the checks and the drill's window too.
TYPES_ANYWHERE = frozenset({"gpugate.config.schema"})


def part_of(module: str) -> str:
    """The part of the house a module belongs to: 'base', or a key of ALLOWED."""
    if module in BASE:
        return "base"
    top = ".".join(module.split(".")[:2])
    if top not in ALLOWED:
        raise AssertionError(
            f"{module}: in no part of the table (tests/unit/core/test_layout.py ALLOWED)"
        )
    return top


class Import:
    """One import of a gpugate module: by whom, where, and whether it runs."""

    def __init__(self, source: str, target: str, line: int, type_only: bool) -> None:
        self.source, self.target, self.line, self.type_only = source, target, line, type_only

    def __repr__(self) -> str:
        kind = " (types only)" if self.type_only else ""
        return f"{self.source}:{self.line} imports {self.target}{kind}"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """`gpugate.x.y` for root/x/y.py (a package's __init__ is the package)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_only_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes under an `if TYPE_CHECKING:` (they never run)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                ids.update(id(n) for n in ast.walk(stmt))
    return ids


def imports_of(module: str, source: str, modules: set[str], is_package: bool) -> list[Import]:
    """Every gpugate module `source` imports, at any depth, resolved to a known module."""
    tree = ast.parse(source)
    type_only = _type_only_nodes(tree)
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                here = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*here, *([node.module] if node.module else [])])
            # `from pkg import submodule` imports the submodule; the package itself only for
            # its own names (its __init__ runs for every import below it anyway).
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            names = subs + ([base] if len(subs) < len(node.names) else [])
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and name.startswith("gpugate"):
                found.append(Import(module, name, node.lineno, id(node) in type_only))
    return found


@functools.cache
def all_imports(root: Path = PACKAGE) -> list[Import]:
    """The imports of every module under `root` (the gpugate package)."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(paths)
    found: list[Import] = []
    for module, path in paths.items():
        text = path.read_text(encoding="utf-8")
        found += imports_of(module, text, modules, path.name == "__init__.py")
    return found


def upward(imports: list[Import]) -> list[Import]:
    """The imports the table does not allow."""
    bad = []
    for imp in imports:
        source, target = part_of(imp.source), part_of(imp.target)
        if source == target or target == "base":
            continue
        if imp.type_only and imp.target in TYPES_ANYWHERE:
            continue
        if source == "base" or target not in ALLOWED[source]:
            bad.append(imp)
    return bad


def circles(imports: list[Import]) -> list[list[str]]:
    """The import circles among modules (each circle's members), through every import.

    Names imported for annotations only (`if TYPE_CHECKING:`) never run, but they still tie
    the two modules together (mypy, readers and structure viewers see the circle): they count.
    The lower module names what it needs as a Protocol, or the shared record moves below both.
    """
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set())
        graph.setdefault(imp.target, set())
        graph[imp.source].add(imp.target)
    # Tarjan's strongly connected components, iteratively (no recursion limit to meet).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def test_every_import_points_down_the_table():
    assert upward(all_imports()) == []


def test_no_import_circle_among_the_modules():
    assert circles(all_imports()) == []


def test_the_table_is_layered():
    """A part imports only parts listed before it: no circle between parts, ever."""
    seen: set[str] = set()
    for part, allowed in ALLOWED.items():
        assert allowed <= seen, f"{part} may import {sorted(allowed - seen)}, listed after it"
        seen.add(part)


def test_every_module_is_in_a_part_and_every_part_exists():
    imports = all_imports()
    for imp in imports:
        part_of(imp.source), part_of(imp.target)
    for part in ALLOWED:
        name = part.split(".", 1)[1]
        assert (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file(), part


def test_the_adapters_entry_is_where_the_design_says():
    """DESIGN.md: `from gpugate.slurm import backend`; the package itself stays cheap to import
    (the reasons and hostlist below it are imported by every hook)."""
    code = (
        "import sys; import gpugate.slurm.reasons; "
        "assert 'gpugate.slurm.choose' not in sys.modules; "
        "from gpugate.slurm import backend; from gpugate.slurm.control import SlurmControl; "
        "assert isinstance(backend('cli', timeout=1.0), SlurmControl)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_design_cards_folders_hold_no_code():
    """checks/, slurm_hooks/ and config/ hold what a site reads; the code is under gpugate/."""
    for folder in ("checks", "slurm_hooks", "config"):
        assert not list((PACKAGE.parent / folder).rglob("*.py")), folder


def test_the_checks_readme_lists_the_registered_checks():
    from gpugate.checks.registry import registered

    text = (PACKAGE.parent / "checks" / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([a-z0-9_.]+)` \|", text, re.M)
    assert sorted(listed) == sorted(registered()) and len(set(listed)) == len(listed)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A stand-in gpugate package of FILES (path -> source) under tmp_path."""
    root = tmp_path / "gpugate"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    "source",
    [
        "from gpugate.gate import policy\n",  # at module level
        "def f():\n    from gpugate.gate.policy import decide\n",  # inside a function
        "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from gpugate.gate.policy import Decision\n",
        "from ..gate import policy\n",  # relative
        "import gpugate.gate.policy\n",
    ],
)
def test_an_upward_import_is_caught(tmp_path, source):
    """The adapter importing the gate, in each way an import can be written, fails."""
    root = _tree(
        tmp_path,
        {"slurm/__init__.py": "", "slurm/control.py": source, "gate/__init__.py": "",
         "gate/policy.py": "Decision = decide = None\n"},
    )  # fmt: skip
    (bad,) = upward(all_imports(root))
    assert (bad.source, bad.target) == ("gpugate.slurm.control", "gpugate.gate.policy")


def test_the_config_types_may_be_named_from_below_but_not_imported(tmp_path):
    types = (
        "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from gpugate.config.schema import Config\n"
    )
    root = _tree(
        tmp_path,
        {"checks/__init__.py": "", "checks/gpu.py": types, "checks/run.py":
         "from gpugate.config import load_config\n", "config/__init__.py": "load_config = 1\n",
         "config/schema.py": "Config = 1\n"},
    )  # fmt: skip
    assert [(i.source, i.target) for i in upward(all_imports(root))] == [
        ("gpugate.checks.run", "gpugate.config")
    ]


def test_a_circle_is_caught_and_a_type_only_one_too(tmp_path):
    root = _tree(
        tmp_path,
        {"store/__init__.py": "", "store/a.py": "def f():\n    from gpugate.store import b\n",
         "store/b.py": "from gpugate.store import a\n",
         "store/c.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from gpugate.store import d\n",
         "store/d.py": "from gpugate.store import c\n",
         "store/e.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from gpugate.store import a\n"},
    )  # fmt: skip
    assert circles(all_imports(root)) == [
        ["gpugate.store.a", "gpugate.store.b"],
        ["gpugate.store.c", "gpugate.store.d"],
    ]

"""The tests' own layout (tests/README.md): found by their names, never importing each other.

pytest imports each test module by its basename (no __init__.py, the default import mode), so
two modules of one name in two folders would collide; a test module imported by another runs
its tests' module-level setup twice and ties the two modules' edits together: what both need
lives in tests/support/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import paths

# Where a test module may stand, as parts of its path below tests/: tests/ itself holds only
# conftest.py, paths.py and folders.
UNIT, FLAT = "unit", ("e2e", "packaging")


def all_test_modules() -> list[Path]:
    """Every test module under tests/ (data folders hold none)."""
    return sorted(paths.TESTS.rglob("test_*.py"))


def imported(path: Path) -> set[str]:
    """The top-level names of the modules PATH imports, in functions too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_modules_are_found_and_none_stands_in_tests_itself():
    modules = all_test_modules()
    assert len(modules) > 100, modules  # the walk found the suite, not an empty folder
    loose = [p.name for p in modules if p.parent == paths.TESTS]
    assert not loose, f"test modules directly in tests/ (put each in its folder): {loose}"


def test_every_module_stands_in_a_folder_of_the_map():
    def placed(parts: tuple[str, ...]) -> bool:
        return (parts[0] == UNIT and len(parts) == 3) or (parts[0] in FLAT and len(parts) == 2)

    rel = [p.relative_to(paths.TESTS).parts for p in all_test_modules()]
    elsewhere = ["/".join(parts) for parts in rel if not placed(parts)]
    assert not elsewhere, (
        f"not in tests/unit/<package>/, tests/e2e/ or tests/packaging/: {elsewhere}"
    )


def test_end_to_end_modules_are_where_ci_runs_them():
    # .ci/second-slurm runs tests/e2e/test_*.py in the installed-package roots: an end-to-end
    # module anywhere else would run only in `make test`.
    astray = [
        str(p)
        for p in all_test_modules()
        if p.name.startswith("test_e2e_") and p.parent.name != "e2e"
    ]
    assert not astray, astray


def test_module_basenames_are_unique():
    seen: dict[str, list[str]] = {}
    for path in all_test_modules():
        seen.setdefault(path.name, []).append(str(path.relative_to(paths.TESTS)))
    twice = {name: where for name, where in seen.items() if len(where) > 1}
    assert not twice, f"pytest imports test modules by basename; these collide: {twice}"


def test_no_module_imports_a_test_module():
    names = {path.stem for path in all_test_modules()}
    helpers = [*sorted(paths.SUPPORT.glob("*.py")), paths.TESTS / "conftest.py"]
    found = {
        str(path.relative_to(paths.TESTS)): sorted(imported(path) & names)
        for path in all_test_modules() + helpers
    }
    found = {path: mods for path, mods in found.items() if mods}
    assert not found, f"imports of test modules (move what is shared to tests/support/): {found}"


def test_the_check_sees_an_import_of_a_test_module(tmp_path):
    # The walk above must see an import inside a function, where most of them stood.
    module = tmp_path / "test_probe.py"
    module.write_text(
        "def test_x():\n    from test_epilog import setup\n    import test_health as T\n"
    )
    assert {"test_epilog", "test_health"} <= imported(module)

"""The start-up budget: the imports gpugate keeps out of a hook's start, in one place.

The Prolog runs before every job and the TaskProlog before every task, each a fresh process,
so what gpugate imports is paid on every node for every job. Modules import what they use at
the top, so that a file's header tells what it depends on; the exceptions are listed in LAZY,
each imported inside the function that needs it. Each entry says what waiting saves the warm
hook runs that do not need it (milliseconds, median, on the 2-core CI machine: measured by
`python bench/bench_lazy.py`) and why the module waits. tests/test_startup.py holds the list
true both ways: every import inside a function names a module listed here, and no module listed
here is imported by every measured hook run (then it saves nothing and belongs at the top).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

LAZY: dict[str, tuple[float, str]] = {}


def import_module(name: str) -> ModuleType:
    """The module `name`, imported: importlib.import_module without importing importlib.

    importlib (with warnings) costs a run about 1 ms; `__import__` is the same import.
    """
    __import__(name)
    return sys.modules[name]

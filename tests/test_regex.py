"""gpugate.regex.lazy: a module constant that behaves as re.compile's pattern, compiled late."""

from __future__ import annotations

import re

from gpugate.regex import lazy


def test_a_lazy_pattern_compiles_on_first_use_and_behaves_as_compiled():
    pattern = lazy(r"Xid \((\S+)\): (\d+)", re.IGNORECASE)
    assert "_compiled" not in vars(pattern)  # nothing compiled at import
    line = "NVRM: xid (PCI:0000:1b:00): 79, pid=1"
    real = re.compile(r"Xid \((\S+)\): (\d+)", re.IGNORECASE)
    assert pattern.search(line).groups() == real.search(line).groups()
    assert "_compiled" in vars(pattern)
    assert pattern.pattern == real.pattern and pattern.flags == real.flags
    assert [m.group(2) for m in pattern.finditer(line)] == ["79"]
    assert pattern.sub("X", line) == real.sub("X", line)


def test_bytes_patterns_too():
    pattern = lazy(rb"\\x([0-9a-f]{2})")
    assert pattern.sub(lambda m: bytes([int(m.group(1), 16)]), b"a\\x41b") == b"aAb"

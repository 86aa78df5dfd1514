"""The node_exporter textfile format, checked line by line."""

from __future__ import annotations

import re

# The text format: `# HELP name text`, `# TYPE name type`, `name{l="v",...} value`.
_HELP = re.compile(r"^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$")


_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge)$")


_LINE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)\} (-?[0-9.e+]+)$'
)


def assert_exposition(text: str) -> dict[str, str]:
    """Every line valid; HELP then TYPE before a family's samples; each family once."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    current = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# HELP"):
            name = _HELP.match(line).group(1)
            assert name not in types, f"{name} declared twice"
            assert _TYPE.match(lines[i + 1]).group(1) == name
        elif line.startswith("# TYPE"):
            current = _TYPE.match(line).group(1)
            types[current] = _TYPE.match(line).group(2)
        else:
            m = _LINE.match(line)
            assert m, f"bad sample line: {line!r}"
            assert m.group(1) == current, f"{m.group(1)} outside its family"
            float(m.group(3))
    for name, kind in types.items():
        assert kind == "counter" or not name.endswith("_total")
    return types

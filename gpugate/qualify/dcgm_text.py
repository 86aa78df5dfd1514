"""The table `dcgmi diag` prints without `-j` (DCGM 3.x and 4.x), read into plain values.

Shape, from the real captures in shared/reference/real-outputs/dcgm/: rows `| name | value |`
in sections (`|-----  Metadata  ---`, `+-----  Hardware  ---`); a `Warning` or `Info` row
starts a message that the rows below with an empty name continue, cut every 45 characters
(even inside a word); 4.x adds a `GPU<n>: <status>` row per GPU under each test; 3.x writes
`Fail - All` or `Fail - GPU: 0, 1` and starts each message with `GPU <n> `. A run that could not
start prints `Error: ...` lines instead of the table.
"""

from __future__ import annotations

from gpugate.record import Record
from gpugate.regex import lazy

_SECTION = lazy(r"^[|+]-----\s+(\w[\w ]*?)\s+-")
_PER_GPU = lazy(r"(?i)^GPU\s?(\d+):\s*(Pass|Fail|Warn|Skip)\b")
_STATUS = lazy(r"(?i)^(Pass|Fail|Warn|Skip)\b(?:\s*-\s*(.*))?$")
_HEADER = lazy(r"(?m)^\|\s*Diagnostic\s*\|\s*Result\s*\|")
_WIDTH = 45  # the value column: DCGM cuts text at this width (the captures: 45 + padding)


class TextTest(Record):
    """One test row of the table, with its messages and per-GPU results."""

    name: str
    section: str
    status: str  # Pass / Fail / Warn / Skip, as printed
    gpus: str = ""  # what follows "Fail - ": "All", "GPU: 0, 1", ""
    warnings: tuple[str, ...] = ()
    per_gpu: tuple[tuple[int, str], ...] = ()


class TextDiag(Record):
    """One `dcgmi diag` table (or its `Error:` lines), as printed."""

    metadata: tuple[tuple[str, str], ...] = ()
    tests: tuple[TextTest, ...] = ()
    errors: tuple[str, ...] = ()  # the `Error: ...` lines of a run that did not complete


def is_table(text: str) -> bool:
    """True when `text` holds dcgmi's diag table."""
    return _HEADER.search(text) is not None


class _Row:
    """A test row while its messages and per-GPU rows are read."""

    def __init__(self, name: str, section: str, value: str) -> None:
        status = _STATUS.match(value)
        self.test = (name, section, status.group(1) if status else value,
                     (status.group(2) or "").strip() if status else "")  # fmt: skip
        self.warnings: list[list[str]] = []
        self.per_gpu: list[tuple[int, str]] = []

    def done(self) -> TextTest:
        name, section, status, gpus = self.test
        return TextTest(name=name, section=section, status=status, gpus=gpus,
                        warnings=tuple(_join(c) for c in self.warnings),
                        per_gpu=tuple(self.per_gpu))  # fmt: skip


def read_table(text: str) -> TextDiag:
    """Read the table (or `Error:` lines); rows that fit no known shape are left out."""
    section, meta, rows = "", [], []
    current: _Row | None = None
    message: list[str] | None = None  # the chunks of the Warning/Info being read
    for line in text.splitlines():
        if m := _SECTION.match(line.strip()):
            section, message = m.group(1).strip(), None
            continue
        parts = line.strip().split("|")
        if len(parts) < 4 or parts[0] != "":
            continue
        name, value = parts[1].strip(), parts[2][1 : 1 + _WIDTH]
        if name in ("Diagnostic", "") and value.strip() in ("Result", ""):
            continue
        if section == "Metadata":
            meta.append((name, value.strip()))
        elif name in ("Warning", "Info"):
            message = [value]
            if current is not None and name == "Warning":  # Info is DCGM's note, not a finding
                current.warnings.append(message)
        elif name:
            current, message = _Row(name, section, value.strip()), None
            rows.append(current)
        elif current is not None and (g := _PER_GPU.match(value.strip())):
            current.per_gpu.append((int(g.group(1)), g.group(2)))
            message = None
        elif message is not None:
            message.append(value)
    errors = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("Error:")]
    return TextDiag(metadata=tuple(meta), tests=tuple(r.done() for r in rows), errors=tuple(errors))


def _join(chunks: list[str]) -> str:
    """One message from its cut chunks: full chunks join as they are (a word may be cut)."""
    return " ".join("".join(c.ljust(_WIDTH) for c in chunks).split())

"""The drain reason grammar (docs/interfaces.md, "The drain reason grammar"): the docs' copy is
the code's, and every reason gpugate builds, and every one written in the test suite, parses."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpugate.act.steps import Drain
from gpugate.checks.registry import registered
from gpugate.gate.repair import reboot_reason
from gpugate.qualify.settle import drain_plan
from gpugate.slurm import reasons as R

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "interfaces.md"
TESTS = ROOT / "tests"


def documented(name: str) -> str:
    """The regular expression in the docs' `<!-- grammar: NAME -->` block."""
    text = DOCS.read_text(encoding="utf-8")
    m = re.search(rf"<!-- grammar: {name} -->\n```\n(.*?)\n```\n<!-- end -->", text, re.S)
    assert m, f"docs/interfaces.md has no grammar block {name!r}"
    return m.group(1)


def test_the_docs_copy_is_the_code() -> None:
    assert documented("reason") == R.REASON_GRAMMAR
    assert documented("budget") == R.BUDGET_COMMENT_GRAMMAR
    assert f"grammar (version {R.REASON_GRAMMAR_VERSION})" in DOCS.read_text(encoding="utf-8")


def test_the_docs_examples_parse() -> None:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("Examples, one per writer")
    table = text[start : text.index("\n\n", text.index("| writer |", start))]
    examples = re.findall(r"\| `(gpugate: [^`]*)` \|", table)
    assert len(examples) >= 7
    for reason in examples:
        assert R.parse_reason(reason), reason


@pytest.fixture
def drill():
    R.mark_drill("20261201-101500")
    yield "20261201-101500"
    R.mark_drill(None)


HOSTILE = 'GPU3 "quoted" \x1b[31mred\x1b[0m\nline two caf\u00e9 StdOut=/etc/shadow ' + "x" * 300


def built() -> list[str]:
    """A reason from every builder gpugate drains with, realistic and hostile inputs."""
    out = [
        R.drain_reason(check, "GPU3 aggregate uncorrected ECC 120 > 100") for check in registered()
    ]
    out += [R.drain_reason(check, "") for check in ("gpu.count", "kernel.xid")]
    out += [R.drain_reason("gpu.ecc", HOSTILE), R.drain_reason("bad id/../x", "detail")]
    bundle = "/var/lib/gpugate/evidence/4242/gpu-07-r1"
    out += [R.drain_reason("kernel.xid", R.evidence_detail(bundle, "GPU1 Xid 79")),
            R.drain_reason("kernel.xid", R.evidence_detail("/e/77_3/n1-r0", HOSTILE))]  # fmt: skip
    out += [reboot_reason("gpugate: kernel.xid: GPU0 Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS"),
            reboot_reason("kernel.xid: GPU0 Xid 79"), reboot_reason("gpugate: kernel.xid"),
            reboot_reason("gpugate: kernel.xid: reboot: GPU0 Xid 79")]  # fmt: skip
    # gpugate qualify: its drain plan's reason (qualify/settle.py).
    plan = drain_plan("n1", "allreduce: 2.00 GB/s is below the floor 9.00 GB/s (job 77)")
    out += [s.reason for s in plan if isinstance(s, Drain)]
    # isolation (isolate/apply.py, isolate/remote.py): their details.
    out += [R.drain_reason("isolate", d) for d in (
        "GPU3 out, node not resumed (ControllerBusy: slurmctld busy)",
        "putting back GPU 3", "putting back GPU 3 (asked by alice on admin1)",
        "GPU3 not isolated (SlurmError: x)")]  # fmt: skip
    return out


def test_every_built_reason_parses() -> None:
    reasons = built()
    for reason in reasons:
        parts = R.parse_reason(reason)
        assert parts is not None, reason
        assert parts["check"] == R.reason_check(reason)  # the grammar and the reader agree
        assert len(reason) <= R.REASON_MAX
    epilog = R.parse_reason(reasons[len(registered()) + 4])
    assert epilog and epilog["bundle"] == "4242/gpu-07-r1" and epilog["detail"] == "GPU1 Xid 79"
    reboot = R.parse_reason(reboot_reason("gpugate: kernel.xid: GPU0 Xid 79"))
    assert reboot and (reboot["reboot"], reboot["detail"]) == ("reboot", "GPU0 Xid 79")


def test_a_drills_reasons_and_comments_parse(drill: str) -> None:
    for reason in built():
        parts = R.parse_reason(reason)
        assert parts is not None and parts["drill"] == drill, reason
    comment = R.admin_comment(R.budget_comment("3 of 16 drained > 10%", built()[0]))
    parts = R.parse_budget_comment(comment)
    assert parts and parts["drill"] == drill and R.parse_reason(parts["reason"])


def test_the_budget_comment_parses() -> None:
    reason = R.drain_reason("gpu.ecc", "GPU3 aggregate uncorrected ECC 120 > 100")
    comment = R.admin_comment(R.budget_comment("3 of 16 nodes of gpu drained > 10%", reason))
    parts = R.parse_budget_comment(comment)
    assert parts == {"drill": None, "why": "3 of 16 nodes of gpu drained > 10%", "reason": reason}
    assert R.parse_reason(comment) is None  # a comment is no drain reason


@pytest.mark.parametrize(
    "text",
    ["Not responding", "Prolog error", "gpugate:gpu.ecc: no space", "gpugate: gpu ecc: x",
     "gpugate: gpu.ecc:", "gpugate: gpu.ecc: two\nlines", "gpugate: gpu.ecc: caf\u00e9",
     "admin: gpugate: gpu.ecc: x", ""],
)  # fmt: skip
def test_what_is_not_a_reason_of_gpugates(text: str) -> None:
    assert R.parse_reason(text) is None


PREFIX = R.GPUGATE_PREFIX + " "
# Where a test puts a drain reason: these keywords and dict keys, these calls' reason argument.
REASON_KEYS = frozenset({"reason", "Reason", "wanted", "before"})
DRAIN_CALLS = {"drain": 1, "record_drain": 2, "note_drain": 2}
# A head that says the text is a drain reason: a check id, or a writer's pseudo-check.
HEAD = re.compile(r"^gpugate: (?:DRILL [^ :]+: )?([A-Za-z0-9_.-]+)(?::|$)")


def _text(node: ast.AST | None) -> str | None:
    ok = isinstance(node, ast.Constant) and isinstance(node.value, str)
    return node.value if ok and node.value.startswith(PREFIX) else None  # type: ignore[union-attr]


def _placed(tree: ast.AST) -> set[int]:
    """The ids of the string nodes a test puts where a drain reason goes."""
    out: list[ast.AST | None] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.keyword) and n.arg in REASON_KEYS:
            out.append(n.value)
        elif isinstance(n, ast.Dict):
            out += [v for k, v in zip(n.keys, n.values)
                    if isinstance(k, ast.Constant) and k.value in REASON_KEYS]  # fmt: skip
        elif isinstance(n, ast.Call):
            name = getattr(n.func, "attr", getattr(n.func, "id", ""))
            at = DRAIN_CALLS.get(name)
            if at is not None and len(n.args) > at:
                out.append(n.args[at])
        elif isinstance(n, ast.Assign) and any(
            "reason" in getattr(t, "id", "").lower() for t in n.targets
        ):
            out.append(n.value)
    return {id(v) for v in out if _text(v) is not None}


def suite_reasons() -> list[tuple[str, str]]:
    """(reason, where) for every `gpugate: ...` string in the tests that is a drain reason: put
    where a reason goes (a `reason=`, a drain() argument, a `Reason=` in Slurm's text), or
    headed by a check id (or `qualify`, `isolate`). Not a prefix some test matches a reason's
    start with (it ends in a space), nor a test of what is no reason (this file)."""
    checks = set(registered()) | {"qualify", "isolate"}
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == Path(__file__).name:
            continue
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        placed = _placed(tree)
        for n in ast.walk(tree):
            value = _text(n)
            if value is None or value != value.rstrip():
                continue
            head = HEAD.match(value)
            if id(n) in placed or (head and head.group(1) in checks):
                found.append((value, f"{path.relative_to(ROOT)}:{n.lineno}"))  # type: ignore[attr-defined]
        # Slurm's own text in fixtures: `Reason=gpugate: ... [user@time]`.
        for m in re.finditer(r"Reason=(gpugate: [^\n\"'\[]*?)\s*(?:\[|\\n|$)", source, re.M):
            found.append((m.group(1), f"{path.relative_to(ROOT)}: Reason="))
    # Recorded Slurm output and history fixtures (JSON, text): reasons headed by a check id.
    for path in sorted(TESTS.rglob("*")):
        if path.suffix not in (".json", ".jsonl", ".txt", ".out") or not path.is_file():
            continue
        for m in re.finditer(
            r"gpugate: [^\"\[\n]*", path.read_text(encoding="utf-8", errors="replace")
        ):
            head = HEAD.match(m.group(0).rstrip())
            if head and head.group(1) in checks:
                found.append((m.group(0).rstrip(), str(path.relative_to(ROOT))))
    return found


def test_every_drain_reason_in_the_test_suite_parses() -> None:
    found = suite_reasons()
    assert len(found) > 100  # the scan sees the suite (about 130 today)
    bad = []
    for value, where in found:
        value = re.sub(r"\{[a-z_]*\}", "d1", value)  # a template's fields (`.format(id=...)`)
        # A test's hostile input is what gpugate writes after sanitising it (own_reason).
        written = value if R.clean_text(value, R.REASON_MAX) == value else R.own_reason(value)
        if R.parse_reason(written) is None:
            bad.append(f"{where}: {value!r}")
    assert not bad, "\n".join(bad)

"""Several nodes of one job at once: diagnose each node, then name the node that failed first.

In a multi-node job one node's fault (an Xid, an OOM) makes every other rank wait until its
collective times out: the others are victims, so the node to look at is the one whose decisive
line came first. Each node is diagnosed alone (`engine.diagnose` on its own files), then the
nodes are ordered by the earliest time stamp among the lines that decided their verdict.

Which files are a node's: an evidence bundle's recorded node name (summary.json `node`); else
`--node NAME=GLOB`; else the name of the file's directory, when the files come from two or more
directories or a bundle or --node was named. Files of one directory are today's single-node diagnosis.

Two nodes whose first lines are within TOLERANCE_S of each other, a node whose lines carry no
time stamp, or stamps that are seconds since boot make the order "uncertain: ..." (summary,
`first_uncertain`) and lower the confidence by one step.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat

from gpugate.diagnosis.categories import SYMPTOM, UNDETERMINED, UNEXPLAINED, is_hardware, kind
from gpugate.diagnosis.engine import diagnose
from gpugate.diagnosis.timestamps import BOOT, NOYEAR, WALL, line_stamp
from gpugate.diagnosis.verdict import JOB_FILE, KERNEL_LOG
from gpugate.record import Record
from gpugate.text import printable
from gpugate.userfiles import UserFileError, open_regular, read_fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from gpugate.diagnosis.timestamps import Stamp
    from gpugate.diagnosis.verdict import Diagnosis

# NTP keeps a cluster's clocks within milliseconds of each other; 2 s also absorbs a log
# line written a moment after the event, while an Xid that starts a 10-minute NCCL timeout
# stands far apart from the timeouts it causes.
TOLERANCE_S = 2.0
SUMMARY_MAX = 1 << 20  # a bundle's summary.json is a few KiB
REREAD_MAX = 64 << 20  # how far into a file a decisive line is looked for again
REREAD_LINES = 3  # how many decisive lines without a stamp are looked for again
_LOWER = {"high": "medium", "medium": "low", "low": "low"}


class InputError(ValueError):
    """The inputs cannot be mapped to nodes; the message says which and why."""


class NodeInputs(Record):
    """One node's files, each with its source."""

    node: str
    paths: tuple[Any, ...] = ()
    sources: tuple[Any, ...] = ()
    bundle: str | None = None


class NodeResult(Record):
    """One node's diagnosis and the time of its first decisive line."""

    node: str
    diagnosis: Diagnosis
    first: Stamp | None = None  # of the earliest decisive line, None without one
    bundle: str | None = None


def parse_node_option(value: str) -> tuple[str, str]:
    """`NAME=GLOB` of --node, as (name, glob); InputError when it is not one."""
    name, sep, pattern = value.partition("=")
    if not sep or not name.strip() or not pattern:
        raise InputError(f"--node wants NAME=GLOB, got {value!r}")
    return name.strip(), pattern


def _regular(path: str) -> bool:
    # Never follows a symlink: a bundle is read as root.
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _has_flightrec(bundle: str | None) -> bool:
    return bool(bundle) and _regular(os.path.join(bundle or "", "flightrec.json"))


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path.rstrip("/") or "/").st_mode)
    except OSError:
        return False


def bundle_node(directory: str) -> str | None:
    """The node name an evidence bundle recorded (summary.json); None when it is no bundle."""
    path = os.path.join(directory, "summary.json")
    if not _regular(path):
        return None
    try:
        fd = open_regular(path)
        try:
            summary = json.loads(read_fd(fd, SUMMARY_MAX))
        finally:
            os.close(fd)
    except (UserFileError, OSError, ValueError) as exc:
        raise InputError(f"{directory}: unreadable evidence bundle summary.json: {exc}") from None
    node = summary.get("node") if isinstance(summary, dict) else None
    if not isinstance(node, str) or not node.strip():
        raise InputError(f"{directory}: evidence bundle summary.json names no node")
    return node.strip()


def _bundle_inputs(directory: str, node: str) -> NodeInputs:
    """A bundle's files (gpugate.store.evidence layout): its kernel.log and its job log tails."""
    logs = os.path.join(directory, "logs")
    tails = sorted(os.listdir(logs)) if _is_dir(logs) else []
    paths = [
        p for p in (os.path.join(logs, n) for n in tails if n.endswith(".tail")) if _regular(p)
    ]
    kernel = os.path.join(directory, "kernel.log")
    has_kernel = _regular(kernel) and os.lstat(kernel).st_size > 0
    sources = [KERNEL_LOG] * has_kernel + [JOB_FILE] * len(paths)
    paths = [kernel] * has_kernel + paths
    return NodeInputs(node=node, paths=tuple(paths), sources=tuple(sources), bundle=directory)


def _file_node(path: str, patterns: list[tuple[str, str]], dir_names: dict[str, str]) -> str:
    for name, pattern in patterns:
        if fnmatch.fnmatch(path, pattern):
            return name
    return dir_names[os.path.dirname(os.path.normpath(path))]


def _dir_names(dirs: list[str]) -> dict[str, str]:
    # Each directory's node name: its base name, or the whole path where two share one.
    base = {d: os.path.basename(d) or d or "." for d in dirs}
    counts: dict[str, int] = {}
    for b in base.values():
        counts[b] = counts.get(b, 0) + 1
    return {d: (b if counts[b] == 1 else d or ".") for d, b in base.items()}


def group_inputs(
    files: list[tuple[str, str]], patterns: list[tuple[str, str]]
) -> list[NodeInputs] | None:
    """Map (path, source) inputs to nodes; None when they are one node (today's diagnosis)."""
    # A directory is a node only as an evidence bundle; any other stays an unreadable input.
    bundles = {p: bundle_node(p) for p, _ in files if p != "-" and _is_dir(p)}
    dirs = [p for p, node in bundles.items() if node is not None]
    plain = [(p, s) for p, s in files if p not in dirs]
    parents = sorted({os.path.dirname(os.path.normpath(p)) for p, _ in plain if p != "-"})
    if not dirs and not patterns and len(parents) <= 1:
        return None
    if any(p == "-" for p, _ in plain):
        raise InputError("- (stdin) cannot be one of several nodes' inputs")
    nodes: dict[str, NodeInputs] = {}

    def add(n: NodeInputs) -> None:
        old = nodes.get(n.node) or NodeInputs(node=n.node, bundle=n.bundle)
        nodes[n.node] = old.replace(paths=old.paths + n.paths, sources=old.sources + n.sources)

    for d in dirs:
        add(_bundle_inputs(d, bundles[d] or ""))
    names = _dir_names(parents)
    for p, s in plain:
        add(NodeInputs(node=_file_node(p, patterns, names), paths=(p,), sources=(s,)))
    # A bundle holding flight-recorder dumps counts without a log (a node that was not the batch
    # host and whose NCCL wrote nothing): its ranks' records can name the culprit.
    empty = [n.node for n in nodes.values() if not n.paths and not _has_flightrec(n.bundle)]
    if empty:
        raise InputError(f"no log file found for node(s) {', '.join(sorted(empty))}")
    return list(nodes.values())


def _reread(path: str, line: int) -> str:
    """Line `line` (1-based) of a file, read again (no symlink followed, at most REREAD_MAX)."""
    if path.endswith(".gz"):
        return ""
    try:
        fd = open_regular(path)
    except OSError:
        return ""
    try:
        seen, tail = 0, b""
        for _ in range(REREAD_MAX >> 20):
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            parts = (tail + chunk).split(b"\n")
            if seen + len(parts) - 1 >= line:
                return parts[line - 1 - seen][:4096].decode("utf-8", "replace")
            seen, tail = seen + len(parts) - 1, parts[-1][-4096:]
        return tail.decode("utf-8", "replace") if seen + 1 == line else ""
    except OSError:
        return ""
    finally:
        os.close(fd)


def first_stamp(d: Diagnosis) -> Stamp | None:
    """The earliest stamp among a diagnosis's decisive lines (a wall clock before a boot one)."""
    stamps = [line_stamp(e.text) for e in d.evidence]
    if d.evidence and not any(stamps):
        # The cleaned text may have lost the stamp: the line as it is in the file.
        # A few lines only: each may mean reading up to REREAD_MAX of a file again.
        stamps = [line_stamp(_reread(e.file, e.line)) for e in d.evidence[:REREAD_LINES]]
    found = [s for s in stamps if s is not None]
    if not found:
        return None
    best = [s for s in found if s.kind != BOOT] or found
    return min(best, key=lambda s: s.without_year() if s.kind in (WALL, NOYEAR) else s.seconds)


def diagnose_nodes(groups: list[NodeInputs], engine: str = "auto") -> list[NodeResult]:
    """Each node's own diagnosis and the time its first decisive line carries."""
    out = []
    for g in groups:
        d = diagnose(list(g.paths), engine=engine, sources=list(g.sources))
        out.append(NodeResult(node=g.node, diagnosis=d, first=first_stamp(d), bundle=g.bundle))
    return out


def _key(r: NodeResult, mode: str) -> float:
    s = r.first
    assert s is not None  # only stamped results are ordered by time
    return s.seconds if mode == WALL or s.kind == BOOT else s.without_year()


def order(results: list[NodeResult]) -> tuple[list[NodeResult], str | None]:
    """The failed nodes, first to fail first, and why that order is uncertain (None if it is not)."""
    failed = [r for r in results if r.diagnosis.evidence]
    if len(failed) <= 1:
        return failed, None
    stamped = [r for r in failed if r.first is not None]
    kinds = {r.first.kind for r in stamped if r.first is not None}
    why = []
    if BOOT in kinds and kinds != {BOOT}:
        # Seconds since boot compare with nothing else: such a node counts as unstamped.
        stamped = [r for r in stamped if r.first is not None and r.first.kind != BOOT]
        kinds.discard(BOOT)
    elif kinds == {BOOT}:
        why.append("only seconds-since-boot stamps, which do not compare across nodes")
    missing = [r.node for r in failed if r not in stamped]
    if missing:
        why.append(f"no comparable time stamp on {', '.join(missing)}")
    mode = WALL if kinds == {WALL} else NOYEAR
    stamped.sort(key=lambda r: _key(r, mode))
    if stamped:
        t0 = _key(stamped[0], mode)
        close = [r for r in stamped if _key(r, mode) - t0 <= TOLERANCE_S]
        if len(close) > 1:
            why.append(f"{', '.join(r.node for r in close)} failed within {TOLERANCE_S:g} s of "
                       "each other (clocks are only that close)")  # fmt: skip
            # Among nodes too close to order, a cause (hardware first) before a symptom.
            close.sort(key=lambda r: (not is_hardware(_cat(r)), kind(_cat(r)) == "symptom"))
            stamped = close + stamped[len(close) :]
    ordered = stamped + [r for r in failed if r not in stamped]
    return ordered, ("; ".join(why) or None)


def _cat(r: NodeResult) -> str:
    return r.diagnosis.category


def job_json(results: list[NodeResult]) -> dict[str, Any]:
    """The `--json` object: the first failing node's verdict, plus `nodes`, `first_node`, `first_uncertain`."""
    ordered, why = order(results)
    # No node failed: one node's success line (rank 0 prints it) is the job's end; the other
    # nodes' quiet logs (unknown) do not make the job's verdict unknown.
    quiet = next((r for r in results if _cat(r) == "no_failure"), results[0])
    first = ordered[0] if ordered else quiet
    out = dict(first.diagnosis.to_json())
    files = [f.to_dict() for r in results for f in r.diagnosis.files]
    out["files"] = files
    out["bytes_scanned"] = sum(f.get("bytes") or 0 for f in files)
    errors = [f"{f['path']}: {f['error']}" for f in files if f.get("error")]
    out.pop("errors", None)
    if errors:
        out["errors"] = errors
    suspects = [r.node for r in results if is_hardware(_cat(r)) and r.diagnosis.trusted]
    text = out["summary"]
    if ordered:
        text = f"node {first.node}" + (" failed first" if len(ordered) > 1 else "") + f": {text}"
    others = [s for s in suspects if s != first.node]
    if others:
        text += f" Own hardware evidence also on {', '.join(others)} (suspect)."
    if why:
        text += f" uncertain: {why}."
        out["confidence"] = _LOWER.get(out.get("confidence") or "high", "low")
    if ordered and out.get("failing_rank") is not None and not out.get("failing_node"):
        out["failing_node"] = first.node  # the rank was read from that node's own logs
    out.update(summary=text, first_node=first.node if ordered else None, first_uncertain=why,
               suspect_nodes=suspects, nodes=[_node_json(r, suspects) for r in results])  # fmt: skip
    _add_flight_recorder(out, [r.bundle for r in results if r.bundle])
    return out


def _add_flight_recorder(out: dict[str, Any], bundles: list[str]) -> None:
    """`flight_recorder` from the bundles' flightrec.json; its culprit joins the summary when
    the verdict is a symptom (an NCCL timeout: every rank's log says the same), `other` or
    `unknown` (the logs name no cause)."""
    if not bundles:
        return
    from gpugate.flightrec.culprit import job_culprit

    fr = job_culprit(bundles)
    out["flight_recorder"] = fr.to_json() if fr else None
    if fr and fr.state and kind(out.get("category")) in (SYMPTOM, UNEXPLAINED, UNDETERMINED):
        out["summary"] += f" Flight recorder: {fr.text}."


def _node_json(r: NodeResult, suspects: list[str]) -> dict[str, Any]:
    d = r.diagnosis.to_json()
    s: Stamp | None = r.first
    return {"node": r.node, "category": d["category"], "xid": d["xid"],
            "failing_rank": d["failing_rank"], "summary": d["summary"],
            "first_failure_at": s.iso() if s else None, "first_failure_stamp": s.text if s else None,
            "suspect": r.node in suspects, "bundle": r.bundle, "evidence": d["evidence"],
            "evidence_locations": d["evidence_locations"]}  # fmt: skip


def render_job(results: list[NodeResult], render_one: Callable[[Diagnosis], str]) -> str:
    """The human report: one line per node (`*` the first to fail), then that node's report."""

    job = job_json(results)
    lines = [f"job diagnosis over {len(results)} node(s): {job['category']}",
             f"  {printable(job['summary'])}"]  # fmt: skip
    for n in job["nodes"]:
        mark = "*" if n["node"] == job["first_node"] else " "
        rank = "-" if n["failing_rank"] is None else n["failing_rank"]
        when = n["first_failure_at"] or n["first_failure_stamp"] or "-"
        lines.append(f"  {mark} {printable(n['node'])}: {n['category']}  rank {rank}  "
                     f"first failure {printable(when)}" + ("  [suspect]" if n["suspect"] else ""))  # fmt: skip
    first = next((r for r in results if r.node == job["first_node"]), None)
    if first is not None:
        lines.append(f"node {printable(first.node)} (first to fail):")
        lines.append(render_one(first.diagnosis).rstrip("\n"))
    return "\n".join(lines) + "\n"

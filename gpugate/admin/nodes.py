"""Admin review: one row per node (state, reason, evidence, repeat count, what to do), most
urgent first. `gpugate nodes` prints the rows; `gpugate report` renders them as HTML.

One Slurm call reads every node (`sinfo --json`, or `scontrol -o show node` where JSON is
missing), one file read gives the whole drain history, and only drained gpugate nodes cost a
bundle's `summary.json` read, so the table stays cheap on a 10,000-node cluster. Rows are plain
dicts (they are printed as JSON as they are), not records: a record per node costs more than
the JSON parsing on large clusters.
"""

from __future__ import annotations

import json
import os
import re
import time
from json.encoder import encode_basestring_ascii as quote

from gpugate.checks import registry
from gpugate.checks.registry import COOLING, HOST, REBOOT, RESEAT, RESET
from gpugate.checks.xid import lookup
from gpugate.diagnosis.categories import is_hardware
from gpugate.isolate.comment import parse_comment
from gpugate.regex import lazy
from gpugate.slurm import control as S
from gpugate.slurm import parse_json as P
from gpugate.slurm.cli import CliBackend
from gpugate.slurm.control import DEFAULT_TIMEOUT
from gpugate.slurm.parse_text import parse_show_node_text
from gpugate.store import history
from gpugate.store.evidence import read_summary
from gpugate.store.held import HELD_LABEL, current_held, held_entries
from gpugate.store.outcomes import check_record
from gpugate.store.summary import EvidenceSummary
from gpugate.store.suspects import open_flags
from gpugate.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

    from gpugate.config.schema import Config
    from gpugate.slurm.cli import CliBackend, Runner
    from gpugate.slurm.records import NodeInfo
    from gpugate.store.entries import DrainEntry, HeldEntry, UnknownXidsEntry
    from gpugate.store.suspects import FlagEntry

    Group = tuple[NodeInfo, list[str]]  # one NodeInfo standing for nodes that share it

# Suggested actions, most urgent first: the index is the row's urgency.
# A check's own action (REBOOT, RESET, RESEAT, COOLING, HOST) is on its @check line.
# In service, but gpugate wanted it out and the drain budget held the drain back: a node
# gpugate knows is failing keeps taking jobs, the most urgent row (gpugate/store/held.py).
HELD = HELD_LABEL
RMA = "RMA candidate"
NOT_RESPONDING = "check node: not responding"
HOOK_ERROR = "read slurmd log: hook failed"
ADMIN = "admin's drain: see reason"
# In service, pointed at by users' jobs (votes, application Xids): a qualification decides
# (gpugate/gate/suspicion.py); until then an admin may look (gpugate qualify / resume NODE).
SUSPECT = "suspect: qualify"
NONE = ""
ACTIONS = (HELD, RMA, REBOOT, RESET, RESEAT, COOLING, HOST, NOT_RESPONDING, HOOK_ERROR, ADMIN,
           SUSPECT, NONE)  # fmt: skip
URGENCY = {a: i for i, a in enumerate(ACTIONS)}

_XID = lazy(r"\bXid (\d+)")
# Texts in a reason that decide by themselves: gpu.memory_errors says "RMA candidate" for a
# failed row remap; a lifetime (aggregate) uncorrected ECC count never goes down with a reset.
_RMA_TEXT = lazy(r"RMA candidate|aggregate uncorrected ECC", re.I)
_REBOOT_TEXT = lazy(r"reboot the node|node_reboot", re.I)


class NodesUnavailable(RuntimeError):
    """Slurm could not be asked for its nodes (the message says why)."""


# ------------------------------------------------------------------------------ reading


def cli_backend(config: Config | None = None, runner: Runner | None = None) -> CliBackend:
    """The adapter's command-line backend (pyslurm is not worth probing for one listing)."""
    timeout = config.slurm.timeout_s if config is not None else DEFAULT_TIMEOUT
    return CliBackend(timeout=timeout, runner=runner)


def as_groups(nodes: Iterable[NodeInfo]) -> list[Group]:
    """Each node as its own group (what `scontrol` text and the `nodes` JSON shape give)."""
    return [(n, [n.name]) for n in nodes]


def parse_node_groups(text: str) -> list[Group]:
    """The adapter's parse_nodes_json(), keeping each aggregated 23.02+ `sinfo` record as one
    NodeInfo with its list of names: one record per node is most of the cost of a listing on
    a large cluster, and those names share state and reason by definition."""
    doc = json.loads(text)
    if not isinstance(doc.get("sinfo"), list):
        # One record per node already; sinfo repeats a node per partition: first one wins.
        return as_groups(P._dedupe([P._node_from_record(r)] for r in doc.get("nodes") or []))
    groups, seen = [], set()
    for rec in doc["sinfo"]:
        listed = (rec.get("nodes") or {}).get("nodes") or []
        names = [n for n in listed if n not in seen]
        if names:
            seen.update(names)
            first = P._nodes_from_sinfo_record({**rec, "nodes": {"nodes": names[:1]}})[0]
            if len(listed) > 1:  # the record's Comment is its first node's (parse_json.py)
                first = first.replace(comment="")
            groups.append((first, names))
    return groups


# `sinfo --json` of 10,000 nodes is some tens of MiB; a bigger file is no saved sinfo output.
SINFO_JSON_MAX = 256 << 20


def read_node_groups(
    slurm: CliBackend | None = None, sinfo_json: str | None = None, per_node: bool = False
) -> list[Group]:
    """Every node: from a saved `sinfo --json` file, else one `sinfo --json` call, else the
    `scontrol -o show node` text (where sinfo has no JSON).

    `per_node` (isolation on, wants_comments()): each node's own Comment and GPU count, which
    23.02+'s aggregated `sinfo` records do not carry: one `scontrol -o show node` call reads
    them when sinfo aggregated any nodes (a saved file cannot be asked again: its aggregated
    nodes show no isolated GPU)."""
    if sinfo_json:
        from gpugate.fsutil import read_text

        try:  # an admin's path: a regular file under the cap, opened without blocking
            text = read_text(sinfo_json, SINFO_JSON_MAX)
        except OSError as exc:
            raise ValueError(exc.strerror or str(exc)) from None
        try:
            return parse_node_groups(text)
        except (KeyError, TypeError, AttributeError, IndexError, RecursionError) as exc:
            # Valid JSON of another shape (`[]`, a record without its fields): say so, once.
            raise ValueError(f"not `sinfo --json` output ({type(exc).__name__}: {exc})") from None

    slurm = slurm or cli_backend()
    try:
        try:
            groups = parse_node_groups(slurm.call("sinfo", "--json"))
        except S.SlurmTimeout:
            raise  # a second slow call would only double the wait
        except (S.SlurmCommandError, ValueError, KeyError, TypeError, AttributeError,
                IndexError, RecursionError):  # fmt: skip
            # No JSON support (no data_parser plugin) or a shape we do not know.
            return as_groups(parse_show_node_text(slurm.scontrol("-o", "show", "node")))
        if per_node and any(len(names) > 1 for _, names in groups):
            return as_groups(parse_show_node_text(slurm.scontrol("-o", "show", "node")))
        return split_reasoned_groups(groups, slurm)
    except S.SlurmError as exc:
        raise NodesUnavailable(f"cannot list Slurm's nodes: {exc}") from exc


def wants_comments(config: Config | None) -> bool:
    """Whether this site isolates GPUs (`isolate.unit: gpu`): the views then read each node's
    Comment, where gpugate records an isolated GPU (gpugate/isolate/comment.py)."""
    return config is not None and config.isolate is not None and config.isolate.unit == "gpu"


def split_reasoned_groups(groups: list[Group], slurm: CliBackend) -> list[Group]:
    """Each node of an aggregated group that carries a reason, read on its own from scontrol.

    24.11's `sinfo --json` puts nodes of one state under one record even when their reasons
    differ, with the first node's reason (seen on Debian 13: gpu.ecc on one node, kernel.xid on
    the other, one record saying gpu.ecc). Groups without a reason (the healthy bulk) stay as
    they are; one `scontrol -o show node` call reads the others only when there are any.
    """
    if not any(len(names) > 1 and node.reason for node, names in groups):
        return groups
    exact = {n.name: n for n in parse_show_node_text(slurm.scontrol("-o", "show", "node"))}
    out: list[Group] = []
    for node, names in groups:
        if len(names) < 2 or not node.reason:
            out.append((node, names))
            continue
        out.extend((exact[name], [name]) for name in names if name in exact)
        rest = [name for name in names if name not in exact]  # gone since sinfo: as it said
        if rest:
            out.append((node, rest))
    return out


# ---------------------------------------------------------------------------- deciding


def suggest_action(
    check: str | None,
    reason: str = "",
    category: str | None = None,
    xid: int | None = None,
    same_check_drains: int = 0,
    rma_after: int = 3,
) -> str:
    """What to do about a node gpugate drained: from the check, the Xid catalog, the count."""
    # A drain without a check id is the epilog's: its bundle's category says what it was.
    hardware = registry.is_hardware(check) if check is not None else is_hardware(category)
    repairs = history.needs_repair(check) if check is not None else hardware
    if _RMA_TEXT.search(reason) or history.reaches_rma(repairs, same_check_drains, rma_after):
        return RMA
    if xid is None:
        m = _XID.search(reason)
        xid = int(m.group(1)) if m else None
    if xid is not None and check in (None, "kernel.xid"):
        return REBOOT if lookup(xid).action == "reboot" else RESET
    if _REBOOT_TEXT.search(reason):
        return REBOOT
    if check is None:
        return RESET if is_hardware(category) else HOST
    return registry.suggested_action(check)


def _foreign_action(node: NodeInfo) -> str:
    """For a node drained or down by someone else: who to ask."""
    text = node.reason.lower()
    if "NOT_RESPONDING" in node.flags or "not responding" in text:
        return NOT_RESPONDING
    if text in ("prolog error", "epilog error") or "batch job complete failure" in text:
        return HOOK_ERROR
    return ADMIN


def _bundle_facts(bundle: str | None) -> dict[str, Any]:
    """Category, Xid and failing rank from a bundle's summary.json ({} when unreadable).

    Only fields of the types the table relies on: a summary is on shared storage and a bad
    one must cost its node's row a blank, not the whole listing.
    """
    if not bundle or type(bundle) is not str:
        return {}

    try:
        summary = read_summary(bundle)
    except Exception:  # any unreadable summary is "no facts"
        return {}
    if not isinstance(summary, EvidenceSummary):
        return {}  # none, an invalid one (read_summary said None), or a qualification's
    found = {"category": summary.category, "xid": summary.xid,
             "failing_rank": summary.failing_rank, "failing_node": summary.failing_node}  # fmt: skip
    return {k: v for k, v in found.items() if v is not None}


def _latest_evidence(
    node: NodeInfo, check: str | None, past: list[DrainEntry], evidence_dir: str
) -> tuple[str | None, dict[str, Any]]:
    """(bundle path, what it says) for a gpugate drain: the bundle the reason names, else the
    one of the newest drain for the same check in the history. The history entry's category
    is used when it is about that bundle: summary.json is read only when it is not (bundles
    are usually on shared storage, a round trip each)."""
    rel = history.reason_bundle(node.reason)
    named = os.path.join(evidence_dir, rel) if rel else None
    entry = next((e for e in reversed(past) if e.check == check), None)
    said = {"category": entry.category, "xid": entry.xid} if entry else {}
    bundle = named or (entry.bundle if entry else None)
    if entry and entry.category and (named is None or entry.bundle == named):
        return bundle, said
    return bundle, _bundle_facts(bundle) or said


def node_row(
    node: NodeInfo,
    past: list[DrainEntry],
    evidence_dir: str,
    since: float,
    rma_after: int,
    drained: bool | None = None,
    unknown_xids: tuple[int, ...] = (),
) -> dict[str, Any]:
    """One node's row: state, reason, who/when, evidence, drains in the window, Xids outside
    NVIDIA's catalog its hooks reported in the window, action."""
    drained = node.drained if drained is None else drained
    # A literal, not a loop over field names: this runs once per node of the cluster.
    row = {
        "node": node.name,
        "state": "+".join((node.state, *node.flags)) if node.flags else node.state,
        "drained": drained,
        "reason": node.reason,
        "set_by": node.reason_user,
        "since": history.iso(node.reason_time) if node.reason_time else "",
        "gpugate": node.gpugate_owned if node.reason else False,
        "check": None,
        "category": None,
        "xid": None,
        "bundle": None,
        # A drill's drains are simulated faults: no repeat, no RMA (history.drill_of).
        "drains": sum(1 for e in past if e.when >= since and not history.drill_of(e))
        if past
        else 0,
        "same_check_drains": 0,
        # A tuple, not a list: rows_json() keys rows by their values (printed as a JSON list).
        "unknown_xids": unknown_xids,
        # The GPUs gpugate took out of the node's service (its Slurm Comment); () for most.
        "isolated_gpus": isolated_of(node) if node.comment else (),
        "action": NONE,
    }
    if not drained:
        return row
    if not row["gpugate"]:
        row["action"] = _foreign_action(node)
        return row
    check = history.reason_check(node.reason)
    bundle, facts = _latest_evidence(node, check, past, evidence_dir)
    same = sum(1 for e in past if e.when >= since and e.check == check
               and not history.drill_of(e))  # fmt: skip
    category, xid = facts.get("category"), facts.get("xid")
    row.update(check=check, category=category, xid=xid, bundle=bundle, same_check_drains=same)
    row["action"] = suggest_action(check, node.reason, category, xid, same, rma_after)
    return row


def urgency_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """Sort key, most urgent first: action, repeats, then the longest-waiting drain."""
    return (
        URGENCY[row["action"]] if row["drained"] or row["action"] == HELD else len(ACTIONS),
        -row["same_check_drains"],
        -row["drains"],
        row["since"] or "~",
        row["node"],
    )


def node_rows(
    groups: list[Group],
    drains: list[DrainEntry],
    evidence_dir: str,
    window_days: float = 30,
    rma_after: int = 3,
    now: float | None = None,
    drained_only: bool = False,
    unknown: Sequence[UnknownXidsEntry] = (),
    held: dict[str, HeldEntry] | None = None,
    suspects: dict[str, FlagEntry] | None = None,
) -> list[dict[str, Any]]:
    """Rows for every node of `groups`, most urgent first; nodes in service keep Slurm's
    order, last. `unknown`: the history's entries of Xids outside NVIDIA's catalog; `held`:
    {node: held entry} of drains the budget held back (those nodes in service rank first);
    `suspects`: {node: open flag} of nodes users' jobs pointed at, awaiting a qualification."""
    since = history.window_start(window_days, now)
    past = history.by_node(drains)
    held = held or {}
    suspects = suspects or {}
    xids = unknown_by_node(unknown, since)
    urgent: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for first, names in groups:
        drained = first.drained
        if drained_only and not drained:
            # A held-back drain is shown with the drained nodes: it is one gpugate wanted; so
            # is a node with isolated GPUs (partly out of service). A Comment is a group's
            # own only for a group of one node (parse_node_groups).
            isolated = len(names) == 1 and bool(parse_comment(first.comment))
            names = [n for n in names if n in held or n in suspects or isolated]
        out = urgent if drained else rest
        shared = None  # the row of the group's nodes without history, made once
        for name in names:
            if name in past or name in xids or name in held or name in suspects:
                node = first.replace(name=name) if name != first.name else first
                row = node_row(node, past.get(name, []), evidence_dir, since, rma_after,
                               drained, xids.get(name, ()))  # fmt: skip
                if not drained and name in held:
                    row = held_row(row, held[name])
                elif not drained and name in suspects:
                    row = suspect_row(row, suspects[name])
                (urgent if row["action"] in (HELD, SUSPECT) else out).append(row)
                continue
            if shared is None:
                shared = node_row(first, [], evidence_dir, since, rma_after, drained)
            out.append(dict(shared, node=name))  # same state and reason as the group's
    urgent.sort(key=urgency_key)
    return urgent + rest


def held_row(row: dict[str, Any], entry: HeldEntry) -> dict[str, Any]:
    """A node in service whose drain the budget held back: what gpugate wanted, why not."""
    return dict(row, check=entry.check, action=HELD, would_drain_reason=entry.reason,
                would_drain_why=entry.why, would_drain_since=entry.at)  # fmt: skip


def suspect_row(row: dict[str, Any], flag: FlagEntry) -> dict[str, Any]:
    """A node in service that users' jobs pointed at: where from, why, what gpugate asked for."""
    return dict(row, action=SUSPECT, suspect_source=flag.source, suspect_detail=flag.detail,
                suspect_since=flag.at, suspect_asked=flag.action,
                suspect_note=flag.note or "")  # fmt: skip


def isolated_of(node: NodeInfo) -> tuple[dict[str, Any], ...]:
    """The node's isolated GPUs as the JSON shows them: index, minor, serial, since (ISO and
    epoch), why."""
    return tuple(
        {"index": g.index, "minor": g.minor, "serial": g.serial, "since": history.iso(g.since),
         "since_epoch": g.since, "why": g.why}
        for g in parse_comment(node.comment)
    )  # fmt: skip


def isolated_gpus(groups: Iterable[Group]) -> list[dict[str, Any]]:
    """Every isolated GPU of the listing, by node then GPU index: isolated_of()'s fields with
    `node` and `gpus_serving` (the node's GPU count as Slurm reports it now; None: unknown)."""
    out = []
    for node, names in groups:
        if len(names) != 1 or not node.comment:  # a group's Comment is its first node's
            continue
        for gpu in isolated_of(node):
            out.append({"node": names[0], **gpu, "gpus_serving": node.gres_gpus})
    return sorted(out, key=lambda e: (e["node"], e["index"]))


def unknown_by_node(
    entries: Iterable[UnknownXidsEntry], since: float
) -> dict[str, tuple[int, ...]]:
    """Each node's Xids outside NVIDIA's catalog reported since `since`, sorted, each once."""
    seen: dict[str, set[int]] = {}
    for e in entries:
        if e.when >= since:
            seen.setdefault(e.node, set()).update(e.xids)
    return {node: tuple(sorted(codes)) for node, codes in seen.items()}


def rows_for(
    config: Config,
    groups: list[Group],
    now: float | None = None,
    drained_only: bool = False,
    window_days: float | None = None,
    drains: list[DrainEntry] | None = None,
) -> list[dict[str, Any]]:
    """node_rows() with the configured history, evidence root, window and RMA threshold."""
    adm = config.admin
    where = history.history_dir(config)
    drains = history.drains(where) if drains is None else drains
    return node_rows(
        groups,
        drains,
        config.evidence_dir,
        adm.history_window_days if window_days is None else window_days,
        adm.rma_after_drains,
        now,
        drained_only,
        history.unknown_xids(where),
        current_held(held_entries(where), drains, now),
        open_flags(history.read_dirs(config)),  # the controller's votes' flags too
    )


def check_stats(config: Config, groups: list[Group], window_days: float,
                now: float | None = None) -> dict[str, dict[str, int]]:  # fmt: skip
    """Each check's record in the window (store/outcomes.py), Slurm's drained nodes included."""

    where = history.history_dir(config)
    drained = {name for first, names in groups if first.drained for name in names}
    since = history.window_start(window_days, now)
    return check_record(history.drains(where), history.resumes(where), since, drained)


# ----------------------------------------------------------------------------- printing

COLUMNS = (
    ("NODE", "node"), ("STATE", "state"), ("CHECK", "check"), ("CATEGORY", "category"),
    ("DRAINS", "drains"), ("ACTION", "action"), ("SET BY", "set_by"), ("SINCE", "since"),
    ("UNKNOWN XIDS", "unknown_xids"), ("REASON", "reason"),
)  # fmt: skip


def render_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table, one line per node; the reason last, uncut."""
    cells = [[h for h, _ in COLUMNS]]
    cells += [[_cell(_shown(r, k)) for _, k in COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS) - 1)]
    lines = []
    for c in cells:
        head = "  ".join(v.ljust(w) for v, w in zip(c, widths))
        lines.append(f"{head}  {c[-1]}".rstrip())
    return "\n".join(lines) + "\n"


def isolated_line(node: str, gpu: dict[str, Any]) -> str:
    """`gpu-07: isolated GPU 3 (serial 1654922010523) since 2026-12-03T10:00:00Z: gpu.ecc: ...`."""
    serial = f" (serial {gpu['serial']})" if gpu["serial"] else ""
    return _cell(f"{node}: isolated GPU {gpu['index']}{serial} since {gpu['since']}: {gpu['why']}")


def render_isolated(rows: list[dict[str, Any]]) -> str:
    """One line per isolated GPU of the rows ("" when none), for below the table."""
    lines = [isolated_line(r["node"], g) for r in rows for g in r.get("isolated_gpus") or ()]
    return "".join(f"{line}\n" for line in lines)


def _shown(row: dict[str, Any], key: str) -> object:
    """A row's value for the table: a held-back drain's reason says what gpugate wanted."""
    if key == "reason" and row["action"] == HELD and not row["reason"]:
        return f"wanted: {row['would_drain_reason']} (held back: {row['would_drain_why']})"
    if key == "reason" and row["action"] == SUSPECT and not row["reason"]:
        asked = "qualification started" if row["suspect_asked"] == "qualify" else "review"
        return (f"pointed at by users' jobs ({row['suspect_source']}): {row['suspect_detail']}; "
                f"{asked} since {row['suspect_since']} (not drained)")  # fmt: skip
    return row[key]


def _cell(value: object) -> str:
    """One printable ASCII line: reasons come from anyone who can drain a node."""
    if type(value) is tuple:  # unknown_xids: the codes, comma-separated
        value = ",".join(map(str, value))
    text = "" if value is None else str(value)
    if text.isascii() and text.isprintable():
        return text

    # Controls and bidi overrides shown as `\x1b`, `\u202e`: the admin sees what was there.
    text = printable(text)
    return text if len(text) <= 400 else text[:397] + "..."


def rows_json(rows: list[dict[str, Any]]) -> str:
    """The rows as a compact JSON array, equal to json.dumps(rows).

    Most nodes of a cluster differ only in their name, and encoding 10,000 rows costs more
    than parsing Slurm's listing: rows equal but for their first key (`node`) share the
    encoding of the rest.
    """

    rests: dict[tuple[Any, ...], str] = {}
    parts = []
    for row in rows:
        items = iter(row.items())
        first, name = next(items)
        key = tuple(items)
        if row.get("isolated_gpus"):  # dicts cannot key the cache; such rows are few
            rest = json.dumps(dict(key), separators=(",", ":"))[1:]
        else:
            cached = rests.get(key)
            if cached is None:
                cached = rests[key] = json.dumps(dict(key), separators=(",", ":"))[1:]
            rest = cached
        parts.append(
            f"{{{quote(first)}:{quote(name)},{rest}" if key else f"{{{quote(first)}:{quote(name)}}}"
        )
    return "[" + ",".join(parts) + "]"


def now_iso(now: float | None = None) -> str:
    """The time a listing was made, for its header."""
    return history.iso(time.time() if now is None else now)

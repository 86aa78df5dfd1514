"""Admin review: one row per node (state, reason, evidence, repeat count, what to do), most
urgent first. `gpugate nodes` prints the rows; `gpugate report` renders them as HTML.

One Slurm call reads every node (`sinfo --json`, or `scontrol -o show node` where JSON is
missing), one file read gives the whole drain history, and only drained gpugate nodes cost a
bundle's `summary.json` read, so the table stays cheap on a 10,000-node cluster. Rows are
records (`NodeRow`; `to_json` is what `gpugate nodes --json` prints), and the nodes of a group
without history share one: most of a cluster is a few distinct rows, each built and encoded
once (`rows_json`).
"""

from __future__ import annotations

import json
import os
import re
import time
from json.encoder import encode_basestring_ascii as quote
from operator import attrgetter

from gpugate.checks import registry
from gpugate.checks.registry import COOLING, HOST, REBOOT, RESEAT, RESET
from gpugate.checks.xid import lookup
from gpugate.diagnosis.categories import is_hardware
from gpugate.isolate.comment import parse_comment
from gpugate.record import Record
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


# ------------------------------------------------------------------------------ rows


class IsolatedGpu(Record):
    """A GPU gpugate isolated on a node (its Comment), as the views show it."""

    index: int
    minor: int
    serial: str
    since: str  # UTC ISO
    since_epoch: int
    why: str

    def to_json(self) -> dict[str, object]:
        """`index`, `minor`, `serial`, `since`, `since_epoch`, `why`."""
        return {"index": self.index, "minor": self.minor, "serial": self.serial,
                "since": self.since, "since_epoch": self.since_epoch, "why": self.why}  # fmt: skip


class IsolatedOn(Record):
    """An isolated GPU of the listing: its node, the GPU, and the GPUs Slurm counts on the
    node now (None: unknown)."""

    node: str
    gpu: IsolatedGpu
    gpus_serving: int | None

    def to_json(self) -> dict[str, object]:
        """`node`, the GPU's keys, `gpus_serving`."""
        return {"node": self.node, **self.gpu.to_json(), "gpus_serving": self.gpus_serving}


class HeldBack(Record):
    """The drain the budget held back on a node in service: what gpugate wanted, why not."""

    reason: str
    why: str | None
    since: str | None  # UTC ISO


class Suspicion(Record):
    """A node in service that users' jobs pointed at: where from, why, what gpugate asked."""

    source: str
    detail: str | None
    since: str | None  # UTC ISO
    asked: str  # qualify / review
    note: str


class NodeRow(Record):
    """One node's row: state, reason, who/when, evidence, drains in the window, Xids outside
    NVIDIA's catalog, isolated GPUs, the suggested action; a held-back drain's or a
    suspicion's details on a node in service."""

    node: str
    state: str
    drained: bool
    reason: str
    set_by: str
    since: str  # UTC ISO of the reason's time; "" unknown
    gpugate: bool  # the reason is gpugate's
    check: str | None = None
    category: str | None = None
    xid: int | None = None
    bundle: str | None = None
    drains: int = 0  # in the window, drills' not counted
    same_check_drains: int = 0
    unknown_xids: tuple[int, ...] = ()
    isolated_gpus: tuple[IsolatedGpu, ...] = ()
    action: str = ""
    held: HeldBack | None = None
    suspect: Suspicion | None = None

    def named(self, node: str) -> NodeRow:
        """This row for another node of the same state and reason."""
        # A copy of fields already checked, not a replace(): on a 10,000-node cluster of
        # healthy nodes this is most of the listing (about 0.5 us against 5).
        row = object.__new__(NodeRow)
        row.__dict__.update(self.__dict__, node=node)
        return row

    def to_json(self) -> dict[str, object]:
        """The row as `gpugate nodes --json` prints it: a held-back drain's `would_drain_*`
        and a suspicion's `suspect_*` keys only on those rows."""
        out: dict[str, object] = {
            "node": self.node, "state": self.state, "drained": self.drained,
            "reason": self.reason, "set_by": self.set_by, "since": self.since,
            "gpugate": self.gpugate, "check": self.check, "category": self.category,
            "xid": self.xid, "bundle": self.bundle, "drains": self.drains,
            "same_check_drains": self.same_check_drains, "unknown_xids": list(self.unknown_xids),
            "isolated_gpus": [g.to_json() for g in self.isolated_gpus], "action": self.action,
        }  # fmt: skip
        if self.held is not None:
            out.update(would_drain_reason=self.held.reason, would_drain_why=self.held.why,
                       would_drain_since=self.held.since)  # fmt: skip
        if self.suspect is not None:
            s = self.suspect
            out.update(suspect_source=s.source, suspect_detail=s.detail, suspect_since=s.since,
                       suspect_asked=s.asked, suspect_note=s.note)  # fmt: skip
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


def _bundle_facts(bundle: str | None) -> tuple[str | None, int | None] | None:
    """(category, Xid) from a bundle's summary.json; None when unreadable or it says neither.

    A summary is on shared storage and a bad one must cost its node's row a blank, not the
    whole listing.
    """
    if not bundle or type(bundle) is not str:
        return None

    try:
        summary = read_summary(bundle)
    except Exception:  # any unreadable summary is "no facts"
        return None
    if not isinstance(summary, EvidenceSummary):
        return None  # none, an invalid one (read_summary said None), or a qualification's
    if summary.category is None and summary.xid is None:
        return None
    return summary.category, summary.xid


def _latest_evidence(
    node: NodeInfo, check: str | None, past: list[DrainEntry], evidence_dir: str
) -> tuple[str | None, str | None, int | None]:
    """(bundle path, category, Xid) for a gpugate drain: the bundle the reason names, else
    the one of the newest drain for the same check in the history. The history entry's
    category is used when it is about that bundle: summary.json is read only when it is not
    (bundles are usually on shared storage, a round trip each)."""
    rel = history.reason_bundle(node.reason)
    named = os.path.join(evidence_dir, rel) if rel else None
    entry = next((e for e in reversed(past) if e.check == check), None)
    said = (entry.category, entry.xid) if entry else (None, None)
    bundle = named or (entry.bundle if entry else None)
    if entry and entry.category and (named is None or entry.bundle == named):
        return bundle, *said
    return bundle, *(_bundle_facts(bundle) or said)


def node_row(
    node: NodeInfo,
    past: list[DrainEntry],
    evidence_dir: str,
    since: float,
    rma_after: int,
    drained: bool | None = None,
    unknown_xids: tuple[int, ...] = (),
) -> NodeRow:
    """One node's row: state, reason, who/when, evidence, drains in the window, Xids outside
    NVIDIA's catalog its hooks reported in the window, action."""
    drained = node.drained if drained is None else drained
    row = NodeRow(
        node=node.name,
        state="+".join((node.state, *node.flags)) if node.flags else node.state,
        drained=drained,
        # A node back in service shows no reason: one Slurm kept past the resume is stale.
        reason=node.state_reason,
        set_by=node.reason_user if node.state_reason else "",
        since=history.iso(node.reason_time) if node.reason_time and node.state_reason else "",
        gpugate=node.gpugate_owned if node.state_reason else False,
        # A drill's drains are simulated faults: no repeat, no RMA (history.drill_of).
        drains=sum(1 for e in past if e.when >= since and not history.drill_of(e)) if past else 0,
        unknown_xids=unknown_xids,
        # The GPUs gpugate took out of the node's service (its Slurm Comment); () for most.
        isolated_gpus=isolated_of(node) if node.comment else (),
    )
    if not drained:
        return row
    if not row.gpugate:
        return row.replace(action=_foreign_action(node))
    check = history.reason_check(node.reason)
    bundle, category, xid = _latest_evidence(node, check, past, evidence_dir)
    same = sum(1 for e in past if e.when >= since and e.check == check
               and not history.drill_of(e))  # fmt: skip
    action = suggest_action(check, node.reason, category, xid, same, rma_after)
    return row.replace(check=check, category=category, xid=xid, bundle=bundle,
                       same_check_drains=same, action=action)  # fmt: skip


def urgency_key(row: NodeRow) -> tuple[Any, ...]:
    """Sort key, most urgent first: action, repeats, then the longest-waiting drain."""
    return (
        URGENCY[row.action] if row.drained or row.action == HELD else len(ACTIONS),
        -row.same_check_drains,
        -row.drains,
        row.since or "~",
        row.node,
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
) -> list[NodeRow]:
    """Rows for every node of `groups`, most urgent first; nodes in service keep Slurm's
    order, last. `unknown`: the history's entries of Xids outside NVIDIA's catalog; `held`:
    {node: held entry} of drains the budget held back (those nodes in service rank first);
    `suspects`: {node: open flag} of nodes users' jobs pointed at, awaiting a qualification."""
    since = history.window_start(window_days, now)
    past = history.by_node(drains)
    held = held or {}
    suspects = suspects or {}
    xids = unknown_by_node(unknown, since)
    urgent: list[NodeRow] = []
    rest: list[NodeRow] = []
    # The rows of nodes without history, by all that node_row() reads of them but the name:
    # healthy nodes are a few distinct rows, whether sinfo grouped them or not.
    shared: dict[tuple[object, ...], NodeRow] = {}
    for first, names in groups:
        drained = first.drained
        if drained_only and not drained:
            # A held-back drain is shown with the drained nodes: it is one gpugate wanted; so
            # is a node with isolated GPUs (partly out of service). A Comment is a group's
            # own only for a group of one node (parse_node_groups).
            isolated = len(names) == 1 and bool(parse_comment(first.comment))
            names = [n for n in names if n in held or n in suspects or isolated]
        out = urgent if drained else rest
        key = (first.state, first.flags, first.reason, first.reason_user, first.reason_time,
               first.comment, drained)  # fmt: skip
        for name in names:
            if name in past or name in xids or name in held or name in suspects:
                node = first.replace(name=name) if name != first.name else first
                row = node_row(node, past.get(name, []), evidence_dir, since, rma_after,
                               drained, xids.get(name, ()))  # fmt: skip
                if not drained and name in held:
                    row = held_row(row, held[name])
                elif not drained and name in suspects:
                    row = suspect_row(row, suspects[name])
                (urgent if row.action in (HELD, SUSPECT) else out).append(row)
                continue
            made = shared.get(key)
            if made is None:
                made = shared[key] = node_row(first, [], evidence_dir, since, rma_after, drained)
            out.append(made if name == made.node else made.named(name))
    urgent.sort(key=urgency_key)
    return urgent + rest


def held_row(row: NodeRow, entry: HeldEntry) -> NodeRow:
    """A node in service whose drain the budget held back: what gpugate wanted, why not."""
    return row.replace(check=entry.check, action=HELD,
                       held=HeldBack(reason=entry.reason, why=entry.why, since=entry.at))  # fmt: skip


def suspect_row(row: NodeRow, flag: FlagEntry) -> NodeRow:
    """A node in service that users' jobs pointed at: where from, why, what gpugate asked for."""
    suspicion = Suspicion(source=flag.source, detail=flag.detail, since=flag.at,
                          asked=flag.action, note=flag.note or "")  # fmt: skip
    return row.replace(action=SUSPECT, suspect=suspicion)


def isolated_of(node: NodeInfo) -> tuple[IsolatedGpu, ...]:
    """The node's isolated GPUs: index, minor, serial, since (ISO and epoch), why."""
    return tuple(
        IsolatedGpu(index=g.index, minor=g.minor, serial=g.serial, since=history.iso(g.since),
                    since_epoch=g.since, why=g.why)
        for g in parse_comment(node.comment)
    )  # fmt: skip


def isolated_gpus(groups: Iterable[Group]) -> list[IsolatedOn]:
    """Every isolated GPU of the listing, by node then GPU index, with the node's GPU count
    as Slurm reports it now (None: unknown)."""
    out = []
    for node, names in groups:
        if len(names) != 1 or not node.comment:  # a group's Comment is its first node's
            continue
        for gpu in isolated_of(node):
            out.append(IsolatedOn(node=names[0], gpu=gpu, gpus_serving=node.gres_gpus))
    return sorted(out, key=lambda e: (e.node, e.gpu.index))


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
) -> list[NodeRow]:
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


def render_table(rows: list[NodeRow]) -> str:
    """A fixed-width table, one line per node; the reason last, uncut."""
    cells = [[h for h, _ in COLUMNS]]
    cells += [[_cell(_shown(r, k)) for _, k in COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS) - 1)]
    lines = []
    for c in cells:
        head = "  ".join(v.ljust(w) for v, w in zip(c, widths))
        lines.append(f"{head}  {c[-1]}".rstrip())
    return "\n".join(lines) + "\n"


def isolated_line(node: str, gpu: IsolatedGpu) -> str:
    """`gpu-07: isolated GPU 3 (serial 1654922010523) since 2026-12-03T10:00:00Z: gpu.ecc: ...`."""
    serial = f" (serial {gpu.serial})" if gpu.serial else ""
    return _cell(f"{node}: isolated GPU {gpu.index}{serial} since {gpu.since}: {gpu.why}")


def render_isolated(rows: list[NodeRow]) -> str:
    """One line per isolated GPU of the rows ("" when none), for below the table."""
    lines = [isolated_line(r.node, g) for r in rows for g in r.isolated_gpus]
    return "".join(f"{line}\n" for line in lines)


def _shown(row: NodeRow, key: str) -> object:
    """A row's value for the table: a held-back drain's reason says what gpugate wanted."""
    if key == "reason" and row.held is not None and row.action == HELD and not row.reason:
        return f"wanted: {row.held.reason} (held back: {row.held.why})"
    s = row.suspect
    if key == "reason" and s is not None and row.action == SUSPECT and not row.reason:
        asked = "qualification started" if s.asked == "qualify" else "review"
        return (f"pointed at by users' jobs ({s.source}): {s.detail}; "
                f"{asked} since {s.since} (not drained)")  # fmt: skip
    return getattr(row, key)


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


def rows_json(rows: list[NodeRow]) -> str:
    """The rows as a compact JSON array, equal to json.dumps of their to_json().

    Most nodes of a cluster differ only in their name, and encoding 10,000 rows costs more
    than parsing Slurm's listing: rows equal but for their first field (`node`) share the
    encoding of the rest.
    """
    rests: dict[tuple[object, ...], str] = {}
    parts = []
    for row in rows:
        key = _rest_of(row)
        rest = rests.get(key)
        if rest is None:
            doc = row.to_json()
            del doc["node"]
            rest = rests[key] = json.dumps(doc, separators=(",", ":"))[1:]
        parts.append(f"{{{quote('node')}:{quote(row.node)},{rest}")
    return "[" + ",".join(parts) + "]"


# Every field but `node` (the first), as one tuple: what rows_json caches a row's encoding by.
_rest_of = attrgetter(*NodeRow._fields[1:])


def now_iso(now: float | None = None) -> str:
    """The time a listing was made, for its header."""
    return history.iso(time.time() if now is None else now)

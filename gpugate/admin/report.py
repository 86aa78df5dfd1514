"""`gpugate report`: one self-contained HTML page for admins (inline CSS, no script, no
external asset): drained nodes with reasons and evidence; job failures and GPU-hours lost by
cause (admin/losses.py, from the bundles), each failed run linked to its bundle, the requeue
decisions, the drains the budget held back; repeat offenders, and a timeline of drains and
resumes from the history and the audit log; inline SVG charts (admin/charts.py); each node's
latest qualification (gpugate/store/qualify.py: values against floors, failures, pair verdict);
the RMA list and each drained node's repair ledger (admin/ledger_view.py, store/ledger.py).
Bundles are kept apart by kind (admin/losses.py): only a job's is a failed run; qualifications
(passed, failed with their reason, not qualified) and drills have their own section, and a
drill's drains stay out of every check's record (store/outcomes.py).

Every value is escaped: drain reasons, resume notes and node names can come from anyone able
to write a job log or run `scontrol update`, and the page must show them as text.
"""

from __future__ import annotations

import os
import time
from html import escape
from urllib.parse import quote

from gpugate.admin import charts
from gpugate.admin.ledger_view import SHOWN, RmaItem, node_lines, rma_list
from gpugate.admin.losses import HOW_COMPUTED, by_category
from gpugate.admin.nodes import HELD, RMA, URGENCY
from gpugate.admin.rollout import check_rates, rate_text
from gpugate.checkpoints.freshness import span
from gpugate.fsutil import atomic_write
from gpugate.record import Record
from gpugate.store import history
from gpugate.store.entries import AuditEntry, DrainEntry, HeldEntry, LedgerEntry
from gpugate.store.outcomes import FIELDS, check_record, drill_drains
from gpugate.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpugate.admin.losses import Bundle, Requeue
    from gpugate.admin.nodes import IsolatedOn, NodeRow
    from gpugate.config.schema import Policy
    from gpugate.store.drills import DrillEntry
    from gpugate.store.qualify import QualifyEntry, QualifyTestResult
    from gpugate.store.suspects import FlagEntry

TIMELINE_MAX = 500  # events shown; the page stays readable and small on a busy cluster

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d2430}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.meta{color:#5b6472;margin:0 0 16px}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{border:1px solid #d7dce3;border-radius:6px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:22px}
table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid #e3e7ec;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f8;font-weight:600}
td.node,td.time{white-space:nowrap;font-weight:600}td.time{font-weight:400}
td.reason{word-break:break-word;max-width:40em}
code{font-size:12px;word-break:break-all}
.a{display:inline-block;border-radius:4px;padding:0 6px;font-size:12px;white-space:nowrap}
.u0{background:#5f0f40;color:#fff}
.u1{background:#b42318;color:#fff}.u2{background:#d9480f;color:#fff}.u3{background:#f59f00}
.u4{background:#ffd43b}.u5,.u6{background:#e9ecef}.u7,.u8,.u9{background:#dbe4ff}
.rma{color:#b42318;font-weight:600}.drain{color:#b42318}.resume{color:#2b8a3e}.refused,.repair{color:#5b6472}.held{color:#5f0f40}
td.false{font-weight:600;color:#b42318}
.notice{border:1px solid #f59f00;background:#fff9db;padding:8px 12px;border-radius:6px}
.empty{color:#5b6472;font-style:italic}
.charts{display:flex;flex-wrap:wrap;gap:16px;margin:8px 0}
.chart{border:1px solid #e3e7ec;border-radius:6px;background:#fff}
td.n{text-align:right}
"""


def esc(value: object) -> str:
    """Any value as HTML text: None as a dash, everything else escaped (quotes too)."""
    if value is None or value == "":
        return "-"

    # html.escape leaves controls and bidi overrides (U+202E shows a reason reversed) alone.
    return escape(printable(value), quote=True)


def kept_serving(isolated: Sequence[IsolatedOn], since: float, now: float) -> dict[str, float]:
    """{node: GPU-hours it kept serving in the window}: the GPUs Slurm counts on it now times
    the hours since its earliest isolation (from the window's start at the earliest).

    `isolated`: admin.nodes.isolated_gpus() entries. A node whose GPU count is unknown counts
    nothing: the page says how it is computed.
    """
    first: dict[str, tuple[float, int | None]] = {}
    for e in isolated:
        when = float(e.gpu.since_epoch)
        if e.node not in first or when < first[e.node][0]:
            first[e.node] = (when, e.gpus_serving)
    return {
        node: max(0.0, now - max(when, since)) / 3600 * gpus
        for node, (when, gpus) in sorted(first.items())
        if isinstance(gpus, int) and gpus > 0
    }


KEPT_HOW = (
    "GPU-hours kept serving: for each node with isolated GPUs, the GPUs Slurm counts on it now "
    "times the hours since its earliest isolation (or the window's start): what a drain of the "
    "whole node would have taken out of service."
)


def isolated_section(isolated: Sequence[IsolatedOn], kept: dict[str, float]) -> str:
    """The GPUs gpugate isolated (node Comments), by node: which, since when, why, and the
    GPU-hours each node kept serving."""
    body = [
        f'<tr><td class="node">{esc(e.node)}</td><td class="n">{esc(g.index)}</td>'
        f'<td class="n">{esc(g.minor)}</td><td><code>{esc(g.serial)}</code></td>'
        f'<td class="time">{esc(g.since)}</td><td class="reason">{esc(g.why)}</td>'
        f'<td class="n">{esc(e.gpus_serving)}</td>'
        f'<td class="n">{_hours(kept.get(e.node))}</td></tr>'
        for e in isolated
        for g in (e.gpu,)
    ]
    headers = ("Node", "GPU", "Minor", "Serial", "Isolated since", "Why", "GPUs still serving",
               "GPU-hours kept serving (node)")  # fmt: skip
    table = _table(headers, body, "No GPU is isolated (isolate.unit: gpu).")
    return f'<p class="meta">{esc(KEPT_HOW)}</p>{table}' if body else table


class Offender(Record):
    """A node drained repeatedly in the window: how often, by which check, its last drain."""

    node: str
    drains: int
    checks: dict[str, int]  # check id -> its drains ("?": a drain without one)
    last: float  # the last drain's time (epoch)
    last_reason: str | None


def repeat_offenders(drains: list[DrainEntry], since: float, min_drains: int = 2) -> list[Offender]:
    """Nodes drained at least `min_drains` times since `since`: count, by check, last drain
    (a drill's drains are simulated: not counted)."""
    out = []
    real = (e for e in drains if e.when >= since and not history.drill_of(e))
    for node, entries in history.by_node(real).items():
        if len(entries) < min_drains:
            continue
        checks: dict[str, int] = {}
        for e in entries:
            checks[e.check or "?"] = checks.get(e.check or "?", 0) + 1
        out.append(Offender(node=node, drains=len(entries), checks=checks,
                            last=entries[-1].when, last_reason=entries[-1].reason))  # fmt: skip
    return sorted(out, key=lambda o: (-o.drains, -max(o.checks.values()), o.node))


def timeline(
    drains: list[DrainEntry],
    resumes: list[AuditEntry],
    since: float,
    limit: int = TIMELINE_MAX,
    held: Sequence[HeldEntry] = (),
) -> list[Happening]:
    """Drains, held-back drains, repairs and resumes since `since`, newest first, at most `limit`."""
    events = [Happening(event="drain", entry=e) for e in drains if e.when >= since]
    events += [Happening(event="held", entry=e) for e in held if e.when >= since]
    events += [Happening(event=resume_event(e), entry=e) for e in resumes if e.when >= since]
    events.sort(key=lambda e: e.entry.when, reverse=True)
    return events[:limit]


class Happening(Record):
    """One event of the timeline: what (`drain`, `held`, `resume`, `refused`, `repair`) and
    the history's entry of it."""

    event: str
    entry: DrainEntry | HeldEntry | AuditEntry


_LABELS = {"drain": "drain", "resume": "resume", "refused": "resume refused", "repair": "repair",
           "held": HELD}  # fmt: skip


def resume_event(entry: AuditEntry) -> str:
    """`resume`, `repair` (a repair audited on a drained node), or `refused` for an audit
    entry of a resume that did not happen."""
    if entry.repair and not entry.resumed:
        return "repair"
    refused = not entry.resumed or str(entry.result).startswith("refused")
    return "refused" if refused else "resume"


def _table(headers: tuple[str, ...], body: list[str], empty: str) -> str:
    if not body:
        return f'<p class="empty">{esc(empty)}</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _action(row: NodeRow) -> str:
    return f'<span class="a u{URGENCY.get(row.action, 9)}">{esc(row.action)}</span>'


def drained_section(rows: list[NodeRow]) -> str:
    """The drained nodes, most urgent first, with reason, evidence and suggested action."""
    body = []
    for r in rows:
        owner = "gpugate" if r.gpugate else "other"
        reason, set_by, since = r.reason, r.set_by, r.since
        if r.action == HELD and r.held:  # in service: the reason gpugate wanted, and why not
            owner = "held back by the drain budget"
            reason, set_by = f"wanted: {r.held.reason} ({r.held.why})", "gpugate"
            since = r.held.since or ""
        body.append(
            "<tr>"
            f'<td class="node">{esc(r.node)}</td><td>{esc(r.state)}</td>'
            f"<td>{_action(r)}</td><td>{esc(r.check)}</td><td>{esc(r.category)}</td>"
            f'<td class="drains">{esc(r.drains)}</td>'
            f'<td>{esc(set_by)} ({owner})</td><td class="time">{esc(since)}</td>'
            f'<td class="reason">{esc(reason)}</td><td><code>{esc(r.bundle)}</code></td>'
            "</tr>"
        )
    headers = ("Node", "State", "Suggested action", "Check", "Category", "Drains",
               "Set by", "Since", "Reason", "Evidence")  # fmt: skip
    return _table(headers, body, "No drained nodes. No drain held back by the budget.")


def offenders_section(offenders: list[Offender], window_days: float) -> str:
    """Nodes drained repeatedly within the window."""
    body = []
    for o in offenders:
        checks = ", ".join(f"{c} \u00d7{n}" for c, n in sorted(o.checks.items()))
        body.append(
            f'<tr><td class="node">{esc(o.node)}</td><td class="drains">{esc(o.drains)}</td>'
            f'<td>{esc(checks)}</td><td class="time">{esc(history.iso(o.last))}</td>'
            f'<td class="reason">{esc(o.last_reason)}</td></tr>'
        )
    headers = ("Node", f"Drains in {window_days:g} days", "By check", "Last drain", "Last reason")
    return _table(headers, body, "No node was drained more than once in the window.")


def timeline_section(events: list[Happening]) -> str:
    """Drains and resumes, newest first."""
    body = []
    for h in events:
        e = h.entry
        if isinstance(e, DrainEntry):
            what = esc(e.reason or e.check)  # the reason starts with the check
            if e.bundle:
                what += f" <code>{esc(e.bundle)}</code>"
        elif isinstance(e, HeldEntry):
            what = f"wanted: {esc(e.reason)}; held back: {esc(e.why)}"
        else:
            forced = " (forced)" if e.forced else ""
            what = (f"by {esc(e.who)}{forced}: {esc(e.why)}; "
                    f"check result: {esc(_result(e.result))}")  # fmt: skip
        body.append(
            f'<tr><td class="time">{esc(history.iso(e.when))}</td>'
            f'<td class="node">{esc(e.node)}</td>'
            f'<td class="{h.event}">{_LABELS[h.event]}</td><td class="reason">{what}</td></tr>'
        )
    return _table(("Time", "Node", "Event", "Detail"), body, "No drains or resumes in the window.")


def rma_section(items: Sequence[RmaItem], window_days: float) -> str:
    """The RMA list (admin/ledger_view.py): nodes whose last verdict is to replace a part."""
    body = [
        f'<tr><td class="node">{esc(i.node)}</td><td><code>{esc(i.gpu)}</code></td>'
        f'<td>{esc(i.check)}</td><td class="time">{esc(i.at)}</td>'
        f'<td class="drains">{esc(i.drains)}</td><td>{esc(i.who)}</td>'
        f'<td class="reason">{esc(i.why)}</td><td><code>{esc(i.evidence)}</code></td></tr>'
        for i in items
    ]
    headers = ("Node", "GPU", "Check", "Since", f"Drains of it in {window_days:g} days", "By",
               "Why", "Evidence")  # fmt: skip
    return _table(headers, body, "No node's last verdict is to replace a part.")


def ledger_section(rows: Sequence[NodeRow], lines: Sequence[LedgerEntry]) -> str:
    """Each drained node's repair ledger: its newest steps, oldest first, node by node."""
    drained = {r.node for r in rows if r.drained}
    body = [
        f'<tr><td class="node">{esc(e.node)}</td><td class="time">{esc(e.at)}</td>'
        f'<td class="{esc(e.step)}">{esc(e.step)}</td><td>{esc(e.who)}</td>'
        f'<td>{esc(e.outcome)}</td><td class="reason">{esc(e.why)}</td>'
        f"<td><code>{esc(e.evidence)}</code></td></tr>"
        for node in sorted(drained)
        for e in node_lines(lines, node)
    ]
    headers = ("Node", "Time", "Step", "Who", "Outcome", "Why", "Evidence")
    return _table(headers, body, "No repair step recorded for the drained nodes.")


def record_section(record: dict[str, dict[str, int]]) -> str:
    """Each check's record: its drains, and how they ended (store/outcomes.py)."""
    body = []
    for check, v in record.items():
        cells = "".join(
            f'<td class="{"false" if f == "lifted_unrepaired" and v[f] else "n"}">{esc(v[f])}</td>'
            for f in FIELDS
        )
        body.append(f"<tr><td>{esc(check)}</td>{cells}</tr>")
    headers = ("Check", "Drains", "Lifted after repair", "Lifted without repair", "Still drained",
               "Lifted outside gpugate")  # fmt: skip
    return _table(headers, body, "No drains in the window.")


ROLLOUT_HOW = (
    "False-drain rate = the check's drains lifted through gpugate (gpugate resume, healing) "
    "with no repair since (no new boot, no GPU reset) ÷ all its drains lifted through "
    "gpugate, in the window; drains still in place or lifted outside gpugate have no verdict "
    "yet, and a drill's drain never counts. A report-only check never drains; a canary-only "
    "check drains only on its canary partitions' nodes, so its rate is its record there."
)


def rollout_sections(record: dict[str, dict[str, int]], policy: Policy | None) -> list[str]:
    """The heading, the how and the table of each check's stage and false-drain rate."""
    if policy is None:
        return []
    body = [
        f'<tr><td>{esc(r.check)}</td><td>{esc(r.rollout)}</td><td class="n">{r.drains}</td>'
        f'<td class="{"false" if r.false_drains else "n"}">{r.false_drains}</td>'
        f'<td class="n">{r.lifted}</td><td class="n">{esc(rate_text(r.rate))}</td></tr>'
        for r in check_rates(record, policy)
    ]
    headers = ("Check", "Stage", "Drains", "False drains", "Lifted through gpugate",
               "False-drain rate")  # fmt: skip
    return ['<h2 id="rollout">Checks: roll-out stage and false-drain rate</h2>',
            f'<p class="meta">{esc(ROLLOUT_HOW)}</p>',
            _table(headers, body, "No drains in the window, and every check acts.")]  # fmt: skip


def _result(result: object) -> object:
    if isinstance(result, dict):
        return result.get("status") or ", ".join(f"{k}={v}" for k, v in result.items())
    return result


def bundle_href(evidence_dir: str, rel: str, page_dir: str) -> str:
    """A relative link from the page's directory to a bundle's directory (percent-quoted)."""
    target = os.path.join(os.path.abspath(evidence_dir), rel)
    # quote() escapes ':' too: a link can never become a scheme (javascript:, http:).
    return quote(os.path.relpath(target, os.path.abspath(page_dir))) + "/"


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _bundle_link(f: Bundle) -> str:
    code = f"<code>{esc(f.path)}</code>"
    return f'<a href="{esc(f.href)}">{code}</a>' if f.href else code


def failures_section(costs: Sequence[Bundle]) -> str:
    """Failures and GPU-hours lost by category: two bar charts, the table, how it is computed."""
    rows = by_category(costs)
    if not rows:
        return '<p class="empty">No failed job left evidence in the window.</p>'
    total = sum(h for _, _, h in rows) or 1.0
    body = [f'<tr><td>{esc(c)}</td><td class="n">{n}</td><td class="n">{_hours(h)}</td>'
            f'<td class="n">{100 * h / total:.0f}%</td></tr>' for c, n, h in rows]  # fmt: skip
    figures = charts.hbars("Failures by cause", [(c, n) for c, n, _ in rows]) + charts.hbars(
        "GPU-hours lost by cause", [(c, h) for c, _, h in rows], unit=" GPU-h"
    )
    table = _table(("Cause", "Failures (bundles)", "GPU-hours lost", "Share"), body, "")
    return f'<p class="meta">{esc(HOW_COMPUTED)}</p><div class="charts">{figures}</div>{table}'


def runs_section(costs: Sequence[Bundle]) -> str:
    """Each failed run: when, where, cause, GPUs, from when its work was lost, its bundle."""
    body = []
    for f in sorted(costs, key=lambda f: f.failed or 0, reverse=True):
        frm = "checkpoint" if f.from_checkpoint else "run start"
        body.append(
            f'<tr><td class="time">{esc(history.iso(f.failed))}</td><td>{esc(f.job)}</td>'
            f'<td class="n">{esc(f.restart)}</td><td class="node">{esc(f.node)}</td>'
            f'<td>{esc(f.category)}</td><td class="n">{esc(f.gpus)}</td>'
            f'<td class="time">{esc(history.iso(f.lost_from))} ({frm})</td>'
            f'<td class="n">{_hours(f.gpu_hours)}</td><td>{_checkpoint_age(f)}</td>'
            f"<td>{_bundle_link(f)}</td></tr>"
        )
    headers = ("Failed", "Job", "Run", "Node", "Cause", "GPUs", "Work lost since",
               "GPU-hours", "Checkpoint age at end", "Evidence")  # fmt: skip
    return _table(headers, body, "No failed run in the window.")


def _checkpoint_age(f: Bundle) -> str:
    """The age the epilog recorded (stale: over checkpoints.max_age_s), or a dash."""
    age, stale = f.checkpoint_age_s, f.checkpoint_stale
    text = "none complete" if age is None else esc(span(age))
    if stale:
        return f"{text} <strong>stale</strong>"
    return text if age is not None else "\u2013"


def requeues_section(events: Sequence[Requeue]) -> str:
    """EpilogSlurmctld's requeue decisions, newest first, with the checkpoint resumed from."""
    body = []
    for e in sorted(events, key=lambda e: e.when, reverse=True):
        verdict = "requeued" if e.requeue is True else "not requeued"
        suspects = ", ".join(e.suspects)
        body.append(
            f'<tr><td class="time">{esc(history.iso(e.when))}</td><td>{esc(e.job)}</td>'
            f'<td class="n">{esc(e.restarts)}</td><td>{verdict}</td>'
            f'<td class="reason">{esc(e.why)}</td><td>{esc(e.category)}</td>'
            f"<td>{esc(suspects)}</td><td>{_resumed_cell(e)}</td></tr>"
        )
    headers = ("Decided", "Job", "Run", "Decision", "Why", "Cause", "Suspects",
               "Resumed from checkpoint")  # fmt: skip
    return _table(headers, body, "No requeue decision in the window.")


def _resumed_cell(event: Requeue) -> str:
    """The checkpoint a requeued run resumed from, or why it is unknown here (never blank)."""
    path, words = event.resumed_from()
    return f"<code>{esc(path)}</code>" if path else esc(words)


def held_section(held: Sequence[HeldEntry], since: float) -> str:
    """The drains the budget held back in the window, newest first."""
    body = [
        f'<tr><td class="time">{esc(history.iso(e.when))}</td>'
        f'<td class="node">{esc(e.node)}</td><td>{esc(e.check)}</td>'
        f'<td class="reason">{esc(e.reason)}</td><td class="reason">{esc(e.why)}</td></tr>'
        for e in sorted(held, key=lambda e: e.when, reverse=True)
        if e.when >= since
    ]
    headers = ("Held back", "Node", "Check", "Drain wanted", "Why the budget held it back")
    return _table(headers, body, "The drain budget held no drain back in the window.")


def latest_per_node(entries: Sequence[QualifyEntry]) -> list[QualifyEntry]:
    """Each node's newest qualification entry, by node name."""
    newest: dict[str, QualifyEntry] = {}
    for e in entries:
        if e.node not in newest or e.when >= newest[e.node].when:
            newest[e.node] = e
    return [newest[n] for n in sorted(newest)]


def _gbps(value: object) -> str:
    return f" {value:.1f} GB/s" if isinstance(value, (int, float)) else ""


def measured(test: QualifyTestResult) -> str:
    """One test result as a line: `pair n1-n2 3.2 GB/s (floor 9.0): FAIL`."""
    name = test.test
    if name == "pair":
        name += " " + "-".join(test.nodes)
    floor = _gbps(test.floor_gbps).replace(" GB/s", "")
    verdict = "not judged" if test.ok is None else "ok" if test.ok else "FAIL"
    return f"{name}{_gbps(test.value_gbps)}{f' (floor{floor})' if floor else ''}: {verdict}"


def qualify_section(entries: Sequence[QualifyEntry]) -> str:
    """Each node's latest qualification: level, result, values against floors, failures, why."""
    body = []
    for e in latest_per_node(entries):
        values = "<br>".join(esc(measured(t)) for t in e.tests)
        failures = "<br>".join(esc(f"{t.test}: {t.detail or 'failed'}") for t in e.tests
                               if t.ok is False)  # fmt: skip
        result = "passed qualification" if e.passed else (
            "qualification failure" if failures else "not qualified")  # fmt: skip
        body.append(
            f'<tr><td class="node">{esc(e.node)}</td>'
            f'<td class="time">{esc(history.iso(e.when))}</td><td>{esc(e.level)}</td>'
            f"<td>{result}</td><td>{values}</td><td>{failures}</td>"
            f'<td class="reason">{esc(e.why)}</td><td>{esc(", ".join(e.job_ids))}</td>'
            f'<td class="reason">{esc(e.trigger or "an admin")}</td></tr>'
        )
    headers = ("Node", "Latest run", "Level", "Result", "Measured (floor)", "Failures",
               "Verdict (pairs: the link or the node)", "Jobs", "Asked by")  # fmt: skip
    return _table(headers, body, "No qualification recorded (gpugate qualify).")


def kind_label(bundle: Bundle) -> str:
    """What a qualification or drill bundle is, in words: `passed qualification`,
    `qualification failure`, `not qualified`, `drill <id>`."""
    if bundle.kind == "drill":
        return f"drill {bundle.drill or ''}".strip()
    return bundle.qualification.label if bundle.qualification else bundle.kind


def kinds_section(bundles: Sequence[Bundle], drills: Sequence[DrillEntry] = ()) -> str:
    """The window's qualification and drill bundles, newest first: never failed runs. A
    drill's row names its fault from the drill records (drills.jsonl) when they are here."""
    faults = {d.id: d.injected or d.fault for d in drills}
    body = []
    for b in sorted(bundles, key=lambda b: b.failed or 0, reverse=True):
        why: object
        if b.kind == "drill":
            fault = faults.get(str(b.drill))
            shown = "; ".join(b.hardware_findings) or b.category
            why = f"simulated: {fault}" if fault else f"simulated fault ({shown})"
        else:
            why = b.qualification.why if b.qualification else None
        body.append(
            f'<tr><td class="time">{esc(history.iso(b.failed))}</td>'
            f'<td class="{esc(b.kind)}">{esc(kind_label(b))}</td><td>{esc(b.job)}</td>'
            f'<td class="node">{esc(b.node)}</td><td class="reason">{esc(why)}</td>'
            f"<td>{_bundle_link(b)}</td></tr>"
        )
    headers = ("When", "What", "Job", "Node", "Why (a qualification's reason, a drill's fault)",
               "Evidence")  # fmt: skip
    return _table(headers, body, "No qualification or drill left evidence in the window.")


def flag_outcome(
    flag: FlagEntry, qualifications: Sequence[QualifyEntry], resumes: list[AuditEntry]
) -> str:
    """What became of a suspect flag: the first qualification or resume of its node after it."""
    after: list[tuple[float, QualifyEntry | AuditEntry]] = [
        (q.when, q) for q in qualifications if q.node == flag.node and q.when >= flag.when
    ]
    after += [(r.when, r) for r in resumes if r.node == flag.node
              and r.when >= flag.when and r.resumed]  # fmt: skip
    if not after:
        return "awaiting: " + ("qualification started" if flag.action == "qualify" else "review")
    _, e = min(after, key=lambda t: t[0])
    if isinstance(e, AuditEntry):
        return f"closed by a resume ({e.who}, {history.iso(e.when)})"
    jobs = ", ".join(e.job_ids)
    if e.passed:
        return f"qualified and cleared (level {e.level}, job {jobs}): kept in service"
    return f"qualification failed (job {jobs}): {e.why}"


def suspects_section(
    flags: list[FlagEntry],
    qualifications: Sequence[QualifyEntry],
    resumes: list[AuditEntry],
    since: float,
) -> str:
    """The window's suspect flags: source, detail, what gpugate asked for, and the outcome."""
    body = []
    for f in reversed([f for f in flags if f.when >= since]):
        body.append(
            f'<tr><td class="node">{esc(f.node)}</td><td class="time">{esc(f.at)}</td>'
            f'<td>{esc(f.source)}</td><td class="reason">{esc(f.detail)}</td>'
            f"<td>{esc(f.action)}</td>"
            f'<td class="reason">{esc(flag_outcome(f, qualifications, resumes))}</td></tr>'
        )
    headers = ("Node", "Flagged", "From", "What the jobs showed", "Asked for", "Outcome")
    return _table(headers, body, "No node was pointed at by users' jobs in the window.")


def real_drains(drains: list[DrainEntry], since: float, now: float) -> list[DrainEntry]:
    """The window's drains that were no drill's (a drill's drain is a simulated fault)."""
    return [e for e in drains if since <= e.when <= now and not history.drill_of(e)]


def drains_chart(drains: list[DrainEntry], since: float, now: float) -> str:
    """Drains per day by check, stacked, one column per day of the window (drills' drains
    left out: simulated faults, counted in their own card)."""
    first = int(since // 86400)
    days = list(range(first, int(now // 86400) + 1))
    series: dict[str, list[float]] = {}
    for e in real_drains(drains, since, now):
        row = series.setdefault(e.check or "?", [0.0] * len(days))
        row[int(e.when // 86400) - first] += 1
    columns = [history.iso(d * 86400)[5:10] for d in days]
    return charts.stacked_bars("Drains per day by check", columns, dict(sorted(series.items())))


def repeats_chart(drains: list[DrainEntry], since: float) -> str:
    """How many nodes were drained once, twice, ... in the window."""
    real = (e for e in drains if e.when >= since and not history.drill_of(e))
    counts = [len(v) for v in history.by_node(real).values()]
    items = [(str(k), float(counts.count(k))) for k in range(1, max(counts, default=0) + 1)]
    return charts.vbars("Nodes by repeat count", items, x_title="drains per node in the window")


def cost_sections(
    costs: Sequence[Bundle],
    requeues: Sequence[Requeue],
    held: Sequence[HeldEntry],
    since: float,
) -> list[str]:
    """Failures and GPU-hours lost, the failed runs, the requeues, the held-back drains."""
    return [
        '<h2 id="failures">Job failures and GPU-hours lost by cause</h2>',
        failures_section(costs),
        '<h2 id="runs">Failed runs and their evidence</h2>',
        runs_section(costs),
        '<h2 id="requeues">Requeue decisions</h2>',
        requeues_section(requeues),
        '<h2 id="held">Drains the budget held back</h2>',
        held_section(held, since),
    ]


def _cards(
    rows: list[NodeRow],
    record: dict[str, dict[str, int]],
    events: list[Happening],
    costs: Sequence[Bundle],
    window_days: float,
    total_nodes: int | None,
    drains: int = 0,
) -> str:
    # The numbers at the top of the page, one card each.
    cards = [
        ("nodes", "-" if total_nodes is None else total_nodes),
        ("drained", sum(1 for r in rows if r.drained)),
        ("drained by gpugate", sum(1 for r in rows if r.drained and r.gpugate)),
        (HELD, sum(1 for r in rows if r.action == HELD)),
        ("lifted without repair", sum(v["lifted_unrepaired"] for v in record.values())),
        ("RMA candidates", sum(1 for r in rows if r.action == RMA)),
        # Not the timeline's events: those hold drills' drains and stop at TIMELINE_MAX.
        (f"drains in {window_days:g} days", drains),
        (f"resumes in {window_days:g} days", sum(1 for e in events if e.event == "resume")),
        (f"failures in {window_days:g} days", len(costs)),
        ("GPU-hours lost", _hours(sum(c.gpu_hours or 0.0 for c in costs))),
    ]
    card_html = "".join(
        f'<div class="card" id="{esc(k.split()[0])}-card"><b>{esc(v)}</b>{esc(k)}</div>'
        for k, v in cards
    )
    return card_html


def render_html(
    rows: list[NodeRow],
    drains: list[DrainEntry],
    resumes: list[AuditEntry],
    window_days: float = 30,
    now: float | None = None,
    total_nodes: int | None = None,
    notice: str | None = None,
    held: Sequence[HeldEntry] = (),
    costs: Sequence[Bundle] = (),
    requeues: Sequence[Requeue] = (),
    qualifications: Sequence[QualifyEntry] = (),
    flags: Sequence[FlagEntry] = (),
    others: Sequence[Bundle] = (),
    drills: Sequence[DrillEntry] = (),
    isolated: Sequence[IsolatedOn] = (),
    policy: Policy | None = None,
    ledger: Sequence[LedgerEntry] = (),
    reliability: Sequence[str] = (),
) -> str:
    """The whole page. `rows` are admin.node_rows() of the drained nodes (and the held-back
    ones); `held`: the history's held-back drains; `costs`: losses.costed() of the window's
    bundles; `requeues`: losses.requeue_events() of the window; `qualifications`: the
    qualification records (store/qualify.py), the latest per node shown; `others`: the
    window's qualification and drill bundles (losses.read_bundles, kind not job); `drills`:
    the drill records (store/drills.py); `isolated`: admin.nodes.isolated_gpus() of the
    listing; `policy`: the site's, for each check's roll-out stage beside its false-drain
    rate (admin/rollout.py; None: that section is left out); `ledger`: the repair ledger's
    lines (store/ledger.py), oldest first; `reliability`: the fleet reliability sections
    (admin/reliability_page.py), before the repeat offenders."""
    now = time.time() if now is None else now
    since = history.window_start(window_days, now)
    offenders = repeat_offenders(drains, since)
    events = timeline(drains, resumes, since, held=held)
    # Which nodes Slurm shows drained is known only when it could be read (total_nodes).
    drained_now = {r.node for r in rows if r.drained} if total_nodes is not None else None
    record = check_record(drains, resumes, since, drained_now)

    card_html = _cards(rows, record, events, costs, window_days, total_nodes,
                       len(real_drains(drains, since, now)))  # fmt: skip
    drilled = len(drill_drains(drains, since))
    card_html += f'<div class="card" id="drill-card"><b>{drilled}</b>drill drains</div>'
    kept = kept_serving(isolated, since, now)
    card_html += (f'<div class="card" id="isolated-card"><b>{len(isolated)}</b>GPUs isolated</div>'
                  f'<div class="card" id="kept-card"><b>{_hours(sum(kept.values()))}</b>'
                  "GPU-hours kept serving</div>")  # fmt: skip
    # The interruption table first: what failures cost, then what gpugate did about them.
    more = len(events) == TIMELINE_MAX
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>gpugate report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>gpugate: failures, drained nodes and repeat offenders</h1>",
        f'<p class="meta">Generated {esc(history.iso(now))}; history window {window_days:g} days.</p>',
        f'<p class="notice">{esc(notice)}</p>' if notice else "",
        f'<div class="cards">{card_html}</div>',
        '<h2 id="drained">Drained nodes</h2>',
        drained_section(rows),
        '<h2 id="rma">RMA list</h2>',
        rma_section(rma_list(ledger, drains, since), window_days),
        '<h2 id="ledger">Repair ledger of the drained nodes</h2>',
        f'<p class="meta">Each node\'s newest {SHOWN} steps, oldest first.</p>',
        ledger_section(rows, ledger),
        '<h2 id="isolated">Isolated GPUs</h2>',
        isolated_section(isolated, kept),
        '<h2 id="qualify">Qualification</h2>',
        qualify_section(list(qualifications)),
        '<h2 id="suspects">Suspects: what users\' jobs pointed at</h2>',
        suspects_section(list(flags), list(qualifications), resumes, since),
        *cost_sections(costs, requeues, held, since),
        '<h2 id="kinds">Qualifications and drills (not failed runs)</h2>',
        kinds_section(others, drills),
        '<h2 id="record">Drains by check: how they ended</h2>',
        f'<p class="meta">Drills\' drains ({drilled}) are simulated faults: not counted here, '
        "in the chart or in the drains card.</p>"
        if drilled
        else "",
        f'<div class="charts">{drains_chart(drains, since, now)}</div>',
        record_section(record),
        *rollout_sections(record, policy),
        *reliability,
        '<h2 id="offenders">Repeat offenders</h2>',
        f'<div class="charts">{repeats_chart(drains, since)}</div>',
        offenders_section(offenders, window_days),
        '<h2 id="timeline">Timeline</h2>',
        f'<p class="meta">Newest {TIMELINE_MAX} events shown.</p>' if more else "",
        timeline_section(events),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def write_report(path: str, page: str) -> None:
    """Write the page atomically (a browser or a web server never reads half of it)."""
    atomic_write(path, page, mode=0o644)

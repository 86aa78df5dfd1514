"""Merge the flight-recorder records of a job's ranks and name the rank the others waited for.

Per process group, from each rank's last enqueued (E) and last completed (C) collective number:

- not_entered: the lowest E among the ranks is below another rank's E: the collective E+1 was
  entered by some and never by these (they were in compute). With gloo (torch 2.14.1) a
  timed-out collective counts as completed, so E, not C, tells the waiting ranks apart.
- gone: no not_entered rank, and the group's ranks (pg_config) name a rank that sent no dump.
- in_collective: a rank entered S = C+1 but did not finish it while another rank finished S.

A rank named in one group that is itself waiting in another group is a victim there, not a
culprit (it waits for the other group): such findings are dropped when another finding stands
without them. A mismatch (the same collective number called as different operations or sizes
on different ranks, the FR analyzer's classic finding) comes first: the minority ranks are named.
Several findings naming different ranks give state "ambiguous" with the candidates, rank None.
"""

from __future__ import annotations

import json
import os

from gpugate.flightrec.reader import _int, _str
from gpugate.flightrec.records import Culprit, FlightrecFile, Refusal
from gpugate.userfiles import UserFileError, open_regular, read_fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NOT_ENTERED, IN_COLLECTIVE, GONE = "not_entered", "in_collective", "gone"
MAX_FLIGHTREC_BYTES = 16 << 20  # flightrec.json holds compact records, not dumps


def _merge(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """pg id -> {"name", "desc", "ranks": set, "status": {rank: pg}, "entries": {rank: [..]}}."""
    groups: dict[str, dict[str, Any]] = {}
    for rec in records:
        rank = rec.get("rank")
        if _int(rank) is None or not isinstance(rec.get("pgs"), dict):
            continue
        for pg_id, pg in rec["pgs"].items():
            if not isinstance(pg, dict):
                continue
            g = groups.setdefault(
                str(pg_id), {"name": "", "desc": "", "ranks": set(), "status": {}, "entries": {}}
            )
            g["name"] = g["name"] or (_str(pg.get("name")) or "")
            g["desc"] = g["desc"] or (_str(pg.get("desc")) or "")
            ranks = pg.get("ranks")
            g["ranks"] |= (
                {r for r in ranks if _int(r) is not None} if isinstance(ranks, list) else set()
            )
            g["status"][rank] = pg
        for e in rec.get("entries") or []:
            if isinstance(e, dict) and str(e.get("pg_id")) in groups:
                groups[str(e["pg_id"])]["entries"].setdefault(rank, []).append(e)
    return groups


def _last(pg: dict[str, Any], entries: list[dict[str, Any]], key: str) -> int:
    """E or C of one rank: pg_status's number, else the newest entry's (older dumps)."""
    v = _int(pg.get(key))
    if v is not None:
        return v
    seqs = [
        e["seq"]
        for e in entries
        if not e.get("is_p2p") and _int(e.get("seq")) is not None
        if key == "last_enqueued" or e.get("state") == "completed" or e.get("retired") is True
    ]
    return max(seqs, default=0)


def _entry_at(g: dict[str, Any], rank: int, seq: int) -> dict[str, Any] | None:
    entry: dict[str, Any]
    for entry in g["entries"].get(rank, []):
        if entry.get("seq") == seq and not entry.get("is_p2p"):
            return entry
    return None


def _op_at(g: dict[str, Any], seq: int, ranks: list[int]) -> str | None:
    for r in ranks:
        e = _entry_at(g, r, seq)
        op = e.get("op") if e is not None else None
        if _str(op):
            return str(op)
    return None


def _finding(
    pg_id: str, g: dict[str, Any], state: str, seq: int, culprits: list[Any], waiting: list[Any]
) -> dict[str, Any]:
    desc = g["desc"] if g["desc"] not in ("", "undefined") else g["name"]
    return {
        "pg_id": pg_id,
        "pg_name": desc or pg_id,
        "op": _op_at(g, seq, waiting + culprits),
        "seq": seq,
        "state": state,
        "culprits": sorted(culprits),
        "waiting_ranks": sorted(waiting),
    }


def _stuck(pg_id: str, g: dict[str, Any]) -> dict[str, Any] | None:
    """The finding of one process group, or None when nothing in it is stuck."""
    seen = sorted(g["status"])
    if not seen:
        return None
    enq = {r: _last(g["status"][r], g["entries"].get(r, []), "last_enqueued") for r in seen}
    done = {r: _last(g["status"][r], g["entries"].get(r, []), "last_completed") for r in seen}
    low, high = min(enq.values()), max(enq.values())
    if low < high:
        seq = low + 1
        culprits = [r for r in seen if enq[r] == low]
        return _finding(pg_id, g, NOT_ENTERED, seq, culprits, [r for r in seen if enq[r] >= seq])
    pending = [r for r in seen if enq[r] > done[r]]  # entered a collective, not finished
    if not pending:
        return None
    seq = min(done[r] + 1 for r in pending)
    gone = sorted(g["ranks"] - set(seen))
    if gone:  # the ranks that dumped all entered it: the one without a dump is the suspect
        return _finding(pg_id, g, GONE, seq, gone, [r for r in seen if enq[r] >= seq])
    finished = [r for r in seen if done[r] >= seq]
    if finished:
        culprits = [r for r in pending if done[r] < seq]
        return _finding(pg_id, g, IN_COLLECTIVE, seq, culprits, finished)
    return None


def _mismatch(pg_id: str, g: dict[str, Any]) -> dict[str, Any] | None:
    """The lowest collective number whose op or sizes differ across ranks; minority named."""
    seqs = sorted({e["seq"] for es in g["entries"].values() for e in es if not e.get("is_p2p")})
    for seq in seqs:
        calls = {}
        for r in g["entries"]:
            e = _entry_at(g, r, seq)
            if e is not None and e.get("op") is not None:
                calls[r] = (e["op"], json.dumps(e.get("sizes")))
        kinds = sorted(set(calls.values()))
        if len(kinds) < 2:
            continue
        counts = {k: sum(1 for v in calls.values() if v == k) for k in kinds}
        top = max(counts.values())
        majority = [k for k in kinds if counts[k] == top]
        if len(majority) == 1:
            culprits = [r for r, v in calls.items() if v != majority[0]]
            others = [r for r, v in calls.items() if v == majority[0]]
        else:  # an even split: no side can be blamed
            culprits, others = sorted(calls), []
        found = _finding(pg_id, g, "mismatch", seq, culprits, others)
        found["op"] = majority[0][0] if len(majority) == 1 else None
        found["calls"] = {str(r): {"op": v[0], "sizes": json.loads(v[1])} for r, v in calls.items()}
        return found
    return None


def _choose(findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One finding: victims (waiting in another group) dropped; ambiguous when several remain."""
    if not findings:
        return None
    waiting = {r for f in findings for r in f["waiting_ranks"]}
    clean = [f for f in findings if not set(f["culprits"]) & waiting] or findings
    blamed = {tuple(f["culprits"]) for f in clean}
    if len(blamed) == 1:
        return clean[0]
    return {"state": "ambiguous", "candidates": clean}


def _text(f: dict[str, Any], nodes: dict[int, str]) -> str:
    ranks = f["culprits"]
    who = ", ".join(f"rank {r}" + (f" on {nodes[r]}" if r in nodes else "") for r in ranks)
    what = f"{f['op'] or 'collective'} #{f['seq']} of process group {f['pg_id']} ({f['pg_name']})"
    waited = ", ".join(str(r) for r in f["waiting_ranks"]) or "none"
    if f["state"] == "mismatch":
        calls = "; ".join(f"rank {r} called {c['op']} {c['sizes']}" for r, c in f["calls"].items())
        return f"mismatched collective #{f['seq']} of process group {f['pg_id']}: {calls}"
    verb = {
        NOT_ENTERED: "never entered",
        IN_COLLECTIVE: "entered but never finished",
        GONE: "sent no dump (gone) before",
    }[f["state"]]
    return f"{who} {verb} {what}; ranks {waited} waited for it"


def find_culprit(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The rank the others waited for, merged over every rank's record, or None."""
    records = [r for r in records if isinstance(r, dict)]
    nodes = {
        r["rank"]: r["node"]
        for r in records
        if _int(r.get("rank")) is not None and _str(r.get("node"))
    }
    groups = _merge(records)
    order = sorted(groups, key=lambda k: (len(k), k))
    found = [m for m in (_mismatch(k, groups[k]) for k in order) if m]
    chosen = _choose(found) or _choose([f for f in (_stuck(k, groups[k]) for k in order) if f])
    if chosen is None:
        return None
    ranks_seen = len({r["rank"] for r in records if _int(r.get("rank")) is not None})
    if chosen["state"] == "ambiguous":
        texts = [_text(f, nodes) for f in chosen["candidates"]]
        return {
            "rank": None, "node": None, "state": "ambiguous", "candidates": chosen["candidates"],
            "ranks_seen": ranks_seen, "text": "flight recorder undecided: " + " | ".join(texts),
        }  # fmt: skip
    rank = chosen["culprits"][0] if len(chosen["culprits"]) == 1 else None
    return {
        "rank": rank,
        "ranks": chosen["culprits"],
        "node": nodes.get(rank) if rank is not None else None,
        "pg_id": chosen["pg_id"],
        "pg_name": chosen["pg_name"],
        "op": chosen["op"],
        "seq": chosen["seq"],
        "state": chosen["state"],
        "waiting_ranks": chosen["waiting_ranks"],
        "ranks_seen": ranks_seen,
        "text": _text(chosen, nodes),
        **({"calls": chosen["calls"]} if "calls" in chosen else {}),
    }


def _read_json(path: str, limit: int) -> object:
    """A bundle member as JSON, or None when absent; ValueError names what is wrong."""

    try:
        fd = open_regular(path)
    except UserFileError as exc:
        if not os.path.lexists(path):
            return None
        raise ValueError(str(exc)) from None
    try:
        data = read_fd(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path}: over {limit >> 20} MiB")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None


def _clean(rec: object, node: str | None) -> dict[str, Any] | None:
    """A record from a bundle, checked field by field (its content came from the user's job)."""
    if (
        not isinstance(rec, dict)
        or _int(rec.get("rank")) is None
        or not isinstance(rec.get("pgs"), dict)
    ):
        return None
    entries = [
        e
        for e in rec.get("entries") or []
        if isinstance(e, dict) and _int(e.get("seq")) is not None and _str(e.get("pg_id"))
        and (e.get("op") is None or _str(e.get("op")))
    ]  # fmt: skip
    pgs = {str(k): v for k, v in rec["pgs"].items() if isinstance(v, dict)}
    return {**rec, "pgs": pgs, "entries": entries, "node": node or _str(rec.get("node"))}


def job_culprit(bundle_dirs: list[str]) -> Culprit | None:
    """find_culprit over the flightrec.json of each node's evidence bundle; errors listed."""
    records: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for d in bundle_dirs:
        try:
            fr = _read_json(os.path.join(d, "flightrec.json"), MAX_FLIGHTREC_BYTES)
            summary = (
                _read_json(os.path.join(d, "summary.json"), 1 << 20) if fr is not None else None
            )
        except ValueError as exc:
            errors.append({"name": d, "error": str(exc)})
            continue
        if fr is None:
            continue
        try:
            member = FlightrecFile.from_json(fr, "flightrec.json")
        except ValueError as exc:
            errors.append({"name": d, "error": str(exc)})
            continue
        node = _str(summary.get("node")) if isinstance(summary, dict) else None
        bad = (d, "flightrec.json: a record without rank or pgs")
        _gather(member.records, member.errors, node, bad, records, errors)
    return _culprit(records, errors)


def records_culprit(views: list[tuple[str | None, dict[str, Any] | None]]) -> Culprit | None:
    """find_culprit over the flight-recorder digests of the nodes' decision records.

    The controller's view (gpugate/store/controller_view.py): each record names its node
    (root wrote it) and carries the compact records and refusals of that node's dumps.
    """
    records: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for node, fr in views:  # (the record's node, its flight-recorder digest)
        if not isinstance(fr, dict):
            continue
        recs, errs = fr.get("records"), fr.get("errors")
        refusals = [
            Refusal(name=e["name"], error=e["error"])
            for e in (errs if isinstance(errs, list) else [])
            if isinstance(e, dict) and _str(e.get("name")) and _str(e.get("error"))
        ]
        bad = (node or "?", "a record without rank or pgs")
        _gather(recs if isinstance(recs, list) else [], refusals, node, bad, records, errors)
    return _culprit(records, errors)


def _gather(
    recs: list[Any],
    refusals: list[Refusal],
    node: str | None,
    bad: tuple[str, str],
    records: list[dict[str, Any]],
    errors: list[dict[str, Any]],
) -> None:
    """Add one node's clean records and its refusals; `bad` names a record without rank."""
    for rec in recs:
        got = _clean(rec, node)
        if got is None:
            errors.append({"name": bad[0], "error": bad[1]})
        else:
            records.append(got)
    for err in refusals:
        if err.name and err.error:
            errors.append({"name": err.name[:256], "error": err.error[:512], "node": node})


def _culprit(records: list[dict[str, Any]], errors: list[dict[str, Any]]) -> Culprit | None:
    """The culprit of the merged records, or the refusals when there is none to name."""
    found = find_culprit(records) if records else None
    if found is None and not errors:
        return None
    if found is None:  # no culprit, but the refusals are worth saying (a hostile dump)
        said = "; ".join(f"{e['name']}: {e['error']}" for e in errors[:3])
        return Culprit(rank=None, node=None, state=None, text=f"flight recorder: {said}",
                       errors=errors)  # fmt: skip
    return Culprit(**found, errors=errors)

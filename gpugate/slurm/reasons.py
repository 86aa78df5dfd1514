"""Every text gpugate writes into Slurm, built here and parsed back here (pure, `re` only).

- Node drain reasons: `gpugate: <check id>: <detail>` (`drain_reason`). An epilog drain's
  detail starts with `evidence <job>/<node>-r<n>: ` (`evidence_detail`), the bundle that
  shows the fault; `reason_check` and `reason_bundle` read both back.
- Job AdminComments, each piece `gpugate: <text>` (`admin_comment`), joined to what others
  wrote by ` | ` (`merge_admin_comment`): the prolog's `gpugate: node <node> refused:
  <check id>: <detail>` (`refusal_comment`, read back by `refused_nodes`) and
  EpilogSlurmctld's `gpugate: requeue: ...` / `gpugate: no requeue: ...`.
- The node Comment when the drain budget stopped a drain: `gpugate: would drain (budget
  exceeded: <why>): <reason>` (`budget_comment`).

Under a fault drill (gpugate/drill/__init__.py, `mark_drill`) every reason and comment built here
says so right after the prefix: `gpugate: DRILL <id>: kernel.xid: ...`; the readers skip it.

Ownership rests on the prefix: a drain whose reason does not start with `gpugate:` is not
gpugate's, and gpugate never replaces or clears it (SlurmControl.drain/resume).
"""

from __future__ import annotations

import os

from gpugate.regex import lazy

GPUGATE_PREFIX = "gpugate:"
ISOLATED_MARKER = "gpugate-isolated:"  # gpugate/isolate/comment.py MARKER (a record, not prose)
REASON_MAX = 200
COMMENT_MAX = 400  # one piece of gpugate's text
# The whole AdminComment gpugate leaves (others' text and its own pieces): Slurm caps a
# job's --comment at 1024 (job_mgr.c `_test_strlen(job_desc->comment, "comment", 1024)`)
# and checks no length on an AdminComment update; stay within the comment's bound.
ADMIN_COMMENT_MAX = 1024
COMMENT_SEPARATOR = " | "

_CONTROL = lazy(r"[\x00-\x1f\x7f]")
_CHECK_ID = lazy(r"[^A-Za-z0-9_.\-]")
_KEY_START = lazy(r"[A-Z]")  # Slurm's keys (and localslurm's test parser) start so
# Read back: `gpugate: <check>: <detail>`, and the bundle an epilog drain names.
_REASON = lazy(r"(?s)^gpugate:\s*(?:DRILL [A-Za-z0-9_.\-]+:\s*)?([A-Za-z0-9_.\-]+)(?::\s*(.*))?$")
_EVIDENCE = lazy(r"\bevidence ([0-9]+(?:_[0-9]+)?/[A-Za-z0-9._-]+-r[0-9]+)\b")
_REFUSED = lazy(r"(?:^|\| )gpugate: (?:DRILL \S+: )?node (\S+) refused")
_DRILL = lazy(r"(?:^|\| )gpugate:\s*DRILL ([A-Za-z0-9_.\-]+):")
# The drain reason grammar (docs/interfaces.md, "The drain reason grammar"): what other tools
# (NVSentinel's Slurm drain monitor, site scripts) may parse. Its version goes up whenever a
# reason gpugate writes would no longer match, or a group changes meaning; a test
# (tests/unit/slurm/test_reason_grammar.py) parses every reason gpugate builds and every one
# in the test suite with it, and checks the docs' copy equals this one.
REASON_GRAMMAR_VERSION = 1
REASON_GRAMMAR = (
    r"^gpugate: (?:DRILL (?P<drill>[A-Za-z0-9_.-]+): )?(?P<check>[A-Za-z0-9_.-]+)"
    r"(?:: (?:evidence (?P<bundle>[0-9]+(?:_[0-9]+)?/[A-Za-z0-9._-]+-r[0-9]+): )?"
    r"(?:(?P<reboot>reboot)(?:: |$))?(?P<detail>[ -~]*))?$"
)
# The node Comment when the drain budget held a drain back (budget_comment, admin_comment):
# `reason` is the drain reason gpugate wanted (REASON_GRAMMAR), possibly cut by COMMENT_MAX.
BUDGET_COMMENT_GRAMMAR = (
    r"^gpugate: (?:DRILL (?P<drill>[A-Za-z0-9_.-]+): )?would drain \(budget exceeded"
    r"(?:: (?P<why>[ -~]*?))?\): (?P<reason>gpugate: [ -~]*)$"
)
_GRAMMAR = lazy(REASON_GRAMMAR)
_BUDGET_GRAMMAR = lazy(BUDGET_COMMENT_GRAMMAR)
# The drill whose overlay this process's facts carry (gpugate/drill/__init__.py): every text built
# here then says `DRILL <id>` right after the prefix, so no one takes a drill for a fault.
_drill: str | None = None
_drill_end: float | None = None  # that drill's window end, epoch seconds


def mark_drill(drill_id: str | None, end: float | None = None) -> None:
    """Mark every reason and comment built from now on as drill `drill_id`'s (None: unmark);
    `end`: its window's end (a drill's drain is timed from it, gate/drain.py)."""
    global _drill, _drill_end
    _drill = _CHECK_ID.sub("_", drill_id) if drill_id else None
    _drill_end = end if _drill else None


def drill_mark() -> str | None:
    """The drill this process's texts are marked with, if any."""
    return _drill


def drill_end() -> float | None:
    """The window end of the drill this process is marked with, if any."""
    return _drill_end


def _marked(text: str) -> str:
    """`gpugate: <rest>` as `gpugate: DRILL <id>: <rest>` while a drill is marked."""
    if not _drill or not text.startswith(GPUGATE_PREFIX):
        return text
    if text.startswith(f"{GPUGATE_PREFIX} DRILL "):  # marked already
        return text
    return f"{GPUGATE_PREFIX} DRILL {_drill}: {text[len(GPUGATE_PREFIX) :].lstrip()}"


# ------------------------------------------------------------------------------ building


def clean_text(text: object, limit: int) -> str:
    """Make hostile text (log lines) safe for a reason or comment: one ASCII line, capped."""
    # Non-ASCII becomes "?": no bidi overrides or zero-width tricks in an admin's terminal.
    out = str(text).encode("ascii", "replace").decode("ascii")
    out = _CONTROL.sub(" ", out)
    # scontrol strips a leading/trailing `"` from Reason=.
    out = out.replace('"', "'").replace("`", "'")
    # A word like ` StdOut=/x` would read back from `scontrol show -o` as another Key= (ours
    # and admins' awk): its `=` becomes `:`. Only there: gpugate's own syntax
    # (`gpugate:ckpt=DIR`, `k=v`, paths with `=`) keeps its `=`, since no Slurm key starts
    # with a lower-case letter, `/` or `(`.
    out = " ".join(_key_like(word) for word in out.split())
    if len(out) > limit:
        out = out[: limit - 3].rstrip() + "..."
    return out


def _key_like(word: str) -> str:
    return word.replace("=", ":") if _KEY_START.match(word) and "=" in word else word


def drain_reason(check_id: str, detail: str) -> str:
    """The one drain reason format: `gpugate: <check id>: <detail>`, sanitised and capped."""
    check = _CHECK_ID.sub("_", str(check_id)) or "unknown"
    detail = str(detail or "").strip()
    text = f"{GPUGATE_PREFIX} {check}: {detail}" if detail else f"{GPUGATE_PREFIX} {check}"
    return clean_text(_marked(text), REASON_MAX)


def own_reason(reason: str) -> str:
    """`reason` sanitised; ValueError unless it is one of gpugate's (from drain_reason())."""
    text = clean_text(reason, REASON_MAX)
    if not text.startswith(GPUGATE_PREFIX):
        raise ValueError(f"drain reasons must come from drain_reason(), got {text!r}")
    return text


def evidence_detail(bundle: str, detail: str) -> str:
    """An epilog drain's detail naming its bundle: `evidence <job>/<node>-r<n>: <detail>`."""
    # `<job>/<node>-r<n>`, as written (reason_bundle reads it back). It goes first: Slurm
    # reasons are read truncated (and gpugate caps them at REASON_MAX).
    where = f"{os.path.basename(os.path.dirname(bundle))}/{os.path.basename(bundle)}"
    return f"evidence {where}: {detail}"


def own_comment(comment: str) -> bool:
    """Whether a node Comment is gpugate's (its prefix, or an isolation record's marker)."""
    return comment.startswith((GPUGATE_PREFIX, ISOLATED_MARKER))


def admin_comment(text: str) -> str:
    """A job AdminComment gpugate writes: `gpugate: <text>`, sanitised and capped."""
    text = str(text or "").strip()
    if not text.startswith(GPUGATE_PREFIX):
        text = f"{GPUGATE_PREFIX} {text}"
    return clean_text(_marked(text), COMMENT_MAX)


def refusal_comment(node: str, check_id: str, detail: str) -> str:
    """The prolog's AdminComment on a job it refused: `gpugate: node N refused: <check>: ...`."""
    return f"{GPUGATE_PREFIX} node {node} refused: {check_id}: {detail}"


BUDGET_COMMENT = "would drain (budget exceeded"  # how budget_comment() starts


def budget_comment(why: str, reason: str) -> str:
    """The node Comment when the budget stopped a drain: what gpugate would have done."""
    return f"{BUDGET_COMMENT}: {why}): {reason}"


def merge_admin_comment(existing: str, piece: str, limit: int = ADMIN_COMMENT_MAX) -> str | None:
    """`existing` with gpugate's `piece` appended (None: nothing to write).

    What others wrote is kept as it is. Past `limit`, gpugate's own oldest pieces go first,
    then the new piece is cut; with no room left (others' text fills it) nothing is written.
    A piece that is already there is not written twice.
    """
    existing = (existing or "").strip()
    piece = admin_comment(piece)
    pieces = [p for p in existing.split(COMMENT_SEPARATOR) if p.strip()] if existing else []
    if piece in pieces:
        return None
    sep = len(COMMENT_SEPARATOR)

    def size(items: list[str]) -> int:
        return sum(len(i) for i in items) + sep * max(len(items) - 1, 0)

    while size([*pieces, piece]) > limit:
        ours = next((i for i, p in enumerate(pieces) if p.startswith(GPUGATE_PREFIX)), None)
        if ours is None:
            break
        del pieces[ours]
    room = limit - size(pieces) - (sep if pieces else 0)
    if room < len(GPUGATE_PREFIX) + 20:  # not even a useful line fits
        return None
    if len(piece) > room:
        piece = piece[: room - 3].rstrip() + "..."
    return COMMENT_SEPARATOR.join([*pieces, piece])


# ------------------------------------------------------------------------------- reading


def is_ours(reason: str | None) -> bool:
    """True when a drain reason (or comment piece) is one gpugate wrote."""
    return (reason or "").startswith(GPUGATE_PREFIX)


def reason_check(reason: str | None) -> str | None:
    """The check id of a gpugate drain reason (`gpugate: gpu.ecc: ...` -> `gpu.ecc`)."""
    m = _REASON.match((reason or "").strip())
    return m.group(1) if m else None


def reason_drill(text: str | None) -> str | None:
    """The drill id a reason or AdminComment is marked with (`gpugate: DRILL <id>: ...`)."""
    m = _DRILL.search(text or "")
    return m.group(1) if m else None


def reason_bundle(reason: str | None) -> str | None:
    """`<job>/<node>-r<n>` when the reason names an evidence bundle (epilog drains)."""
    m = _EVIDENCE.search(reason or "")
    return m.group(1) if m else None


def refused_nodes(admin_comment: str | None) -> list[str]:
    """The nodes whose prolog refused the job, from its AdminComment (refusal_comment)."""
    return _REFUSED.findall(admin_comment or "")


def parse_reason(reason: str | None) -> dict[str, str | None] | None:
    """A drain reason's parts by REASON_GRAMMAR (drill, check, bundle, reboot, detail), or
    None when it is not a reason gpugate writes (another's, a Slurm one, a cut or odd text)."""
    m = _GRAMMAR.match(reason or "")
    return m.groupdict() if m else None


def parse_budget_comment(comment: str | None) -> dict[str, str | None] | None:
    """A held-back drain's node Comment by BUDGET_COMMENT_GRAMMAR (drill, why, reason), or None."""
    m = _BUDGET_GRAMMAR.match(comment or "")
    return m.groupdict() if m else None

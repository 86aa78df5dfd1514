"""The Slurm adapter: every drain reason gpugate writes and every call it makes to Slurm.

Two backends behind one interface (`SlurmControl`):

- `CliBackend` (the default) runs `scontrol`/`sinfo` through `gpugate.runner.run`: argv lists,
  a timeout on every call, `SLURM_CONF` passed through. It reads the `scontrol -o` text, which
  every version prints (22.05 has no `scontrol --json`), and optionally `sinfo --json`.
- `PyslurmBackend` talks to libslurm through pyslurm, used only when pyslurm's X.Y equals the
  site's Slurm and a subprocess can import it (`select_backend`).

The ownership rules live once, in `SlurmControl.drain`/`resume`: gpugate never replaces or
clears a drain whose reason it did not write (reasons start with `gpugate:`). Parsers are in
`slurm_parse.py`.
"""

from __future__ import annotations

import os
import re

from gpugate.slurm_hooks.slurm.parse import (
    GPUGATE_PREFIX,
    HostlistError,
    JobInfo,
    NodeInfo,
    ended_at,
    hostlist_expand,
    job_reason,
    parse_show_jobs_text,
    parse_show_node_text,
    parse_sinfo_json,
    split_state,
)

from gpugate import runner as _runner
from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    Runner = Callable[..., _runner.CommandResult]

DEFAULT_TIMEOUT = 10.0  # seconds per scontrol call
PROBE_TIMEOUT = 5.0  # `python -c "import pyslurm"`; a missing slurm.conf makes it hang 59 s
REASON_MAX = 200
COMMENT_MAX = 400  # one piece of gpugate's text
# The whole AdminComment gpugate leaves (others' text and its own pieces): Slurm caps a
# job's --comment at 1024 (job_mgr.c `_test_strlen(job_desc->comment, "comment", 1024)`)
# and checks no length on an AdminComment update; stay within the comment's bound.
ADMIN_COMMENT_MAX = 1024
COMMENT_SEPARATOR = " | "
ENV_BACKEND = "GPUGATE_SLURM_BACKEND"
KINDS = ("auto", "cli", "pyslurm")

DRAINED, RESUMED, REFUSED, UNCHANGED = "drained", "resumed", "refused", "unchanged"


# ------------------------------------------------------------------------- reason strings

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CHECK_ID = re.compile(r"[^A-Za-z0-9_.\-]")
_KEY_START = re.compile(r"[A-Z]")  # Slurm's keys (and localslurm's test parser) start so


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
    return clean_text(text, REASON_MAX)


def admin_comment(text: str) -> str:
    """A job AdminComment gpugate writes: `gpugate: <text>`, sanitised and capped."""
    text = str(text or "").strip()
    if not text.startswith(GPUGATE_PREFIX):
        text = f"{GPUGATE_PREFIX} {text}"
    return clean_text(text, COMMENT_MAX)


def _own_reason(reason: str) -> str:
    text = clean_text(reason, REASON_MAX)
    if not text.startswith(GPUGATE_PREFIX):
        raise ValueError(f"drain reasons must come from drain_reason(), got {text!r}")
    return text


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


# ---------------------------------------------------------------------------------- errors


class SlurmError(RuntimeError):
    """Anything that went wrong talking to Slurm."""


class SlurmCommandError(_runner.CommandError, SlurmError):
    """An scontrol/sinfo call failed; `.result` has the argv, status and output."""


class SlurmTimeout(SlurmCommandError):
    """An scontrol/sinfo call ran past its timeout and was killed."""


class SlurmMissing(SlurmCommandError):
    """scontrol/sinfo is not installed (or not on PATH)."""


class NodeNotFound(SlurmError):
    """Slurm does not know this node."""


class JobNotFound(SlurmError):
    """Slurm does not know this job (or has purged it)."""


class BackendUnavailable(SlurmError):
    """The pyslurm backend was asked for but cannot be used safely here."""


class NotOurDrain(SlurmError):
    """drain()/resume() refused: the node is drained with a reason gpugate did not write.

    `.change` is the refusal (action "refused"); `.change.before` the node as it was.
    """

    def __init__(self, change: NodeChange) -> None:
        super().__init__(change.why)
        self.change = change


# ------------------------------------------------------------------------------- results


class NodeChange(Record):
    """What drain()/resume() did to a node, and why."""

    node: str
    action: str  # drained / resumed / unchanged; "refused" only inside NotOurDrain
    why: str
    reason: str = ""  # the reason written (drain)
    before: NodeInfo | None = None


class BackendChoice(Record):
    """Which backend select_backend() chose, and the reason (for the log)."""

    kind: str  # cli / pyslurm
    why: str


# ------------------------------------------------------------------------- the interface


class SlurmControl:
    """What gpugate asks of Slurm. Backends implement the reads and raw writes; the rules on
    whose drain may be touched are here, once."""

    kind = "abstract"
    why = ""  # why select_backend() chose this backend

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeInfo]:
        """Every node (or those named; unknown names are left out), keyed by name."""
        raise NotImplementedError

    def node(self, name: str) -> NodeInfo:
        """One node; NodeNotFound when Slurm does not know it."""
        raise NotImplementedError

    def job(self, job_id: int | str) -> JobInfo:
        """One job; JobNotFound when Slurm does not know it."""
        raise NotImplementedError

    def requeue(self, job_id: int | str, hold: bool = False) -> None:
        """Requeue a running job, held if asked (so the exclusion can be set first)."""
        raise NotImplementedError

    def release(self, job_id: int | str) -> None:
        """Release a held job and let it start now (a requeue delays it by 120 s)."""
        raise NotImplementedError

    def set_excluded(self, job_id: int | str, nodes: Iterable[str]) -> None:
        """Set a pending job's excluded nodes; an empty list clears them."""
        raise NotImplementedError

    def set_admin_comment(self, job_id: int | str, text: str) -> None:
        """Write `gpugate: <text>` (sanitised) into the job's AdminComment."""
        self._write_admin_comment(job_id, admin_comment(text))

    def _write_admin_comment(self, job_id: int | str, comment: str) -> None:
        raise NotImplementedError

    def add_admin_comment(self, job_id: int | str, text: str) -> str:
        """Append `gpugate: <text>` to the job's AdminComment, keeping what is there (the
        prolog's refusal, an admin's note); returns what was written, "" for nothing."""
        merged = merge_admin_comment(self.job(job_id).admin_comment, text)
        if merged is None:
            return ""
        self._write_admin_comment(job_id, merged)
        return merged

    def exclude_nodes(
        self, job_id: int | str, nodes: Iterable[str]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Add `nodes` to the job's own ExcNodeList; returns (now excluded, left alone).

        A node the job asks for by name (`-w`, ReqNodeList) is left alone: excluding it too
        would leave the job pending for good (Slurm accepts ReqNodeList=n1 ExcNodeList=n1 and
        never runs the job). The pin is the user's choice; the job waits for that node.
        """
        job = self.job(job_id)
        wanted = [_node_name(n) for n in nodes]
        pinned = tuple(n for n in wanted if n in job.required_nodes)
        merged = tuple(
            dict.fromkeys([*job.excluded_nodes, *(n for n in wanted if n not in pinned)])
        )
        if merged != tuple(job.excluded_nodes):
            self.set_excluded(job_id, merged)
        return merged, pinned

    def set_node_comment(self, node: str, text: str) -> None:
        """Write `gpugate: <text>` (sanitised) into the node's Comment (no state change)."""
        self.cli.scontrol(
            "update", f"NodeName={_node_name(node)}", f"Comment={admin_comment(text)}"
        )

    def _write_drain(self, node: str, reason: str) -> None:
        raise NotImplementedError

    def _write_resume(self, node: str) -> None:
        raise NotImplementedError

    @property
    def cli(self) -> CliBackend:
        """The command-line backend, for what only scontrol can do."""
        raise NotImplementedError

    def drain(self, node: str, reason: str, force: bool = False) -> NodeChange:
        """Drain `node` with a gpugate reason; NotOurDrain if someone else drained it."""
        reason = _own_reason(reason)
        before = self.node(_node_name(node))
        # An empty reason on a DOWN node is Slurm's, not an admin's: nothing to overwrite.
        if before.drained and before.reason and not before.gpugate_owned and not force:
            why = (
                f"{node}: already drained by {before.reason_user or 'someone else'} "
                f"({before.reason!r}); gpugate does not replace a drain it did not set"
            )
            raise NotOurDrain(NodeChange(node=node, action=REFUSED, why=why, before=before))
        self._write_drain(node, reason)
        return NodeChange(
            node=node, action=DRAINED, why=f"{node}: {reason}", reason=reason, before=before
        )

    def resume(self, node: str, force: bool = False) -> NodeChange:
        """Resume `node` if gpugate drained it (any drain with force); else NotOurDrain."""
        before = self.node(_node_name(node))
        if not before.drained:
            # `state=resume` on a node that is not drained fails (rc 1, "Invalid node state").
            return NodeChange(
                node=node, action=UNCHANGED, why=f"{node}: not drained", before=before
            )
        if not before.gpugate_owned and not force:
            why = (
                f"{node}: drained by {before.reason_user or 'someone else'} "
                f"({before.reason!r}), not by gpugate; resume it with force"
            )
            raise NotOurDrain(NodeChange(node=node, action=REFUSED, why=why, before=before))
        self._write_resume(node)
        return NodeChange(node=node, action=RESUMED, why=f"{node}: resumed", before=before)

    def expand_hostlist(self, expr: str) -> list[str]:
        """`gpu-[01-03,07],other` as names; asks `scontrol show hostnames` only when unsure."""
        try:
            return hostlist_expand(expr)
        except HostlistError:
            if expr.lstrip().startswith("-"):  # would be an scontrol option
                raise
            return self.cli.scontrol("show", "hostnames", expr).split()


_NODE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")


def _node_name(name: str) -> str:
    # Names reach argv; one starting with "-" would be read as an scontrol option.
    if not _NODE_NAME.match(str(name)):
        raise ValueError(f"not a Slurm node name: {name!r}")
    return str(name)


def _job_id(job_id: int | str) -> str:
    if not _JOB_ID.match(str(job_id)):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return str(job_id)


# ---------------------------------------------------------------------------------- CLI


class CliBackend(SlurmControl):
    """scontrol/sinfo through gpugate.runner.run: one timeout per call, typed errors."""

    kind = "cli"

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        runner: Runner | None = None,
        slurm_conf: str | None = None,
        listing: str = "scontrol",
    ) -> None:
        if listing not in ("scontrol", "sinfo-json"):
            raise ValueError(f"listing must be 'scontrol' or 'sinfo-json', not {listing!r}")
        self.timeout = timeout
        self.listing = listing
        self.slurm_conf = slurm_conf
        self._run = runner or _runner.run

    @property
    def cli(self) -> CliBackend:
        """This backend itself."""
        return self

    def env(self) -> dict[str, str]:
        """What every call adds to the environment."""
        # ISO times in `Reason=... [user@time]`, whatever the site's SLURM_TIME_FORMAT says.
        env = {"SLURM_TIME_FORMAT": "standard"}
        conf = self.slurm_conf or os.environ.get("SLURM_CONF")
        if conf:
            env["SLURM_CONF"] = conf
        return env

    def call(self, *argv: str) -> str:
        """Run one command; its stdout, or a typed SlurmCommandError."""
        res = self._run(list(argv), self.timeout, env=self.env())
        if res.ok:
            return res.stdout
        error = {_runner.TIMEOUT: SlurmTimeout, _runner.MISSING: SlurmMissing}
        raise error.get(res.status, SlurmCommandError)(res)

    def scontrol(self, *args: str) -> str:
        """`scontrol ARGS...`; its stdout."""
        return self.call("scontrol", *args)

    def version(self) -> tuple[int, int] | None:
        """Slurm's (major, minor) from `scontrol --version`, e.g. (22, 5)."""
        return parse_version(self.scontrol("--version"))

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeInfo]:
        """Every node (or those named; unknown names are left out), keyed by name."""
        if self.listing == "sinfo-json":
            found = parse_sinfo_json(self.call("sinfo", "--json"))
        else:
            found = parse_show_node_text(self.scontrol("-o", "show", "node"))
        wanted = None if names is None else set(names)
        return {n.name: n for n in found if wanted is None or n.name in wanted}

    def node(self, name: str) -> NodeInfo:
        """One node; NodeNotFound when Slurm does not know it."""
        try:
            text = self.scontrol("-o", "show", "node", _node_name(name))
        except SlurmCommandError as e:
            if _says(e, "not found"):
                raise NodeNotFound(f"node {name!r} not found") from e
            raise
        for node in parse_show_node_text(text):
            if node.name == name:
                return node
        raise NodeNotFound(f"node {name!r} not in scontrol output")

    def job(self, job_id: int | str) -> JobInfo:
        """One job; JobNotFound when Slurm does not know it."""
        try:
            text = self.scontrol("-o", "show", "job", _job_id(job_id))
        except SlurmCommandError as e:
            if _says(e, "invalid job id"):
                raise JobNotFound(f"job {job_id} not found") from e
            raise
        jobs = parse_show_jobs_text(text, self.expand_hostlist)
        if not jobs:
            raise JobNotFound(f"job {job_id} not in scontrol output")
        # An array's master id lists every task; prefer the record with this very id.
        return next((j for j in jobs if str(j.job_id) == str(job_id)), jobs[0])

    def _write_drain(self, node: str, reason: str) -> None:
        self.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def _write_resume(self, node: str) -> None:
        self.scontrol("update", f"NodeName={node}", "State=RESUME")

    def requeue(self, job_id: int | str, hold: bool = False) -> None:
        """Requeue a running job, held if asked (so the exclusion can be set first)."""
        self.scontrol("requeuehold" if hold else "requeue", _job_id(job_id))

    def release(self, job_id: int | str) -> None:
        """Release a held job and let it start now (a requeue delays it by 120 s)."""
        self.scontrol("release", _job_id(job_id))
        self.start_now(job_id)

    def start_now(self, job_id: int | str) -> None:
        """Clear the BeginTime (+120 s) that every requeue sets."""
        self.scontrol("update", f"JobId={_job_id(job_id)}", "StartTime=now")

    def set_excluded(self, job_id: int | str, nodes: Iterable[str]) -> None:
        """Set a pending job's excluded nodes; an empty list clears them (`ExcNodeList=`)."""
        names = ",".join(_node_name(n) for n in nodes)
        self.scontrol("update", f"JobId={_job_id(job_id)}", f"ExcNodeList={names}")

    def _write_admin_comment(self, job_id: int | str, comment: str) -> None:
        self.scontrol("update", f"JobId={_job_id(job_id)}", f"AdminComment={comment}")


def _says(error: SlurmCommandError, words: str) -> bool:
    res = error.result
    return res.status == _runner.NONZERO and words in (res.stdout + res.stderr).lower()


def expand_hostlist(expr: str) -> list[str]:
    """`gpu-[01-03,07],other` as names, for callers without a backend (see SlurmControl)."""
    return CliBackend().expand_hostlist(expr)


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) as integers from "slurm-wlm 22.05.8" or pyslurm's "22.5.3"."""
    m = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


# ------------------------------------------------------------------------------ pyslurm


class PyslurmBackend(SlurmControl):
    """pyslurm's 22.5+ API (Node.modify, Nodes.load, Job.load, requeue, release, modify).

    pyslurm cannot be built on the project's machines (no matching libslurm; see
    reference/pyslurm.md), so this class is tested only against a fake `pyslurm` module; the
    one live check was pyslurm 22.5.3 on Slurm 22.05.8, by hand. Use it through
    select_backend(), which never imports pyslurm in-process to probe: a failing `slurm_init()`
    exits the interpreter. What pyslurm cannot do goes to the CLI: clearing ExcNodeList (an
    empty list reads as "unchanged") and StartTime=now.
    """

    kind = "pyslurm"

    def __init__(self, cli: CliBackend | None = None, module: object = None) -> None:
        self._cli = cli or CliBackend()
        self._module = module

    @property
    def cli(self) -> CliBackend:
        """The CLI backend used for what pyslurm cannot do."""
        return self._cli

    @property
    def _ps(self):  # the pyslurm module
        if self._module is None:
            import pyslurm  # only after select_backend()'s subprocess probe passed

            self._module = pyslurm
        return self._module

    def _rpc(self, what: str, fn: Callable, *args: object, **kwargs: object) -> object:
        try:
            return fn(*args, **kwargs)
        except self._ps.RPCError as e:
            text = str(e)
            if "does not exist" in text:
                raise NodeNotFound(f"{what}: {text}") from e
            if "invalid job id" in text.lower():
                raise JobNotFound(f"{what}: {text}") from e
            raise SlurmError(f"pyslurm {what}: {text}") from e

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeInfo]:
        """Every node (or those named; unknown names are left out), keyed by name."""
        loaded = self._rpc("Nodes.load()", self._ps.Nodes.load)
        wanted = None if names is None else set(names)
        infos = (_node_from_pyslurm(n) for n in loaded.values())
        return {n.name: n for n in infos if wanted is None or n.name in wanted}

    def node(self, name: str) -> NodeInfo:
        """One node; NodeNotFound when Slurm does not know it."""
        return _node_from_pyslurm(self._rpc(f"Node.load({name})", self._ps.Node.load, name))

    def job(self, job_id: int | str) -> JobInfo:
        """One job; JobNotFound when Slurm does not know it."""
        j = self._rpc(f"Job.load({job_id})", self._ps.Job.load, int(_job_id(job_id)))
        code, sig = j.exit_code or 0, j.exit_code_signal or 0
        return JobInfo(
            job_id=int(j.id),
            user=j.user_name or "",
            uid=j.user_id,
            state=j.state or "",
            reason=job_reason(j.state_reason),
            nodes=tuple(self.expand_hostlist(j.allocated_nodes or "")),
            batch_host=j.batch_host or "",
            stdout=j.standard_output or "",
            stderr=j.standard_error or "",
            work_dir=j.working_directory or "",
            exit_code=code,
            exit_signal=sig,
            restarts=j.requeue_count or 0,
            comment=j.comment or "",
            admin_comment=j.admin_comment or "",
            excluded_nodes=tuple(self.expand_hostlist(j.excluded_nodes or "")),
            requeue=bool(j.is_requeueable),
            partition=j.partition or "",
            required_nodes=tuple(self.expand_hostlist(getattr(j, "required_nodes", None) or "")),
            end_time=ended_at(_pyslurm_epoch(getattr(j, "end_time", None))),
        )

    def _job(self, job_id: int | str) -> object:
        return self._ps.Job(int(_job_id(job_id)))

    def _modify_job(self, job_id: int | str, **changes: object) -> None:
        desc = self._ps.JobSubmitDescription(**changes)
        self._rpc(f"Job({job_id}).modify", self._job(job_id).modify, desc)

    def _write_drain(self, node: str, reason: str) -> None:
        changes = self._ps.Node(state="DRAIN", reason=reason)
        self._rpc(f"Node({node}).modify", self._ps.Node(node).modify, changes)

    def _write_resume(self, node: str) -> None:
        changes = self._ps.Node(state="RESUME")
        self._rpc(f"Node({node}).modify", self._ps.Node(node).modify, changes)

    def requeue(self, job_id: int | str, hold: bool = False) -> None:
        """Requeue a running job, held if asked (so the exclusion can be set first)."""
        self._rpc(f"Job({job_id}).requeue", self._job(job_id).requeue, hold=hold)

    def release(self, job_id: int | str) -> None:
        """Release a held job and let it start now (a requeue delays it by 120 s)."""
        self._rpc(f"Job({job_id}).release", self._job(job_id).release)
        self._cli.start_now(job_id)

    def set_excluded(self, job_id: int | str, nodes: Iterable[str]) -> None:
        """Set a pending job's excluded nodes; an empty list clears them (through scontrol)."""
        names = [_node_name(n) for n in nodes]
        if not names:
            # pyslurm turns [] or "" into NULL, which Slurm reads as "unchanged".
            self._cli.set_excluded(job_id, [])
            return
        self._modify_job(job_id, excluded_nodes=names)

    def _write_admin_comment(self, job_id: int | str, comment: str) -> None:
        self._modify_job(job_id, admin_comment=comment)


def _pyslurm_epoch(value: object) -> int | None:
    # pyslurm's Job.end_time is epoch seconds; be lenient with None or odd types.
    try:
        return int(value) if value else None  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _node_from_pyslurm(n: object) -> NodeInfo:
    state, flags = split_state(getattr(n, "state", None) or "UNKNOWN")  # "IDLE+DRAIN"
    return NodeInfo(
        name=n.name,
        state=state,
        flags=flags,  # type: ignore[attr-defined]
        reason=(getattr(n, "reason", None) or "").strip(),
        reason_user=getattr(n, "reason_user", None) or "",
        reason_time=getattr(n, "reason_time", None) or None,
        partitions=tuple(getattr(n, "partitions", None) or ()),
    )


# ------------------------------------------------------------------------------ choosing


def select_backend(
    kind: str = "auto",
    *,
    runner: Runner | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    version_of: Callable[[str], str] | None = None,
) -> BackendChoice:
    """Pick cli or pyslurm; GPUGATE_SLURM_BACKEND (auto/cli/pyslurm) overrides `kind`."""
    requested = (os.environ.get(ENV_BACKEND) or kind or "auto").strip().lower()
    if requested not in KINDS:
        raise ValueError(f"{ENV_BACKEND}/backend: {requested!r} is not one of {', '.join(KINDS)}")
    if requested == "cli":
        return BackendChoice(kind="cli", why="the command-line backend was asked for")
    problem = _pyslurm_problem(CliBackend(timeout=timeout, runner=runner), version_of)
    if problem is None:
        return BackendChoice(kind="pyslurm", why="pyslurm matches Slurm and imports cleanly")
    if requested == "pyslurm":
        raise BackendUnavailable(f"pyslurm backend unavailable: {problem}")
    return BackendChoice(kind="cli", why=problem)


def _pyslurm_problem(cli: CliBackend, version_of: Callable[[str], str] | None) -> str | None:
    """Why pyslurm must not be used here, or None when it may."""
    if version_of is None:
        from importlib.metadata import version as version_of
    try:
        # Reads the installed metadata only: libslurm is not loaded.
        have = version_of("pyslurm")
    except Exception:  # PackageNotFoundError, or broken metadata
        return "pyslurm is not installed"
    try:
        slurm = cli.version()
    except SlurmError as e:
        return f"cannot read Slurm's version: {e}"
    if slurm is None or parse_version(have) != slurm:
        return f"pyslurm {have} does not match Slurm {slurm} (X.Y must be equal)"
    return _probe_import(cli)


def _probe_import(cli: CliBackend) -> str | None:
    import sys

    # In a child: `import pyslurm` runs slurm_init(), which exits or hangs without a usable
    # slurm.conf, and no try/except can catch that.
    res = cli._run([sys.executable, "-c", "import pyslurm"], PROBE_TIMEOUT, env=cli.env())
    return None if res.ok else f"`import pyslurm` failed in a subprocess: {res.describe()}"


def backend(
    kind: str = "auto", *, timeout: float = DEFAULT_TIMEOUT, runner: Runner | None = None
) -> SlurmControl:
    """The Slurm backend to use: see select_backend(); `.why` says why it was chosen."""
    choice = select_backend(kind, runner=runner, timeout=timeout)
    cli = CliBackend(timeout=timeout, runner=runner)
    chosen: SlurmControl = PyslurmBackend(cli=cli) if choice.kind == "pyslurm" else cli
    chosen.why = choice.why
    return chosen

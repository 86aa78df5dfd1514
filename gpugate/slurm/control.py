"""The Slurm seam: `SlurmControl`, the methods the hooks call, its errors and results.

Backends implement the reads and raw writes: `cli.py` (scontrol/sinfo, the default) and
`pyslurm.py` (libslurm through pyslurm); `choose.py` picks one. The ownership rules live once,
here, in `SlurmControl.drain`/`resume`: gpugate never replaces or clears a drain whose reason
it did not write (reasons start with `gpugate:`, see `gpugate/slurm/reasons.py`). The records
(NodeInfo, JobInfo) are in `records.py`, the parsers in `parse_text.py` and `parse_json.py`.

Job ids: every method that takes one accepts a plain id (`14`, `"14"`), an array task
(`"14_1"`) or a het component (`"14+1"`), parsed once by `jobid.parse_job_id`, and acts on
exactly that job, whatever the backend: never on another job whose digits match (pyslurm
takes only plain ids, so its backend hands array tasks and het components to scontrol).
Every backend returns the same record for the same job or node, and raises JobNotFound /
NodeNotFound, for reads and writes alike, when Slurm does not know the id.
Tests use the in-memory `tests/support/fakes.py:FakeSlurm`, a subclass of this interface.
"""

from __future__ import annotations

import math
import time

from gpugate import runner as _runner
from gpugate.record import Record
from gpugate.regex import lazy
from gpugate.slurm.hostlist import HostlistError, hostlist_expand
from gpugate.slurm.jobid import JobId, parse_job_id
from gpugate.slurm.reasons import (
    admin_comment,
    merge_admin_comment,
    own_comment,
    own_reason,
    reason_drill,
)
from gpugate.slurm.records import JobInfo, NodeInfo

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Protocol

    class CommandLine(Protocol):
        """What only scontrol can do: `cli.py`'s CliBackend is one (named here, not imported,
        so that the backend below the seam and the seam import no circle)."""

        timeout: float

        def call(self, *argv: str) -> str: ...

        def scontrol(self, *args: str) -> str: ...

        def start_now(self, job_id: int | str | JobId) -> None: ...

        def version(self) -> tuple[int, int] | None: ...

        def script_jobs(self) -> list[tuple[str, str]]: ...


__all__ = ["JobId", "JobInfo", "NodeInfo", "SlurmControl", "SlurmError", "parse_job_id"]

DEFAULT_TIMEOUT = 10.0  # seconds per scontrol call

DRAINED, RESUMED, REFUSED, UNCHANGED = "drained", "resumed", "refused", "unchanged"
# A job whose requeue is still under way: its nodes are cleaning up (job_state_string() prints
# the COMPLETING flag, or REQUEUED/REQUEUE_FED, before the base state). Not REQUEUE_HOLD: a
# job held by its requeue may show that until it is released.
REQUEUE_UNDER_WAY = frozenset({"COMPLETING", "REQUEUED", "REQUEUE_FED"})
REQUEUE_WAIT_S = 60.0  # a node's Epilog gets PrologEpilogTimeout; gpugate's takes ~1 s
REQUEUE_POLL_S = 0.2
REBOOT_REQUESTED = "reboot_requested"
# `scontrol update NodeName=N State=DRAIN ResumeAfter=<seconds>`: slurmctld resumes the node by
# itself once the seconds have passed (check_node_timers, src/slurmctld/node_mgr.c); -1 cancels
# a timer already set. First in Slurm 23.02 (commits d3cf9683eb and b5a7ad0422, tag
# slurm-23-02-0-0rc1); 22.05's scontrol has no such keyword. docs/slurm-facts.md, "ResumeAfter".
RESUME_AFTER_SINCE = (23, 2)
CANCEL_RESUME_AFTER = -1
NEXT_STATES = ("RESUME", "DOWN")  # `scontrol reboot ... nextstate=` (scontrol(1))


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


class NotOurComment(SlurmError):
    """set_node_comment() refused: the node's Comment, or its drain, is someone else's."""


class NodeChange(Record):
    """What drain()/resume() did to a node, and why."""

    node: str
    action: str  # drained / resumed / unchanged / reboot_requested; "refused": NotOurDrain
    why: str
    reason: str = ""  # the reason written (drain)
    before: NodeInfo | None = None


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
        """One job (plain id, array task `14_1`, het component `14+1`); JobNotFound when Slurm
        does not know it."""
        raise NotImplementedError

    def requeue(self, job_id: int | str, hold: bool = False) -> None:
        """Requeue a running job, held if asked (so the exclusion can be set first);
        JobNotFound when Slurm does not know it."""
        raise NotImplementedError

    def release(self, job_id: int | str) -> None:
        """Release a held job and let it start now, once a requeue under way is over
        (wait_requeued); JobNotFound when Slurm does not know it."""
        self.wait_requeued(job_id)
        self._write_release(job_id)
        self.cli.start_now(job_id)

    def _write_release(self, job_id: int | str) -> None:
        raise NotImplementedError

    def wait_requeued(self, job_id: int | str, wait_s: float = REQUEUE_WAIT_S) -> bool:
        """Wait while a requeue of the job is under way; False if it was not over in `wait_s`.

        A requeue ends when the job's nodes have cleaned up: Slurm then moves its BeginTime to
        now + cred_expire + 1 (job_mgr.c batch_requeue_fini; 121 s by default), which would
        overwrite a `StartTime=now` sent earlier (seen on 22.05). And a node refuses a launch
        credential made in the second it revoked the job's last one (slurm_cred.c, ctime <=
        revoked): on 24.11 a job requeued held and released within that second came back
        FAILED, "Job credential revoked". So: wait out COMPLETING, then for the next second.
        """
        deadline = time.monotonic() + wait_s
        while self.job(job_id).state.upper() in REQUEUE_UNDER_WAY:
            if time.monotonic() > deadline:
                return False
            time.sleep(REQUEUE_POLL_S)
        time.sleep(1.0 - time.time() % 1.0)  # into the next whole second
        return True

    def set_excluded(self, job_id: int | str, nodes: Iterable[str]) -> None:
        """Set a pending job's excluded nodes; an empty list clears them; JobNotFound when
        Slurm does not know the job."""
        raise NotImplementedError

    def set_admin_comment(self, job_id: int | str, text: str) -> None:
        """Write `gpugate: <text>` (sanitised) into the job's AdminComment; JobNotFound when
        Slurm does not know the job."""
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
        wanted = [valid_node_name(n) for n in nodes]
        pinned = tuple(n for n in wanted if n in job.required_nodes)
        merged = tuple(
            dict.fromkeys([*job.excluded_nodes, *(n for n in wanted if n not in pinned)])
        )
        if merged != tuple(job.excluded_nodes):
            self.set_excluded(job_id, merged)
        return merged, pinned

    def set_node_comment(self, node: str, text: str) -> None:
        """Write `gpugate: <text>` (sanitised) into the node's Comment (no state change);
        NotOurComment where the Comment or the node's drain is someone else's."""
        before = self.node(valid_node_name(node))
        # Ownership, as for drains: an admin's note is never overwritten, and a node an admin
        # drained gets no gpugate text (a "would drain" there would read as gpugate's act).
        if before.comment and not own_comment(before.comment):
            raise NotOurComment(
                f"{node}: its Comment ({before.comment!r}) is not gpugate's; left as it is"
            )
        if before.drained and before.reason and not before.gpugate_owned:
            raise NotOurComment(
                f"{node}: drained by {before.reason_user or 'someone else'} "
                f"({before.reason!r}); gpugate writes no Comment there"
            )
        self._write_node_comment(node, admin_comment(text))

    def clear_node_comment(self, node: str) -> bool:
        """Empty the node's Comment if gpugate wrote it (an isolation put back); False when
        there was someone else's Comment, left as it is."""
        before = self.node(valid_node_name(node))
        if before.comment and not own_comment(before.comment):
            return False
        self._write_node_comment(node, "")
        return True

    def _write_node_comment(self, node: str, comment: str) -> None:
        # scontrol in the CLI backend; pyslurm (22.5 and 24.11 alike) through Node.modify.
        raise NotImplementedError

    def _write_drain(self, node: str, reason: str) -> None:
        raise NotImplementedError

    def _write_resume(self, node: str) -> None:
        raise NotImplementedError

    @property
    def cli(self) -> CommandLine:
        """The command-line backend, for what only scontrol can do."""
        raise NotImplementedError

    def show_config(self) -> str:
        """`scontrol show config`: the controller's settings, `Name = value` lines."""
        return self.cli.scontrol("show", "config")

    def slurm_version(self) -> tuple[int, int] | None:
        """Slurm's (major, minor), read once per adapter (`scontrol --version`, no RPC); None
        when it cannot be read (the older path is then taken)."""
        if not hasattr(self, "_version"):
            try:
                self._version: tuple[int, int] | None = self.cli.version()
            except Exception:  # no scontrol, a broken install: as if unknown
                self._version = None
        return self._version

    def drain(
        self, node: str, reason: str, force: bool = False, resume_at: float | None = None
    ) -> NodeChange:
        """Drain `node` with a gpugate reason; NotOurDrain if someone else drained it.

        `resume_at` (epoch seconds): Slurm resumes the node by itself then (ResumeAfter, Slurm
        23.02+; ignored on older Slurm, where gpugate's own lift is the only one). A drain
        without it over a timed drain of gpugate's cancels Slurm's timer: slurmctld keeps the
        timer when a drained node is drained again (`_equivalent_node_state`, node_mgr.c), and
        gpugate's untimed drain must not be lifted blindly."""
        reason = own_reason(reason)
        before = self.node(valid_node_name(node))
        # An empty reason on a DOWN node is Slurm's, not an admin's: nothing to overwrite.
        if before.drained and before.reason and not before.gpugate_owned and not force:
            why = (
                f"{node}: already drained by {before.reason_user or 'someone else'} "
                f"({before.reason!r}); gpugate does not replace a drain it did not set"
            )
            raise NotOurDrain(NodeChange(node=node, action=REFUSED, why=why, before=before))
        timer = self._resume_after(before, resume_at)
        if timer is None:
            self._write_drain(node, reason)
        else:
            self._write_timed_drain(node, reason, timer)
        return NodeChange(
            node=node, action=DRAINED, why=f"{node}: {reason}", reason=reason, before=before
        )

    def _resume_after(self, before: NodeInfo, resume_at: float | None) -> int | None:
        """ResumeAfter's seconds for a drain (CANCEL_RESUME_AFTER: cancel a timer gpugate set),
        or None: a plain drain (no timer wanted, or a Slurm without ResumeAfter)."""
        # gpugate times only a drill's drain (gate/drain.py): one replaced by an untimed drain
        # of gpugate's gets its timer cancelled (harmless where none was set).
        timed_before = before.drained and reason_drill(before.reason) is not None
        if resume_at is None and not timed_before:
            return None
        version = self.slurm_version()
        if version is None or version < RESUME_AFTER_SINCE:
            return None
        if resume_at is None:
            return CANCEL_RESUME_AFTER
        return max(1, math.ceil(resume_at - time.time()))

    def _write_timed_drain(self, node: str, reason: str, resume_after: int) -> None:
        # Only scontrol sets ResumeAfter (pyslurm's backend goes through the CLI for it too).
        self.cli.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}",
                          f"ResumeAfter={resume_after}")  # fmt: skip

    def resume(self, node: str, force: bool = False) -> NodeChange:
        """Resume `node` if gpugate drained it (any drain with force); else NotOurDrain."""
        before = self.node(valid_node_name(node))
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

    def reboot_asap(self, node: str, reason: str, nextstate: str = "RESUME") -> NodeChange:
        """`scontrol reboot ASAP nextstate=... reason=... NODE`; NotOurDrain on an admin's drain.

        scontrol(1), `reboot`: ASAP drains the node so no new job starts, the site's
        RebootProgram runs once it is idle, and nextstate=RESUME clears the DRAIN flag and the
        reason when slurmd registers again (DOWN if it does not within ResumeTimeout).
        """
        reason = own_reason(reason)
        if nextstate.upper() not in NEXT_STATES:
            raise ValueError(f"nextstate must be one of {NEXT_STATES}, not {nextstate!r}")
        before = self.node(valid_node_name(node))
        if before.drained and before.reason and not before.gpugate_owned:
            why = (
                f"{node}: drained by {before.reason_user or 'someone else'} "
                f"({before.reason!r}), not by gpugate; gpugate does not reboot it"
            )
            raise NotOurDrain(NodeChange(node=node, action=REFUSED, why=why, before=before))
        self._write_reboot(node, reason, nextstate.upper())
        why = f"{node}: {reason}"
        return NodeChange(node=node, action=REBOOT_REQUESTED, why=why, reason=reason, before=before)

    def _write_reboot(self, node: str, reason: str, nextstate: str) -> None:
        # Only scontrol reboots a node (pyslurm's backend goes through the CLI for it too).
        self.cli.scontrol("reboot", "ASAP", f"nextstate={nextstate}", f"reason={reason}", node)

    def expand_hostlist(self, expr: str) -> list[str]:
        """`gpu-[01-03,07],other` as names; asks `scontrol show hostnames` only when unsure."""
        try:
            return hostlist_expand(expr)
        except HostlistError:
            if expr.lstrip().startswith("-"):  # would be an scontrol option
                raise
            return self.cli.scontrol("show", "hostnames", expr).split()


_NODE_NAME = lazy(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def valid_node_name(name: str) -> str:
    """`name`, or ValueError when it is not a Slurm node name (names reach argv)."""
    # Names reach argv; one starting with "-" would be read as an scontrol option.
    if not _NODE_NAME.match(str(name)):
        raise ValueError(f"not a Slurm node name: {name!r}")
    return str(name)


def valid_job_id(job_id: int | str | JobId) -> str:
    """`job_id` as Slurm spells it (`14`, `14_1`, `14+1`), or ValueError when it is not one."""
    # Ids reach argv; parse_job_id admits digits, "_" and "+" only, so never an option.
    return str(parse_job_id(job_id))

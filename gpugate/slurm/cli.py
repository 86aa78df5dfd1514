"""The default backend: `scontrol`/`sinfo` through `gpugate.runner.run`.

Argv lists, a timeout on every call, `SLURM_CONF` passed through, typed errors. It reads the
`scontrol -o` text, which every version prints (22.05 has no `scontrol --json`), and
optionally `sinfo --json` (`listing="sinfo-json"`).
"""

from __future__ import annotations

import os
import re

from gpugate import runner as _runner
from gpugate.slurm.control import (
    DEFAULT_TIMEOUT,
    JobNotFound,
    NodeNotFound,
    SlurmCommandError,
    SlurmControl,
    SlurmError,
    SlurmMissing,
    SlurmTimeout,
    valid_node_name,
)
from gpugate.slurm.jobid import parse_job_id
from gpugate.slurm.parse_json import parse_sinfo_json
from gpugate.slurm.parse_text import parse_show_jobs_text, parse_show_node_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from gpugate.slurm.jobid import JobId
    from gpugate.slurm.records import JobInfo, NodeInfo

    Runner = Callable[..., _runner.CommandResult]


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

    def script_jobs(self) -> list[tuple[str, str]]:
        """(job id, state) of every job during which slurmctld may run a PrologSlurmctld or
        EpilogSlurmctld: CONFIGURING (PrologSlurmctld) or COMPLETING (EpilogSlurmctld), in
        any partition, hidden ones too. One squeue, this backend's timeout.

        squeue's state filter tests the COMPLETING and CONFIGURING flags, whatever the base
        state (`_filter_job` in src/squeue/print.c): a job put back in the queue while its
        EpilogSlurmctld runs (PENDING+COMPLETING) is listed too. docs/slurm-facts.md
        ("Reconfigure and the controller's scripts") has the Slurm source behind the states.
        """
        out = self.call("squeue", "--all", "--noheader", "--states=CONFIGURING,COMPLETING",
                        "--format=%i %T")  # fmt: skip
        jobs = []
        for line in out.splitlines():
            job, _, state = line.strip().partition(" ")
            if job:
                jobs.append((job, state.strip()))
        return jobs

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
        missing = NodeNotFound(f"node {name!r} not found")
        text = self._show("node", valid_node_name(name), "not found", missing)
        for node in parse_show_node_text(text):
            if node.name == name:
                return node
        raise NodeNotFound(f"node {name!r} not in scontrol output")

    def job(self, job_id: int | str) -> JobInfo:
        """One job (plain, array task `14_1`, het `14+1`); JobNotFound when Slurm does not know it."""
        jid = parse_job_id(job_id)
        text = self._job_call(jid, "-o", "show", "job", str(jid))
        jobs = parse_show_jobs_text(text, self.expand_hostlist)
        if not jobs:
            raise JobNotFound(f"job {jid} not in scontrol output")
        # An array's master id lists every task; prefer the record with this very id (an
        # array task or het component prints one record, under its own plain JobId).
        return next((j for j in jobs if j.job_id == jid.plain), jobs[0])

    def _show(self, what: str, name: str, says: str, missing: SlurmError) -> str:
        """`scontrol -o show <what> <name>`; `missing` raised when scontrol's error `says` so."""
        try:
            return self.scontrol("-o", "show", what, name)
        except SlurmCommandError as e:
            if _says(e, says):
                raise missing from e
            raise

    def _job_call(self, job_id: object, *args: str) -> str:
        """`scontrol ARGS...` about one job; JobNotFound when scontrol says it does not know it."""
        try:
            return self.scontrol(*args)
        except SlurmCommandError as e:
            # "Invalid job id specified" for an unknown plain id, "Job 1_4 not found" for an
            # unknown array task (scontrol's own words, 22.05 and 24.11).
            if _says(e, "invalid job id") or _says_job_not_found(e):
                raise JobNotFound(f"job {job_id} not found: {_said(e)}") from e
            raise

    def _write_drain(self, node: str, reason: str) -> None:
        self.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def _write_resume(self, node: str) -> None:
        self.scontrol("update", f"NodeName={node}", "State=RESUME")

    def requeue(self, job_id: int | str, hold: bool = False) -> None:
        """Requeue a running job, held if asked (so the exclusion can be set first)."""
        jid = parse_job_id(job_id)
        self._job_call(jid, "requeuehold" if hold else "requeue", str(jid))

    def _write_release(self, job_id: int | str) -> None:
        jid = parse_job_id(job_id)
        self._job_call(jid, "release", str(jid))

    def start_now(self, job_id: int | str | JobId) -> None:
        """Clear the BeginTime (+120 s) that every requeue sets."""
        jid = parse_job_id(job_id)
        self._job_call(jid, "update", f"JobId={jid}", "StartTime=now")

    def set_excluded(self, job_id: int | str, nodes: Iterable[str]) -> None:
        """Set a pending job's excluded nodes; an empty list clears them (`ExcNodeList=`)."""
        jid = parse_job_id(job_id)
        names = ",".join(valid_node_name(n) for n in nodes)
        self._job_call(jid, "update", f"JobId={jid}", f"ExcNodeList={names}")

    def _write_admin_comment(self, job_id: int | str, comment: str) -> None:
        jid = parse_job_id(job_id)
        self._job_call(jid, "update", f"JobId={jid}", f"AdminComment={comment}")

    def _write_node_comment(self, node: str, comment: str) -> None:
        self.scontrol("update", f"NodeName={node}", f"Comment={comment}")


def _says(error: SlurmCommandError, words: str) -> bool:
    res = error.result
    return res.status == _runner.NONZERO and words in (res.stdout + res.stderr).lower()


def _says_job_not_found(error: SlurmCommandError) -> bool:
    # "Job 1_4 not found", not any "not found" (an unknown node in ExcNodeList is no unknown job).
    res = error.result
    return res.status == _runner.NONZERO and bool(
        re.search(r"(?i)\bjob\s+\S+\s+not found", res.stdout + res.stderr)
    )


def _said(error: SlurmCommandError) -> str:
    res = error.result
    return " ".join((res.stderr or res.stdout).split())


def expand_hostlist(expr: str) -> list[str]:
    """`gpu-[01-03,07],other` as names, for callers without a backend (see SlurmControl)."""
    return CliBackend().expand_hostlist(expr)


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) as integers from "slurm-wlm 22.05.8" or pyslurm's "22.5.3"."""
    m = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None

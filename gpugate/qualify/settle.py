"""After a qualification: drain, keep drained or restore each node, then record the outcome.

The drains come first, for every node, while gpugate's reservation still holds the nodes: a
failing node is drained (a new drain: within the budget, a plan the executor carries out:
drain_plan, gpugate/act) or kept drained
(`gpugate: qualify: <why> (job N)`); a passing node that was drained before is drained again
with its earlier reason, or resumed with an audit entry when resume_passed (each node's
repair ledger line of its verdict comes just before). Only then the records: the evidence
bundle (under the node job's id), the drain history, qualify.jsonl and an event line. A record
that cannot be written is logged; it never undoes a drain.
"""

from __future__ import annotations

import os
import time

from gpugate import log
from gpugate.act.execute import Hands, execute
from gpugate.act.plans import budget_drain
from gpugate.qualify.judge import first_failure, result_files
from gpugate.slurm.reasons import drain_reason
from gpugate.store import ledger
from gpugate.store.evidence import EvidenceError, retention_for, write_bundle
from gpugate.store.history import history_dir, note_drain
from gpugate.store.metrics import note_qualification
from gpugate.store.qualify import QualifyEntry
from gpugate.store.summary import QualifySummary

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from gpugate.act.steps import Plan
    from gpugate.config.schema import Config
    from gpugate.qualify.records import Job, QualifyRun
    from gpugate.slurm.control import SlurmControl
    from gpugate.store.qualify import QualifyTestResult

    class _Run(Protocol):
        """What settle reads of run.py's _Run (named here, not imported: no circle)."""

        config: Config
        slurm: SlurmControl
        run_id: str
        trigger: str
        drained: dict[str, str]  # node -> its earlier drain reason
        settled: set[str]  # taken nodes whose drain is decided
        jobs: dict[str, Job]  # by name, their latest state


WHY_MAX = 150  # the drain reason keeps its `(job N)` within Slurm's length
OUT_MAX = 256 * 1024  # of each job's output in the bundle


def settle(run: _Run, result: QualifyRun, resume_passed: bool, by: str) -> None:
    """Act on every node's verdict (drains first), then record each outcome."""
    reasons = {}
    for node in result.nodes:
        verdict = result.verdicts[node]
        note_verdict(run, result, node, by)  # the ledger: the verdict before what follows it
        verdict["action"], reasons[node] = act(run, node, verdict, resume_passed, by)
    for node in result.nodes:
        try:
            record(run, result, node, reasons[node], by)
        except Exception as exc:  # the drain stands; the admin learns from the log
            log.error(run.config.state_dir, f"qualify: could not record {node}'s outcome", exc)


def note_verdict(run: _Run, result: QualifyRun, node: str, by: str) -> None:
    """The node's QUALIFY line in the repair ledger (never raising): passed, failed or not
    qualified, the run and its jobs, and the failed test. The drain or resume that follows
    writes its own line (store/history.py)."""
    try:  # a line lost must not keep the node from its drain
        verdict = result.verdicts[node]
        jobs = ", ".join(str(j) for j in verdict.get("job_ids") or ())
        said = outcome(verdict)
        why = said["failure"] or ("" if verdict.get("passed") else str(verdict.get("why") or ""))
        evidence = f"qualify {result.run_id}" + (f" (job {jobs})" if jobs else "")
    except Exception as exc:
        log.error(run.config.state_dir, f"qualify: no ledger line for {node}'s verdict", exc)
        return
    ledger.note(run.config, node, ledger.QUALIFY, who=by or "gpugate", why=why,
                outcome=said["outcome"].replace("_", " "), evidence=evidence)  # fmt: skip


def act(
    run: _Run, node: str, verdict: dict[str, Any], resume_passed: bool, by: str
) -> tuple[Any, ...]:
    """(what was done, the drain reason written or None) for one node."""

    before = run.drained.get(node)
    if verdict["failed"]:
        why, job = first_failure(verdict)
        why = " ".join(why.split())
        why = why if len(why) <= WHY_MAX else why[: WHY_MAX - 3] + "..."
        detail = f"{why} (job {job})" if job else why
        if before is not None:  # drained already: it stays drained, the budget counted it
            change = run.slurm.drain(node, drain_reason("qualify", detail))
            run.settled.add(node)
            return "kept drained", change.reason
        hands = Hands(run.config, run.slurm, hook="qualify")
        drain = execute(drain_plan(node, detail), hands).drain  # its Drain ran: never None
        if drain is not None and drain.drained:
            return "drained", drain.reason
        return (f"not drained ({drain.blocked_by}: {drain.why})" if drain else "not drained"), None
    if before is None:
        return "in service", None
    if resume_passed and verdict["passed"]:
        from gpugate.store.history import history_dir, record_resume

        record_resume(history_dir(run.config), node, who=by, reason=before,
                      why=f"qualify {run.run_id}: passed (jobs {', '.join(verdict['job_ids'])})",
                      result={"qualify": run.run_id, "job_ids": verdict["job_ids"]})  # fmt: skip
        run.settled.add(node)
        return "resumed", None
    run.slurm.drain(node, before)  # its own earlier reason: nothing changes for the admin
    run.settled.add(node)
    return "drained as before", None


def drain_plan(node: str, detail: str) -> Plan:
    """A failing node's new drain: `gpugate: qualify: <detail>` within the budget, undone if it
    ranks beyond it, and a drain the budget holds back said (the node's Comment, the log line,
    the event) and recorded in the history's held entries, as every hook's drain."""
    return budget_drain(node, "qualify", drain_reason("qualify", detail))


def record(run: _Run, result: QualifyRun, node: str, reason: str | None, by: str) -> None:
    """The evidence bundle, the drain history (when drained), qualify.jsonl, an event."""
    from gpugate.store.qualify import record_qualification

    verdict = result.verdicts[node]
    verdict["bundle"] = bundle(run, result, node)
    job = first_failure(verdict)[1] if verdict["failed"] else None
    if reason:
        note_drain(run.config, node, reason, job=job, hook="qualify", bundle=verdict["bundle"])
    adm = run.config.admin
    entry = QualifyEntry(node=node, when=time.time(), run_id=result.run_id, level=result.level,
                         passed=verdict["passed"], tests=verdict["tests"],
                         job_ids=verdict["job_ids"], why=verdict["why"], by=by,
                         trigger=run.trigger)  # fmt: skip
    full = record_qualification(history_dir(run.config), entry, max_per_node=adm.history_max_per_node,
                                max_entries=adm.history_max_entries)  # fmt: skip
    note_qualification(run.config, [full])  # gpugate_qualify_* (never raises)
    log.event(run.config.state_dir, "qualify", node=node, run=result.run_id,
              outcome="passed" if verdict["passed"] else "failed" if verdict["failed"] else
              "not_qualified", action=verdict["action"], jobs=verdict["job_ids"])  # fmt: skip


def bundle(run: _Run, result: QualifyRun, node: str) -> str | None:
    """One evidence bundle for the node, under its qualification job's id; its path."""

    verdict = result.verdicts[node]
    if not verdict["job_ids"]:
        return None  # no job ran: nothing to file it under
    job_id = verdict["job_ids"][0]
    files = result_files(result.run_dir, node)
    for job in run.jobs.values():
        if node in job.nodes:
            if len(job.nodes) > 1:
                files.update(result_files(result.run_dir, job.name))
            out = _tail(job.output)
            if out is not None:
                files[os.path.basename(job.output)] = out
    summary = QualifySummary(
        job=job_id, node=node, kind="qualify", run_id=result.run_id, level=result.level,
        tests_run=list(result.tests), passed=verdict["passed"], why=verdict["why"],
        tests=verdict["tests"], job_ids=verdict["job_ids"], action=verdict["action"],
        reservation=result.reservation, user="root", when=time.time(), trigger=run.trigger,
        **outcome(verdict),
    )  # fmt: skip
    try:
        return write_bundle(run.config.evidence_dir, job_id, node, 0, files, summary,
                            group=run.config.epilog.evidence_group,
                            retention=retention_for(run.config))  # fmt: skip
    except (EvidenceError, OSError) as exc:
        log.error(run.config.state_dir, f"qualify: no evidence bundle for {node}", exc)
        return None


def outcome(verdict: dict[str, Any]) -> dict[str, Any]:
    """A verdict's outcome for the bundle: passed / failed / not_qualified, the first failure,
    its fault kind, and hardware_fault only where the failure is evidence against the GPUs."""
    if verdict.get("passed"):
        return {"outcome": "passed", "hardware_fault": False, "fault_kind": None, "failure": None}
    bad = [t for t in verdict.get("tests") or () if t.ok is False]
    if not bad:
        return {"outcome": "not_qualified", "hardware_fault": False, "fault_kind": None,
                "failure": None}  # fmt: skip
    kinds = [fault_kind(t) for t in bad]
    first = next((t for t, k in zip(bad, kinds) if k == "hardware"), bad[0])
    return {"outcome": "failed", "hardware_fault": "hardware" in kinds,
            "fault_kind": "hardware" if "hardware" in kinds else kinds[0],
            "failure": f"{first.test}: {first.detail or 'failed'}"}  # fmt: skip


def fault_kind(test: QualifyTestResult) -> str:
    """What a failed TEST RESULT shows: hardware (DCGM's hardware verdict, a bandwidth measured
    below its bar), software (DCGM's node problem that is not the GPU: fabric manager, ...),
    config, or error (a step that failed without measuring: the setup, not the GPU)."""
    if test.test == "dcgm":
        found = [f.kind for f in test.findings or ()]
        for kind in ("hardware", "software", "config"):
            if kind in found:
                return kind
        return "hardware"  # a failed DCGM result with no finding kinds (older): as before
    return "hardware" if test.value_gbps is not None else "error"


def _tail(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - OUT_MAX))
            return fh.read(OUT_MAX)
    except OSError:
        return None

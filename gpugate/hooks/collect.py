"""The epilog's hands: read the job's files as its user, drain for hardware, write the bundle."""

from __future__ import annotations

import io
import json
import os
import time

from gpugate import fsutil, log
from gpugate.checks.kerneltime import line_utc
from gpugate.checks.sources.kernel_log import newest_lines
from gpugate.clock import utc
from gpugate.diagnosis.engine import Input, diagnose_streams
from gpugate.diagnosis.scan import LimitedStream
from gpugate.diagnosis.verdict import JOB_FILE, KERNEL_LOG
from gpugate.fsutil import atomic_write
from gpugate.hooks import flightrec_collect
from gpugate.hooks.child_answer import ChildDiagnosis, JobDiagnosis
from gpugate.hooks.deltas import describe
from gpugate.hooks.task_prolog import FR_PREFIX
from gpugate.slurm.choose import backend
from gpugate.slurm.hookenv import comment_tokens
from gpugate.slurm.layout import node_of_rank
from gpugate.slurm.reasons import drill_mark
from gpugate.store.evidence import EvidenceError, retention_for, write_bundle
from gpugate.store.held import HELD_LABEL
from gpugate.store.nccl_dir import nccl_job_dir
from gpugate.store.state import load_task_file
from gpugate.store.summary import CheckpointAtEnd, EvidenceSummary, SummaryJob, summary_from_json
from gpugate.store.suspects import first_failure_at
from gpugate.text import printable
from gpugate.userfiles import UserFileError, as_user, open_regular, read_fd
from gpugate.yamlio import dump_yaml

DIAGNOSE_SHARE = 0.8  # of the reader's timeout, shared among the job's files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.checkpoints.freshness import Freshness
    from gpugate.checks.facts import Facts
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config
    from gpugate.hooks.epilog_result import EpilogResult
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.hookenv import HookEnv
    from gpugate.store.state import Baseline


def failing_node(diagnosis: JobDiagnosis, env: HookEnv, job: SummaryJob) -> str | None:
    """The failing rank's node: the one the log names, else the job's only node.

    Slurm's tasks per node are not used here: under torchrun (one task per node, a process per
    GPU) they would put rank 1 on the second node. An admin who knows the layout gives it to
    `gpugate diagnose --nodelist --tasks-per-node`.
    """
    if diagnosis.failing_node:
        return diagnosis.failing_node
    rank = diagnosis.failing_rank
    if rank is None:
        return None
    nodes = job.nodes or env.nodelist
    return node_of_rank(rank, nodes or None, None)


def job_info(config: Config, env: HookEnv, slurm: SlurmControl | None = None) -> SummaryJob:
    """What Slurm knows of the job (stdout/stderr paths, user, batch host), best effort."""
    info = SummaryJob(job_id=env.job_id, user=env.user, uid=env.uid, gid=env.gid)
    try:
        slurm = slurm or slurm_for(config)
        job = slurm.job(env.job_id or "")
        return info.replace(
            stdout=job.stdout or None, stderr=job.stderr or None, batch_host=job.batch_host,
            nodes=list(job.nodes), state=job.state, exit_code=job.exit_code,
            exit_signal=job.exit_signal, restarts=job.restarts, work_dir=job.work_dir,
            comment=job.comment, start_time=job.start_time, end_time=job.end_time,
        )  # fmt: skip
    except Exception as exc:  # Slurm slow or the job gone: fall back to the environment
        return info.replace(slurm_error=f"{type(exc).__name__}: {exc}",
                            stdout=_expand(env.stdout, env))  # fmt: skip


def _expand(path: str | None, env: HookEnv) -> str | None:
    # SLURM_JOB_STDOUT is the pattern as given (`out.%j`), not expanded: do the common ones.
    if not path:
        return None
    for key, value in (("%j", env.job_id), ("%u", env.user), ("%N", env.node), ("%%", "%")):
        path = path.replace(key, value or "")
    return path if os.path.isabs(path) else os.path.join(env.work_dir or "/", path)


def job_files(config: Config, env: HookEnv, job: SummaryJob) -> list[str]:
    """The job's logs this node should read: stdout/stderr on the batch host, NCCL files here."""
    files: list[str] = []
    if not job.batch_host or job.batch_host == env.node:
        for path in (job.stdout, job.stderr):
            if path and path not in files and path != "/dev/null":
                files.append(path)

    nccl = nccl_job_dir(config, env.job_id)
    if nccl:
        files.append(nccl + "/")  # listed by the reader, as the user
    return files


def read_job_files(
    config: Config,
    env: HookEnv,
    job: SummaryJob,
    kernel_lines: list[str],
    timeout: float | None = None,
    offsets: dict[str, int] | None = None,
) -> ChildDiagnosis:
    """Tails and the diagnosis of the job's logs plus this job's kernel lines, as the job's user.

    `offsets`: where this run's part of a file starts (runs.record_log_offsets, taken by the
    prolog): nothing before it is read, so an appended log never replays an earlier run.
    """
    files = job_files(config, env, job)
    cap = config.epilog.log_tail_kib * 1024
    kernel_text = "\n".join(kernel_lines) + "\n" if kernel_lines else ""
    diag_cap = int(config.epilog.diagnose_max_mib * 1024 * 1024)
    # Most of the reader's time goes to the diagnosis; the rest keeps the answer in time.
    budget_s = DIAGNOSE_SHARE * (timeout or config.epilog.read_timeout_s)

    # _read_and_diagnose's keyword arguments, sent as JSON to the reader child (userfiles).
    reader_kwargs = {
        "files": files, "kernel_text": kernel_text, "cap": cap,
        "max_files": config.epilog.max_log_files, "diag_cap": diag_cap, "budget_s": budget_s,
        "offsets": {p: n for p, n in (offsets or {}).items() if p in files},
    }  # fmt: skip

    uid = env.uid if env.uid is not None else job.uid
    gid = env.gid if env.gid is not None else job.gid
    try:
        answer = as_user(uid, gid, "gpugate.hooks.collect:_read_and_diagnose", reader_kwargs,
                         timeout or config.epilog.read_timeout_s)  # fmt: skip
        # JSON a process of the job's user wrote: nothing of it is used before it is checked.
        return ChildDiagnosis.from_json(answer, "the reader child's answer")
    except (UserFileError, ValueError) as exc:
        log.say(f"epilog job {env.job_id}: could not read the job's files: {exc}")
        # The kernel lines are root's own: diagnose them here even when the user's files fail.
        own = JobDiagnosis.from_json(
            _diagnose([], kernel_text, 0, 0), "the kernel lines' diagnosis"
        )
        return ChildDiagnosis(errors=[str(exc)], diagnosis=own)


def _read_and_diagnose(
    files: list[str],
    kernel_text: str,
    cap: int,
    max_files: int,
    diag_cap: int = 64 << 20,
    budget_s: float | None = None,
    offsets: dict[str, int] | None = None,
) -> dict[str, Any]:
    """In the child, as the user: safe tails of each file, then one diagnosis over all.

    A file with an offset (this run's start in it) is read from there on, never before: an
    earlier run's lines are not this run's. A file now shorter than its offset was truncated
    (`--open-mode=truncate` on the rerun): all of it is this run's.

    Each file is opened once (no symlink, no FIFO, a regular file); its tail for the bundle
    and the bytes the diagnosis reads both come from that descriptor: the last `diag_cap`
    bytes at most, within an equal share of `budget_s`. A huge or sparse file costs its
    budget, never the others' (the tails are all read first). JSON in, JSON out: this may run
    in a separate child process.
    """
    paths: list[str] = []
    errors: list[str] = []
    for entry in files:
        if entry.endswith("/"):
            try:
                # Flight-recorder dumps (pickles) are read apart: flightrec_collect.
                names = sorted(n for n in os.listdir(entry) if not n.startswith(FR_PREFIX))
                names = names[:max_files]
            except OSError as exc:
                errors.append(f"{entry}: {exc.strerror}")
                continue
            paths += [os.path.join(entry, n) for n in names]
        else:
            paths.append(entry)
    tails: dict[str, str] = {}
    opened: list[tuple[str, int, int, int]] = []  # (path, fd, size, this run's start)
    try:
        for path in paths:
            try:
                fd = open_regular(path)
            except (UserFileError, OSError) as exc:
                errors.append(str(exc))
                continue
            try:
                size = os.fstat(fd).st_size
                start = run_start(size, (offsets or {}).get(path))
                os.lseek(fd, max(start, size - cap), os.SEEK_SET)
                tails[path] = read_fd(fd, cap).decode("utf-8", "replace")
                opened.append((path, fd, size, start))
            except OSError as exc:
                errors.append(f"{path}: {exc.strerror}")
                os.close(fd)
        diagnosis = _diagnose(opened, kernel_text, diag_cap, budget_s)
    finally:
        for _, fd, _, _ in opened:
            os.close(fd)
    return {"tails": tails, "errors": errors, "diagnosis": diagnosis}


def run_start(size: int, offset: object) -> int:
    """Where this run's part of a file of `size` bytes starts, given the prolog's offset."""
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or offset > size:
        return 0  # none recorded, or the file was truncated since: all of it is this run's
    return offset


def _diagnose(
    opened: list[tuple[str, int, int, int]],
    kernel_text: str,
    diag_cap: int,
    budget_s: float | None,
) -> dict[str, Any]:
    """One diagnosis: the job's files (not trusted) and root's own kernel lines (trusted)."""

    share = budget_s / len(opened) if budget_s and opened else None
    inputs = []
    for path, fd, size, start in opened:
        begin = max(start, size - diag_cap)  # the cap keeps its tail; never before this run
        inputs.append(Input(name=path, source=JOB_FILE, offset=begin,
                            stream=LimitedStream(fd, begin, diag_cap, seconds=share)))  # fmt: skip
    if kernel_text:
        inputs.append(Input(name="kernel log", source=KERNEL_LOG,
                            stream=io.BytesIO(kernel_text.encode())))  # fmt: skip
    diagnosis = diagnose_streams(inputs)
    # Read here, where the job's files can be read again: the cleaned lines lose their stamps.
    return {**diagnosis.to_json(), "first_failure_at": first_failure_at(diagnosis)}


def _action(result: EpilogResult, pending_drain: bool) -> str:
    if result.drained:
        return "drained"
    if result.reason and result.blocked_by == "budget":
        return HELD_LABEL  # the budget held the drain back: the node takes jobs
    if result.reason and result.blocked_by == "error":
        return "drain failed (scontrol)"
    if result.reason:
        return "drain refused (not gpugate's)"
    return "drain pending" if pending_drain else "none"


def record_outcome(config: Config, bundle: str, result: EpilogResult) -> bool:
    """After the drain, say in the bundle's summary.json what it did (atomic rewrite); True if so."""
    path = os.path.join(bundle, "summary.json")
    try:
        fd = fsutil.open_regular(path, follow=False)  # never blocks, never a symlink
        with os.fdopen(fd) as fh:
            st = os.fstat(fh.fileno())
            summary = summary_from_json(json.load(fh), path)
        summary = summary.replace(action=_action(result, False), drain_reason=result.reason)
        text = json.dumps(summary.to_json(), indent=1, default=str)
        atomic_write(path, text, mode=st.st_mode & 0o777)
        os.chown(path, -1, st.st_gid)  # the admins' group, as write_bundle set it
        return True
    except (OSError, ValueError) as exc:
        log.error(config.state_dir, f"epilog job {_job_of(bundle)}: could not record the drain "
                  "in the bundle", exc)  # fmt: skip
        return False


def declared_checkpoint_dir(config: Config, env: HookEnv, job: SummaryJob) -> str | None:
    """The job's `gpugate:ckpt=DIR`: from the prolog's task file, else the job's comment."""

    saved = load_task_file(config.state_dir, env.job_id) if env.job_id else None
    ckpt = (saved or {}).get("ckpt_dir")
    if isinstance(ckpt, str) and ckpt:
        return ckpt
    for comment in (env.comment, job.comment):
        ckpt = comment_tokens(comment if isinstance(comment, str) else "").get("ckpt")
        if ckpt:
            return ckpt
    return None


def checkpoint_freshness(
    config: Config, env: HookEnv, job: SummaryJob, facts: Facts, timeout: float
) -> Freshness | None:
    """How old the job's newest complete checkpoint was at its end (None: it declared none)."""
    from gpugate.checkpoints.freshness import measure

    ckpt_dir = declared_checkpoint_dir(config, env, job)
    if not ckpt_dir:
        return None
    gpus = len(env.gpus) if env.gpus is not None else _node_gpus(facts)
    uid = env.uid if env.uid is not None else job.uid
    gid = env.gid if env.gid is not None else job.gid
    return measure(ckpt_dir, uid, gid, env.end_time, env.start_time, gpus,
                   config.checkpoints.max_age_s, timeout)  # fmt: skip


def _node_gpus(facts: Facts) -> int | None:
    return len(facts.gpus) if facts.gpus is not None else facts.slurm_gres_gpus


def _job_of(bundle: str) -> str:
    """The job id a bundle path names (`<evidence_dir>/<job>/<node>-r<n>`)."""
    return os.path.basename(os.path.dirname(bundle))


def write_evidence(
    config: Config,
    env: HookEnv,
    job: SummaryJob,
    facts: Facts,
    fresh: list[str],
    deltas: dict[str, Any],
    hardware: list[Finding],
    logs: ChildDiagnosis,
    result: EpilogResult,
    pending_drain: bool = False,
    freshness: Freshness | None = None,
    flightrec: dict[str, Any] | None = None,
    elsewhere: list[Finding] | None = None,
    baseline: Baseline | None = None,
) -> str | None:
    """Write the bundle (atomically, admins only); returns its path or None on failure.

    `hardware`: the faults that are the job's (new since its prolog, on its GPUs or node-wide);
    `elsewhere`: new ones on GPUs outside its allocation, recorded but never the job's.
    """
    from gpugate.checkpoints.freshness import message

    ep = config.epilog
    kernel = newest_lines(fresh, ep.kernel_lines_max)  # an OOM flood never pushes an Xid out
    summary = _summary(env, job, facts, kernel, deltas, hardware, logs, result, pending_drain)
    summary = summary.replace(
        **run_times(env, job, facts, baseline),
        faults_outside_job=[f.message for f in elsewhere or ()],
        **checkpoint_fields(freshness),
        flightrec_dumps=len((flightrec or {}).get("records") or []),
    )
    files = _bundle_files(facts, kernel, deltas, logs)
    stale = message(freshness) if freshness is not None else None
    decisive = files["decisive.txt"]
    assert isinstance(decisive, str)  # _bundle_files writes it as text
    if stale:  # the admin reads the stale checkpoint beside the cause
        decisive = files["decisive.txt"] = f"{decisive}gpugate: {printable(stale)}\n"
    if result.kernel_log_lost:  # the cause may be among what the kernel lost (issue 41, R9)
        decisive = files["decisive.txt"] = (
            f"{decisive}gpugate: kernel.xid: {result.kernel_log_lost}\n"
        )
    files.update(flightrec_collect.bundle_files(flightrec))
    refused = flightrec_collect.decisive_lines(flightrec)
    if refused:  # a refused dump may be a hostile one: the admin sees it beside the cause
        files["decisive.txt"] = decisive + "".join(line + "\n" for line in refused)
    try:
        return write_bundle(config.evidence_dir, env.job_id or "", env.node or "node", env.restart_count,
                            files, summary, group=ep.evidence_group,
                            retention=retention_for(config))  # fmt: skip
    except (EvidenceError, OSError) as exc:
        log.error(
            config.state_dir, f"epilog job {env.job_id}: could not write the evidence bundle", exc
        )
        return None


def _summary(
    env: HookEnv,
    job: SummaryJob,
    facts: Facts,
    kernel: list[str],
    deltas: dict[str, Any],
    hardware: list[Finding],
    logs: ChildDiagnosis,
    result: EpilogResult,
    pending_drain: bool,
) -> EvidenceSummary:
    """The bundle's summary.json.

    The verdict (`category`, `xid`) is the diagnosis with a job's own hardware claims set
    aside (only root's kernel lines can make one); `job_output_category` is what the job's
    output says at its word, and `untrusted_claims` the lines that claimed it.
    """
    diagnosis = logs.diagnosis
    return EvidenceSummary(
        # job, or drill: this run ended under a fault drill's overlay (gpugate/drill), so its
        # fault is simulated; the report and the controller keep it apart from real failures.
        kind="drill" if drill_mark() else "job",
        drill=drill_mark(),
        job_id=env.job_id or "",
        node=env.node,
        restart=env.restart_count,
        sluid=env.sluid,  # this run's, unique where the job id may be reused (Slurm 25.11+)
        user=env.user,
        why=result.why,
        exit_code2=env.exit_code2,
        # The job's GPUs here (SLURM_JOB_GPUS; null: not known, read as the whole node's
        # node_gpus): `gpugate report` weighs the time lost by them (GPU-hours).
        gpus=None if env.gpus is None else list(env.gpus),
        node_gpus=len(facts.gpus) if facts.gpus is not None else facts.slurm_gres_gpus,
        category=diagnosis.category,
        category_source=diagnosis.decided_by,
        category_trusted=diagnosis.trusted,
        # high / medium / low (gpugate.diagnosis.confidence): the requeue acts on high only.
        confidence=diagnosis.confidence,
        xid=diagnosis.xid,
        failing_rank=diagnosis.failing_rank,
        # The failing rank's node (the log's word, else a one-node job's), why that rank, and
        # how sure: the controller's suspect vote points at this node when it is one of the job's.
        failing_node=result.failing_node,
        rank_reason=diagnosis.rank_reason,
        rank_confidence=diagnosis.rank_confidence,
        summary_text=diagnosis.summary,
        job_output_category=diagnosis.job_output_category,
        job_output_xid=diagnosis.job_output_xid,
        untrusted_claims=[c.get("claim") for c in diagnosis.untrusted],
        hardware_fault=bool(hardware),
        hardware_findings=[f.message for f in hardware],
        first_hardware_error_at=_first_time(kernel) if hardware else None,
        # When this node's decisive lines say it failed (UTC; null without a full date):
        # the controller's cross-job suspect voting orders a job's nodes by it.
        first_failure_at=diagnosis.first_failure_at,
        suspected_node=env.node if hardware else None,
        counter_changes=describe(deltas),
        action=_action(result, pending_drain),
        drain_reason=result.reason,
        job=job,  # its comment is never written (SummaryJob)
        read_errors=logs.errors,
        # Kernel records lost unread since the prolog: an Xid may be unseen (kernel.xid unknown).
        kernel_log_lost=result.kernel_log_lost,
    )


def checkpoint_fields(f: Freshness | None) -> dict[str, Any]:
    """The summary's checkpoint keys (`checkpoint_age_s`, `_stale`, `_message`, `checkpoint`),
    floats to the millisecond; none for a job that declared no checkpoint directory."""
    from gpugate.checkpoints.freshness import message

    if f is None:
        return {}
    at = utc(f.mtime) if f.mtime is not None else None
    measured = CheckpointAtEnd(
        ckpt_dir=f.ckpt_dir, max_age_s=round(f.max_age_s, 3), path=f.path, mtime=_ms(f.mtime),
        age_s=_ms(f.age_s), at_risk_s=_ms(f.at_risk_s), gpu_hours=_ms(f.gpu_hours), stale=f.stale,
        error=f.error, at=at,
    )  # fmt: skip
    return {"checkpoint_age_s": _ms(f.age_s), "checkpoint_stale": f.stale,
            "checkpoint_message": message(f), "checkpoint": measured}  # fmt: skip


def _ms(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def _bundle_files(
    facts: Facts, kernel: list[str], deltas: dict[str, Any], logs: ChildDiagnosis
) -> dict[str, str | bytes]:
    """The bundle's files besides summary.json: kernel lines, counters, snapshot, log tails."""

    diagnosis = logs.diagnosis
    files: dict[str, str | bytes] = {
        "kernel.log": "\n".join(kernel) + ("\n" if kernel else ""),
        "counters.json": json.dumps(deltas, indent=1),
        "snapshot.yaml": dump_yaml(facts.to_dict()),
        "diagnosis.json": json.dumps(diagnosis.to_json(), indent=1, default=str),
        # The lines quote the job's logs: an admin will `cat` this file (gpugate.text).
        "decisive.txt": "\n".join(map(printable, diagnosis.evidence)) + "\n",
    }
    for i, (path, tail) in enumerate(sorted(logs.tails.items())):
        name = os.path.basename(path.rstrip("/")) or f"log{i}"
        files[f"logs/{i:02d}-{_safe(name)}.tail"] = f"# tail of {path}\n{tail}"
    return files


def run_times(
    env: HookEnv, job: SummaryJob, facts: Facts, baseline: Baseline | None
) -> dict[str, Any]:
    """The bundle's times: when it was collected (now) and this run's start and end.

    The run's start and end come from Slurm: the Epilog's SLURM_JOB_START_TIME and
    SLURM_JOB_END_TIME (23.x on; 22.05's Epilog has neither: reference/slurm-in-ci.md, "Slurm
    24.11", and the captures in reference/real-outputs/slurm-24.11-debian13/hook-env/), else
    `scontrol show job`'s StartTime/EndTime (job_info), else the start the prolog recorded and
    the epilog's own clock for the end (it runs as the job ends). `collected_at` is the real
    time of the collection, also when the facts are a replayed snapshot, whose own time is
    kept as `facts_time`.
    """
    now = time.time()
    start = (
        env.start_time
        or _epoch(job.start_time)
        or _epoch(baseline.started_at if baseline else None)
    )
    end = env.end_time or _epoch(job.end_time) or now
    return {
        "collected_at": utc(now),
        "facts_time": facts.collected_at,
        "job_start": _iso(start),
        "job_end": _iso(end),
    }


def _epoch(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def _iso(epoch: float | None) -> str | None:
    return utc(epoch) if epoch else None


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80] or "log"


def _first_time(lines: list[str]) -> str | None:
    """UTC time of the first fresh kernel line: what orders the nodes' faults in a job."""
    for line in lines:
        when = line_utc(line)
        if when:
            return when
    return None


def slurm_for(config: Config) -> SlurmControl:
    return backend(config.slurm.backend, timeout=config.slurm.timeout_s)

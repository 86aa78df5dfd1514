"""From the qualification jobs' result files to TEST RESULTs and each node's verdict (pure).

The files are what the jobs wrote (gpugate/qualify/jobs.py): the DCGM step's TEST RESULT, the
payload's all-reduce and h2d objects (or {"error": ...}). Bandwidths are judged together,
against max(floor, min_fraction_of_median x the set's median) (pairs.judge_bandwidth), the
floor and its source from floors.floor_for. A node fails on a test that ran and failed (ok
False); a test that could not run (no dcgmi, no GPU, a job that never started) is not judged
(ok None), and a node with nothing to show for a test it was asked for is not passed either.
A step that was "not run" (a tool the site lacks: no torch or NCCL in qualify.python, no
dcgmi, gpugate's DCGM step that could not start; {"not_run": why, "fix": ...}) is never the
node's failure: ok None, "not run: why; fix: ..." in the detail and in the node's unproven list.
"""

from __future__ import annotations

import json
import os

from gpugate.checks.boards import match_board
from gpugate.qualify import jobs
from gpugate.qualify.floors import floor_for
from gpugate.qualify.pairs import judge_bandwidth, judge_pairs
from gpugate.qualify.records import PayloadResult
from gpugate.store.qualify import QualifyTestResult

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.config.schema import Config
    from gpugate.qualify.records import Job

_READ_MAX = 4 * 1024 * 1024  # a result file is a few KB: anything larger is not ours


def read_result(path: str) -> dict[str, Any] | None:
    """The JSON object a step wrote, or None (missing, unreadable, not an object)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(_READ_MAX + 1)
    except OSError:
        return None
    if len(data) > _READ_MAX:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_payload(path: str) -> PayloadResult | None:
    """The payload's result (payload.py, or the job script's "not run"), or None: missing,
    unreadable, or not a payload's result (a key of the wrong type)."""
    raw = read_result(path)
    try:
        return None if raw is None else PayloadResult.from_json(raw, path)
    except ValueError:
        return None


def read_step(path: str) -> QualifyTestResult | None:
    """The DCGM step's TEST RESULT (`gpugate qualify --step dcgm`), or None: missing,
    unreadable, or no DCGM TEST RESULT."""
    raw = read_result(path)
    try:
        step = None if raw is None else QualifyTestResult.from_json(raw, path)
    except ValueError:
        return None
    return step if step is not None and step.test == "dcgm" else None


def result(
    test: str,
    nodes: list[str],
    ok: bool | None,
    detail: str,
    *,
    job_id: str | None = None,
    value_gbps: float | None = None,
    floor_gbps: float | None = None,
    floor_source: str | None = None,
    not_run: bool | None = None,
) -> QualifyTestResult:
    """One TEST RESULT (the shared shape of issue 17)."""
    return QualifyTestResult(test=test, nodes=list(nodes), ok=ok, value_gbps=value_gbps,
                             floor_gbps=floor_gbps, detail=detail, job_id=job_id,
                             not_run=not_run, floor_source=floor_source)  # fmt: skip


def dcgm_result(
    step: QualifyTestResult | None, node: str, job_id: str | None, missing: str
) -> QualifyTestResult:
    """The DCGM step's own TEST RESULT, or a not-judged one saying why there is none."""
    if step is None:
        return result("dcgm", [node], None, f"dcgm: no result: {missing}", job_id=job_id)
    if step.not_run:
        return step.replace(nodes=[node], ok=None, detail=not_run_text("dcgm", step.not_run,
                            step.fix), not_run=True, job_id=step.job_id or job_id)  # fmt: skip
    return step.replace(nodes=[node], job_id=step.job_id or job_id)


def not_run_text(test: str, why: object, fix: object) -> str:
    """'TEST: not run: WHY; fix: FIX' of a step that could not run (a tool the site lacks)."""
    why = " ".join(str(why or "").split())[:300]
    fix = " ".join(str(fix or "").split())[:300]
    return f"{test}: not run: {why}" + (f"; fix: {fix}" if fix else "")


def _setup_failure(errors: dict[str, str], asked: int) -> bool:
    """Every node's payload failed with the same error: the setup (qualify.python), not them."""
    return asked >= 2 and len(errors) == asked and len(set(errors.values())) == 1


def bandwidth_results(
    test: str,
    values: dict[str, float | None],
    errors: dict[str, str],
    missing: dict[str, str],
    floor: tuple[float | None, str],
    fraction: float,
    job_ids: dict[str, str | None],
    not_run: dict[str, str] | None = None,
) -> dict[str, QualifyTestResult]:
    """Per node: the TEST RESULT of one bandwidth test (allreduce busbw, h2d slowest GPU);
    `not_run`: node -> the "TEST: not run: ..." line of a step the site could not run."""

    measured = {n: v for n, v in values.items() if v is not None}
    verdicts = judge_bandwidth(measured, floor[0], fraction) if measured else {}
    not_run = not_run or {}
    setup = _setup_failure(errors, len(values) + len(errors) + len(missing) + len(not_run))

    def of(node: str, ok: bool | None, detail: str, value: float | None = None,
           not_run: bool | None = None) -> QualifyTestResult:  # fmt: skip
        return result(test, [node], ok, detail, job_id=job_ids.get(node), value_gbps=value,
                      floor_gbps=floor[0], floor_source=floor[1], not_run=not_run)  # fmt: skip

    out = {}
    for node in [*values, *errors, *missing, *not_run]:
        if node in not_run:
            out[node] = of(node, None, not_run[node], not_run=True)
        elif node in errors:
            ok = None if setup else False
            why = "the same on every node: the setup, not the node; " if setup else ""
            out[node] = of(node, ok, f"{test}: failed: {why}{errors[node]}")
        elif node in missing:
            out[node] = of(node, None, f"{test}: no result: {missing[node]}")
        elif values[node] is None:
            out[node] = of(node, None, f"{test}: nothing measured (one rank, no GPU): not judged")
        else:
            ok, why = verdicts[node]
            out[node] = of(node, ok, f"{test}: {why}", values[node])
    return out


def allreduce_value(raw: PayloadResult) -> float | None:
    """The bus bandwidth an all-reduce result reports (None: one rank, nothing moved)."""
    return None if raw.busbw_gbps is None else float(raw.busbw_gbps)


def h2d_value(raw: PayloadResult) -> float | None:
    """The slowest GPU's host-to-device GB/s (None: skipped, no GPU)."""
    speeds = [float(g.gbps) for g in raw.gpus or ()]
    return min(speeds) if speeds and not raw.skipped else None


def pair_results(
    measured: dict[tuple[str, str], float | None],
    judged: dict[str, Any],
    job_ids: dict[tuple[str, str], str | None],
    floor: tuple[float | None, str],
) -> dict[str, list[QualifyTestResult]]:
    """Per node: one TEST RESULT per pair it was in. ok False only for the suspect (slow with
    every partner); a slow pair blamed on its link, or undecided, is None for both nodes."""
    slow = {tuple(p) for p in judged.get("slow_pairs", [])}
    links = {tuple(p) for p in judged.get("links", [])}
    suspects = set(judged.get("suspects", []))
    bar = judged.get("threshold_gbps")
    out: dict[str, list[QualifyTestResult]] = {}
    for pair, value in measured.items():
        key = tuple(sorted(pair))
        said = "no result" if value is None else f"{value:.2f} GB/s"
        base = f"pair {pair[0]}-{pair[1]}: {said}" + (f" (bar {bar:.2f} GB/s)" if bar else "")
        for node in pair:
            if key not in slow:
                ok, why = True, base
            elif node in suspects:
                ok, why = False, f"{base}: {node} is slow with every partner: suspect"
            elif key in links:
                ok, why = None, f"{base}: the link between {key[0]} and {key[1]}"
            else:
                ok, why = None, f"{base}: slow; node or link cannot be told apart"
            out.setdefault(node, []).append(result(
                "pair", list(pair), ok, why, value_gbps=value, floor_gbps=floor[0],
                floor_source=floor[1], job_id=job_ids.get(pair)))  # fmt: skip
    return out


def verdict(
    tests: list[QualifyTestResult], job_ids: list[str], unproven: list[str]
) -> dict[str, Any]:
    """A node's verdict: failed on any test that failed; not passed while something it was
    asked for could not be shown (`unproven`: a job that never ran, a missing result)."""
    failed = [t for t in tests if t.ok is False]
    if failed:
        why = "; ".join(t.detail for t in failed)
    elif unproven:
        why = "not qualified: " + "; ".join(unproven)
    else:
        why = "passed: " + ", ".join(dict.fromkeys(t.test for t in tests))
    return {"passed": not failed and not unproven, "tests": tests,
            "job_ids": list(dict.fromkeys(j for j in job_ids if j)), "why": why,
            "failed": bool(failed)}  # fmt: skip


def first_failure(v: dict[str, Any]) -> tuple[str, str | None]:
    """(short why, the job id) of a failed verdict's first failing test, for a drain reason."""
    bad = next(t for t in v["tests"] if t.ok is False)
    return bad.detail, bad.job_id


def result_files(run_dir: str, where: str) -> dict[str, str | bytes]:
    """The raw result files of one job directory, by name (for the evidence bundle)."""
    base = os.path.join(run_dir, where)
    out: dict[str, str | bytes] = {}
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        raw = read_result(os.path.join(base, name))
        if raw is not None and name.endswith(".json"):
            out[f"{where}-{name}" if where.startswith("pair-") else name] = json.dumps(
                raw, indent=1
            )
    return out


def _missing(job: Job, test: str) -> str:
    """Why a job left no result file for `test`."""
    if not job.started:
        return f"job {job.job_id or '(not submitted)'}: {job.note or job.state}"
    return f"job {job.job_id} wrote no {test} result (see {job.output})"


def _dcgm_did_not_start(run_dir: str, job: Job) -> QualifyTestResult | None:
    """A "not run" result from the DCGM step's stderr (jobs.STEP_STDERR) when it wrote none:
    gpugate's own step could not start on the node (e.g. its python cannot import gpugate)."""
    path = os.path.join(os.path.dirname(jobs.result_path(run_dir, job.nodes, "dcgm")),
                        jobs.STEP_STDERR)  # fmt: skip
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4096))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    if not lines:
        return None
    return QualifyTestResult(test="dcgm", nodes=[], ok=None, detail="", job_id=None,
                             not_run=f"gpugate's DCGM step could not start: {lines[-1][:200]}",
                             fix=f"run `gpugate selftest` on the node; the job's output "
                             f"{job.output} has the whole error")  # fmt: skip


def _floor(
    config: Config, test: str, backend: object, site: float | None, gpu_name: object = None
) -> tuple[Any, ...]:
    name = config.board if config.board in config.boards else None
    if name is None and isinstance(gpu_name, str) and gpu_name:
        # board: auto. The payload names the GPU model it ran on; the same match the checks use.
        name = match_board([gpu_name], config.boards)[0]
    board = config.boards.get(name) if name else None
    known = backend if backend in ("nccl", "gloo") else None
    return floor_for(board, test, known, site, board_name=name)


def _bandwidth(config: Config, run_dir: str, node_jobs: list[Job], test: str) -> tuple[Any, ...]:
    """(per-node TEST RESULTs, per-node unproven lines) of one bandwidth test."""
    value_of = allreduce_value if test == "allreduce" else h2d_value
    values: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    missing: dict[str, Any] = {}
    not_run: dict[str, str] = {}
    unproven: dict[str, Any] = {}
    backend = gpu_name = None
    for job in node_jobs:
        node = job.nodes[0]
        raw = read_payload(jobs.result_path(run_dir, job.nodes, test))
        if raw is None:
            missing[node] = _missing(job, test)
            unproven[node] = missing[node]
        elif raw.not_run:
            not_run[node] = unproven[node] = not_run_text(test, raw.not_run, raw.fix)
        elif raw.error is not None:
            errors[node] = " ".join(raw.error.split())[:300]
        else:
            values[node] = value_of(raw)
            backend = backend or raw.backend
            gpu_name = gpu_name or raw.gpu_name
    qc = config.qualify
    assert qc is not None  # qualification runs only with a qualify: section
    site = qc.gloo_busbw_gbps if test == "allreduce" and backend == "gloo" else None
    floor = _floor(config, test, backend, site, gpu_name)
    ids = {j.nodes[0]: j.job_id for j in node_jobs}
    return bandwidth_results(test, values, errors, missing, floor,
                             qc.min_fraction_of_median, ids, not_run), unproven  # fmt: skip


def _pairs(
    config: Config, run_dir: str, pair_jobs: list[Job]
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(judge_pairs' verdict with the pairs that did not run, per-node pair TEST RESULTs)."""

    measured: dict[Any, float | None] = {}  # keyed by the pair job's two nodes
    ids: dict[Any, str | None] = {}
    not_run = []
    backend = None
    for job in pair_jobs:
        if not job.started:
            not_run.append({"nodes": list(job.nodes), "job_id": job.job_id, "why": job.note})
            continue
        raw = read_payload(jobs.result_path(run_dir, job.nodes, "allreduce"))
        if raw is not None and raw.not_run:  # the site lacks a tool: nothing to judge
            not_run.append({"nodes": list(job.nodes), "job_id": job.job_id,
                            "why": not_run_text("pair", raw.not_run, raw.fix)})  # fmt: skip
            continue
        ok = raw is not None and raw.error is None
        measured[job.nodes] = allreduce_value(raw) if raw is not None and ok else None
        backend = backend or (raw.backend if raw is not None else None)
        ids[job.nodes] = job.job_id
    if not measured:
        whys = list(dict.fromkeys(str(n["why"]) for n in not_run if n.get("why")))
        text = "no pair ran" + (f": {'; '.join(whys[:2])}" if whys else "")
        return ({"not_run": not_run, "text": text} if not_run else None), {}
    assert config.qualify is not None  # qualification runs only with a qualify: section
    floor = _floor(config, "pair", backend, config.qualify.pair_busbw_gbps)
    judged = judge_pairs(measured, floor[0], config.qualify.min_fraction_of_median)
    judged = dict(judged, not_run=not_run, floor_source=floor[1],
                  measured=[{"nodes": list(p), "busbw_gbps": v, "job_id": ids[p]}
                            for p, v in measured.items()])  # fmt: skip
    return judged, pair_results(measured, judged, ids, floor)


def judge_all(
    config: Config, run_dir: str, node_jobs: list[Job], pair_jobs: list[Job], tests: list[str]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(verdict per node, the pair verdict) from the run's jobs and their result files."""
    per: dict[str, list[QualifyTestResult]] = {j.nodes[0]: [] for j in node_jobs}
    unproven: dict[str, list[str]] = {n: [] for n in per}
    for job in node_jobs:
        if not job.started:
            unproven[job.nodes[0]].append(_missing(job, "any"))
    if "dcgm" in tests:
        for job in node_jobs:
            node = job.nodes[0]
            step = read_step(jobs.result_path(run_dir, job.nodes, "dcgm"))
            if step is None and job.started:
                step = _dcgm_did_not_start(run_dir, job)
            res = dcgm_result(step, node, job.job_id, _missing(job, "dcgm"))
            per[node].append(res)
            if step is None and job.started:
                unproven[node].append(_missing(job, "dcgm"))
            elif res.ok is None:
                # DCGM could not test, the step was not run, dcgmi timed out or printed nothing
                # readable: nothing was proven, so not a pass either; never a fail.
                unproven[node].append(res.detail)
    for test in ("allreduce", "h2d"):
        if test in tests:
            results, missing = _bandwidth(config, run_dir, node_jobs, test)
            for node, res in results.items():
                per[node].append(res)
            for node, why in missing.items():
                if why not in unproven[node]:
                    unproven[node].append(why)
    pairs, by_node = _pairs(config, run_dir, pair_jobs) if "pairs" in tests else (None, {})
    verdicts = {}
    for job in node_jobs:
        node = job.nodes[0]
        tests_of = per[node] + by_node.get(node, [])
        ids = [job.job_id or ""] + [t.job_id or "" for t in by_node.get(node, [])]
        verdicts[node] = verdict(tests_of, ids, unproven[node])
    return verdicts, pairs

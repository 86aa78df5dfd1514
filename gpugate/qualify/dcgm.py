"""DCGM diagnostics (`dcgmi diag -r N -j`) for `gpugate qualify`: run, parse, judge.

Facts are from NVIDIA's DCGM sources, 4.6.0 (commit 72fa3fe) unless noted:
- dcgmi/Diag.cpp `HelperJsonBuildOutput`/`HelperJsonAddResult`: 4.x writes
  {"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results": [{"entity_group",
  "entity_group_id", "entity_id", "status", "warnings": [{"warning", "error_id", "error_category",
  "error_severity"}], "info"}], "test_summary": {"status", "warnings"}}]}]}, "entity_groups",
  "metadata": {"version", "Driver Version Detected"}}; a failed run writes {"DCGM Diagnostic":
  {"version", "runtime_error"}} (`HelperDisplayFailureMessage`).
- Diag.cpp `HelperDisplayDiagResult` with its default DDR_NO_DISPLAY_WARN: in JSON a *Warn* result is
  written as "Fail". So the status cannot tell a warning from a failure: the error's id, category and
  severity (dcgmlib/src/dcgm_errors.c table) decide what a finding is.
- DCGM 3.3.9 (commit b0ec3c6) Diag.cpp: top key "DCGM GPU Diagnostic", display names as test names
  ("GPU Memory", "PCIe", ...), each result with "gpu_id" (a string), and the deployment tests each
  with one result whose warning text sits under "warnings" (not "warning").
- MIG: `dcgmi diag` does not run on a GPU in MIG mode ("GPU 0's MIG configuration is
  incompatible with the diagnostic because it prevents access to the entire GPU"; DCGM's
  maintainers in NVIDIA/DCGM#31: "dcgmi diag does not support all MIG configurations", only a
  single instance spanning the GPU; one MIG GPU stops the run for all, NVIDIA/DCGM#70). So the
  step asks nvidia-smi first and skips the diag on a node with a GPU in MIG mode (issue 28).
- Exit status: main_dcgmi.cpp returns the dcgmReturn_t; Diag.cpp `GetFailureResult` gives
  DCGM_ST_NVVS_ISOLATE_ERROR (-51, exit 205) when an error's severity is ISOLATE, else
  DCGM_ST_NVVS_ERROR (-30, exit 226) for any error on a GPU or in the software test; 0 otherwise.
"""

from __future__ import annotations

import json

from gpugate import runner
from gpugate.qualify import dcgm_catalog, dcgm_text
from gpugate.record import Record
from gpugate.regex import lazy
from gpugate.store.qualify import DcgmFindingEntry, QualifyTestResult

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Level -> what it runs and costs. Sources: dcgmi/CommandLineParser.cpp (the `-r` help text: "1 -
# Quick (System Validation ~ seconds)", "2 - Medium (Extended System Validation ~ 2 minutes)", "3 -
# Long (System HW Diagnostics ~ 15 minutes)", "4 - Extended (Longer-running System HW
# Diagnostics)", no figure) and nvvs/src/NvidiaValidationSuite.cpp `FillTestVectors` (the plugins
# per suite; eud and cpu_eud only when run as root, nvbandwidth/nccl_tests where installed).
# timeout_s is gpugate's default budget (not a DCGM figure), used when the caller passes none.
_L1 = ("software",)
_L2 = (*_L1, "memory", "pcie")
_L3: tuple[str, ...] = (
    *_L2,
    "diagnostic",
    "eud",
    "cpu_eud",
    "nvbandwidth",
    "nccl_tests",
    "memory_bandwidth",
)
_L3 = (*_L3, "targeted_stress", "targeted_power")
_L4 = (*_L3, "memtest", "pulse_test")
LEVELS: dict[int, dict[str, Any]] = {
    1: {
        "name": "quick",
        "typical_min": 0.5,
        "timeout_s": 300,
        "plugins": _L1,
        "finds": "deployment problems: denylisted driver, NVML/CUDA libraries, permissions, "
        "persistence mode, environment, pending page retirement/row remap, graphics processes, "
        "inforom, fabric manager",
    },
    2: {
        "name": "medium",
        "typical_min": 2.0,
        "timeout_s": 900,
        "plugins": _L2,
        "finds": "level 1 plus GPU memory errors (memory) and PCIe bandwidth/replays (pcie)",
    },
    3: {
        "name": "long",
        "typical_min": 15.0,
        "timeout_s": 3600,
        "plugins": _L3,
        "finds": "level 2 plus compute under load (diagnostic), memory bandwidth, sustained "
        "stress and power, EUD (as root), NVLink/copy bandwidth where nvbandwidth is installed",
    },
    4: {
        "name": "extended",
        "typical_min": None,  # DCGM's help gives no figure: "longer-running"; can take hours
        "timeout_s": 4 * 3600,
        "plugins": _L4,
        "finds": "level 3 plus memtest (memory patterns) and pulse_test (power transients)",
    },
}

# The verdict of an error follows DCGM's own catalog (dcgm_catalog.py: dcgm_errors.h/.c); a
# finding with neither id nor category (an old document, the text table) falls back on its test.
KINDS = ("hardware", "software", "config", "not_tested")

# Plugins that test the hardware (PluginStrings.h names); "software" is the deployment test.
HARDWARE_TESTS = frozenset(LEVELS[4]["plugins"]) - {"software"} | {"sm_stress", "context_create"}

# DCGM 3.x display names (3.3.9 Diag.cpp DISPLAY_*) -> 4.x plugin names.
_V3_NAMES = {
    "GPU Memory": "memory", "PCIe": "pcie", "Diagnostic": "diagnostic", "SM Stress": "sm_stress",
    "Targeted Stress": "targeted_stress", "Targeted Power": "targeted_power",
    "Memory Bandwidth": "memory_bandwidth", "Memtest": "memtest", "Pulse Test": "pulse_test",
    "EUD Test": "eud", "CPU EUD Test": "cpu_eud", "Context Create": "context_create",
}  # fmt: skip
_FAILING = ("fail", "warn")
_NO_DETAIL = " (DCGM gave no detail)"
_V4_KEY, _V3_KEY = "DCGM Diagnostic", "DCGM GPU Diagnostic"
_GPU_PREFIX = lazy(r"^GPU \d+ ")  # 3.x messages start with their GPU
# What dcgmi prints when it cannot reach DCGM's host engine (nv-hostengine / nvidia-dcgm not
# running, or an embedded one that cannot start): DCGM is not there to test, not a GPU fault.
_NO_HOSTENGINE = ("host engine", "connection to the specified host")
_MIG_REFUSAL = "mig configuration is incompatible with the diagnostic"
FIX_DCGMI = ("install DCGM on the node (datacenter-gpu-manager, or datacenter-gpu-manager-4-core "
             "for 4.x) or set qualify.dcgmi to dcgmi's path, or drop dcgm from --tests")  # fmt: skip
FIX_HOSTENGINE = ("start DCGM's host engine on the node: systemctl enable --now nvidia-dcgm "
                  "(or run nv-hostengine)")  # fmt: skip
FIX_MIG = ("to qualify these GPUs with DCGM, disable MIG (nvidia-smi -mig 0, then reset the GPU) "
           "for the qualification; the other checks run under MIG")  # fmt: skip
MIG_QUERY = ["--query-gpu=index,mig.mode.current", "--format=csv,noheader"]
MIG_TIMEOUT_S = 20.0


class DcgmError(ValueError):
    """dcgmi could not be run or its output could not be read; `reason` says which."""

    def __init__(self, message: str, reason: str = "output") -> None:
        super().__init__(message)
        self.reason = reason  # missing / timeout / killed / output / usage / hostengine / mig


class DcgmFinding(Record):
    """One problem DCGM reported: a test's error on one GPU (or on no entity)."""

    test: str  # plugin name: memory, pcie, software, ...
    gpu: int | None
    status: str  # as written: Fail (also a Warn, see the module docstring), Warn
    message: str
    error_id: int | None = None
    error_category: int | None = None
    error_severity: int | None = None
    kind: str = "hardware"  # one of KINDS
    cause: str = ""  # what on the node, when it is not the GPU: "fabric manager", ...

    def sentence(self) -> str:
        """'memory: GPU 3: <message> (DCGM error id 58) [DCGM_FR_MEMORY_MISMATCH, category 10 ...]'."""
        where = f"GPU {self.gpu}: " if self.gpu is not None else ""
        cause = f"{self.cause}: " if self.cause else ""
        code = f" (DCGM error id {self.error_id})" if self.error_id is not None else ""
        known = dcgm_catalog.describe(self.error_id, self.error_category)
        return f"{self.test}: {where}{cause}{self.message}{code}" + (f" [{known}]" if known else "")


class DcgmResult(Record):
    """One `dcgmi diag -j` document, parsed."""

    format: str  # "4.x" / "3.x"
    version: str | None = None
    driver_version: str | None = None
    gpus: tuple[int, ...] = ()
    tests: tuple[tuple[str, str], ...] = ()  # (test, overall status), in DCGM's order
    findings: tuple[DcgmFinding, ...] = ()
    runtime_error: str | None = None
    exit_code: int | None = None

    def of_kind(self, kind: str) -> tuple[DcgmFinding, ...]:
        """The findings of one kind (hardware, config, software)."""
        return tuple(f for f in self.findings if f.kind == kind)

    @property
    def passed(self) -> bool:
        """True when DCGM ran, tested everything, and found nothing but configuration findings."""
        return (
            self.runtime_error is None
            and bool(self.tests)
            and not any(f.kind != "config" for f in self.findings)
        )


def diag_argv(level: int, dcgmi: str = "dcgmi") -> list[str]:
    """The argument list for `dcgmi diag -r LEVEL -j`."""
    if isinstance(level, bool) or level not in LEVELS:
        raise DcgmError(f"dcgm: level {level!r}: must be one of {sorted(LEVELS)}", "usage")
    if not dcgmi:
        raise DcgmError("dcgm: dcgmi: empty command", "usage")
    return [dcgmi, "diag", "-r", str(level), "-j"]


def parse_diag(text: str) -> DcgmResult:
    """Parse what `dcgmi diag` prints: its JSON (`-j`, 4.x or 3.x, warnings before it allowed)
    or its table; DcgmError if it is neither."""
    if dcgm_text.is_table(text):
        return _from_text(dcgm_text.read_table(text))
    start = text.find("{")
    if start < 0:
        raise DcgmError(f"dcgm: not JSON output: {_first_line(text)!r}")
    try:
        doc = json.loads(text[start:])
    except ValueError as exc:
        raise DcgmError(f"dcgm: not JSON output ({exc}): {_first_line(text)!r}") from None
    if not isinstance(doc, dict):
        raise DcgmError("dcgm: JSON output is not an object")
    try:
        return _parse_doc(doc)
    except DcgmError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a shape DCGM never writes
        raise DcgmError(f"dcgm: unexpected JSON shape: {type(exc).__name__}: {exc}") from None


def parse_text(text: str) -> DcgmResult:
    """Parse what `dcgmi diag` prints without -j: its table, or the `Error:` lines of a run that
    could not start (e.g. "Cannot load plugins"); DcgmError if it is neither."""
    table = dcgm_text.read_table(text)
    if not table.tests and not table.errors:
        raise DcgmError(f"dcgm: not a dcgmi diag table: {_first_line(text)!r}")
    return _from_text(table)


def _parse_doc(doc: dict[str, Any]) -> DcgmResult:
    if "iterations" in doc:  # `-i N`: one document per iteration (Diag.cpp RunStartDiag)
        return _merge([_parse_doc(_obj(it, "iteration")) for it in doc["iterations"] if it])
    if _V4_KEY in doc:
        return _parse_v4(doc)
    if _V3_KEY in doc:
        return _parse_v3(doc)
    raise DcgmError(f"dcgm: JSON has neither {_V4_KEY!r} nor {_V3_KEY!r}: keys {sorted(doc)[:5]}")


def _parse_v4(doc: dict[str, Any]) -> DcgmResult:
    body = _obj(doc[_V4_KEY], _V4_KEY)
    meta = _obj(doc.get("metadata") or {}, "metadata")
    gpus: list[int] = []
    for group in doc.get("entity_groups") or []:
        if isinstance(group, dict) and group.get("entity_group") == "GPU":
            gpus += [int(e["entity_id"]) for e in group.get("entities") or [] if "entity_id" in e]
    tests, findings = [], []
    for category in _list(body.get("test_categories"), "test_categories"):
        for test in _list(_obj(category, "category").get("tests"), "tests"):
            name = str(_obj(test, "test").get("name", "?"))
            summary = test.get("test_summary") or {}
            tests.append((name, str(summary.get("status", "?"))))
            findings += _test_findings(name, test.get("results") or [], summary)
    return DcgmResult(
        format="4.x", version=meta.get("version") or body.get("version"),
        driver_version=meta.get("Driver Version Detected"), gpus=tuple(gpus), tests=tuple(tests),
        findings=tuple(findings), runtime_error=body.get("runtime_error"),
    )  # fmt: skip


def _test_findings(name: str, results: list[Any], summary: dict[str, Any]) -> list[DcgmFinding]:
    found: list[DcgmFinding] = []
    for res in _list(results, f"{name}.results"):
        if str(res.get("status", "")).lower() in _FAILING:
            gpu = res.get("entity_id") if res.get("entity_group", "GPU") == "GPU" else None
            found += _findings(name, res, None if gpu is None else int(gpu))
    # test_summary repeats every error of the test (includeAllErrors): keep only those no
    # entity's result carried, e.g. an error on no entity.
    seen = {(f.error_id, f.message) for f in found}
    if str(summary.get("status", "")).lower() in _FAILING:
        found += [f for f in _findings(name, summary, None) if (f.error_id, f.message) not in seen]
    # A Warn sets every GPU's result (PluginTest::SetResult) while the error names one GPU: the
    # GPUs without an error of their own add nothing once the test has a finding with detail.
    detailed = [f for f in found if f.error_id is not None or not f.message.endswith(_NO_DETAIL)]
    return detailed or found


def _findings(test: str, res: dict[str, Any], gpu: int | None) -> list[DcgmFinding]:
    status = str(res.get("status", "Fail"))
    warnings = res.get("warnings") or []
    if isinstance(warnings, str):  # old documents: one string
        warnings = [{"warning": warnings}]
    out = []
    for w in warnings:
        if w is None:  # nvvs writes null in its lists
            continue
        w = w if isinstance(w, dict) else {"warning": str(w)}
        msg = w.get("warning", w.get("warnings", ""))  # 3.x deployment tests: under "warnings"
        out.append(_finding(test, gpu, status, str(msg).strip(), w))
    if not out:
        out.append(_finding(test, gpu, status, f"{status}{_NO_DETAIL}", {}))
    return out


def _finding(test: str, gpu: int | None, status: str, msg: str, w: dict[str, Any]) -> DcgmFinding:
    ids = {k: _int(w.get(k)) for k in ("error_id", "error_category", "error_severity")}
    if ids["error_id"] is None and ids["error_category"] is None:  # the text table has no ids
        ids["error_id"] = dcgm_catalog.error_id_from_message(msg)
    kind, cause = verdict(test, message=msg, **ids)
    return DcgmFinding(test=test, gpu=gpu, status=status, message=msg, kind=kind, cause=cause,
                       **ids)  # fmt: skip


def verdict(
    test: str,
    error_id: int | None = None,
    error_category: int | None = None,
    error_severity: int | None = None,
    message: str = "",
) -> tuple[str, str]:
    """(kind, cause) of one error: DCGM's catalog decides; without id or category, the test."""
    kind, cause = dcgm_catalog.verdict(error_id, error_category, error_severity, message)
    if kind is None:  # nothing DCGM's catalog can place: the deployment test checks settings
        kind = (
            "config" if test == "software" else "hardware" if test in HARDWARE_TESTS else "software"
        )
    return kind, cause


def classify(
    test: str,
    error_id: int | None = None,
    error_category: int | None = None,
    error_severity: int | None = None,
) -> str:
    """The kind of one error (one of KINDS), by DCGM's catalog."""
    return verdict(test, error_id, error_category, error_severity)[0]


def _from_text(table: dcgm_text.TextDiag) -> DcgmResult:
    """The table `dcgmi diag` prints without -j (3.x and 4.x), as a result like the JSON's."""
    meta = dict(table.metadata)
    tests, findings = [], []
    for t in table.tests:
        deployment = t.section == "Deployment" and t.name != "software"  # 3.x: one row a subtest
        name = "software" if deployment else _V3_NAMES.get(t.name, t.name.lower().replace(" ", "_"))
        tests.append((t.name if deployment else name, t.status))
        if t.status.lower() not in _FAILING:
            continue
        found = [_finding(name, _gpu_in(w), t.status, f"{t.name}: {w}" if deployment else w, {})
                 for w in t.warnings]  # fmt: skip
        found = found or [_finding(name, g, s, f"{s}{_NO_DETAIL}", {})
                          for g, s in t.per_gpu if s.lower() in _FAILING]  # fmt: skip
        findings += found or [_finding(name, None, t.status, f"{t.status}{_NO_DETAIL}", {})]
    ids = [i for i in meta.get("GPU Device IDs Detected", "").replace(" ", "").split(",") if i]
    return DcgmResult(
        format="text", version=meta.get("DCGM Version"), gpus=tuple(range(len(ids))),
        driver_version=meta.get("Driver Version Detected"), tests=tuple(tests),
        findings=tuple(findings), runtime_error="; ".join(table.errors) or None,
    )  # fmt: skip


def _gpu_in(message: str) -> int | None:
    """The GPU a 3.x message starts with ('GPU 3 Error using ...'), else None."""
    words = message.split(maxsplit=2)
    return int(words[1]) if len(words) > 1 and words[0] == "GPU" and words[1].isdigit() else None


def _parse_v3(doc: dict[str, Any]) -> DcgmResult:
    body = _obj(doc[_V3_KEY], _V3_KEY)
    tests, findings = [], []
    for category in _list(body.get("test_categories"), "test_categories"):
        cat = _obj(category, "category")
        deployment = cat.get("category") == "Deployment"
        for test in _list(cat.get("tests"), "tests"):
            shown = str(_obj(test, "test").get("name", "?"))
            name = (
                "software" if deployment else _V3_NAMES.get(shown, shown.lower().replace(" ", "_"))
            )
            worst = "Pass"
            for res in _list(test.get("results") or [], f"{shown}.results"):
                status = str(res.get("status", ""))
                if status.lower() in _FAILING:
                    worst = status
                    found = _findings(name, res, _v3_gpu(res))
                    if deployment:  # keep the subtest's name: 'software: Persistence Mode: ...'
                        found = [f.replace(message=f"{shown}: {f.message}") for f in found]
                    findings += found
                elif status.lower() == "skip" and worst == "Pass":
                    worst = "Skip"
            tests.append((shown if deployment else name, worst))
    version = body.get("version") or doc.get("version")
    return DcgmResult(
        format="3.x", version=version, driver_version=doc.get("Driver Version Detected"),
        gpus=tuple(range(len(doc.get("GPU Device IDs") or []))), tests=tuple(tests),
        findings=tuple(findings), runtime_error=body.get("runtime_error"),
    )  # fmt: skip


def _v3_gpu(res: dict[str, Any]) -> int | None:
    raw = res.get("gpu_id", res.get("gpu_ids"))
    if raw is None or raw == "":
        return None
    first = str(raw).split(",")[0].strip()  # "gpu_ids" (older) may list several
    return int(first) if first.isdigit() else None


def _merge(results: list[DcgmResult]) -> DcgmResult:
    if not results:
        raise DcgmError("dcgm: 'iterations' holds no result")
    last = results[-1]
    findings = tuple(f for r in results for f in r.findings)
    errors = [r.runtime_error for r in results if r.runtime_error]
    return last.replace(findings=findings, runtime_error=errors[0] if errors else None)


def run_diag(level: int, dcgmi: str = "dcgmi", timeout_s: float | None = None) -> DcgmResult:
    """Run `dcgmi diag -r LEVEL -j` with a timeout and parse it; DcgmError when that fails."""

    argv = diag_argv(level, dcgmi)
    limit = float(timeout_s if timeout_s is not None else LEVELS[level]["timeout_s"])
    if limit <= 0:
        raise DcgmError(f"dcgm: timeout {timeout_s!r}: must be > 0 seconds", "usage")
    res = runner.run(argv, timeout=limit)
    if res.status in (runner.MISSING, runner.TIMEOUT, runner.KILLED):
        why = {runner.MISSING: "missing", runner.TIMEOUT: "timeout", runner.KILLED: "killed"}
        raise DcgmError(f"dcgm: {res.describe()}", why[res.status])
    try:
        parsed = parse_diag(res.stdout)
    except DcgmError as exc:
        err = _first_line(res.stderr)
        said = f"{res.stdout}\n{res.stderr}".lower()
        reason = ("hostengine" if any(m in said for m in _NO_HOSTENGINE)
                  else "mig" if _MIG_REFUSAL in said else "output")  # fmt: skip
        raise DcgmError(f"{exc} (exit {res.returncode}{': ' + err if err else ''})",
                        reason) from None  # fmt: skip
    return parsed.replace(exit_code=res.returncode)


def mig_gpus(nvidia_smi: str = "nvidia-smi", timeout_s: float = MIG_TIMEOUT_S) -> list[int] | None:
    """The indices of this node's GPUs in MIG mode (`nvidia-smi --query-gpu=mig.mode.current`);
    None when nvidia-smi cannot tell (missing, failed): then dcgmi runs and speaks for itself."""
    res = runner.run([nvidia_smi, *MIG_QUERY], timeout=timeout_s)
    if not res.ok:
        return None
    found = []
    for line in res.stdout.splitlines():
        index, _, mode = (w.strip() for w in line.partition(","))
        if index.isdigit() and mode.lower() == "enabled":  # "Disabled", "[N/A]" (no MIG): not
            found.append(int(index))
    return found


def dcgm_step(
    level: int,
    dcgmi: str = "dcgmi",
    timeout_s: float | None = None,
    node: str = "",
    job_id: str | None = None,
    nvidia_smi: str = "nvidia-smi",
) -> QualifyTestResult:
    """Run the DCGM diagnostic on this node and return one TEST RESULT (ok None: not judged;
    "not_run" with its "fix": DCGM cannot test here, a matter of the site, never the node's)."""
    step = QualifyTestResult(test="dcgm", nodes=[node] if node else [], ok=None, detail="",
                             job_id=job_id, level=level)  # fmt: skip
    mig = mig_gpus(nvidia_smi) if level in LEVELS else None
    if mig:
        gpus = ",".join(map(str, mig))
        why = (f"GPU{'s' if len(mig) > 1 else ''} {gpus} in MIG mode: DCGM's diagnostic does "
               "not support MIG (it needs the whole GPU)")  # fmt: skip
        return _not_run(step, why, FIX_MIG, "mig", mig=mig)
    try:
        result = run_diag(level, dcgmi, timeout_s)
    except DcgmError as exc:
        if exc.reason == "missing":
            return _not_run(step, f"{dcgmi} (qualify.dcgmi) not found on this node", FIX_DCGMI,
                            "missing")  # fmt: skip
        if exc.reason == "hostengine":
            return _not_run(step, f"DCGM's host engine is not running ({exc})", FIX_HOSTENGINE,
                            "hostengine")  # fmt: skip
        if exc.reason == "mig":
            return _not_run(step, f"DCGM refused the GPUs' MIG configuration ({exc})", FIX_MIG,
                            "mig")  # fmt: skip
        # Not judged (ok None), never a pass: the node is "not qualified" (judge.judge_all).
        return step.replace(detail=str(exc), error=exc.reason)
    return judge(result, level, step)


def _not_run(
    step: QualifyTestResult, why: str, fix: str, reason: str, mig: list[int] | None = None
) -> QualifyTestResult:
    """The step as "not run": why, the exact fix; not tested, so never a failure or a drain."""
    return step.replace(detail=f"dcgm: not run: {why}; fix: {fix}", not_run=why, fix=fix,
                        not_tested=True, error=reason, mig=mig)  # fmt: skip


def judge(
    result: DcgmResult, level: int, step: QualifyTestResult | None = None
) -> QualifyTestResult:
    """The step (a bare DCGM TEST RESULT if none) with ok/detail and one parsed run's findings."""
    name = f"dcgm level {level}"
    step = step or QualifyTestResult(test="dcgm", nodes=[], ok=None, detail="", level=level)
    step = step.replace(findings=[finding_entry(f) for f in result.findings],
                        dcgm_version=result.version, exit_code=result.exit_code)  # fmt: skip
    if result.runtime_error:  # e.g. "Cannot load plugins": DCGM could not test, not a node fault
        return step.replace(ok=None, detail=f"{name}: DCGM could not run: "
                            f"{_first_line(result.runtime_error)}", not_tested=True)  # fmt: skip
    if not result.tests:
        return step.replace(ok=None, detail=f"{name}: DCGM reported no tests")
    bad = [f for f in result.findings if f.kind in ("hardware", "software")]
    config = "; ".join(f.sentence() for f in result.of_kind("config"))
    note = f"; configuration (not hardware): {config}" if config else ""
    untested = result.of_kind("not_tested")
    if untested:  # never a failure: DCGM's own error, not the node's (category 16, a skip, ...)
        note += f"; DCGM could not test (not a node fault): {_summary(untested)}"
    if bad:
        return step.replace(ok=False, detail=f"{name}: failed: {_summary(bad)}{note}")
    if untested:
        return step.replace(ok=None, detail=f"{name}: not judged{note}", not_tested=True)
    ran = ", ".join(t for t, _ in result.tests)
    return step.replace(ok=True, detail=f"{name}: passed ({ran}){note}")


def finding_entry(f: DcgmFinding) -> DcgmFindingEntry:
    """A finding as a TEST RESULT lists it: its fields and its sentence."""
    return DcgmFindingEntry(test=f.test, gpu=f.gpu, status=f.status, message=f.message,
                            error_id=f.error_id, error_category=f.error_category,
                            error_severity=f.error_severity, kind=f.kind, cause=f.cause,
                            text=f.sentence())  # fmt: skip


def _summary(findings: tuple[DcgmFinding, ...] | list[DcgmFinding]) -> str:
    """Findings in a few words: the same message on several GPUs once (3.x writes one per GPU),
    DCGM's own errors once per test and cause with the rest counted (they differ by a pid)."""
    groups: dict[tuple[str, ...], list[DcgmFinding]] = {}
    for f in findings:
        text = "" if f.kind == "not_tested" else _GPU_PREFIX.sub("", f.message)
        groups.setdefault((f.test, f.kind, f.cause, text), []).append(f)
    out = []
    for (_, kind, _, _), same in groups.items():
        gpus = sorted({f.gpu for f in same if f.gpu is not None})
        first = same[0].replace(gpu=None, message=_GPU_PREFIX.sub("", same[0].message))
        where = f"GPU{'s' if len(gpus) > 1 else ''} {','.join(map(str, gpus))}: " if gpus else ""
        text = first.sentence().replace(": ", f": {where}", 1) if where else first.sentence()
        more = len({_GPU_PREFIX.sub("", f.message) for f in same}) - 1
        tag = " [not the GPU: a node problem]" if kind == "software" else ""
        out.append(text + tag + (f" (and {more} more like it)" if more > 0 else ""))
    return "; ".join(out)


def _obj(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DcgmError(f"dcgm: {what}: expected an object, got {type(value).__name__}")
    return value


def _list(value: object, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DcgmError(f"dcgm: {what}: expected a list, got {type(value).__name__}")
    return [v for v in value if v is not None]  # nvvs 3.1 writes null between its tests


def _int(value: object) -> int | None:
    try:
        number: int = int(value)  # type: ignore[call-overload]  # what int() refuses raises, below
    except (TypeError, ValueError):
        return None
    return number


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[0][:200] if lines else ""

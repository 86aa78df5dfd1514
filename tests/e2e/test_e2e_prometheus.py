"""End to end: a real node_exporter and Prometheus read what gpugate's hooks wrote on a real Slurm.

node_exporter's textfile collector points at the site's metrics directory (admin.metrics_file's),
Prometheus scrapes it every second with config/gpugate-alerts.yml loaded, both on loopback,
started and stopped here (tests/support/prometheus.py: Debian's binaries; absent, the module
skips, and fails under CI). On the local Slurm a job ends ok, one fails (a CUDA OOM the epilog
diagnoses), and the prolog drains the node for an ECC fault (the replayed snapshot, as
test_e2e_admin.py); `gpugate report` writes the checks' file beside it. The isolation and
qualification series come from their own writers (note_isolated, note_qualification: the
isolation and qualification suites prove their callers). Then Prometheus' HTTP API must show
the series, the drained node's firing alert, and an answer to every dashboard panel's query.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e import SlurmSite, SlurmSites, slurm_or_skip
from prometheus import Prometheus, dashboard_queries, tool_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

NODE = "gpu-node-01"
GPUGATE = str(Path(sys.executable).parent / "gpugate")
ALERTS = Path(__file__).resolve().parent.parent.parent / "config" / "gpugate-alerts.yml"
CUDA_OOM = (
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 1 "
    "has a total capacity of 79.10 GiB of which 12.73 GiB is free."
)


@pytest.fixture(scope="module", autouse=True)
def tools() -> None:
    """Skip (fail under CI) before any Slurm starts when Prometheus' programs are missing."""
    for tool in ("prometheus", "node_exporter"):
        tool_or_skip(tool)


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site([NODE], hooks=("prolog", "epilog"), slurm_user="root")


@pytest.fixture(scope="module")
def prom(e2e_site: SlurmSite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """node_exporter on the site's textfile directory and Prometheus with the shipped rules,
    each `for:` cut to 1 s (the expressions as shipped): a test waits seconds, not minutes."""
    base = tmp_path_factory.mktemp("prometheus")
    rules = base / "gpugate-alerts.yml"
    rules.write_text(re.sub(r"^(\s+for:) .*$", r"\1 1s", ALERTS.read_text(), flags=re.M))
    prometheus = Prometheus(base, e2e_site.site.metrics.parent, [rules])
    try:
        yield prometheus.start()
    finally:
        prometheus.stop()


def run_job(e2e_site: SlurmSite, name: str, script: str, state: str) -> int:
    site, cluster = e2e_site
    job = cluster.submit(script=f"#!/bin/sh\n{script}\n", output=str(site.base / f"{name}.out"))
    cluster.wait_job(job, state, timeout=60)
    return job


@pytest.fixture(scope="module")
def fleet(e2e_site: SlurmSite, prom: Prometheus) -> Prometheus:
    """The story, once: jobs end ok and failed, the prolog drains the node, the admin host
    reports, a GPU is isolated and a qualification recorded; Prometheus has scraped it all."""
    from gpugate.config import load_config
    from gpugate.store.metrics import note_isolated, note_qualification
    from gpugate.store.qualify import QualifyEntry, QualifyTestResult

    site, cluster = e2e_site
    run_job(e2e_site, "ok", "true", "COMPLETED")
    run_job(e2e_site, "oom", f"echo '{CUDA_OOM}'; exit 1", "FAILED")
    prom.wait_for(lambda: prom.query('gpugate_job_ends_total{result="failed"}'), "failed job")
    site.use_snapshot(NODE, "h100-ecc")
    job = cluster.submit(wrap="true", output="/dev/null", nodelist=NODE)
    cluster.wait_job(job, "PENDING", reason="launch failed requeued held", timeout=30)
    cluster.run(["scancel", str(job)])
    assert cluster.is_drained(NODE)
    report = subprocess.run([GPUGATE, "report", "--html", str(site.base / "report.html")],
                            env=e2e_site.env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert report.returncode == 0, report.stderr
    config = load_config(str(site.config))
    assert note_isolated(config, NODE, 1)
    test = QualifyTestResult(test="allreduce", nodes=[NODE], ok=True, value_gbps=361.5,
                             floor_gbps=300.0, detail="busbw 361.5 GB/s")  # fmt: skip
    entry = QualifyEntry(node=NODE, when=time.time(), run_id="e2e-1", level=1, passed=True,
                         tests=[test], job_ids=["1"], why="passed", by="root")  # fmt: skip
    assert note_qualification(config, [entry])
    names = sorted(p.name for p in site.metrics.parent.glob("*.prom"))
    assert names == ["gpugate-checks.prom", "gpugate-qualify.prom", "gpugate-reliability.prom",
                     "gpugate.prom"], names  # fmt: skip
    for series in ('gpugate_drains_total{check="gpu.ecc"}', "gpugate_isolated_gpus",
                   "gpugate_qualify_runs_total", "gpugate_check_window_drains"):  # fmt: skip
        prom.wait_for(lambda s=series: prom.query(s), f"{series} scraped")
    return prom


def value(prom: Prometheus, expr: str) -> float:
    """The one sample `expr` selects, as a number."""
    rows = prom.query(expr)
    assert len(rows) == 1, (expr, rows)
    return float(rows[0]["value"][1])


def test_the_drained_node_and_the_failed_job_are_scraped(fleet: Prometheus):
    n = f'node="{NODE}"'
    assert value(fleet, f"gpugate_node_healthy{{{n}}}") == 0
    assert value(fleet, f'gpugate_check_status{{{n},check="gpu.ecc"}}') == 2
    assert value(fleet, f'gpugate_drains_total{{{n},check="gpu.ecc"}}') == 1
    assert value(fleet, f'gpugate_job_ends_total{{{n},result="failed"}}') == 1
    assert value(fleet, f'gpugate_job_ends_total{{{n},result="ok"}}') == 1
    assert value(fleet, f'gpugate_diagnoses_total{{{n},category="cuda_oom"}}') == 1
    assert value(fleet, f"gpugate_prolog_duration_seconds{{{n}}}") > 0
    # The scrape itself: node_exporter read every file without an error.
    assert value(fleet, "node_textfile_scrape_error") == 0


def test_the_drained_node_fires_its_alert(fleet: Prometheus):
    def firing() -> dict[str, dict]:
        return {a["labels"]["alertname"]: a for a in fleet.alerts() if a["state"] == "firing"}

    alerts = fleet.wait_for(lambda: "GpugateNodeUnhealthy" in firing() and firing(), "alert")
    assert alerts["GpugateNodeUnhealthy"]["labels"]["node"] == NODE
    assert alerts["GpugateNodeUnhealthy"]["labels"]["severity"] == "warning"
    # With every `for` at 1 s the isolated GPU's week-long alert fires too; nothing else does
    # (no check unknown, no internal error, a fresh qualification, one drain).
    time.sleep(3)  # a few evaluations more
    assert set(firing()) == {"GpugateNodeUnhealthy", "GpugateGpuIsolatedLong"}, firing()


@pytest.mark.parametrize(
    ("title", "expr"), [pytest.param(*q, id=q[0]) for q in dashboard_queries()]
)
def test_every_dashboard_panel_answers(fleet: Prometheus, title: str, expr: str):
    rows = fleet.query(expr)
    assert rows, f"panel {title!r} would show No data: {expr}"

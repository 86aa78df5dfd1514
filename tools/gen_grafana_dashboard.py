"""Write config/grafana/gpugate.json: gpugate's Grafana dashboard, over its Prometheus series.

Run it after changing a panel (`python tools/gen_grafana_dashboard.py`); the committed JSON is
what the packages ship (/usr/share/gpugate/grafana/gpugate.json), and
tests/unit/store/test_grafana_dashboard.py fails while it differs from this script's output.
tests/e2e/test_e2e_prometheus.py runs every panel's query against a real Prometheus scraping
the hooks' textfiles and fails on a query that returns nothing.

Plain JSON from the standard library, no dashboard SDK: the dashboard is data (a dozen panels of
four kinds), gpugate gains no dependency, and the check that matters (every query answers, on
the series gpugate writes) needs a Prometheus, not a schema. The JSON is Grafana's dashboard
model (schemaVersion 39, Grafana 10/11) with a datasource variable, so it imports anywhere.

Counters over the dashboard's range count `X - X at the range's start`, or X where the series
is new in the range (it was 0): Prometheus' increase() misses a series' first increment, and a
node's first drain for a check is a new series (config/gpugate-alerts.yml says the same).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "config" / "grafana" / "gpugate.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24  # Grafana's grid


def in_range(counter: str, by: str = "") -> str:
    """A counter's increments over the dashboard's range, summed (by `by`), counting new series."""
    group = f" by ({by})" if by else ""
    return f"sum{group} ({counter} - ({counter} offset $__range) or {counter})"


def panel(
    kind: str, title: str, expr: str, description: str, legend: str = "", **options: Any
) -> dict[str, Any]:
    """One panel of `kind` (stat, timeseries, bargauge, table) with one Prometheus query."""
    target: dict[str, Any] = {"refId": "A", "datasource": DATASOURCE, "expr": expr}
    if legend:
        target["legendFormat"] = legend
    if kind in ("table", "bargauge"):
        target.update(
            instant=True, range=False, format="table" if kind == "table" else "time_series"
        )
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [target],
        "fieldConfig": {"defaults": {"noValue": options.pop("no_value", "0"),
                                     **options.pop("defaults", {})}, "overrides": []},
        "options": options,
    }  # fmt: skip


# (row title, [(width, height, panel)]): the layout, top to bottom.
ROWS: list[tuple[str, list[tuple[int, int, dict[str, Any]]]]] = [
    ("Fleet health", [
        (4, 4, panel("stat", "Nodes reporting", "count(gpugate_node_healthy)",
                     "Nodes whose gpugate textfile node_exporter serves.")),
        (4, 4, panel("stat", "Nodes unhealthy", "sum(1 - gpugate_node_healthy)",
                     "Nodes that failed gpugate's last checks or that gpugate drained.",
                     defaults={"thresholds": {"mode": "absolute", "steps": [
                         {"color": "green", "value": None}, {"color": "red", "value": 1}]}})),
        (4, 4, panel("stat", "GPUs isolated", "sum(gpugate_isolated_gpus)",
                     "GPUs gpugate took out of their node's service (isolate.unit: gpu); "
                     "`gpugate nodes` says which and why.")),
        (4, 4, panel("stat", "Drains held back by the budget", in_range(
                     "gpugate_drain_budget_exceeded_total"),
                     "Drains gpugate did not do in the range because the drain budget was "
                     "spent (drain_budget in gpugate.yaml).")),
        (4, 4, panel("stat", "gpugate internal errors", in_range("gpugate_internal_errors_total"),
                     "Hook runs in the range in which gpugate itself failed (gpugate.log in "
                     "the node's state directory).")),
        (4, 4, panel("stat", "Slowest prolog (s)", "max(gpugate_prolog_duration_seconds)",
                     "The longest last-prolog run time of the fleet.", defaults={"unit": "s"})),
        (12, 8, panel("timeseries", "Node health", "gpugate_node_healthy",
                      "1 passed gpugate's last checks, 0 failed or drained, per node.",
                      legend="{{node}}")),
        (12, 8, panel("table", "Failing checks", "gpugate_check_status >= 2",
                      "Checks whose last status is fail (2) or unknown (3: not evaluated), "
                      "per node.", no_value="no failing check")),
    ]),
    ("Drains", [
        (8, 8, panel("bargauge", "Drains by check", in_range("gpugate_drains_total", "check"),
                      "Drains gpugate set in the range, by the check that failed (fault "
                      "drills not counted).", legend="{{check}}")),
        (8, 8, panel("bargauge", "Drains by node", in_range("gpugate_drains_total", "node"),
                     "Drains gpugate set in the range, by node.", legend="{{node}}")),
        (8, 8, panel("timeseries", "Drains, cumulative, by check",
                     "sum by (check) (gpugate_drains_total)",
                     "gpugate's drain counters summed over the fleet.", legend="{{check}}")),
        (12, 8, panel("table", "Checks: roll-out and false drains", "gpugate_check_window_drains",
                      "From the last `gpugate report`: each check's drains in the history "
                      "window (gpugate_check_rollout, gpugate_check_window_false_drains and "
                      "gpugate_check_false_drain_ratio beside it in gpugate-checks.prom).")),
        (12, 8, panel("table", "Roll-out stage", "gpugate_check_rollout",
                      "0 acting, 1 canary-only, 2 report-only (the last `gpugate report`).")),
    ]),
    ("Jobs", [
        (12, 8, panel("bargauge", "Diagnosed failures by category",
                      in_range("gpugate_diagnoses_total", "category"),
                      "Abnormal job ends in the range, by the epilog's diagnosis (medium or low "
                      "confidence: uncertain).", legend="{{category}}")),
        (12, 8, panel("bargauge", "Job ends by result", in_range("gpugate_job_ends_total", "result"),
                      "Job runs ended in the range, as the epilog judged each: ok, failed, or "
                      "drill.", legend="{{result}}")),
    ]),
    ("Reliability (the last `gpugate report`, its history window)", [
        (6, 8, panel("stat", "Fleet MTBF (h)", "gpugate_fleet_mtbf_hours",
                     "Hours in service per failure over the window: every node's time out of "
                     "a gpugate drain, divided by its drains (docs/guide/admin-review.md, "
                     "\"Fleet reliability figures\").", defaults={"unit": "h"},
                     no_value="no failure")),
        (9, 8, panel("bargauge", "GPU-hours lost by cause",
                     "gpugate_cause_window_gpu_hours_lost",
                     "GPU-hours of the failed runs in the window, by the epilog's diagnosis.",
                     legend="{{cause}}")),
        (9, 8, panel("bargauge", "Failures by node", "gpugate_node_window_failures",
                     "gpugate's drains of each node in the window (repeat offenders first: "
                     "gpugate_node_repeat_drains).", legend="{{node}}")),
    ]),
    ("Hook latency", [
        (12, 8, panel("timeseries", "Prolog run time", "gpugate_prolog_duration_seconds",
                      "Each node's last prolog run time; over PrologEpilogTimeout Slurm drains "
                      "the node itself.", legend="{{node}}", defaults={"unit": "s"})),
        (12, 8, panel("table", "Since each hook last ran",
                      "time() - max by (hook) (gpugate_last_run_timestamp_seconds)",
                      "Seconds since the fleet's newest run of each gpugate hook.",
                      defaults={"unit": "s"})),
    ]),
    ("Qualification", [
        (8, 8, panel("bargauge", "Qualifications by result",
                     in_range("gpugate_qualify_runs_total", "result"),
                     "`gpugate qualify` runs in the range: passed, failed, not_qualified.",
                     legend="{{result}}")),
        (8, 8, panel("table", "Days since the last passed qualification",
                     "(time() - gpugate_qualify_last_pass_timestamp_seconds) / 86400",
                     "Per node; GpugateQualificationStale fires past eight days.")),
        (8, 8, panel("table", "Qualification bandwidth (GB/s)", "gpugate_qualify_bandwidth_gbps",
                     "The last qualification's measured bandwidth per node and test.")),
    ]),
]  # fmt: skip


def dashboard() -> dict[str, Any]:
    """The dashboard model: rows of panels laid out left to right, ids in order."""
    panels: list[dict[str, Any]] = []
    y = 0
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                       "id": len(panels) + 1, "gridPos": {"x": 0, "y": y, "w": WIDTH, "h": 1}})  # fmt: skip
        y += 1
        x = height = 0
        for w, h, p in row:
            if x + w > WIDTH:
                x, y, height = 0, y + height, 0
            panels.append({"id": len(panels) + 1, "gridPos": {"x": x, "y": y, "w": w, "h": h}, **p})
            x, height = x + w, max(height, h)
        y += height
    return {
        "title": "gpugate",
        "uid": "gpugate",
        "description": "gpugate's node_exporter textfile series: fleet health, drains, jobs, "
        "reliability, hook latency, qualification (docs/guide/monitoring.md).",
        "tags": ["gpugate", "slurm", "gpu"],
        "editable": True,
        "schemaVersion": 39,
        "time": {"from": "now-7d", "to": "now"},
        "refresh": "1m",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    """The committed file's text."""
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    """Write the dashboard (or, with --check, exit 1 if the committed one differs)."""
    if "--check" in argv:
        return 0 if OUT.exists() and OUT.read_text() == render() else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

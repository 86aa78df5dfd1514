"""config/grafana/gpugate.json: written by tools/gen_grafana_dashboard.py, laid out on Grafana's
grid, every query over gpugate's own series (tests/e2e/test_e2e_prometheus.py runs each one
against a real Prometheus)."""

from __future__ import annotations

import importlib.util
import json
import re

import paths
from prometheus import DASHBOARD, dashboard_queries

from gpugate.store import metrics as M


def generator():
    spec = importlib.util.spec_from_file_location(
        "gen_grafana_dashboard", paths.ROOT / "tools/gen_grafana_dashboard.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_dashboard_is_the_generators():
    assert DASHBOARD.read_text() == generator().render(), (
        "config/grafana/gpugate.json is stale: run python tools/gen_grafana_dashboard.py"
    )


def test_panels_have_ids_a_place_on_the_grid_and_one_query_each():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "gpugate" and doc["schemaVersion"] >= 36
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for p in doc["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & taken, f"{p['title']} overlaps another panel"
        taken |= cells
        if p["type"] == "row":
            continue
        assert p["type"] in {"stat", "timeseries", "bargauge", "table"}, p["type"]
        assert p["description"] and len(p["targets"]) == 1, p["title"]
        assert p["datasource"]["uid"] == "${datasource}" == p["targets"][0]["datasource"]["uid"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"


def test_every_query_reads_series_gpugate_writes():
    queries = dashboard_queries()
    assert len(queries) >= 15
    named = set()
    for title, expr in queries:
        names = set(re.findall(r"\bgpugate_[a-z_]+", expr))
        assert names, f"{title}: reads no gpugate series"
        assert names <= set(M.FAMILIES), (
            f"{title}: not written by gpugate: {names - set(M.FAMILIES)}"
        )
        assert "$" not in expr and "increase(" not in expr, (title, expr)
        named |= names
    # What the dashboard is for (issue 46): health, drains, isolation, budget, latency, qualify.
    assert {"gpugate_node_healthy", "gpugate_drains_total", "gpugate_isolated_gpus",
            "gpugate_drain_budget_exceeded_total", "gpugate_prolog_duration_seconds",
            "gpugate_qualify_runs_total"} <= named  # fmt: skip

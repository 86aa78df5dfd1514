"""config/gpugate-alerts.yml proven by Prometheus itself: `promtool check rules` and, per alert,
`promtool test rules` with a firing case and quiet cases on a healthy fleet and on a drill.

The series are what gpugate/store/metrics.py writes (a counter appears at its first increment,
a drill's drain counts in gpugate_drill_drains_total and marks gpugate_drill_active), sampled
every 5 minutes for ten days. promtool: Debian's `prometheus` (tests/support/prometheus.py says
where it is looked for, and when its absence fails).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import paths
import pytest
from prometheus import tool_or_skip

from gpugate.store import metrics as M
from gpugate.yamlio import parse_yaml

pytestmark = pytest.mark.slow  # promtool evaluates ten days of a fleet per alert: seconds each

ALERTS = paths.CONFIG / "gpugate-alerts.yml"
SAMPLES = 2400  # 5-minute samples: 8 1/3 days, past every rule's window and `for`


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    """One promtool input series (values in promtool's notation: `_x6 1x100`)."""
    assert name in M.FAMILIES, name  # only what gpugate writes
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def flat(value: float | str) -> str:
    """The same value for the whole test."""
    return f"{value}x{SAMPLES}"


# Two nodes as the hooks leave healthy ones: passing checks, jobs ending ok, a drain long ago
# (the counter is flat: no alert for old drains), a qualification passed an hour ago, every
# hour (the timestamp follows promtool's clock, which starts at 0).
HEALTHY = [
    s
    for node in ("n1", "n2")
    for s in (
        series("gpugate_node_healthy", flat(1), node=node),
        series("gpugate_check_status", flat(0), node=node, check="gpu.ecc"),
        series("gpugate_check_status", flat(0), node=node, check="kernel.xid"),
        series("gpugate_prolog_duration_seconds", flat(2.5), node=node),
        series("gpugate_internal_errors_total", flat(0), node=node),
        series("gpugate_drain_budget_exceeded_total", flat(0), node=node),
        series("gpugate_job_ends_total", f"1+1x{SAMPLES}", node=node, result="ok"),
        series("gpugate_drains_total", flat(3), node=node, check="gpu.ecc"),
        series("gpugate_isolated_gpus", flat(0), node=node),
        series("gpugate_qualify_last_pass_timestamp_seconds", f"0+300x{SAMPLES}", node=node),
    )
]

# n3 under a 30-minute fault drill (an Xid 79 laid over its facts) from 1 h to 1 h 30: the
# drill drains it for real (gpugate_node_healthy 0, the check failing), counts its drain and
# job end as the drill's, and marks the node; `gpugate health` resumes it after the window.
DRILL_FROM, DRILL_SAMPLES = 12, 6
_BEFORE, _AFTER = DRILL_FROM, SAMPLES - DRILL_FROM - DRILL_SAMPLES
DRILL = [
    series("gpugate_node_healthy", f"1x{_BEFORE - 1} 0x{DRILL_SAMPLES} 1x{_AFTER}", node="n3"),
    series("gpugate_drill_active", f"_x{_BEFORE} 1x{DRILL_SAMPLES} 0x{_AFTER}", node="n3"),
    series(
        "gpugate_check_status",
        f"0x{_BEFORE - 1} 2x{DRILL_SAMPLES} 0x{_AFTER}",
        node="n3",
        check="kernel.xid",
    ),
    series("gpugate_drill_drains_total", f"_x{_BEFORE} 1x{SAMPLES}", node="n3", check="kernel.xid"),
    series("gpugate_job_ends_total", f"_x{_BEFORE} 1x{SAMPLES}", node="n3", result="drill"),
    series("gpugate_internal_errors_total", flat(0), node="n3"),
    series("gpugate_prolog_duration_seconds", flat(2.5), node="n3"),
]
QUIET_HEALTHY_AT = ("40m", "2h", "7d1h", "8d2h")
QUIET_DRILL_AT = ("1h10m", "1h25m", "2h", "8d2h")  # during the drill, after it, much later


def fires(node: str | None = None, value: float = 1, **labels: str) -> dict[str, Any]:
    """An expected alert: its labels (`node` and the rule's own; alertname is implied) and the
    value its annotations' templates show (expanded per rule in cases())."""
    return {"exp_labels": {**({"node": node} if node else {}), **labels}, "value": value}


def drained_at_2h30m(count: int) -> list[dict[str, str]]:
    """`count` nodes reporting from the start, each drained for the first time at 2h30m."""
    return [
        s
        for i in range(count)
        for s in (series("gpugate_node_healthy", "1x29 0x100", node=f"d{i}"),
                  series("gpugate_drains_total", "_x30 1x100", node=f"d{i}", check="gpu.ecc"))
    ]  # fmt: skip


# alert -> its firing tests: (what, extra series, [(eval_time, expected alerts)]); the healthy
# fleet's series are added to each, so only the faulty node may fire.
FIRING: dict[str, list[tuple[str, list[dict[str, str]], list[tuple[str, list[Any]]]]]] = {
    "GpugateNodeUnhealthy": [
        (
            "n9 fails its checks from 30m: pending at 33m, firing after 5m",
            [series("gpugate_node_healthy", "1x5 0x100", node="n9")],
            [("33m", []), ("40m", [fires("n9", severity="warning")])],
        )
    ],
    "GpugateCheckUnknown": [
        (
            "nvlink.links cannot be evaluated on n9 from 30m: firing after 30m",
            [series("gpugate_check_status", "0x5 3x100", node="n9", check="nvlink.links")],
            [("50m", []), ("65m", [fires("n9", check="nvlink.links", severity="info")])],
        )
    ],
    "GpugateNodeDrainedRepeatedly": [
        (
            "n9, reporting for a week, drained twice for gpu.ecc (a new series at 1, then 2)",
            [
                series("gpugate_node_healthy", flat(1), node="n9"),
                series("gpugate_drains_total", "_x2030 1x10 2x100", node="n9", check="gpu.ecc"),
            ],
            [("169h35m", []), ("170h50m", [fires("n9", 2, check="gpu.ecc", severity="warning")])],
        ),
        (
            "n8 drained five times long ago, twice more this week; n7 once more",
            [
                series("gpugate_drains_total", "5x2100 6x6 7x100", node="n8", check="nvlink.links"),
                series("gpugate_drains_total", "5x2100 6x106", node="n7", check="nvlink.links"),
            ],
            [("179h10m", [fires("n8", 2, check="nvlink.links", severity="warning")])],
        ),
    ],
    "GpugateDrainsRising": [
        (
            "six reporting nodes drained for the first time at 2h30m",
            drained_at_2h30m(6),
            [("2h25m", []), ("2h40m", [fires(None, 6, severity="critical")]), ("3h40m", [])],
        ),
        ("five nodes: not yet a storm", drained_at_2h30m(5), [("2h40m", [])]),
    ],
    "GpugateInternalErrors": [
        (
            "n9 fails internally at 2h30m",
            [series("gpugate_internal_errors_total", "0x29 1x100", node="n9")],
            [("2h25m", []), ("2h40m", [fires("n9", severity="warning")]), ("3h40m", [])],
        )
    ],
    "GpugatePrologSlow": [
        (
            "n9's prolog takes 25 s from 30m: firing after 30m",
            [series("gpugate_prolog_duration_seconds", "3x5 25x100", node="n9")],
            [("45m", []), ("65m", [fires("n9", 25, severity="info")])],
        )
    ],
    "GpugateQualificationStale": [
        (
            "n9 passed a qualification at time 0 and never again",
            [series("gpugate_qualify_last_pass_timestamp_seconds", flat(0), node="n9")],
            [("7d", []), ("8d2h", [fires("n9", severity="info")])],
        )
    ],
    "GpugateGpuIsolatedLong": [
        (
            "n9 has served without one isolated GPU since 30m",
            [series("gpugate_isolated_gpus", f"0x5 1x{SAMPLES}", node="n9")],
            [("6d", []), ("7d1h", [fires("n9", severity="info")])],
        )
    ],
}


def rules() -> dict[str, dict[str, Any]]:
    """The alert rules of the file, by name."""
    doc = parse_yaml(ALERTS.read_text(), str(ALERTS))
    return {r["alert"]: r for group in doc["groups"] for r in group["rules"]}


_TEMPLATE = re.compile(r"{{\s*\$(labels\.(\w+)|value)(\s*\|\s*humanize)?\s*}}")


def expand(text: str, labels: dict[str, str], value: float) -> str:
    """A rule's annotation as Prometheus renders it, for the templates the rules use
    (`$labels.X`, `$value`, `$value | humanize` of a whole number)."""
    assert float(value).is_integer(), value  # humanize's `%.4g` of a whole number: itself
    out = _TEMPLATE.sub(lambda m: labels[m.group(2)] if m.group(2) else str(int(value)), text)
    assert "{{" not in out, f"a template this test cannot expand: {text}"
    return out


def cases(alert: str) -> list[dict[str, Any]]:
    """promtool's tests of one alert: each firing case, the healthy fleet, the drill."""

    annotations = rules()[alert]["annotations"]

    def expected(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"exp_labels": a["exp_labels"],
             "exp_annotations": {k: expand(v, a["exp_labels"], a["value"])
                                 for k, v in annotations.items()}}
            for a in alerts
        ]  # fmt: skip

    def test(name: str, extra: list[dict[str, str]], evals: list[tuple[str, list[Any]]]) -> dict:
        return {
            "name": f"{alert}: {name}",
            "interval": "5m",
            "input_series": HEALTHY + extra,
            "alert_rule_test": [
                {"eval_time": at, "alertname": alert, "exp_alerts": expected(alerts)}
                for at, alerts in evals
            ],
        }

    return [
        *(test(*case) for case in FIRING[alert]),
        test("quiet on a healthy fleet", [], [(at, []) for at in QUIET_HEALTHY_AT]),
        test("quiet on a drill", DRILL, [(at, []) for at in QUIET_DRILL_AT]),
    ]


def promtool_test(
    tmp_path: Path, alert: str, tests: list[dict[str, Any]]
) -> subprocess.CompletedProcess:
    """Run `promtool test rules` with `tests` on the shipped rule of `alert`, alone (the file's
    other rules would only be evaluated for nothing). JSON is YAML to promtool."""
    rule = tmp_path / "rule.yml"
    rule.write_text(json.dumps({"groups": [{"name": "gpugate", "rules": [rules()[alert]]}]}))
    # Rules evaluated at the series' own 5-minute step: ten days of 1-minute steps took promtool
    # 13 s per alert, and every rule's `for` and window is a multiple of 5 minutes.
    doc = {"rule_files": [str(rule)], "evaluation_interval": "5m", "tests": tests}
    path = tmp_path / "gpugate-alerts.test.yml"
    path.write_text(json.dumps(doc, indent=1))
    return subprocess.run([tool_or_skip("promtool"), "test", "rules", str(path)],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def test_every_alert_has_its_cases():
    assert sorted(FIRING) == sorted(rules())


def test_promtool_checks_the_rules():
    res = subprocess.run([tool_or_skip("promtool"), "check", "rules", str(ALERTS)],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert res.returncode == 0 and "SUCCESS: 8 rules found" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("alert", sorted(FIRING))
def test_promtool_runs_the_alert_firing_and_quiet(alert, tmp_path):
    res = promtool_test(tmp_path, alert, cases(alert))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_notices_a_wrong_expectation(tmp_path):
    """The harness can fail: the healthy fleet's expectation turned into a firing one."""
    wrong = cases("GpugateNodeUnhealthy")[-2]
    wrong["alert_rule_test"][0]["exp_alerts"] = [fires("n1", severity="warning")]
    res = promtool_test(tmp_path, "GpugateNodeUnhealthy", [wrong])
    assert res.returncode != 0 and re.search(r"FAILED", res.stdout + res.stderr), res.stdout

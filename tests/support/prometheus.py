"""Prometheus' own tools for the tests: promtool, prometheus and node_exporter, found or skipped.

The binaries are Debian's (`prometheus`: prometheus and promtool; `prometheus-node-exporter`:
prometheus-node-exporter), found on PATH or in GPUGATE_PROMETHEUS_BIN_DIR (a directory where
the packages were unpacked without installing them, e.g. `dpkg -x prometheus_*.deb ROOT` and
GPUGATE_PROMETHEUS_BIN_DIR=ROOT/usr/bin). Where one is missing the test skips, except under
CI (CI=true, or GPUGATE_REQUIRE_PROMETHEUS=1 as .ci/run exports it), where it fails: CI
installs both packages, and an alert rule no Prometheus ever ran must not pass unseen.

`Prometheus` runs node_exporter (textfile collector only) and a Prometheus scraping it, on
loopback ports picked free, in a temporary directory; never the system's services.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

# Debian's names first, then upstream's (a tarball's node_exporter).
NAMES = {
    "promtool": ("promtool",),
    "prometheus": ("prometheus",),
    "node_exporter": ("prometheus-node-exporter", "node_exporter"),
}
PACKAGES = "Debian's `prometheus` and `prometheus-node-exporter` packages"


def required() -> bool:
    """Whether a missing tool fails the test rather than skipping it (CI)."""
    return os.environ.get("CI") == "true" or os.environ.get("GPUGATE_REQUIRE_PROMETHEUS") == "1"


def find(tool: str) -> str | None:
    """The binary of `tool` (a NAMES key) in GPUGATE_PROMETHEUS_BIN_DIR or on PATH, or None."""
    folder = os.environ.get("GPUGATE_PROMETHEUS_BIN_DIR")
    for name in NAMES[tool]:
        if folder and os.access(os.path.join(folder, name), os.X_OK):
            return os.path.join(folder, name)
    for name in NAMES[tool]:
        found = shutil.which(name)
        if found:
            return found
    return None


def tool_or_skip(tool: str) -> str:
    """The binary of `tool`, or skip the test (fail it under CI) saying what to install."""
    found = find(tool)
    if found:
        return found
    why = (f"{NAMES[tool][0]} not found on PATH nor in GPUGATE_PROMETHEUS_BIN_DIR "
           f"(install {PACKAGES}, or unpack them and set GPUGATE_PROMETHEUS_BIN_DIR)")  # fmt: skip
    if required():
        pytest.fail(why + "; CI=true or GPUGATE_REQUIRE_PROMETHEUS=1 requires them", pytrace=False)
    pytest.skip(why)


def free_port() -> int:
    """A loopback TCP port free now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """node_exporter reading `textfile_dir`, and Prometheus scraping it every second with
    `rule_files` loaded; both on loopback, under `base`; stop() ends both."""

    def __init__(self, base: Path, textfile_dir: Path, rule_files: list[Path]) -> None:
        self.base = base
        self.textfile_dir = textfile_dir
        self.rule_files = rule_files
        self.procs: list[subprocess.Popen[bytes]] = []
        self.url = ""

    def start(self) -> Prometheus:
        """Start both and wait until Prometheus has scraped node_exporter once."""
        exporter, prometheus = tool_or_skip("node_exporter"), tool_or_skip("prometheus")
        self.base.mkdir(parents=True, exist_ok=True)
        exporter_port, port = free_port(), free_port()
        # Only the textfile collector: the host's own collectors are noise here.
        self._spawn("node_exporter", [exporter, "--collector.disable-defaults",
                    "--collector.textfile", f"--collector.textfile.directory={self.textfile_dir}",
                    f"--web.listen-address=127.0.0.1:{exporter_port}"])  # fmt: skip
        config = self.base / "prometheus.yml"
        rules = [str(p) for p in self.rule_files]
        # 1 s scrapes and rule evaluations: a test waits seconds, not minutes.
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rules,
            "scrape_configs": [{"job_name": "node",
                                "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}],
        }))  # fmt: skip
        self._spawn("prometheus", [prometheus, f"--config.file={config}",
                    f"--storage.tsdb.path={self.base / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}"])  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        self.wait_for(lambda: self.query('up{job="node"} == 1'), "node_exporter scraped", 60)
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.base / f"{name}.log", "wb")  # noqa: SIM115 (kept open for the process)
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))  # fmt: skip

    def logs(self) -> str:
        """The last lines of both programs' logs, for a failure's message."""
        out = []
        for path in sorted(self.base.glob("*.log")):
            out.append(f"--- {path.name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(out)

    def api(self, path: str, **params: str) -> Any:
        """GET one API path (e.g. /api/v1/query) and return its `data`."""
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result of an instant query: a list of {metric, value} (a scalar as one row)."""
        data = self.api("/api/v1/query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts now pending or firing, each with labels and state."""
        return list(self.api("/api/v1/alerts")["alerts"])

    def wait_for(self, probe: Any, what: str, timeout: float = 30) -> Any:
        """Poll `probe()` until it returns something truthy; fail after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            for proc in self.procs:
                if proc.poll() is not None:
                    pytest.fail(f"{proc.args[0]} exited {proc.returncode}\n{self.logs()}")
            try:
                found = probe()
            except OSError:  # not listening yet
                found = None
            if found:
                return found
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not seen in {timeout:g} s\n{self.logs()}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop both (SIGTERM, then SIGKILL after 10 s)."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self.procs = []


DASHBOARD = Path(__file__).resolve().parent.parent.parent / "config" / "grafana" / "gpugate.json"


def dashboard_queries(range_: str = "1h") -> list[tuple[str, str]]:
    """(panel title, query) of every panel of the shipped dashboard, Grafana's `$__range` as
    `range_` (the only variable in its queries besides the datasource)."""
    doc = json.loads(DASHBOARD.read_text())
    return [
        (p["title"], t["expr"].replace("$__range", range_))
        for p in doc["panels"]
        for t in p.get("targets", [])
    ]

"""`gpugate report`: the page's content, escaping of hostile reasons and notes, repeat
offenders, the timeline, the CLI, and what headless Chromium shows of it.

Chromium comes from Debian's `chromium` package: installed here when missing and this is root
with apt-get; otherwise the browser test is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from test_slurm_adapter import FakeRunner, fixture

from gpugate import cli
from gpugate.admin import nodes as A
from gpugate.admin import report as R
from gpugate.slurm_hooks.slurm.cli import CliBackend
from gpugate.slurm_hooks.slurm.records import NodeInfo
from gpugate.store import history as H

DAY = 86400.0
NOW = 1_790_000_000.0
SCRIPT = "<script>alert('pwned')</script>"
REASON = f"gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100 {SCRIPT}"
ADMIN_REASON = 'IT-77 "><img src=x onerror=alert(1)> & more'


class Page(HTMLParser):
    """The parts of a page the tests look at: elements, text, attributes, cards by id."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs

    def handle_data(self, data):
        if data.strip():
            self.text.append(data.strip())

    @property
    def all_text(self) -> str:
        return " ".join(self.text)


def sample_rows() -> list[dict]:
    nodes = [
        NodeInfo(name="gpu-07", state="IDLE", flags=("DRAIN",), reason=REASON, reason_user="root",
                 reason_time=int(NOW - DAY)),
        NodeInfo(name="gpu-09", state="MIXED", flags=("DRAIN",), reason=ADMIN_REASON,
                 reason_user="alice", reason_time=int(NOW - 2 * DAY)),
    ]  # fmt: skip
    drains = sample_drains()
    return A.node_rows(A.as_groups(nodes), drains, "/ev", now=NOW, drained_only=True)


def sample_drains() -> list[dict]:
    return [
        {"node": "gpu-07", "when": NOW - 20 * DAY, "check": "gpu.ecc", "reason": REASON},
        {"node": "gpu-07", "when": NOW - 9 * DAY, "check": "gpu.ecc", "reason": REASON,
         "bundle": "/ev/4242/gpu-07-r0"},
        {"node": "gpu-07", "when": NOW - DAY, "check": "gpu.ecc", "reason": REASON},
        {"node": "gpu-03", "when": NOW - 3 * DAY, "check": "pcie.link", "reason": "gpugate: pcie.link: x8"},
        {"node": "gpu-03", "when": NOW - 2 * DAY, "check": "ib.ports", "reason": "gpugate: ib.ports: down"},
        {"node": "gpu-05", "when": NOW - 40 * DAY, "check": "gpu.ecc", "reason": "gpugate: gpu.ecc: old"},
        {"node": "gpu-05", "when": NOW - 50 * DAY, "check": "gpu.ecc", "reason": "gpugate: gpu.ecc: old"},
    ]  # fmt: skip


def sample_resumes() -> list[dict]:
    return [{"node": "gpu-03", "when": NOW - DAY, "who": "bob", "why": f"reseated {SCRIPT}",
             "result": {"status": "ok"}, "forced": False},
            {"node": "gpu-01", "when": NOW - 60 * DAY, "who": "old", "why": "long ago",
             "result": "ok", "forced": True},
            {"node": "gpu-07", "when": NOW - DAY / 2, "who": "eve", "why": "try",
             "result": "refused: gpu-07 still fails its checks", "forced": False,
             "resumed": False}]  # fmt: skip


def sample_page() -> str:
    return R.render_html(sample_rows(), sample_drains(), sample_resumes(), window_days=30,
                         now=NOW, total_nodes=12)  # fmt: skip


# ------------------------------------------------------------------------------ content


def test_page_is_self_contained_and_has_no_script():
    html = sample_page()
    page = Page(html)
    assert html.startswith("<!DOCTYPE html>")
    assert "style" in page.tags and "script" not in page.tags and "img" not in page.tags
    assert "link" not in page.tags and "iframe" not in page.tags
    # No attribute that loads or runs anything: no src, no event handler, no URL anywhere.
    assert not [a for a, _ in page.attrs if a == "src" or a.startswith("on") or a == "href"]
    assert "http://" not in html and "https://" not in html and "url(" not in html


def test_hostile_reasons_and_notes_are_text():
    html = sample_page()
    assert SCRIPT not in html and "<img" not in html
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt; &amp; more" in html
    text = Page(html).all_text
    assert SCRIPT in text  # shown to the reader exactly as written
    assert ADMIN_REASON in text


def test_drained_section_offenders_and_timeline():
    html = sample_page()
    text = Page(html).all_text
    drained = html.split('id="drained"')[1].split('id="offenders"')[0]
    assert drained.index("gpu-07") < drained.index("gpu-09")  # RMA candidate first
    assert "RMA candidate" in drained and A.ADMIN in Page(drained).all_text
    assert "alice (other)" in text and "root (gpugate)" in text
    offenders = html.split('id="offenders"')[1].split('id="timeline"')[0]
    assert "gpu-07" in offenders and "gpu.ecc \u00d73" in offenders
    assert "gpu-03" in offenders and "ib.ports \u00d71, pcie.link \u00d71" in offenders
    assert "gpu-05" not in offenders  # its drains are older than the window
    timeline = html.split('id="timeline"')[1]
    assert timeline.count("<tr>") == 8  # header + 5 drains + 1 resume + 1 refused in 30 days
    assert "resume refused</td>" in timeline and "by eve: try" in timeline
    assert "by bob: reseated" in timeline and "check result: ok" in timeline
    assert "/ev/4242/gpu-07-r0" in timeline and "long ago" not in timeline
    assert '<div class="card" id="drained-card"><b>2</b>drained</div>' in html
    assert '<div class="card" id="nodes-card"><b>12</b>nodes</div>' in html


def test_repeat_offenders_order_and_threshold():
    since = NOW - 30 * DAY
    got = R.repeat_offenders(sample_drains(), since)
    assert [(o["node"], o["drains"]) for o in got] == [("gpu-07", 3), ("gpu-03", 2)]
    assert got[0]["checks"] == {"gpu.ecc": 3}
    assert R.repeat_offenders(sample_drains(), since, min_drains=3)[0]["node"] == "gpu-07"


def test_timeline_is_newest_first_and_capped():
    events = R.timeline(sample_drains(), sample_resumes(), NOW - 30 * DAY, limit=3)
    assert [e["event"] for e in events] == ["refused", "drain", "resume"]
    assert events[0]["when"] >= events[1]["when"] >= events[2]["when"]


def test_empty_page_says_so():
    page = Page(R.render_html([], [], [], now=NOW)).all_text
    assert "No drained nodes." in page and "No drains or resumes in the window." in page


# ---------------------------------------------------------------------------------- CLI


@pytest.fixture
def site(tmp_path, monkeypatch):
    state = tmp_path / "state"
    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {state}\nevidence_dir: {tmp_path / 'ev'}\n")
    monkeypatch.setenv("GPUGATE_CONFIG", str(cfg))
    doc = json.loads(fixture("22.05/sinfo.drained.json"))
    doc["nodes"][0]["reason"] = REASON
    (tmp_path / "sinfo.json").write_text(json.dumps(doc))
    import time

    for days in (3, 2, 1):
        H.record_drain(str(state), "vm", REASON, when=time.time() - days * DAY)
    H.record_resume(str(state), "vm", who="carol", why=f"tested {SCRIPT}", result="ok")
    return tmp_path


def test_cli_writes_the_page(site, capsys):
    out = site / "report.html"
    assert cli.main(["report", "--html", str(out), "--sinfo-json", str(site / "sinfo.json")]) == 0
    assert "1 drained node(s)" in capsys.readouterr().out
    html = out.read_text()
    assert SCRIPT not in html and "carol" in html and "vm" in html
    assert oct(os.stat(out).st_mode & 0o777) == "0o644"


def test_cli_without_slurm_still_writes_the_history(site, capsys, monkeypatch):
    runner = FakeRunner().fail(("sinfo", "--json"), status="timeout", rc=None)
    monkeypatch.setattr(A, "cli_backend", lambda config=None: CliBackend(runner=runner))
    out = site / "report.html"
    assert cli.main(["report", "--html", str(out)]) == 1
    assert "cannot list Slurm's nodes" in capsys.readouterr().err
    text = Page(out.read_text()).all_text
    assert "cannot list Slurm's nodes" in text and "carol" in text


def test_cli_requires_html(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["report"])
    assert exc.value.code == 2


# ------------------------------------------------------------------------------ browser


def chromium() -> str:
    """The chromium binary; installs Debian's package when missing (root with apt only)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and this is not root with apt-get "
                    "(apt-get install chromium)")  # fmt: skip
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"],
                 ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]):  # fmt: skip
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            pytest.skip(f"could not install chromium: {' '.join(argv)}: {res.stderr[-500:]}")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get installed chromium but it is not on PATH")
    return found


def headless(binary: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    argv = [binary, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", f"--user-data-dir={profile}", *args]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_chromium_renders_what_the_admin_needs(tmp_path):
    binary = chromium()
    page = tmp_path / "report.html"
    page.write_text(sample_page())
    res = headless(binary, tmp_path, "--dump-dom", page.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    dom = Page(res.stdout)
    text = dom.all_text
    # The browser built no script or image from the hostile text, and shows it as text.
    assert "script" not in dom.tags and "img" not in dom.tags
    assert SCRIPT in text and ADMIN_REASON in text
    for name in ("gpu-07", "gpu-09", "gpu-03"):
        assert name in text
    assert "2 drained" in text and "12 nodes" in text and "RMA candidate" in text
    assert "gpu.ecc \u00d73" in text
    shot = tmp_path / "report.png"
    res = headless(binary, tmp_path, "--window-size=1280,1400", f"--screenshot={shot}",
                   page.as_uri())  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a page, not a blank

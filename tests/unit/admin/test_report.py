"""`gpugate report`: the page's content, escaping of hostile reasons and notes, repeat
offenders, the timeline, the CLI, and what headless Chromium shows of it.

Chromium comes from Debian's `chromium` package: installed here when missing and this is root
with apt-get; otherwise the browser test is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from collections import Counter

import pytest
from factories import make_bundle, make_decision
from report_page import (
    DAY,
    REASON,
    SCRIPT,
    Page,
    section,
    site,
)
from slurm_recorded import FakeRunner

from gpugate import cli
from gpugate.admin import charts as C
from gpugate.admin import nodes as A
from gpugate.admin import report as R
from gpugate.admin.losses import Bundle, Requeue
from gpugate.slurm.cli import CliBackend
from gpugate.slurm.records import NodeInfo
from gpugate.store.entries import AuditEntry, DrainEntry, HeldEntry

__all__ = ["site"]  # the fixture, from tests/support/report_page.py

NOW = 1_790_000_000.0
ADMIN_REASON = 'IT-77 "><img src=x onerror=alert(1)> & more'


def sample_rows() -> list[A.NodeRow]:
    nodes = [
        NodeInfo(name="gpu-07", state="IDLE", flags=("DRAIN",), reason=REASON, reason_user="root",
                 reason_time=int(NOW - DAY)),
        NodeInfo(name="gpu-09", state="MIXED", flags=("DRAIN",), reason=ADMIN_REASON,
                 reason_user="alice", reason_time=int(NOW - 2 * DAY)),
    ]  # fmt: skip
    drains = sample_drains()
    return A.node_rows(A.as_groups(nodes), drains, "/ev", now=NOW, drained_only=True)


def sample_drains() -> list[DrainEntry]:
    return [DrainEntry.from_json(e) for e in [
        {"node": "gpu-07", "when": NOW - 20 * DAY, "check": "gpu.ecc", "reason": REASON},
        {"node": "gpu-07", "when": NOW - 9 * DAY, "check": "gpu.ecc", "reason": REASON,
         "bundle": "/ev/4242/gpu-07-r0"},
        {"node": "gpu-07", "when": NOW - DAY, "check": "gpu.ecc", "reason": REASON},
        {"node": "gpu-03", "when": NOW - 3 * DAY, "check": "pcie.link", "reason": "gpugate: pcie.link: x8"},
        {"node": "gpu-03", "when": NOW - 2 * DAY, "check": "ib.ports", "reason": "gpugate: ib.ports: down"},
        {"node": "gpu-05", "when": NOW - 40 * DAY, "check": "gpu.ecc", "reason": "gpugate: gpu.ecc: old"},
        {"node": "gpu-05", "when": NOW - 50 * DAY, "check": "gpu.ecc", "reason": "gpugate: gpu.ecc: old"},
    ]]  # fmt: skip


def sample_resumes() -> list[AuditEntry]:
    return [AuditEntry.from_json(e) for e in [{"node": "gpu-03", "when": NOW - DAY, "who": "bob", "why": f"reseated {SCRIPT}",
             "result": {"status": "ok"}, "forced": False},
            {"node": "gpu-01", "when": NOW - 60 * DAY, "who": "old", "why": "long ago",
             "result": "ok", "forced": True},
            {"node": "gpu-07", "when": NOW - DAY / 2, "who": "eve", "why": "try",
             "result": "refused: gpu-07 still fails its checks", "forced": False,
             "resumed": False}]]  # fmt: skip


def sample_costs() -> list[Bundle]:
    def run(job, restart, node, category, gpus, failed_ago, lost_h, ckpt=None):
        failed = NOW - failed_ago
        return make_bundle(job, node, restart, category=category, gpus=gpus,
                           start=failed - 5 * 3600, failed=failed, checkpoint=ckpt,
                           requeued=ckpt is not None, gpu_hours=gpus * lost_h,
                           lost_from=failed - lost_h * 3600, from_checkpoint=ckpt is not None,
                           href=f"../ev/{job}/{node}-r{restart}/")  # fmt: skip

    return [run("4242", 0, "gpu-07", "gpu_xid_hardware", 8, 9 * DAY, 2.0, "/ck/step-90"),
            run("4242", 0, "gpu-08", "gpu_xid_hardware", 8, 9 * DAY, 2.0, "/ck/step-90"),
            run("4300", 0, "gpu-03", "nccl_timeout", 4, 2 * DAY, 5.0),
            run("4301", 1, "gpu-11", SCRIPT, 2, DAY, 1.0)]  # fmt: skip


def sample_requeues() -> list[Requeue]:
    return [make_decision(NOW - 9 * DAY + 60, job="4242", restarts=0, requeue=True,
                          why="infrastructure failure (gpu_xid_hardware)",
                          category="gpu_xid_hardware", suspects=["gpu-07"],
                          checkpoint="/ck/step-90"),
            make_decision(NOW - DAY + 60, job="4301", restarts=1, requeue=False,
                          why=f"not an infrastructure failure ({SCRIPT})",
                          checkpoint=None)]  # fmt: skip


def sample_held() -> list[HeldEntry]:
    return [HeldEntry(node="gpu-12", when=NOW - 3 * DAY, check="ib.ports",
                      reason="gpugate: ib.ports: mlx5_1 down", why=f"budget 2/2 {SCRIPT}")]  # fmt: skip


def sample_page() -> str:
    return R.render_html(sample_rows(), sample_drains(), sample_resumes(), window_days=30,
                         now=NOW, total_nodes=12, held=sample_held(), costs=sample_costs(),
                         requeues=sample_requeues())  # fmt: skip


# ------------------------------------------------------------------------------ content


def test_page_is_self_contained_and_has_no_script():
    html = sample_page()
    page = Page(html)
    assert html.startswith("<!DOCTYPE html>")
    assert "style" in page.tags and "script" not in page.tags and "img" not in page.tags
    assert "link" not in page.tags and "iframe" not in page.tags
    # No attribute that loads or runs anything: no src, no event handler, no URL anywhere;
    # the only links are relative paths to bundle directories.
    assert not [a for a, _ in page.attrs if a == "src" or a.startswith("on")]
    hrefs = [v for a, v in page.attrs if a == "href"]
    assert hrefs and all(v.startswith("../ev/") and ":" not in v for v in hrefs)
    assert "http://" not in html and "https://" not in html and "url(" not in html


def test_failures_and_gpu_hours_by_cause():
    html = sample_page()
    part = section(html, "failures")
    assert part.count('<svg class="chart hbars"') == 2 and "How" not in part
    assert "GPU-hours lost = the job&#x27;s GPUs on the node" in part  # how it is computed
    rows = Page(part.split("<table>")[1]).text
    # By GPU-hours: the Xid job's 2 nodes x 8 GPUs x 2 h = 32, then 4 x 5 = 20, then 2.
    assert rows[4:] == ["gpu_xid_hardware", "2", "32.0", "59%", "nccl_timeout", "1", "20.0",
                        "37%", SCRIPT, "1", "2.0", "4%"]  # fmt: skip
    assert '<div class="card" id="GPU-hours-card"><b>54.0</b>GPU-hours lost</div>' in html
    assert '<div class="card" id="failures-card"><b>4</b>failures in 30 days</div>' in html


def test_runs_requeues_and_held_sections():
    html = sample_page()
    runs = section(html, "runs")
    assert runs.count("<tr>") == 5 and '<a href="../ev/4242/gpu-07-r0/">' in runs
    assert runs.count("(checkpoint)") == 2 and runs.count("(run start)") == 2
    requeues = Page(section(html, "requeues")).all_text
    assert "requeued infrastructure failure (gpu_xid_hardware)" in requeues
    assert "/ck/step-90" in requeues and "not requeued" in requeues and SCRIPT in requeues
    held = Page(section(html, "held")).all_text
    assert "gpu-12 ib.ports gpugate: ib.ports: mlx5_1 down" in held and SCRIPT in held
    assert SCRIPT not in html  # every string escaped, the category and the budget's why too


def test_a_resume_point_the_controller_could_not_see_is_unknown_not_none():
    # SlurmUser=slurm: EpilogSlurmctld cannot look as the job's user; the TaskProlog picks it.
    events = [make_decision(NOW, job="77", restarts=0, requeue=True, why="x", checkpoint=None,
                            ckpt_dir="/ck/run7"),
              make_decision(NOW, job="78", restarts=0, requeue=True, why="x",
                            checkpoint=None)]  # fmt: skip
    rows = Page(R.requeues_section(events)).all_text
    assert "unknown: the newest complete checkpoint in /ck/run7, picked by the job's" in rows
    assert "unknown: no checkpoint directory in the job's comment" in rows
    assert "no checkpoint" not in rows.replace("no checkpoint directory", "")


def test_drills_stay_out_of_the_drain_chart_and_card():
    # Two drills' drains in the window, one marked by its id, one by its reason's DRILL mark.
    drills = [DrainEntry(node="gpu-09", when=NOW - 4 * DAY, check="kernel.xid", drill="d1",
                         reason="gpugate: DRILL d1: kernel.xid: Xid 79"),
              DrainEntry(node="gpu-09", when=NOW - 4 * DAY + 60, check="kernel.xid",
                         reason="gpugate: DRILL 20261201-101500: kernel.xid: Xid 79")]  # fmt: skip
    page = R.render_html(sample_rows(), sample_drains() + drills, sample_resumes(),
                         window_days=30, now=NOW, total_nodes=12)  # fmt: skip
    plain = sample_page()
    assert '<div class="card" id="drains-card"><b>5</b>drains in 30 days</div>' in page
    assert '<div class="card" id="drill-card"><b>2</b>drill drains</div>' in page
    record = section(page, "record")
    assert "kernel.xid" not in record and record.count('class="seg"') == 5
    chart = section(plain, "record").split('<div class="charts">')[1].split("</div>")[0]
    assert chart in record  # the very chart of the page without the drills
    assert "not counted here, in the chart or in the drains card" in record
    assert "gpu-09" in Page(section(page, "timeline")).all_text  # the timeline keeps them


def test_drain_and_repeat_charts():
    html = sample_page()
    record = section(html, "record")
    assert record.count('<svg class="chart stacked"') == 1
    # Five drains in the window on five days, by three checks: one segment each.
    assert record.count('class="seg"') == 5 and "gpu.ecc" in record and "ib.ports" in record
    repeats = section(html, "offenders")
    assert repeats.count('<svg class="chart vbars"') == 1
    assert "<title>1: 0</title>" in repeats and "<title>2: 1</title>" in repeats  # gpu-03 twice
    assert "<title>3: 1</title>" in repeats  # gpu-07 three times


def test_bundle_href_is_relative_and_quoted(tmp_path):
    href = R.bundle_href(str(tmp_path / "ev:x y"), "42/gpu-01-r0", str(tmp_path / "www"))
    assert href == "../ev%3Ax%20y/42/gpu-01-r0/"


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
    # header + 5 drains + 1 resume + 1 refused + 1 held back in 30 days
    assert timeline.count("<tr>") == 9
    assert "resume refused</td>" in timeline and "by eve: try" in timeline
    assert "by bob: reseated" in timeline and "check result: ok" in timeline
    assert "/ev/4242/gpu-07-r0" in timeline and "long ago" not in timeline
    assert '<div class="card" id="drained-card"><b>2</b>drained</div>' in html
    assert '<div class="card" id="nodes-card"><b>12</b>nodes</div>' in html


def test_repeat_offenders_order_and_threshold():
    since = NOW - 30 * DAY
    got = R.repeat_offenders(sample_drains(), since)
    assert [(o.node, o.drains) for o in got] == [("gpu-07", 3), ("gpu-03", 2)]
    assert got[0].checks == {"gpu.ecc": 3}
    assert R.repeat_offenders(sample_drains(), since, min_drains=3)[0].node == "gpu-07"


def test_timeline_is_newest_first_and_capped():
    events = R.timeline(sample_drains(), sample_resumes(), NOW - 30 * DAY, limit=3)
    assert [e.event for e in events] == ["refused", "drain", "resume"]
    assert events[0].entry.when >= events[1].entry.when >= events[2].entry.when


def test_empty_page_says_so():
    page = Page(R.render_html([], [], [], now=NOW)).all_text
    assert "No drained nodes." in page and "No drains or resumes in the window." in page


# ---------------------------------------------------------------------------------- CLI


def test_cli_writes_the_page(site, capsys):
    out = site / "report.html"
    assert cli.main(["report", "--html", str(out), "--sinfo-json", str(site / "sinfo.json")]) == 0
    assert "1 drained node(s)" in capsys.readouterr().out
    html = out.read_text()
    assert SCRIPT not in html and "carol" in html and "vm" in html
    assert oct(os.stat(out).st_mode & 0o777) == "0o644"


def test_cli_reads_bundles_and_requeues(site, capsys):
    import time

    from gpugate.clock import utc
    from gpugate.store.evidence import write_bundle

    start = time.time() - 3 * 3600
    summary = {"node": "vm", "restart": 0, "category": "nccl_timeout", "gpus": [0, 1],
               "job_start": utc(start), "first_failure_at": utc(start + 2 * 3600)}  # fmt: skip
    write_bundle(str(site / "ev"), "77", "vm", 0, {}, summary)
    event = {"time": utc(start + 2 * 3600 + 60), "hook": "epilog-slurmctld", "job": "77",
             "restarts": 0, "requeue": True, "why": "infrastructure failure (nccl_timeout)",
             "checkpoint": "/nowhere/step-9"}  # fmt: skip
    (site / "state" / "events.jsonl").write_text(json.dumps(event) + "\n")
    (site / "www").mkdir()
    out = site / "www" / "report.html"
    assert cli.main(["report", "--html", str(out), "--sinfo-json", str(site / "sinfo.json")]) == 0
    html = out.read_text()
    assert '<a href="../ev/77/vm-r0/"><code>77/vm-r0</code></a>' in html
    runs = Page(section(html, "runs")).all_text
    assert "nccl_timeout 2" in runs and "(run start) 4.0" in runs  # no checkpoint seen: 2 x 2 h
    assert "/nowhere/step-9" in Page(section(html, "requeues")).all_text


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


@pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`
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
    # What a person sees: every section's heading, the five charts, the bundle links.
    for heading in ("Drained nodes", "Job failures and GPU-hours lost by cause",
                    "Failed runs and their evidence", "Requeue decisions",
                    "Drains the budget held back", "Repeat offenders", "Timeline"):  # fmt: skip
        assert heading in dom.text
    assert dom.tags.count("svg") == 4 and "rect" in dom.tags
    titles = {"Failures by cause", "GPU-hours lost by cause", "Drains per day by check",
              "Nodes by repeat count"}  # fmt: skip
    assert titles <= set(dom.text)
    assert dom.tags.count("a") == 4
    shot = tmp_path / "report.png"
    res = headless(binary, tmp_path, "--window-size=1280,3000", "--hide-scrollbars",
                   f"--screenshot={shot}", page.as_uri())  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    width, height, pixels = read_png(shot.read_bytes())
    assert (width, height) == (1280, 3000)
    # The charts were drawn: enough pixels in the charts' own colours (no other part of the
    # page uses them), the first series' blue in the bar charts, the second in the stack.
    found = colour_counts(pixels, [C.colour(0), C.colour(1)])
    assert found[C.colour(0)] > 2000 and found[C.colour(1)] > 100, found
    assert sum(1 for p in pixels if p != (255, 255, 255)) > 50_000  # a page, not a blank


def read_png(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(width, height, RGB pixels) of an 8-bit RGB/RGBA non-interlaced PNG (stdlib zlib only)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, b"", b""
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + size]
        pos += 12 + size
        head = chunk if kind == b"IHDR" else head
        idat += chunk if kind == b"IDAT" else b""
    width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", head)
    assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    prev, pixels = bytearray(stride), []
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels += [tuple(line[x : x + 3]) for x in range(0, stride, bpp)]
        prev = line
    return width, height, pixels


def colour_counts(pixels: list[tuple[int, int, int]], colours: list[str]) -> dict[str, int]:
    """How many pixels are (within a small tolerance, for colour management) each colour."""
    want = {c: tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in colours}
    counts = dict.fromkeys(colours, 0)
    for p, n in Counter(pixels).items():
        for name, rgb in want.items():
            if all(abs(p[i] - rgb[i]) <= 6 for i in range(3)):
                counts[name] += n
    return counts

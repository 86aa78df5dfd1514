"""gpugate.text: terminal controls and bidi characters made visible at every output edge."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpugate.text import dumps, is_printable, printable

HOSTILE = "ok\x1b[2J\u202edrah\x07\x08\x9b\u2066\u200f\u061c\u2028"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("a\u202eb", "a\\u202eb"),
        ("bell\x07 bs\x08 del\x7f csi\x9b", "bell\\x07 bs\\x08 del\\x7f csi\\x9b"),
        ("\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069", "\\u202a\\u202b\\u202c\\u202d\\u2066\\u2067\\u2068\\u2069"),
        ("\u200e\u200f\u061c", "\\u200e\\u200f\\u061c"),
        ("line\nnext\r\t", "line\\nnext\\r\\t"),
        ("name\udcff", "name\\udcff"),  # a non-UTF-8 byte under surrogateescape
        ("plain ASCII, ünïcödé, 模型 stay", "plain ASCII, ünïcödé, 模型 stay"),
        (None, ""),
        (42, "42"),
    ],
)  # fmt: skip
def test_printable_makes_every_control_visible(raw, shown):
    assert printable(raw) == shown
    assert is_printable(shown)


def test_multiline_keeps_newlines_and_tabs_only():
    assert printable("a\tb\nc\x1b[0m\r", multiline=True) == "a\tb\nc\\x1b[0m\\r"


def test_the_result_can_always_be_written_as_utf8():
    printable(HOSTILE + "\udc80").encode("utf-8")  # no UnicodeEncodeError


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_dumps_never_emits_raw_controls(ensure_ascii):
    text = dumps({"name": HOSTILE + "\x7f"}, ensure_ascii=ensure_ascii, indent=1)
    assert is_printable(text.replace("\n", " "))
    assert json.loads(text) == {"name": HOSTILE + "\x7f"}  # the data itself is kept exactly


def test_import_is_cheap():
    code = "import sys; import gpugate.text; print(sorted(m for m in ('json', 'yaml', 'unicodedata') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- every output edge (issue 11, point 6) -----------------------------------------------------
# The same hostile text through each printer: an ESC sequence (clear screen), an OSC title
# sequence ending in BEL, and a bidi override (shows what follows reversed).

EVIL = "\x1b[2J\x1b]0;owned\x07\u202eevil"


def assert_no_raw(text: str) -> None:
    for c in ("\x1b", "\u202e", "\x07", "\x9b"):
        assert c not in text, f"raw {c!r} in output"


def test_check_json_and_table_with_a_hostile_process_name(tmp_path, capsys):
    from factories import make_facts

    from gpugate.checks.facts import GpuProcess
    from gpugate.cli import main
    from gpugate.yamlio import dump_yaml

    proc = GpuProcess(pid=4242, name="python" + EVIL, used_memory_mib=100)
    snap = tmp_path / "s.yaml"
    snap.write_text(dump_yaml(make_facts(gpus={0: {"processes": (proc,)}}).to_dict()))
    assert main(["check", "--config", "/dev/null", "--facts", str(snap), "--json"]) == 1
    out = capsys.readouterr().out
    assert_no_raw(out)
    [finding] = [f for f in json.loads(out)["findings"] if f["check"] == "gpu.processes"]
    assert "python" + EVIL in finding["message"]  # the data survives, escaped in transit
    assert main(["check", "--config", "/dev/null", "--facts", str(snap)]) == 1
    out = capsys.readouterr().out
    assert_no_raw(out)
    assert "\\x1b[2J" in out and "\\u202eevil" in out  # visible, so the admin sees the attempt


def test_diagnose_text_and_json_with_hostile_log_lines(tmp_path, capsys):
    from gpugate.cli import main

    log = tmp_path / f"job{EVIL}.out"
    log.write_text(f"step 1\ntorch.OutOfMemoryError: CUDA out of memory. {EVIL}\n")
    assert main(["diagnose", str(log)]) == 0
    out = capsys.readouterr().out
    assert "cuda_oom" in out and "\\u202e" in out
    assert_no_raw(out)
    assert main(["diagnose", "--json", str(log)]) == 0
    out = capsys.readouterr().out
    assert_no_raw(out)
    assert json.loads(out)["category"] == "cuda_oom"
    assert main(["diagnose", str(tmp_path / f"missing{EVIL}")]) == 2
    assert_no_raw(capsys.readouterr().err)


def test_nodes_table_and_json_with_a_hostile_reason(tmp_path, monkeypatch, capsys):
    from admin_site import gpugate_sinfo

    from gpugate.cli import main

    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nevidence_dir: {tmp_path / 'ev'}\n")
    monkeypatch.setenv("GPUGATE_CONFIG", str(cfg))
    saved = tmp_path / "sinfo.json"
    saved.write_text(gpugate_sinfo(f"broken by {EVIL}\x7f"))
    assert main(["nodes", "--sinfo-json", str(saved)]) == 0
    out = capsys.readouterr().out
    assert_no_raw(out)
    assert "\x7f" not in out and "\\u202eevil" in out
    assert main(["nodes", "--sinfo-json", str(saved), "--json"]) == 0
    out = capsys.readouterr().out
    assert_no_raw(out)
    assert "\x7f" not in out
    assert json.loads(out)["nodes"][0]["reason"] == f"broken by {EVIL}\x7f"


def test_report_html_with_a_hostile_reason():
    from gpugate.admin import nodes as A
    from gpugate.admin import report as R
    from gpugate.slurm.records import NodeInfo
    from gpugate.store.entries import DrainEntry

    now = 1_790_000_000.0
    reason = f"gpugate: gpu.ecc: {EVIL} <b>"
    n = NodeInfo(name="gpu-07", state="IDLE", flags=("DRAIN",), reason=reason,
                 reason_user="root", reason_time=int(now - 60))  # fmt: skip
    rows = A.node_rows(A.as_groups([n]), [], "/ev", now=now, drained_only=True)
    drains = [DrainEntry(node="gpu-07", when=now - 60, check="gpu.ecc", reason=reason)]
    html = R.render_html(rows, drains, [], window_days=30, now=now, total_nodes=1)
    assert_no_raw(html)
    assert "\\u202eevil &lt;b&gt;" in html


def test_decisive_txt_in_the_bundle_holds_no_raw_controls(tmp_path):
    from epilog_setup import job_run

    oom = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB."
    result, _, _ = job_run(tmp_path, f"step 10\n{oom} {EVIL}\n")
    assert result.bundle and result.category == "cuda_oom"
    with open(os.path.join(result.bundle, "decisive.txt"), encoding="utf-8") as fh:
        decisive = fh.read()
    assert "CUDA out of memory" in decisive and "\\u202eevil" in decisive
    assert_no_raw(decisive)


def test_evidence_text_with_hostile_summary_and_file_names():
    from gpugate.commands.evidence import FIELDS, render

    item = dict.fromkeys(FIELDS)
    item.update(job_id="9", node="gpu-01", why=f"exit {EVIL}\nsecond", summary_text=EVIL,
                path="/ev/9/gpu-01-r0", files=[f"logs/job{EVIL}.out"])  # fmt: skip
    text = render("gpu-01", [item])
    assert_no_raw(text)
    assert "exit \\x1b[2J" in text and "\\nsecond" in text and "logs/job\\x1b" in text


def test_checkpoint_cli_with_a_hostile_file_name(tmp_path, capsys):
    import zipfile

    from gpugate.cli import main

    d = tmp_path / "run"
    d.mkdir()
    name = f"ckpt{EVIL}_3.pt"
    with zipfile.ZipFile(d / name, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    (d / f"ckpt{EVIL}_4.pt").write_bytes(b"junk")
    assert main(["checkpoint", "latest", str(d)]) == 0
    out, err = capsys.readouterr()
    assert_no_raw(out + err)
    assert out == f"{d}/ckpt\\x1b[2J\\x1b]0;owned\\x07\\u202eevil_3.pt\n"
    assert "shown escaped" in err and "--json" in err and "skipped" in err
    assert main(["checkpoint", "latest", str(d), "--json"]) == 0
    out = capsys.readouterr().out
    assert_no_raw(out)
    assert json.loads(out)["path"] == str(d / name)  # exact in JSON
    assert main(["checkpoint", "list", str(d)]) == 0
    assert_no_raw(capsys.readouterr().out)

"""gpugate.text: terminal controls and bidi characters made visible at every output edge."""

from __future__ import annotations

import json
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

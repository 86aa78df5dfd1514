"""`gpugate report`'s page read back: its sections and text, and the site a report reads."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from slurm_recorded import fixture

from gpugate.store import history as H

DAY = 86400.0


SCRIPT = "<script>alert('pwned')</script>"


REASON = f"gpugate: gpu.ecc: GPU3 aggregate uncorrected ECC 120 > 100 {SCRIPT}"


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


def section(html: str, name: str) -> str:
    """The page from `<h2 id="name">` to the next heading."""
    return html.split(f'<h2 id="{name}">')[1].split("<h2 ")[0]


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site in tmp_path: config, a recorded sinfo.json with a hostile reason, drains on vm."""
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

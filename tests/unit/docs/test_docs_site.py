"""The README a newcomer reads first and the docs site beside it (issue 42, deliver 4).

`make docs` (CI's "docs" stage) builds the site with `mkdocs build --strict`, which checks the
links inside docs/. What it cannot see is checked here, without MkDocs: the README's length and
links (the README is not a page of the site), and that every page under docs/ is in the nav.
"""

from __future__ import annotations

import re
from pathlib import Path

import paths
import pytest

REPO = paths.ROOT
README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """Python-Markdown's toc anchor for a heading (what GitHub makes of it too, for these)."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move the detail into docs/"


@pytest.mark.parametrize("target", sorted(set(LINK.findall(README.read_text()))))
def test_each_readme_link_leads_somewhere(target):
    assert not target.startswith(("http:", "https:", "/")), target
    path, _, anchor = target.partition("#")
    assert (REPO / path).is_file(), target
    assert not anchor or anchor in _anchors(REPO / path), target


def test_every_page_under_docs_is_in_the_nav():
    nav = set(
        re.findall(r"^\s*- (?:[^:\n]+: )?(\S+\.md)$", (REPO / "mkdocs.yml").read_text(), re.M)
    )
    pages = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert pages == nav

"""The check pages of the docs site (docs/checks/, tools/gen_check_pages.py): one per check,
equal to what the generator writes from the registry, the catalogue and config/gpugate.yaml."""

from __future__ import annotations

import importlib.util
import re

import paths
import pytest

from gpugate.checks.registry import registered

REPO = paths.ROOT


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_check_pages", REPO / "tools/gen_check_pages.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_the_committed_pages_are_what_the_generator_writes():
    """A page edited by hand, or a check, catalogue entry or config comment changed without
    `make docs`, shows here."""
    stale = [path for path, text in gen.render().items() if (REPO / path).read_text() != text]
    assert not stale, f"stale (run `make docs` and commit): {stale}"


def test_every_check_has_its_page_and_no_page_is_left_over():
    pages = {p.stem for p in (REPO / "docs/checks").glob("*.md")} - {"index"}
    assert pages == set(registered())
    index = (REPO / "docs/checks/index.md").read_text()
    for cid in registered():
        assert f"[`{cid}`]({cid}.md)" in index, cid
        assert (REPO / f"docs/checks/{cid}.md").read_text().splitlines()[2] == f"# {cid}"


def test_the_catalogue_names_exactly_the_registered_checks():
    import yaml

    words = yaml.safe_load((REPO / "docs/checks/catalogue.yaml").read_text())["checks"]
    assert sorted(words) == sorted(registered())
    for cid, entry in words.items():
        assert set(entry) == {"what", "keys", "default", "source"}, cid
        assert all(isinstance(v, str) and v for v in entry.values()), cid


@pytest.mark.parametrize(
    ("check_id", "keys"),
    [
        # an alias (`cfg = ctx.config.checks.gpu`) read inside a nested function
        ("gpu.temperature", ["checks.gpu.temperature_max_c", "checks.gpu.temperature_warn_c"]),
        # a read in a helper of the same module, and a list of records
        ("host.mounts", ["sources.required_mounts", "checks.host.fsync_ms_max"]),
        # a method called on a setting (`xid_actions.get`) and keys the catalogue names
        ("kernel.xid", ["checks.kernel.app_xid_jobs_min", "checks.kernel.xid_actions"]),
    ],
)
def test_a_page_lists_the_settings_its_check_reads(check_id, keys):
    text = (REPO / f"docs/checks/{check_id}.md").read_text()
    listed = re.findall(r"^\| `([\w.]+)` \| `", text, re.M)
    assert set(keys) <= set(listed), listed


def test_a_comment_is_found_above_its_key_and_shared_by_a_sibling_it_names():
    text = "a:\n  # the first two\n  x_max: 1\n  x_min: 2\n  other: 3\n\n  # own\n  b: {}\n"
    assert gen.yaml_comments(text) == {
        "a": "", "a.x_max": "the first two", "a.x_min": "the first two", "a.other": "",
        "a.b": "own",
    }  # fmt: skip


def test_the_nav_lists_every_check_page():
    """mkdocs.yml's check pages are the generator's (its markers hold one line per check)."""
    text = (REPO / "mkdocs.yml").read_text()
    listed = re.findall(r"^\s*- ([\w.]+): checks/\1\.md$", text, re.M)
    assert listed == list(gen.in_catalog_order(registered()))

"""The end-to-end harness's hook modes (tests/slurm/gpugate_site.py), without a Slurm.

GPUGATE_E2E_HOOKS=installed writes /etc/gpugate/hook.env for the installed package's hooks:
only inside .ci/second-slurm's throwaway root, never on a host (whose gpugate it would
reconfigure). The checkout's mode writes plain `NAME=value` lines, the README's spelling.
"""

from __future__ import annotations

import sys

import paths
import pytest

sys.path.insert(0, str(paths.SLURM_HARNESS))

import gpugate_site


def test_the_checkout_is_the_default_mode(monkeypatch):
    monkeypatch.delenv(gpugate_site.HOOKS_MODE_VAR, raising=False)
    assert not gpugate_site.installed_hooks()
    monkeypatch.setenv(gpugate_site.HOOKS_MODE_VAR, "checkout")
    assert not gpugate_site.installed_hooks()


def test_installed_mode_refuses_a_host_without_the_throwaway_marker(monkeypatch, tmp_path):
    monkeypatch.setenv(gpugate_site.HOOKS_MODE_VAR, "installed")
    monkeypatch.setattr(gpugate_site, "THROWAWAY_MARKER", tmp_path / "no-marker")
    with pytest.raises(RuntimeError, match="only in the throwaway root"):
        gpugate_site.installed_hooks()


def test_installed_mode_needs_the_installed_wrappers(monkeypatch, tmp_path):
    monkeypatch.setenv(gpugate_site.HOOKS_MODE_VAR, "installed")
    (tmp_path / "marker").touch()
    monkeypatch.setattr(gpugate_site, "THROWAWAY_MARKER", tmp_path / "marker")
    monkeypatch.setattr(gpugate_site, "INSTALLED_HOOKS", tmp_path / "libexec")
    with pytest.raises(RuntimeError, match="the package is not installed"):
        gpugate_site.installed_hooks()
    (tmp_path / "libexec").mkdir()
    for hook in gpugate_site.HOOKS:
        (tmp_path / "libexec" / f"gpugate-{hook}").touch()
    assert gpugate_site.installed_hooks()


def test_a_mistyped_mode_is_an_error_not_the_default(monkeypatch):
    monkeypatch.setenv(gpugate_site.HOOKS_MODE_VAR, "instaled")
    with pytest.raises(RuntimeError, match="expected 'installed' or 'checkout'"):
        gpugate_site.installed_hooks()


def test_hook_env_lines_are_plain_as_the_readme_writes_them(tmp_path):
    site = gpugate_site.Site.__new__(gpugate_site.Site)  # no user, no chmod: the text only
    site.base, site.config = tmp_path, tmp_path / "gpugate.yaml"
    site.state = tmp_path / "state"
    text = site.hook_env_text(slurm_conf="/srv/slurm/slurm.conf")
    assert text.splitlines() == [
        f"GPUGATE_CONFIG={tmp_path / 'gpugate.yaml'}",
        f"GPUGATE_CACHE_DIR={tmp_path / 'cache'}",
        f"GPUGATE_FALLBACK_STATE_DIR={tmp_path / 'state'}",
        "SLURM_CONF=/srv/slurm/slurm.conf",
    ]

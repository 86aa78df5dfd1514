"""The version a build gets (packaging/version.sh), and the shape every version has."""

from __future__ import annotations

import os
import subprocess

import paths

REPO = str(paths.ROOT)


VERSION_SH = os.path.join(REPO, "packaging", "version.sh")


# <pyproject version>+git<count>.<YYYYMMDD>.<hash>[.dirty], or the plain version without git.
VERSION_RE = r"\d+\.\d+\.\d+(\+git\d+\.\d{8}\.[0-9a-f]{7,}(\.dirty)?)?"


def build_version(env: dict[str, str] | None = None, script: str = VERSION_SH) -> str:
    """What packaging/version.sh prints for this checkout now (a build's version)."""
    done = subprocess.run([script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()

"""What the labelled-corpus tests share: the scan engines to run and how a label reads."""

from __future__ import annotations

import shutil

ENGINES = ["python"] + (["grep"] if shutil.which("grep") else [])


def optional_int(text: str) -> int | None:
    """An empty label means null."""
    return int(text) if text.strip() else None

"""Checkpoint files on disk: PyTorch's zip layout, aged as a test needs."""

from __future__ import annotations

import os
import pickle
import time
import zipfile
from pathlib import Path

HOUR = 3600.0


def torch_zip(path: Path, state: dict | None = None, payload: bytes = b"\x01" * 256) -> Path:
    """A file laid out like torch.save's ZIP (stored members, data.pkl first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps(state or {"w": 1}, protocol=2))
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/data/0", payload)
        z.writestr("archive/version", b"3\n")
    return path


def set_age(root: Path, seconds: float = HOUR) -> None:
    """Make everything under `root` (symlinks themselves, not their targets) `seconds` old."""
    when = time.time() - seconds
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (when, when), follow_symlinks=False)

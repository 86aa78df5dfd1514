"""The guide's "Try it without GPUs" recipe (docs/guide/snapshots.md, once in the README),
followed as written (issue 40, deliver 5).

Its first block runs with bash in a temporary directory (DIR and CONF pointed there, nothing of
the host's /etc touched); the gres.conf it gives Slurm must name exactly the devices that block
made, in the form tests/slurm/localslurm.py gives the end-to-end clusters.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import paths
import pytest

REPO = paths.ROOT


def recipe() -> tuple[str, str]:
    """(the shell block, the gres.conf block) of the guide's section."""
    text = (REPO / "docs" / "guide" / "snapshots.md").read_text()
    section = text.split("## Try it without GPUs\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    shell = next(body for lang, body in blocks if lang == "sh")
    gres = next(body for lang, body in blocks if lang == "" and "gres.conf" in body)
    return shell, gres


def run_shell(tmp_path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    shell, _ = recipe()
    shell = re.sub(r"^DIR=\S+", f"DIR={tmp_path / 'try'}", shell, count=1, flags=re.M)
    shell = re.sub(r"^CONF=\S+", f"CONF={config}", shell, count=1, flags=re.M)
    assert f"DIR={tmp_path / 'try'}" in shell and f"CONF={config}" in shell  # never the host's
    env = {**os.environ, "GPUGATE_CONFIG": str(config),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
    env.pop("SLURMD_NODENAME", None)
    return subprocess.run(["bash", "-euc", shell], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="the recipe runs mknod, as root")
def test_the_recipe_runs_as_written_and_checks_ok(tmp_path):
    config = tmp_path / "gpugate.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    done = run_shell(tmp_path, config)
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.startswith("gpu-07: OK"), done.stdout
    snapshot = tmp_path / "try" / "snapshots" / "gpu-07.yaml"
    assert "node: gpu-07\n" in snapshot.read_text()
    assert f"facts_file: {tmp_path / 'try'}/snapshots/{{node}}.yaml" in config.read_text()
    # Slurm's side: every File= the gres.conf names is a character device the block made.
    _, gres = recipe()
    assert "AutoDetect=off" in gres and "GresTypes=gpu" in gres
    line = next(ln for ln in gres.splitlines() if ln.startswith("NodeName=gpu-07 Name=gpu"))
    files = line.split("File=", 1)[1].replace("/var/tmp/gpugate-try", str(tmp_path / "try"))
    glob = re.fullmatch(r"(.*)\[(\d+)-(\d+)\]", files)
    assert glob, files
    head, first, last = glob.groups()
    made = [Path(f"{head}{i}") for i in range(int(first), int(last) + 1)]
    assert len(made) == 8 and all(p.is_char_device() for p in made)
    # A broken node, replayed the same way, fails the check (what the prolog would drain).
    broken = (REPO / "config" / "snapshots" / "h100-xid79.yaml").read_text()
    snapshot.write_text(re.sub(r"(?m)^node: .*", "node: gpu-07", broken))
    env = {**os.environ, "GPUGATE_CONFIG": str(config)}
    check = [str(Path(sys.executable).parent / "gpugate"), "check", "--node", "gpu-07"]
    failed = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1 and "kernel.xid" in failed.stdout

"""Every path an admin gives a command, and every state file a hook reads, is checked before it
is read: a regular file, under its cap, opened without blocking (issue 26, deliver 5).

A FIFO or `/dev/zero` named as an input used to make a command run until killed: each command
runs here in a subprocess with a timeout, so a hang fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpugate import fsutil

TIMEOUT_S = 30  # far above a refusal's cost; a command that blocks on a FIFO never ends


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "input.fifo"
    os.mkfifo(path)
    return str(path)


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site config of the tests' own (nothing of the host's /etc or /var is read)."""
    config = tmp_path / "site.yaml"
    config.write_text(site_text(tmp_path, tmp_path / "state"))
    return str(config)


def site_text(tmp_path, state) -> str:
    """Every place a command may write under `tmp_path` (never the host's)."""
    return (f"state_dir: {state}\nevidence_dir: {tmp_path / 'evidence'}\nadmin:\n"
            f"  history_dir: {tmp_path / 'hist'}\n  metrics_file: {tmp_path / 'm' / 'g.prom'}\n")  # fmt: skip


def gpugate(*argv: str, config: str | None = None) -> subprocess.CompletedProcess:
    """Run `gpugate ARGV` in a child with a timeout (a hang is a TimeoutExpired, a failure)."""
    env = dict(os.environ, GPUGATE_CACHE_DIR="")
    if config:
        env["GPUGATE_CONFIG"] = config
    return subprocess.run([sys.executable, "-m", "gpugate", *argv], capture_output=True,
                          text=True, timeout=TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)  # fmt: skip


def refused(result: subprocess.CompletedProcess, path: str, what: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert path in result.stderr and what in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_nodes_sinfo_json_refuses_what_is_no_regular_file(kind, fifo, site):
    path = fifo if kind == "fifo" else "/dev/zero"
    what = "a FIFO" if kind == "fifo" else "a character device"
    refused(gpugate("nodes", "--sinfo-json", path, config=site), path, what)


def test_report_sinfo_json_refuses_a_fifo(fifo, site, tmp_path):
    out = str(tmp_path / "report.html")
    result = gpugate("report", "--html", out, "--sinfo-json", fifo, config=site)
    refused(result, fifo, "a FIFO")


def test_diagnose_refuses_a_fifo_and_still_reads_the_others(fifo, tmp_path):
    log = tmp_path / "job.out"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    result = gpugate("diagnose", "--json", fifo, str(log))
    refused(result, fifo, "not a regular file (a FIFO)")
    assert json.loads(result.stdout)["category"] == "cuda_oom"


def test_diagnose_refuses_dev_zero(tmp_path):
    refused(gpugate("diagnose", "/dev/zero"), "/dev/zero", "a character device")


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--facts", "{fifo}"],
        ["profile", "--from", "{fifo}"],
        ["facts", "--from-nvidia-smi-xml", "{fifo}"],
        ["check", "--facts", "/dev/zero"],
        ["check", "--config", "{fifo}"],
    ],
    ids=["check-facts", "profile-from", "facts-xml", "check-dev-zero", "config"],
)
def test_file_options_refuse_what_is_no_regular_file(argv, fifo, site):
    argv = [a.replace("{fifo}", fifo) for a in argv]
    path = fifo if fifo in argv else "/dev/zero"
    config = None if "--config" in argv else site
    refused(gpugate(*argv, config=config), path, "not a regular file")


def test_a_snapshot_over_its_cap_is_refused_unread(tmp_path, site):
    from gpugate.yamlio import YAML_MAX

    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:  # sparse: costs no disk
        fh.truncate(YAML_MAX + 1)
    refused(gpugate("check", "--facts", str(big), config=site), str(big), "bigger than 64 MiB")


def test_sinfo_json_over_its_cap_is_refused(tmp_path, monkeypatch):
    from gpugate.admin import nodes

    saved = tmp_path / "sinfo.json"
    saved.write_text('{"nodes": []}' + " " * 100)
    monkeypatch.setattr(nodes, "SINFO_JSON_MAX", 64)
    with pytest.raises(ValueError, match="bigger than 64 bytes"):
        nodes.read_node_groups(None, str(saved))


# The helpers themselves.


def test_read_regular_reads_a_file_under_its_cap_and_refuses_a_bigger_one(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert fsutil.read_regular(str(path), 10) == b"x" * 10
    with pytest.raises(fsutil.FileRefused) as caught:
        fsutil.read_regular(str(path), 9)
    assert fsutil.refusal(caught.value) == f"{path}: bigger than 9 bytes; not read"


def test_open_regular_refuses_a_symlink_where_none_is_followed(tmp_path):
    target = tmp_path / "target"
    target.write_text("{}")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert fsutil.read_regular(str(link), 10) == b"{}"  # an admin's own path may be a link
    with pytest.raises(fsutil.FileRefused, match="symlink"):
        fsutil.read_regular(str(link), 10, follow=False)


def test_open_regular_never_blocks_on_a_fifo(fifo):
    # In a child: were the open to block (no O_NONBLOCK), the timeout would fail the test.
    code = ("import sys; from gpugate import fsutil\n"
            "try:\n    fsutil.open_regular(sys.argv[1])\n"
            "except fsutil.FileRefused as exc:\n    print(fsutil.refusal(exc))\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, fifo], capture_output=True, text=True,
                         timeout=TIMEOUT_S).stdout  # fmt: skip
    assert out.strip() == f"{fifo}: not a regular file (a FIFO); not read"


# State files: a FIFO in place of one hangs no hook.

STATE_READERS = {
    "healing.json": "from gpugate.store.healing import load; print(load(sys.argv[1]))",
    "kernel-log.pos": "from gpugate.store.state import load_kernel_pos as f; print(f(sys.argv[1]))",
    "jobs/77/baseline.json": "from gpugate.store.state import load_baseline as f; "
    "print(f(sys.argv[1], '77'))",
    "slurm-gres.json": "from gpugate.slurm.choose import cached_gpus as f; "
    "print(f(sys.argv[1], 'n1', lambda: 8))",
    "77/n1-r0/summary.json": "import os; from gpugate.store.evidence import read_summary as f; "
    "print(f(os.path.join(sys.argv[1], '77', 'n1-r0')))",
}
EXPECTED = {
    "healing.json": "{}",
    "kernel-log.pos": "(None, None)",
    "jobs/77/baseline.json": "None",
    "slurm-gres.json": "8",
    "77/n1-r0/summary.json": "None",
}


@pytest.mark.parametrize("name", sorted(STATE_READERS))
def test_a_fifo_in_place_of_a_state_file_hangs_nothing(name, tmp_path):
    state = tmp_path / "state"
    (state / name).parent.mkdir(parents=True)
    os.mkfifo(state / name)
    code = "import sys\n" + STATE_READERS[name]
    out = subprocess.run([sys.executable, "-c", code, str(state)], capture_output=True,
                         text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == EXPECTED[name]

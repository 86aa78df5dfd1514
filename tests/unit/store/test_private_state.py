"""Secrets stay with their owner (issue 11, point 1): gpugate's state is root's and the admin
group's; the TaskProlog's own file is the job's user's; the log holds no frame locals.

The hooks run through the real CLI on a replayed node. Tests run as root, so permissions are
asserted on st_mode/st_uid/st_gid, and where this machine lets us, by opening the files as
other uids in a child process.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from e2e import gpugate_for_job_user
from factories import make_facts, run_command
from fakes import FakeSlurm

from gpugate import log
from gpugate.cli import main
from gpugate.store import state as S
from gpugate.yamlio import dump_yaml

NODE = "gpu-node-01"
JOB_UID = 65534  # nobody: the job's user
OTHER_UID = 65533  # another user on the node

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root")


@pytest.fixture
def world(monkeypatch):
    """A directory every uid can traverse (pytest's own tmp dirs are root's 0700)."""
    top = Path(tempfile.mkdtemp(prefix="gpugate-private-"))
    os.chmod(top, 0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def make_site(top: Path, monkeypatch, broken: bool = False, extra: str = "", **env: str) -> Path:
    gpus = {3: {"ecc_aggregate_uncorrected": 120}} if broken else {}
    facts = make_facts(gpus=gpus).replace(boot_id="boot-1", kernel_log_seq=7)
    (top / f"{NODE}.yaml").write_text(dump_yaml(facts.to_dict()))
    (top / "prom").mkdir(exist_ok=True)
    site = top / "site.yaml"
    site.write_text(
        f"facts_file: {top}/{{node}}.yaml\nstate_dir: {top / 'state'}\n"
        f"evidence_dir: {top / 'ev'}\ntask_prolog:\n  nccl_debug_dir: null\n"
        f"budget:\n  settle_s: 0\nadmin:\n  metrics_file: {top / 'prom' / 'gpugate.prom'}\n" + extra
    )
    os.chmod(site, 0o644)
    values = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": NODE, "SLURM_JOB_GPUS": "2,3",
              "SLURM_JOB_UID": str(JOB_UID), "SLURM_JOB_GID": str(JOB_UID),
              "SLURM_JOB_COMMENT": f"gpugate:ckpt={top / 'ckpts'}", "PATH": "/nonexistent"}  # fmt: skip
    values.update(env)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return site


def prolog(site: Path) -> int:
    """`gpugate prolog` on `site`, Slurm faked at the adapter."""
    return run_command(["prolog", "--config", str(site)], make_slurm=lambda config: FakeSlurm())


def modes(root: Path) -> dict[str, tuple[int, int, int]]:
    """{relative path: (mode, uid, gid)} of everything under root, symlinks not followed."""
    out = {".": _st(root)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = _st(p)
    return out


def _st(p: Path) -> tuple[int, int, int]:
    st = os.lstat(p)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def expected_mode(rel: str) -> int:
    if rel == ".":
        return 0o751
    if rel == "task":
        return 0o711
    if rel.startswith("task/"):
        return 0o400
    if rel == "jobs" or (rel.startswith("jobs/") and rel.count("/") == 1):
        return 0o700
    if rel == "locks":  # root's only: a user who can open a lock file can hold it
        return 0o700
    if rel.startswith("locks/"):
        return 0o600
    if rel == "fleet":  # the budget's shared read of Slurm's nodes: root's only, no group
        return 0o700
    if rel.startswith("fleet/"):
        return 0o600
    return 0o640


def assert_private(state: Path, gid: int = 0) -> None:
    for rel, (mode, uid, file_gid) in modes(state).items():
        assert mode == expected_mode(rel), f"{rel}: {oct(mode)}"
        if rel.startswith("task/"):
            assert uid == JOB_UID, rel  # the job's user's own file
            continue
        assert uid == 0, rel
        if rel != "task" and not rel.startswith(("locks", "fleet")):  # no group access at all
            assert file_gid == gid, f"{rel}: gid {file_gid}"


def test_a_refused_prolog_and_its_epilog_leave_only_private_files(world, monkeypatch):
    site = make_site(world, monkeypatch, broken=True)
    state = world / "state"
    assert prolog(site) == 1
    log.error(str(state), "an error with a traceback", RuntimeError("x"))
    found = modes(state)
    for name in ("events.jsonl", "gpugate.log", "kernel-log.pos", "drains.jsonl",
                 "locks/history.lock", "jobs/42/baseline.json", "jobs/42/refused.json",
                 "task/42.json", "fleet/nodes.json"):  # fmt: skip
        assert name in found, name
    assert_private(state)
    # The metrics textfile is node_exporter's to read: it keeps 0644 under the hooks' umask.
    assert _st(world / "prom" / "gpugate.prom")[0] == 0o644
    monkeypatch.setenv("SLURM_JOB_EXIT_CODE2", "0:0")
    assert main(["epilog", "--config", str(state.parent / "site.yaml")]) == 0
    after = modes(state)
    assert not any(k.startswith("jobs/42") or k.startswith("task/42") for k in after)
    assert_private(state)


def test_the_admin_group_gets_the_state_and_nothing_else(world, monkeypatch):
    group = next((g for g in grp.getgrall() if g.gr_gid not in (0, JOB_UID)), None)
    if group is None:
        pytest.skip("no group besides root on this machine")
    site = make_site(world, monkeypatch, broken=True, extra=f"admin_group: {group.gr_name}\n")
    assert prolog(site) == 1
    log.error(str(world / "state"), "x")
    assert_private(world / "state", gid=group.gr_gid)


def test_a_missing_admin_group_says_so_and_keeps_the_state_roots(world, monkeypatch, capsys):
    site = make_site(world, monkeypatch, extra="admin_group: no-such-group-gpugate\n")
    assert prolog(site) == 0
    assert "admin_group 'no-such-group-gpugate' does not exist" in capsys.readouterr().err
    assert_private(world / "state")


def test_an_older_releases_world_readable_state_is_tightened(world, monkeypatch):
    state = world / "state"
    (state / "jobs" / "7").mkdir(parents=True)
    for d in (state, state / "jobs", state / "jobs" / "7"):
        os.chmod(d, 0o755)
    old = ["events.jsonl", "gpugate.log", "gpugate.2026-11-01_10-00-00_000000.log",
           "drains.jsonl", "audit.jsonl", "kernel-log.pos", "jobs/7/baseline.json"]  # fmt: skip
    for name in old:
        (state / name).write_text("{}\n")
        os.chmod(state / name, 0o644)
    site = make_site(world, monkeypatch)
    assert prolog(site) == 0
    assert_private(state)


def test_the_log_holds_no_frame_locals(tmp_path):
    def read_users_file() -> None:
        token = "hunter2-SECRET-from-a-users-file"
        fields = {"token": token}
        fields["user"]  # KeyError on a line that names both locals

    try:
        read_users_file()
    except KeyError as exc:
        log.error(str(tmp_path), "epilog: reading the job's files failed", exc)
    text = (tmp_path / "gpugate.log").read_text()
    assert "KeyError: 'user'" in text  # the plain traceback stays
    assert "read_users_file" in text
    assert "hunter2" not in text


def test_the_hooks_umask_leaves_no_world_bits_and_is_restored(tmp_path):
    from gpugate.gate.guard import run_hook

    site = tmp_path / "site.yaml"
    site.write_text(f"state_dir: {tmp_path / 'state'}\n")
    made = tmp_path / "made-by-a-library"

    def body(config) -> int:
        with open(made, "w") as fh:  # no mode given: the umask decides
            fh.write("x")
        return 0

    before = os.umask(0o022)
    try:
        assert run_hook("prolog", str(site), body) == 0
        assert os.umask(0o022) == 0o022  # restored
    finally:
        os.umask(before)
    assert _st(made)[0] == 0o640


def test_the_task_file_is_the_job_users_and_the_taskprolog_reads_it(world, monkeypatch):
    site = make_site(world, monkeypatch)
    assert prolog(site) == 0
    state = world / "state"
    path = state / "task" / "42.json"
    assert _st(path) == (0o400, JOB_UID, 0)
    assert json.loads(path.read_text())["ckpt_dir"] == str(world / "ckpts")
    baseline = json.loads((state / "jobs" / "42" / "baseline.json").read_text())
    assert "ckpt_dir" not in baseline  # the user's path is not in root's state any more


def test_a_job_without_a_checkpoint_gets_no_task_file_and_loses_a_stale_one(world, monkeypatch):
    site = make_site(world, monkeypatch, SLURM_JOB_COMMENT="")
    stale = S.save_task_file(str(world / "state"), "42", JOB_UID, {"ckpt_dir": "/old/job"})
    assert prolog(site) == 0
    assert not os.path.exists(stale)


def test_a_symlinked_task_dir_is_not_written_through(world, monkeypatch, capsys):
    elsewhere = world / "elsewhere"
    elsewhere.mkdir()
    (world / "state").mkdir()
    os.chmod(world / "state", 0o751)
    os.symlink(elsewhere, world / "state" / "task")
    site = make_site(world, monkeypatch)
    assert prolog(site) == 0
    assert list(elsewhere.iterdir()) == []
    assert "could not write the job's TaskProlog file" in capsys.readouterr().err


def test_remove_job_state_drops_baseline_and_task_file(tmp_path):
    d = str(tmp_path)
    S.ensure_job_dir(d, "9")
    (tmp_path / "jobs" / "9" / "baseline.json").write_text("{}")
    S.save_task_file(d, "9", JOB_UID, {"ckpt_dir": "/c"})
    S.remove_job_state(d, "9")
    assert not (tmp_path / "jobs" / "9").exists() and not (tmp_path / "task" / "9.json").exists()
    S.remove_job_state(d, "9")  # again: nothing to do
    S.remove_job_state(d, "../etc")  # not a job id: nothing


def _as(uid: int, code: str, **env: str) -> subprocess.CompletedProcess:
    """Python CODE as UID, with gpugate importable: the checkout and this interpreter may be
    out of that user's reach (a clone in 0700 `mktemp -d`, pyenv's under 0700 /root)."""
    if os.geteuid() != 0:
        pytest.skip("runs Python as another user: root only")
    python, user_env = gpugate_for_job_user()
    return subprocess.run([python, "-s", "-c", code], user=uid, group=uid, extra_groups=[],
                          capture_output=True, text=True, timeout=60,
                          env={**user_env, "GPUGATE_CACHE_DIR": "", **env})  # fmt: skip


READ = """
import sys
for path in sys.argv[1:] if False else {paths!r}:
    try:
        open(path, "rb").read(1)
        print("READ", path)
    except OSError as exc:
        print("DENIED", path, exc.errno)
"""


def test_other_users_cannot_read_the_state_and_the_job_user_only_their_task_file(
    world, monkeypatch
):
    if _as(OTHER_UID, "print(1)").returncode != 0:
        pytest.skip("cannot run python as another uid here")
    site = make_site(world, monkeypatch)
    assert prolog(site) == 0
    state = world / "state"
    log.error(str(state), "x")
    secrets = [str(state / n) for n in ("jobs/42/baseline.json", "events.jsonl", "gpugate.log",
                                        "kernel-log.pos")]  # fmt: skip
    task = str(state / "task" / "42.json")
    other = _as(OTHER_UID, READ.format(paths=[*secrets, task])).stdout
    assert "READ" not in other and other.count("DENIED") == len(secrets) + 1
    mine = _as(JOB_UID, READ.format(paths=[*secrets, task])).stdout
    assert f"READ {task}" in mine and mine.count("DENIED") == len(secrets)
    # Others cannot list the state either (0751 / 0711): only pass through.
    listing = _as(OTHER_UID, f"import os\nos.listdir({str(state / 'task')!r})")
    assert "PermissionError" in listing.stderr


def test_the_taskprolog_as_the_job_user_exports_the_checkpoint_dir(world, monkeypatch):
    if _as(JOB_UID, "print(1)").returncode != 0:
        pytest.skip("cannot run python as another uid here")
    site = make_site(world, monkeypatch)
    assert prolog(site) == 0
    code = "import sys\nfrom gpugate.cli import main\nsys.exit(main(['task-prolog']))"
    done = _as(JOB_UID, code, GPUGATE_CONFIG=str(site), SLURM_JOB_ID="42", SLURMD_NODENAME=NODE)
    assert done.returncode == 0, done.stderr
    assert f"export GPUGATE_CKPT_DIR={world / 'ckpts'}" in done.stdout.splitlines()


def test_a_state_dir_owned_by_a_user_gets_no_job_state_from_root(world, monkeypatch, capsys):
    """A user who made the directory first could read and replace what root writes there."""
    (world / "state").mkdir()
    os.chown(world / "state", JOB_UID, JOB_UID)
    site = make_site(world, monkeypatch, broken=True)
    assert prolog(site) == 1  # the decision stands
    assert not (world / "state" / "jobs").exists() and not (world / "state" / "task").exists()
    assert f"owned by uid {JOB_UID}, not root" in capsys.readouterr().err

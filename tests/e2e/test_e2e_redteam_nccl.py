"""Red team, end to end: the jobs' NCCL directory on a real local Slurm, as ordinary users.

Repeats two attacks of issue 25 with all the node hooks installed as the README says:

- Attack 4 (a squatted NCCL base directory): a second ordinary user creates the configured
  `task_prolog.nccl_debug_dir` first, inside a world-writable directory, 0777 and their own,
  with a directory for the victim's next job id holding a symlink `fr_rank_0` to a file of
  the victim's. The victim's job then runs and writes wherever NCCL_DEBUG_FILE and the
  flight-recorder dump prefixes point. The victim's secret must never land in the attacker's
  tree, the victim's file must be untouched, the job must still run, the node stay in service.
- Attack 9 (a user's file count stretches the epilog): a job leaves 200,000 files and a chain
  of directories deeper than Python's recursion limit in its NCCL directory. The epilog must
  end well within its deadline (the node is not drained for "Epilog error", the job ends
  normally), and the tree must be gone afterwards (the epilog's detached child removes it).

And issue 41, R7 (another user's files at PyTorch's default dump place, /tmp): a second user's
sixteen unreadable `nccl_trace_rank_!NN`, which sort first, must not keep the epilog from
reading the victim's own dump there.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import time
from pathlib import Path

import paths
import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm, ensure_user  # noqa: E402
from redteam import ATTACKER, NODE, PYTHON, as_user, node_in_service  # noqa: E402


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site([NODE])


def use_nccl_base(site: Site, base: Path) -> None:
    """Point task_prolog.nccl_debug_dir at `base` (the hooks read the config at each run)."""
    text = site.config.read_text()
    current = next(line for line in text.splitlines() if "nccl_debug_dir:" in line)
    site.config.write_text(text.replace(current, f"  nccl_debug_dir: {base}"))


def files_under(top: Path) -> dict[str, bytes]:
    """Every regular file below `top` (as root, links not followed) and its content."""
    found = {}
    for directory, _, names in os.walk(top):
        for name in names:
            path = Path(directory) / name
            if path.is_file() and not path.is_symlink():
                found[str(path.relative_to(top))] = path.read_bytes()
    return found


SQUAT = """\
import os, sys
base, victim_file, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.mkdir(base)
os.chmod(base, 0o777)
for job in range(first, first + 5):  # the next job ids: the victim's is among them
    d = os.path.join(base, str(job))
    os.mkdir(d)
    os.chmod(d, 0o777)
    for name in ("fr_rank_0", "fr_rank_1"):
        os.symlink(victim_file, os.path.join(d, name))
"""

VICTIM_JOB = """\
#!/bin/sh
# What NCCL and PyTorch do with the exported paths: NCCL expands %h and %p, PyTorch's flight
# recorder writes <prefix><rank>.
echo "NCCL_DEBUG_FILE=${{NCCL_DEBUG_FILE-unset}}"
echo "TORCH_FR_DUMP_TEMP_FILE=${{TORCH_FR_DUMP_TEMP_FILE-unset}}"
echo "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=${{TORCH_NCCL_DEBUG_INFO_TEMP_FILE-unset}}"
if [ -n "$NCCL_DEBUG_FILE" ]; then
    f=$(printf %s "$NCCL_DEBUG_FILE" | sed "s/%h/$(hostname)/; s/%p/$$/")
    echo "NCCL WARN wandb key {secret}" > "$f"
fi
for prefix in "$TORCH_FR_DUMP_TEMP_FILE" "$TORCH_NCCL_DEBUG_INFO_TEMP_FILE"; do
    [ -n "$prefix" ] && echo "flight recorder dump {secret}" > "${{prefix}}0"
done
echo "VICTIM-JOB-RAN"
"""


def test_a_squatted_nccl_base_receives_nothing_of_another_users_job(
    cluster: LocalSlurm, site: Site
):
    """Attack 4."""
    site.restore(cluster, [NODE])
    secret = f"SECRET-{secrets.token_hex(8)}"
    base = site.base / "squatted-nccl"  # in the site's base: sticky and world-writable, as /tmp
    use_nccl_base(site, base)
    victim_file = site.base / "victim-notes.txt"
    victim_file.write_text("the victim's own work\n")
    uid, gid = ensure_user()  # the cluster's job user: the victim
    os.chown(victim_file, uid, gid)
    victim_file.chmod(0o644)

    job = cluster.submit(script=VICTIM_JOB.format(secret=secret), hold=True,
                         output=str(site.base / "victim.out"), gres="gpu:8")  # fmt: skip
    as_user(ATTACKER, SQUAT, str(base), str(victim_file), str(job))
    planted = files_under(base)
    cluster.release(job)
    cluster.wait_job(job, "COMPLETED", timeout=120)
    site.wait_event("epilog", job)

    out = (site.base / "victim.out").read_text()
    assert "VICTIM-JOB-RAN" in out, out  # the victim's job still ran
    for name in ("NCCL_DEBUG_FILE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        assert f"{name}=unset" in out, out  # never pointed into the attacker's tree
    assert victim_file.read_text() == "the victim's own work\n"  # the symlink was never followed
    after = files_under(base)
    assert after == planted and not any(secret.encode() in v for v in after.values())
    assert os.lstat(base).st_uid != 0 and sorted(os.listdir(base)) == sorted(
        str(j) for j in range(job, job + 5)
    )  # root created nothing in it, removed nothing of it
    assert (
        f"job {job}: NCCL debug directory not prepared: {base}"
        in (site.state / "gpugate.log").read_text()
    )  # the prolog says so; the node was not drained for it
    node_in_service(cluster)


def test_the_hooks_say_why_they_left_the_squatted_base_alone(cluster: LocalSlurm, site: Site):
    """Attack 4: the prolog and epilog record why (gpugate.log, root's); the TaskProlog, run as
    the job's user, says on stderr why it exported no NCCL path."""
    site.restore(cluster, [NODE])
    base = site.base / "squatted-nccl-2"
    use_nccl_base(site, base)
    as_user(ATTACKER, "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)",
            str(base))  # fmt: skip
    job = cluster.submit(wrap="echo ran", output=str(site.base / "why.out"), gres="gpu:8")
    cluster.wait_job(job, "COMPLETED", timeout=120)
    site.wait_event("epilog", job)
    assert (site.base / "why.out").read_text() == "ran\n"
    logged = (site.state / "gpugate.log").read_text()
    assert f"job {job}: NCCL debug directory not prepared: {base}: owned by uid" in logged
    # What slurmstepd runs, as the job's user (Slurm itself drops the TaskProlog's stderr).
    uid, gid = ensure_user()
    proc = subprocess.run([site.hook("task-prolog")], user=uid, group=gid, extra_groups=[],
                          env={"SLURM_JOB_ID": str(job), "PATH": "/usr/bin:/bin"}, cwd="/",
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "export NCCL_DEBUG=WARN" in proc.stdout.splitlines()
    assert "NCCL_DEBUG_FILE=" not in proc.stdout and "DUMP_TEMP_FILE=" not in proc.stdout
    assert "not exported" in proc.stderr and f"{base}: owned by uid" in proc.stderr, proc.stderr
    node_in_service(cluster)


MANY_FILES = 200_000
DEPTH = 1200  # deeper than Python's recursion limit (1000)
HOARD_JOB = f"""\
#!/bin/sh
d=${{NCCL_DEBUG_FILE%/*}}
if [ -z "$NCCL_DEBUG_FILE" ] || [ ! -d "$d" ]; then
    echo "no NCCL directory: NCCL_DEBUG_FILE=${{NCCL_DEBUG_FILE-unset}}"
    exit 3
fi
{PYTHON} - "$d" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
for i in range({MANY_FILES}):
    os.close(os.open(f"f{{i}}", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
for _ in range({DEPTH}):
    os.mkdir("d", dir_fd=fd)
    sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = sub
print("hoarded", flush=True)
EOF
"""


def test_a_job_hoarding_files_in_its_nccl_directory_does_not_stretch_the_epilog(
    cluster: LocalSlurm, site: Site
):
    """Attack 9."""
    site.restore(cluster, [NODE])
    base = site.base / "nccl"
    use_nccl_base(site, base)
    job = cluster.submit(script=HOARD_JOB, output=str(site.base / "hoard.out"), gres="gpu:8")
    cluster.wait_job(job, "COMPLETED", timeout=300)
    assert "hoarded" in (site.base / "hoard.out").read_text()
    event = site.wait_event("epilog", job)
    import yaml

    deadline_s = yaml.safe_load((paths.CONFIG / "gpugate.yaml").read_text())["epilog"]["deadline_s"]
    assert event["duration_s"] < deadline_s / 3, event  # only a rename, whatever the count
    assert not os.path.lexists(base / str(job))  # set aside before the epilog ended
    node_in_service(cluster)  # no "Epilog error" drain
    deadline = time.monotonic() + 300
    while os.listdir(base) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert os.listdir(base) == [], "the set-aside tree was not removed"
    node_in_service(cluster)


# PyTorch's default dump prefix (gpugate.hooks.task_prolog.FR_DEFAULT_PREFIX): the host's real
# /tmp, which the product does not let a site move. The names here are this test's own.
DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
PLANT_UNREADABLE = """\
import os, sys
prefix, tag = sys.argv[1], sys.argv[2]
for n in range(16):  # '!' sorts before every digit: these come first in a sorted listing
    fd = os.open(f"{prefix}!{tag}{n:02d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"not yours")
    os.close(fd)
"""
DEFAULT_PLACE_JOB = f"""\
#!/bin/sh
# A job whose rank dumps at PyTorch's default place (its prefix overridden away), then fails.
{PYTHON} -c 'import pickle, sys
open(sys.argv[1], "wb").write(pickle.dumps({{"version": "2.10", "entries": []}}, protocol=4))' \\
    "{{path}}"
exit 1
"""


def test_another_users_unreadable_dumps_at_tmp_do_not_hide_the_jobs_own(
    cluster: LocalSlurm,
    site: Site,
    default_dump_place: None,
):
    """Issue 41, R7: a second user's sixteen unreadable `/tmp/nccl_trace_rank_!NN` sort first
    and used up `epilog.fr_max_dumps` (16): the victim's own dump at PyTorch's default place
    was never read. The epilog must read it (and remove it), and leave the others alone."""
    site.restore(cluster, [NODE])
    use_nccl_base(site, site.base / "nccl-r7")  # the job's own directory: an ordinary one
    tag = secrets.token_hex(4)
    rank = 9_000_000 + secrets.randbelow(999_999)  # a rank no other test dumps as
    planted = [f"{DEFAULT_PREFIX}!{tag}{n:02d}" for n in range(16)]
    mine = f"{DEFAULT_PREFIX}{rank}"
    try:
        as_user(ATTACKER, PLANT_UNREADABLE, DEFAULT_PREFIX, tag)
        job = cluster.submit(script=DEFAULT_PLACE_JOB.replace("{path}", mine),
                             output=str(site.base / "dp.out"), gres="gpu:8", no_requeue=True)  # fmt: skip
        cluster.wait_job(job, "FAILED", timeout=120)
        site.wait_event("epilog", job)
        with open(site.evidence / str(job) / f"{NODE}-r0" / "flightrec.json") as fh:
            doc = json.load(fh)
        assert [r.get("rank") for r in doc["records"]] == [rank], doc
        assert doc["errors"] == [] and doc["truncated"] is False, doc
        assert not os.path.lexists(mine)  # read, so removed from the shared /tmp
        assert all(Path(p).read_bytes() == b"not yours" for p in planted)  # untouched
    finally:
        for path in (*planted, mine):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    node_in_service(cluster)

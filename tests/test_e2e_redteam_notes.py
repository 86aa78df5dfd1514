"""Red team, end to end: the controller's "not requeued" note in a shared output directory.

Issue 41, R5: in an output directory every user may write (sticky, like /tmp or a project's
scratch), a second ordinary user pre-creates `gpugate-<J>.requeue.txt`, 0666, for the coming
job ids. The victim's opted-in job fails (not an infrastructure failure), and the controller
(SlurmUser root here, so it writes the note as the job's user) must leave that file alone:
nothing of the victim's lands in it, and the controller's event says the note was skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from e2e import Site, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm, ensure_user  # noqa: E402

NODE = "gpu-node-01"
ATTACKER = "gpugate-e2e-squat"  # a second ordinary user, besides the cluster's job user
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    site = Site(tmp_path_factory.mktemp("e2e-redteam-notes"))  # its base: 1777, like /tmp
    site.use_snapshot(NODE, "h100-healthy")
    return site


@pytest.fixture(scope="module")
def cluster(site: Site):
    with site.cluster([NODE], slurm_user="root") as c:  # a root controller writes notes
        yield c


PLANT = """\
import os, sys
out, first = sys.argv[1], int(sys.argv[2])
for job in range(first, first + 5):  # the next job ids: the victim's is among them
    path = os.path.join(out, f"gpugate-{job}.requeue.txt")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    os.fchmod(fd, 0o666)
    os.close(fd)
"""


def controller_event(site: Site, job: int, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in site.events()
                 if e["hook"] == "epilog-slurmctld" and e.get("job") == str(job)]  # fmt: skip
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no epilog-slurmctld decision for job {job}: {site.events()[-3:]}")


def test_a_note_file_planted_by_another_user_gets_nothing(cluster: LocalSlurm, site: Site):
    site.restore(cluster, [NODE])
    out = site.base / "shared-out"
    out.mkdir()
    out.chmod(0o1777)
    job = cluster.submit(wrap="echo 'CUDA error'; exit 3", hold=True, comment="gpugate:requeue",
                         output=str(out / "victim-%j.out"))  # fmt: skip
    uid, gid = ensure_user(ATTACKER)
    subprocess.run([PYTHON, "-c", PLANT, str(out), str(job)], user=uid, group=gid,
                   extra_groups=[], cwd="/", check=True, timeout=30)  # fmt: skip
    cluster.release(job)
    event = controller_event(site, job)
    note = out / f"gpugate-{job}.requeue.txt"
    assert event["requeue"] is False and event["told"] is True, event
    assert note.read_text() == "" and note.stat().st_uid == uid  # the attacker's, untouched
    said = [s for s in event["steps"] if s.startswith("note beside the job's output")]
    assert said and "skipped" in said[0] and "not the job user's" in said[0], event["steps"]
    assert f"owner uid {uid}" in said[0]

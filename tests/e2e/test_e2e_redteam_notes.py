"""Red team, end to end: the controller's "not requeued" note in a shared output directory.

Issue 41, R5: in an output directory every user may write (sticky, like /tmp or a project's
scratch), a second ordinary user pre-creates `gpugate-<J>.requeue.txt`, 0666, for the coming
job ids. The victim's opted-in job fails (not an infrastructure failure), and the controller
(SlurmUser root here, so it writes the note as the job's user) must leave that file alone:
nothing of the victim's lands in it, and the controller's event says the note was skipped.
"""

from __future__ import annotations

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm, ensure_user  # noqa: E402
from redteam import ATTACKER, NODE, as_user  # noqa: E402


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    # A root controller writes the notes as the job's user.
    return slurm_site([NODE], slurm_user="root")


PLANT = """\
import os, sys
out, first = sys.argv[1], int(sys.argv[2])
for job in range(first, first + 5):  # the next job ids: the victim's is among them
    path = os.path.join(out, f"gpugate-{job}.requeue.txt")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    os.fchmod(fd, 0o666)
    os.close(fd)
"""


def test_a_note_file_planted_by_another_user_gets_nothing(cluster: LocalSlurm, site: Site):
    site.restore(cluster, [NODE])
    out = site.base / "shared-out"
    out.mkdir()
    out.chmod(0o1777)
    job = cluster.submit(wrap="echo 'CUDA error'; exit 3", hold=True, comment="gpugate:requeue",
                         output=str(out / "victim-%j.out"))  # fmt: skip
    uid, _ = ensure_user(ATTACKER)
    as_user(ATTACKER, PLANT, str(out), str(job))
    cluster.release(job)
    event = site.wait_event("epilog-slurmctld", job, timeout=90)
    note = out / f"gpugate-{job}.requeue.txt"
    assert event["requeue"] is False and event["told"] is True, event
    assert note.read_text() == "" and note.stat().st_uid == uid  # the attacker's, untouched
    said = [s for s in event["steps"] if s.startswith("note beside the job's output")]
    assert said and "skipped" in said[0] and "not the job user's" in said[0], event["steps"]
    assert f"owner uid {uid}" in said[0]

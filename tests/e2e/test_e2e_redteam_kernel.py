"""Red team, end to end: a user's OOM-kill flood and the kernel log, on a real local Slurm.

Issue 41, R9. A job's OOM-kill loop in its own memory cgroup (a thousand kills in half a minute)
logs thousands of kernel lines:

- They overwrite the kernel's ring buffer between the prolog's read and the epilog's, and an
  Xid logged before them is gone. The reader sees it (/dev/kmsg: EPIPE, a jump in the sequence
  numbers) and the snapshot says `kernel_log_lost`; here the node's replayed snapshot carries
  what the reader records (the hooks replay snapshots in these tests: no test may touch the
  host's /dev/kmsg; the reader's own detection is unit-tested with a fake device in
  test_kernel_log_loss.py). The epilog must say it in the bundle (summary.json, decisive.txt)
  and its event, and the next prolog must not pass silently.
- Or, kept, they outnumber the Xid line they follow: the bundle's kernel.log (its newest
  `epilog.kernel_lines_max` lines) must still hold the Xid.
"""

from __future__ import annotations

import json

import pytest
import yaml
from e2e import SNAPSHOTS, Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import LocalSlurm  # noqa: E402
from redteam import NODE, node_in_service  # noqa: E402

from gpugate.store.metrics import parse_samples  # noqa: E402

XID79 = (
    "[ 4000.000000] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus."
)


def oom_kills(n: int, start: float = 4100.0) -> list[str]:
    """What mm/oom_kill.c logs for `n` kills in one memory cgroup, three lines a kill."""
    out = []
    for i in range(n):
        t = start + i * 0.027
        out += [
            f"[{t:13.6f}] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0",
            f"[{t:13.6f}] oom-kill:constraint=CONSTRAINT_MEMCG,task=python3,pid={5000 + i},uid=1001",
            f"[{t:13.6f}] Memory cgroup out of memory: Killed process {5000 + i} (python3)",
        ]
    return out


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site([NODE])


def during_the_job(site: Site, name: str, **changes: object) -> str:
    """A snapshot of the node as it will be when the job ends (`changes` over the healthy
    one), for the job to put in place: the shell line that does it."""
    facts = yaml.safe_load((SNAPSHOTS / "h100-healthy.yaml").read_text().replace(
        "gpu-node-01", NODE))  # fmt: skip
    facts.update(changes)
    path = site.snapshots / f"{name}.yaml"
    path.write_text(yaml.safe_dump(facts))
    path.chmod(0o644)
    return f"cp {path} {site.snapshots / f'{NODE}.yaml'}"


def failing_job(cluster: LocalSlurm, site: Site, name: str, line: str) -> int:
    job = cluster.submit(script=f"#!/bin/sh\n{line}\nexit 1\n", output=str(site.base / name),
                         no_requeue=True, gres="gpu:8")  # fmt: skip
    cluster.wait_job(job, "FAILED", timeout=120)
    return job


def test_records_lost_to_an_oom_flood_are_reported_not_passed(cluster: LocalSlurm, site: Site):
    site.restore(cluster, [NODE])
    healthy = yaml.safe_load((SNAPSHOTS / "h100-healthy.yaml").read_text())["kernel_log"]
    # The Xid was among the 3,599 records overwritten: only the flood's tail is left.
    lost = {"records": 3599, "after_seq": 812, "resumed_seq": 4412,
            "resumed_at": "2026-12-06T10:00:27.000000Z"}  # fmt: skip
    swap = during_the_job(site, "lost", kernel_log=healthy + oom_kills(40), kernel_log_lost=lost)
    job = failing_job(cluster, site, "lost.out", swap)
    event = site.wait_event("epilog", job)
    said = (
        "kernel records lost between the last check (record 812) and "
        "2026-12-06T10:00:27.000000Z (3599 overwritten in the ring buffer before they were "
        "read, e.g. by a flood of OOM kills): an Xid may be unseen"
    )
    assert event.get("kernel_log_lost") == said, event
    with open(f"{event['bundle']}/summary.json") as fh:
        assert json.load(fh)["kernel_log_lost"] == said
    with open(f"{event['bundle']}/decisive.txt") as fh:
        assert f"gpugate: kernel.xid: {said}\n" in fh.read()
    node_in_service(cluster)  # unknown: a warning by default (policy.unknown), never a drain

    # The next job's prolog sees the same loss (its position is before it): not a silent ok.
    job2 = cluster.submit(wrap="true", output=str(site.base / "next.out"), gres="gpu:8")
    cluster.wait_job(job2, "COMPLETED", timeout=120)
    prolog = site.wait_event("prolog", job2)
    assert prolog["status"] == "warn" and prolog["action"] == "warn", prolog
    samples = parse_samples(site.metrics.read_text())
    status = [v for (name, labels), v in samples.items() if name == "gpugate_check_status"
              and dict(labels).get("check") == "kernel.xid"]  # fmt: skip
    assert status and max(status) >= 1, status  # warn (or unknown), not ok
    node_in_service(cluster)


def test_an_xid_followed_by_an_oom_flood_stays_in_the_bundle(cluster: LocalSlurm, site: Site):
    site.restore(cluster, [NODE])
    healthy = yaml.safe_load((SNAPSHOTS / "h100-healthy.yaml").read_text())["kernel_log"]
    # 600 lines of OOM kills after the Xid: more than epilog.kernel_lines_max (500).
    swap = during_the_job(site, "xid-then-oom", kernel_log=[*healthy, XID79, *oom_kills(200)])
    job = failing_job(cluster, site, "xid-oom.out", swap)
    event = site.wait_event("epilog", job)
    assert event["hardware_fault"] is True and event["bundle"], event
    with open(f"{event['bundle']}/kernel.log") as fh:
        kept = fh.read().splitlines()
    # The Xid, and the newest 500 of the OOM killer's lines: each kept within its own budget.
    assert kept[0] == XID79 and len(kept) == 501, kept[:3]
    with open(f"{event['bundle']}/summary.json") as fh:
        summary = json.load(fh)
    assert summary["xid"] == 79 and summary["first_hardware_error_at"], summary

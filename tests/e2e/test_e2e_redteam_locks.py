"""Red team, end to end: issue 25's attacks 7 and 8 as an ordinary user on a real local Slurm.

The hooks are installed through Site as the README says (Prolog, Epilog, TaskProlog,
EpilogSlurmctld; `gpugate health` run as slurmd runs it). Jobs run as the ordinary user
`gpugate-e2e`.

- Attack 8 ("any user can freeze every hook on a node"), twice:
  `test_a_user_can_open_no_lock_and_flocking_what_it_can_open_stalls_no_hook`: a job tries to
  open and `flock -x` every lock file gpugate uses (gpugate.store.locks.lock_paths of this
  site's config) and is refused each one; meanwhile it holds `flock -x` on every file of
  gpugate's it can open (the metrics textfile, as the attack did with the 0644 lock beside
  it), and the next job's prolog still finishes inside its deadline, the node in service.
  `test_with_every_lock_held_by_root_the_hooks_still_finish_in_time`: the worst case a user
  can no longer cause, every lock held by root: a failing job's prolog and epilog and a
  `gpugate health` run finish inside their deadlines, the node stays in service, and the
  skipped metric updates are counted.
- Attack 7 ("gpugate turns a user's pickle into root-owned evidence"):
  `test_a_hostile_dump_leaves_no_pickle_in_the_bundle`: a plain-python job writes a
  flight-recorder dump whose pickle REDUCEs to os.system (writing a marker file) beside an
  acceptable one. The bundle holds no pickle: the refused dump only as its error and sha256,
  the accepted one as JSON; an admin who runs pickle.load over the bundle's flightrec/ folder
  (what torchfrtrace does) runs nothing, and the marker is never written.
"""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e import Site, SlurmSite, SlurmSites, slurm_or_skip

pytestmark = pytest.mark.slurm

slurm_or_skip()

from heldlock import held  # noqa: E402
from localslurm import LocalSlurm  # noqa: E402

from gpugate import fsutil  # noqa: E402
from gpugate.config import load_config  # noqa: E402
from gpugate.store.locks import lock_paths  # noqa: E402
from gpugate.store.metrics import parse_samples  # noqa: E402

NODE = "gpu-node-01"
HOLD_S = 45  # how long the user's job holds what it could flock (the attack held 150 s)
HOSTILE_RANK, GOOD_RANK = 9274, 9275  # PyTorch's default dump place: unlikely ranks


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site([NODE])


@pytest.fixture(scope="module")
def locks(site: Site, cluster: LocalSlurm) -> list[str]:
    """Every lock file of this site, made as the hooks make them (root's, 0600 in 0700)."""
    job = cluster.submit(wrap="true", output="/dev/null")  # the hooks set the state up
    cluster.wait_job(job, "COMPLETED", timeout=60)
    paths = lock_paths(load_config(str(site.config)))
    for path in paths:
        base = os.path.dirname(os.path.dirname(path))
        with fsutil.FileLock(fsutil.lock_file(base, os.path.basename(path)), wait_s=0):
            pass
    return paths


def _hook_event(site: Site, hook: str, job: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in site.events() if e["hook"] == hook and e.get("job") == str(job)]
        if found:
            return found[-1]
        time.sleep(0.3)
    raise AssertionError(f"no {hook} event for job {job}: {site.events()[-3:]}")


def _utc(text: str) -> float:
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def _slurm_time(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))  # scontrol: local time


def _in_service(cluster: LocalSlurm) -> None:
    node = cluster.node(NODE)
    assert not cluster.is_drained(NODE), node
    assert "gpugate" not in node.get("Reason", "") and "Prolog" not in node.get("Reason", ""), node


def _prolog_wall_s(site: Site, cluster: LocalSlurm, job: int) -> float:
    """From the job's start (its prolog's, PrologFlags=Alloc) to the prolog's event, which it
    writes last; whole seconds on both sides."""
    event = _hook_event(site, "prolog", job)
    return _utc(event["time"]) - _slurm_time(cluster.job_state(job)["StartTime"])


USER_JOB = """\
#!/bin/sh
/usr/bin/python3 - <<'EOF'
import fcntl, json, os, subprocess, time
locks, places, out = {locks!r}, {places!r}, {out!r}
tried = {{}}
for path in locks:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        opened = exc.strerror
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            opened = "LOCKED"
        except OSError as exc:
            opened = "opened, not locked: " + exc.strerror
    cli = subprocess.run(["flock", "-x", "-n", path, "true"], capture_output=True, text=True,
                         timeout=10)
    tried[path] = {{"open": opened, "flock_rc": cli.returncode, "flock_err": cli.stderr.strip()}}
holding = []
for place in places:
    for top, dirs, names in os.walk(place):
        for name in names:
            try:
                fd = os.open(os.path.join(top, name), os.O_RDONLY | os.O_NONBLOCK)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                holding.append(os.path.join(top, name))
            except OSError:
                pass
with open(out + ".tmp", "w") as fh:
    json.dump({{"tried": tried, "holding": holding}}, fh)
os.rename(out + ".tmp", out)
time.sleep({hold})
EOF
"""


def test_a_user_can_open_no_lock_and_flocking_what_it_can_open_stalls_no_hook(
    site: Site, cluster: LocalSlurm, locks: list[str]
):
    config = load_config(str(site.config))
    out = site.base / "attempt.json"
    places = [str(site.state), str(site.metrics.parent), str(site.evidence)]
    script = USER_JOB.format(locks=locks, places=places, out=str(out), hold=HOLD_S)
    attacker = cluster.submit(script=script, output=str(site.base / "attacker.out"))
    deadline = time.monotonic() + 60
    while not out.exists():
        assert time.monotonic() < deadline, (site.base / "attacker.out").read_text()
        time.sleep(0.3)
    report = json.loads(out.read_text())
    assert set(report["tried"]) == set(locks)
    for path, got in report["tried"].items():
        assert got["open"] == "Permission denied", (path, got)  # not even read-only
        assert got["flock_rc"] != 0 and "Permission denied" in got["flock_err"], (path, got)
    # What it could open it now holds (the metrics textfile, 0644 for node_exporter).
    assert str(site.metrics) in report["holding"], report
    # The next job, while the attacker holds all that: its prolog is not held up.
    victim = cluster.submit(wrap="true", output="/dev/null")
    cluster.wait_job(victim, "COMPLETED", timeout=60)
    assert _prolog_wall_s(site, cluster, victim) <= config.prolog.deadline_s
    assert cluster.job_state(attacker)["JobState"] == "RUNNING"  # it held all that throughout
    _in_service(cluster)
    cluster.run(["scancel", str(attacker)])
    # No lock file is left in node_exporter's directory for the next user to take.
    assert os.listdir(site.metrics.parent) == [site.metrics.name]


def test_with_every_lock_held_by_root_the_hooks_still_finish_in_time(
    site: Site, cluster: LocalSlurm, locks: list[str]
):
    config = load_config(str(site.config))
    before = parse_samples(site.metrics.read_text())
    skipped = ("gpugate_metrics_skipped_total", (("node", NODE),))
    with contextlib.ExitStack() as stack:
        for path in locks:
            stack.enter_context(held(path))
        job = cluster.submit(wrap="echo step 1; exit 3", output=str(site.base / "fail.out"))
        cluster.wait_job(job, "FAILED", timeout=60)
        epilog = _hook_event(site, "epilog", job)
        end = _slurm_time(cluster.job_state(job)["EndTime"])
        assert _utc(epilog["time"]) - end <= config.epilog.deadline_s, epilog
        assert epilog["abnormal"] is True and epilog["bundle"], epilog  # evidence written
        assert _prolog_wall_s(site, cluster, job) <= config.prolog.deadline_s
        started = time.monotonic()
        done = subprocess.run([site.hook("health")], env={**cluster.env(), "SLURMD_NODENAME": NODE},
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        assert took <= config.health.deadline_s, (took, done.stderr)
        assert "metrics not updated" in done.stderr, done.stderr
    _in_service(cluster)
    # Released: the next run folds in the updates skipped meanwhile (prolog, epilog, health).
    after_job = cluster.submit(wrap="true", output="/dev/null")
    cluster.wait_job(after_job, "COMPLETED", timeout=60)
    _hook_event(site, "epilog", after_job)
    after = parse_samples(site.metrics.read_text())
    assert after.get(skipped, 0) - before.get(skipped, 0) >= 3, after.get(skipped)
    _in_service(cluster)


class _System:
    """What the attacker pickled: unpickling it runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


GOOD_DUMP = {
    "version": "2.10",
    "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}},
    "pg_status": {"0": {"last_enqueued_collective": 2, "last_started_collective": 2,
                        "last_completed_collective": 1}},
    "entries": [{"pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 2,
                 "profiling_name": "nccl:all_reduce", "state": "started"}],
    "blob": b"\x80\x04 user bytes",
}  # fmt: skip


def test_a_hostile_dump_leaves_no_pickle_in_the_bundle(
    site: Site, cluster: LocalSlurm, default_dump_place: None
):
    marker = site.base / "pickle-ran"
    hostile = pickle.dumps({"version": "2.10", "entries": [_System(f"touch {marker}")]})
    good = pickle.dumps(GOOD_DUMP)
    for name, data in (("hostile.pkl", hostile), ("good.pkl", good)):
        (site.base / name).write_bytes(data)
        (site.base / name).chmod(0o644)
    defaults = [Path(f"/tmp/nccl_trace_rank_{r}") for r in (HOSTILE_RANK, GOOD_RANK)]
    assert not any(os.path.lexists(p) for p in defaults), "left over from an earlier run"
    script = (f"#!/bin/sh\ncp {site.base}/hostile.pkl {defaults[0]}\n"
              f"cp {site.base}/good.pkl {defaults[1]}\nexit 1\n")  # fmt: skip
    job = cluster.submit(script=script, output=str(site.base / "dump.out"), no_requeue=True)
    cluster.wait_job(job, "FAILED", timeout=60)
    bundle = Path(_hook_event(site, "epilog", job)["bundle"])
    doc = json.loads((bundle / "flightrec.json").read_text())

    (error,) = doc["errors"]  # the hostile one: its error and hash, never its bytes
    assert error["name"] == defaults[0].name and "refused" in error["error"], error
    assert error["sha256"] == hashlib.sha256(hostile).hexdigest(), error
    (record,) = doc["records"]
    assert record["sha256"] == hashlib.sha256(good).hexdigest() and record["rank"] == GOOD_RANK
    assert sorted(os.listdir(bundle / "flightrec")) == [f"{defaults[1].name}.json"]
    kept = json.loads((bundle / "flightrec" / f"{defaults[1].name}.json").read_text())
    assert kept["blob"] == {"dropped_bytes": len(GOOD_DUMP["blob"])}  # no user bytes kept
    assert kept["entries"][0]["profiling_name"] == "nccl:all_reduce"
    for path in bundle.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert hostile not in data and b"\x80\x04\x95" not in data, path  # no pickle frame
    # The admin runs PyTorch's analyzer on the folder: its loader pickle.load()s each file.
    loader = ("import os, pickle, sys\nfor n in sorted(os.listdir(sys.argv[1])):\n"
              "    try: pickle.load(open(os.path.join(sys.argv[1], n), 'rb'))\n"
              "    except Exception as e: print(n, type(e).__name__)\n")  # fmt: skip
    ran = subprocess.run([sys.executable, "-c", loader, str(bundle / "flightrec")],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "UnpicklingError" in ran.stdout, ran.stdout
    assert not marker.exists(), "the user's pickle ran"
    assert not any(os.path.lexists(p) for p in defaults)  # read, so removed from /tmp
    # gpugate evidence tells the admin the same.
    shown = subprocess.run([os.path.join(os.path.dirname(sys.executable), "gpugate"), "evidence",
                            str(job)], env={**os.environ, "GPUGATE_CONFIG": str(site.config)},
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "never unpickle a raw dump" in shown.stdout, shown.stdout
    _in_service(cluster)

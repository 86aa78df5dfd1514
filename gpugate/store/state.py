"""The node-local state directory: per-job baselines of the counters the epilog compares.

Layout under `state_dir` (root:<admin_group>, 0751; files 0640 unless said):
  jobs/                         0700: root's only
  jobs/<job id>/baseline.json   counters at prolog time (ECC, remapped rows, NVLink, PCIe, IB)
                                and the kernel lines seen (dmesg_restrict=1 hides them)
  task/                         0711 root: each user can open their own job's file, list none
  task/<job id>.json            0400, owned by the job's user: what the TaskProlog (running as
                                that user) needs from the prolog, e.g. the checkpoint directory
  kernel-log.pos                the kernel-log position the last check reached (boot id, seq)
  events.jsonl, gpugate.log     one line per hook run; errors (gpugate.log)
  controller/                   controller_dir's default: EpilogSlurmctld's own (the SlurmUser's),
                                see gpugate.store.history.controller_dir; left to its owner here
Several jobs share a node, so everything is keyed by job id and written atomically.
"""

from __future__ import annotations

import json
import os

from gpugate.fstree import remove_tree
from gpugate.fsutil import (
    PRIVATE_FILE,
    STATE_DIR_MODE,
    atomic_write,
    dir_group,
    private_dir,
    read_regular,
    tighten,
)
from gpugate.jsonrecord import JsonRecord
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

    from gpugate.checks.facts import Facts
    from gpugate.config.schema import Config

_JOB_ID = lazy(r"^[0-9]+(?:_[0-9]+)?$")


class StateError(RuntimeError):
    """The state directory or a state file is unusable."""


def job_dir(state_dir: str, job_id: str) -> str:
    """The directory of one job's state (the id is checked: it becomes a path)."""
    if not _JOB_ID.match(job_id or ""):
        raise StateError(f"not a Slurm job id: {job_id!r}")
    return os.path.join(state_dir, "jobs", job_id)


JOBS_MODE = 0o700
TASK_DIR_MODE = 0o711
TASK_FILE_MODE = 0o400
_TASK_MAX = 64 * 1024  # the task file holds a path or two; anything bigger is not ours
# The state files are read without blocking (a FIFO in their place hangs nothing) and capped:
_POS_MAX = 4096  # a boot id and a number
_BASELINE_MAX = 16 << 20  # counters of every GPU and port, 200 kernel lines, the run's record


def _private(path: str, mode: int, gid: int | None = None) -> str:
    try:
        return private_dir(path, mode, gid)
    except OSError as exc:
        raise StateError(str(exc)) from None


def ensure_state_dir(state_dir: str) -> str:
    """The state directory itself, 0751 (root:<admin group>, see secure_state_dir)."""
    return _private(state_dir, STATE_DIR_MODE, -1)  # its group is secure_state_dir's to set


def ensure_job_dir(state_dir: str, job_id: str) -> str:
    """jobs/<job id>, root's only (0700, as jobs/ is)."""
    path = job_dir(state_dir, job_id)  # checks the id first
    ensure_state_dir(state_dir)
    _private(os.path.dirname(path), JOBS_MODE)
    return _private(path, JOBS_MODE)


def admin_gid(group: str | None) -> int:
    """The admin group's id; -1 for none. StateError when the group does not exist."""
    if not group:
        return -1
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise StateError(f"admin_group {group!r} does not exist; state stays root's only") from None


def secure_state_dir(config: Config) -> list[str]:
    """Give the state (and history) directory its mode and the admin group; the problems.

    Run at each hook's start. Files take their group from their directory (fsutil.dir_group).
    A directory found readable by others (an older release wrote 0755/0644) has its files
    tightened once. Never raises: a problem here must not change what the hook decides.
    """
    if os.geteuid() != 0:
        return []  # a non-root hook (TaskProlog, EpilogSlurmctld as SlurmUser) changes nothing
    problems = []
    try:
        gid = admin_gid(config.admin_group)
    except StateError as exc:
        problems.append(str(exc))
        gid = -1
    gid = gid if gid >= 0 else 0
    places = [config.state_dir]
    history = config.admin.history_dir
    if history and history != config.state_dir:
        places.append(history)
    for place in places:
        try:
            before = os.lstat(place).st_mode & 0o7777
        except OSError:
            before = STATE_DIR_MODE
        try:
            private_dir(place, STATE_DIR_MODE, gid)
        except (OSError, ValueError) as exc:
            problems.append(f"state directory not secured: {exc}")
            continue
        if before & 0o006:  # others could read or write: an older release's modes
            tighten_tree(place, gid)
    return problems


def tighten_tree(state_dir: str, gid: int = -1) -> None:
    """Files directly in `state_dir` to 0640 and group `gid`; jobs/ and its contents to 0700/0640.

    Never follows a symlink; leaves other directories (an evidence_dir inside) to their owners.
    """

    def fix(path: str, mode: int) -> None:
        try:  # O_NONBLOCK: a FIFO someone left here must not hang the hook
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if os.fstat(fd).st_uid == 0:
                tighten(fd, mode, gid)
        finally:
            os.close(fd)

    def walk(directory: str, depth: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for e in entries:
            if e.is_symlink():
                continue
            if e.is_file():
                fix(e.path, PRIVATE_FILE)
            elif e.is_dir() and (depth > 0 or e.name == "jobs"):
                fix(e.path, JOBS_MODE)
                if depth < 2:
                    walk(e.path, depth + 1)

    walk(state_dir, 0)


def counters(facts: Facts) -> dict[str, Any]:
    """The monotonic counters and states the epilog compares against (per GPU and IB port)."""
    gpus = {}
    for g in facts.gpus or ():
        rr = g.remapped_rows
        gpus[str(g.index)] = {
            "uuid": g.uuid,
            "ecc_volatile_uncorrected": g.ecc_volatile_uncorrected,
            "ecc_volatile_corrected": g.ecc_volatile_corrected,
            "ecc_aggregate_uncorrected": g.ecc_aggregate_uncorrected,
            "ecc_aggregate_corrected": g.ecc_aggregate_corrected,
            "remapped_uncorrected": rr.uncorrected if rr else None,
            "remapped_corrected": rr.corrected if rr else None,
            "remap_pending": rr.pending if rr else None,
            "retired_pages_pending": g.retired_pages_pending,
            "pcie_replay_errors": g.pcie.replay_errors if g.pcie else None,
            "nvlink_errors": dict(g.nvlink_errors or {}),
            "nvlink_active": sum(1 for a in g.nvlink_active or () if a),
            "throttle_reasons": list(g.throttle_reasons or ()),
            "error": g.error,
        }
    ib = {
        f"{p.device}/{p.port}": dict(p.counters or {}, state=p.state)
        for p in facts.infiniband or ()
    }
    return {
        "gpus": gpus,
        "infiniband": ib,
        "boot_id": facts.boot_id,
        "kernel_log_seq": facts.kernel_log_seq,
        # The last lines seen, so that a replayed or re-read log can be compared line by line.
        "kernel_log_tail": list(facts.kernel_log or ())[-200:],
    }


def load_kernel_pos(state_dir: str) -> tuple[str | None, int | None]:
    """(boot id, sequence number) the last check reached, or (None, None)."""
    try:
        data = json.loads(read_regular(os.path.join(state_dir, "kernel-log.pos"), _POS_MAX, False))
        return data.get("boot_id"), int(data["seq"])
    # OverflowError: `"seq": Infinity`; RecursionError: `[[[[...` 100k deep.
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        OverflowError,
        RecursionError,
    ):
        return None, None


def save_kernel_pos(state_dir: str, boot_id: str | None, seq: int | None) -> None:
    """Remember how far the kernel log has been checked (atomically)."""
    if seq is None:
        return
    ensure_state_dir(state_dir)
    text = json.dumps({"boot_id": boot_id, "seq": seq})
    write_private(os.path.join(state_dir, "kernel-log.pos"), text)


def write_private(path: str, text: str) -> None:
    """atomic_write() as 0640 with the group of the file's directory (the admin group)."""
    atomic_write(path, text, PRIVATE_FILE, gid=dir_group(os.path.dirname(path)))


# ------------------------------------------------------------------------------ the baseline
# The job's baseline (`jobs/<job id>/baseline.json`): what its prolog saw and recorded of its
# run, for its epilog. Every release wrote `job_id` (and the node) with the counters; the
# run's own fields came later (`restart_count`, `known_faults`, `job_gpus`, `started_at`,
# `log_offsets`), and an absent one reads as its default: an epilog after an upgrade reads its
# prolog's older baseline. Releases before the TaskProlog's own file kept the job's `ckpt_dir`
# here; it is read, never written. Here, not in a module of its own: the prolog imports this
# one anyway (the start-up budget, gpugate/startup.py).


class KnownFault(JsonRecord):
    """A failing finding the prolog itself reported: not new since the prolog."""

    check: str
    gpu: int | None = None

    _doc: ClassVar[dict[str, str]] = {"check": "the check id", "gpu": "its GPU, or null"}


class RunRecord(JsonRecord):
    """What the prolog keeps of this run beside the counters (store/runs.py)."""

    restart_count: int = 0
    known_faults: list[KnownFault] = []
    job_gpus: list[int] | None = None
    started_at: float | None = None
    log_offsets: dict[str, int] | None = None

    _omit = frozenset({"log_offsets"})
    _doc: ClassVar[dict[str, str]] = {
        "restart_count": "the run (SLURM_JOB_RESTART_COUNT)",
        "known_faults": "the prolog's failing findings (`check`, `gpu`)",
        "job_gpus": "the job's GPUs here (SLURM_JOB_GPUS); null: not known",
        "started_at": "the prolog's clock (epoch)",
        "log_offsets": "a rerun's StdOut/StdErr sizes as it started (path -> bytes)",
    }


class Baseline(RunRecord):
    """The counters and kernel position at the prolog, with its run's record."""

    job_id: str
    node: str | None = None
    collected_at: str | None = None
    gpus: dict[str, dict[str, Any]] = {}
    infiniband: dict[str, dict[str, Any]] = {}
    boot_id: str | None = None
    kernel_log_seq: int | None = None
    kernel_log_tail: list[str] = []
    ckpt_dir: str | None = None

    _omit = frozenset({"log_offsets", "ckpt_dir"})
    _doc: ClassVar[dict[str, str]] = {
        **RunRecord._doc,
        "job_id": "the job",
        "node": "the node",
        "collected_at": "the facts' time",
        "gpus": "per GPU index: its counters (ECC, remapped rows, NVLink, PCIe replays, ...)",
        "infiniband": "per `device/port`: its counters and state",
        "boot_id": "the node's boot",
        "kernel_log_seq": "the kernel log's sequence number the prolog reached",
        "kernel_log_tail": "the last 200 kernel lines it saw",
        "ckpt_dir": "releases before the TaskProlog's file: the job's checkpoint directory "
        "(read, never written)",
    }


def save_baseline(state_dir: str, job_id: str, facts: Facts, run: RunRecord | None = None) -> str:
    """Write the job's baseline atomically (the counters, and `run`: store/runs.run_record);
    returns its path."""
    directory = ensure_job_dir(state_dir, job_id)
    run_fields = {f: getattr(run, f) for f in RunRecord._fields if f != "extra"} if run else {}
    data = Baseline(job_id=job_id, node=facts.node, collected_at=facts.collected_at,
                    **counters(facts), **run_fields)  # fmt: skip
    path = os.path.join(directory, "baseline.json")
    write_private(path, json.dumps(data.to_json(), indent=1, sort_keys=True))
    return path


def load_baseline(state_dir: str, job_id: str) -> Baseline | None:
    """The job's baseline, or None when there is none (or it is unreadable, or not one)."""
    path = os.path.join(job_dir(state_dir, job_id), "baseline.json")
    try:
        return Baseline.from_json(json.loads(read_regular(path, _BASELINE_MAX, follow=False)), path)
    except (OSError, ValueError, RecursionError):  # RecursionError: "[[[[..." 100k deep
        return None


def task_file(state_dir: str, job_id: str) -> str:
    """`task/<job id>.json`: the TaskProlog's own file for one job (the id is checked)."""
    job_dir(state_dir, job_id)  # the same check: the id becomes a path
    return os.path.join(state_dir, "task", job_id + ".json")


def save_task_file(state_dir: str, job_id: str, uid: int, data: dict[str, Any]) -> str:
    """Write the job's task file, readable by the job's user only (0400, theirs); its path.

    The directory is root's 0711: a user can open a file whose name they know, list none, and
    create nothing (so no symlink of theirs can be where root writes). Owner and mode are set
    before the name appears.
    """
    if not isinstance(uid, int) or uid < 0:
        raise StateError(f"not a user id: {uid!r}")
    path = task_file(state_dir, job_id)
    ensure_state_dir(state_dir)
    _private(os.path.dirname(path), TASK_DIR_MODE)
    atomic_write(path, json.dumps(data, sort_keys=True), TASK_FILE_MODE, uid=uid)
    return path


def load_task_file(state_dir: str, job_id: str) -> dict[str, Any] | None:
    """The job's task file (read as the job's user), or None when missing or unusable."""
    try:
        path = task_file(state_dir, job_id)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(_TASK_MAX + 1)
        data = json.loads(raw) if len(raw) <= _TASK_MAX else None
    except (OSError, ValueError, RecursionError, StateError):
        return None
    return data if isinstance(data, dict) else None


def remove_task_file(state_dir: str, job_id: str) -> None:
    """Drop the job's task file, if any (a reused job id must not find the last one's)."""
    try:
        os.unlink(task_file(state_dir, job_id))
    except (FileNotFoundError, StateError):
        pass


def remove_job_state(state_dir: str, job_id: str) -> None:
    """Drop everything the prolog kept for one job (baseline, refusal note, task file).

    For the epilog's cleanup: the evidence bundle keeps what matters. Never raises for a
    missing or already removed state.
    """
    try:
        path = job_dir(state_dir, job_id)
    except StateError:
        return
    if not os.path.islink(path):  # a symlink here is not ours: leave it, and what it names
        try:
            remove_tree(path)
        except OSError:
            pass
    try:
        remove_task_file(state_dir, job_id)
    except OSError:
        pass

"""How old the newest complete checkpoint was when a job ended, and what that age cost.

The fault-domain article asks every training job to save at least every 5 minutes
(`checkpoints.max_age_s`). The epilog measures it for jobs that declared a directory
(`--comment gpugate:ckpt=DIR`) after each abnormal end: the ends that lose work, requeues
included. A normal end loses nothing, so it is not measured (nor does it pay for a child).

The directory is the user's: it is listed by `newest_complete`, a child task running as the
job's user (userfiles.as_user), never by root, so a user's symlink cannot make root read
anything. What the child answers is untrusted and checked here (`_answer`).

- `checkpoint_age_s`: the job's end minus the checkpoint's time (its newest file's mtime).
- The work at risk: from the checkpoint, or from the run's start when the checkpoint is older
  (work before it was counted in the run before) or there is none, to the end. Its GPU-hours
  are the job's GPUs on the node times that span.
- Stale: the work at risk is longer than `max_age_s`. So a run that resumed from an old
  checkpoint and died a minute later is not blamed for the old age. A stale end gets a line
  in the bundle's decisive.txt and, when EpilogSlurmctld requeues the job, in its AdminComment
  (view_records.stale_note's line, appended by gpugate/act/plans.py requeued_notes: slurmctld
  takes no AdminComment on a job that has finished).
"""

from __future__ import annotations

import os
import time

from gpugate.checkpoints.discover import latest_complete
from gpugate.record import Record

TASK = "gpugate.checkpoints.freshness:newest_complete"  # allow-listed in gpugate/child.py

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class Freshness(Record):
    """One job end on one node: its checkpoint directory, newest complete checkpoint, age."""

    ckpt_dir: str
    max_age_s: float
    path: str | None = None
    mtime: float | None = None  # the checkpoint's time: its newest file's mtime (epoch)
    age_s: float | None = None  # end - time
    at_risk_s: float | None = None  # end - max(time, run start)
    gpu_hours: float | None = None
    stale: bool = False
    error: str | None = None


def newest_complete(ckpt_dir: str) -> dict[str, Any] | None:
    """The child task, as the job's user: the newest complete checkpoint's path and time."""

    found = latest_complete(ckpt_dir, settle_s=0)  # the job has ended: nothing is in flight
    if found is None:
        return None
    return {"path": found.path, "mtime": found.mtime, "step": found.step, "layout": found.layout}


def _answer(found: object) -> tuple[str | None, float | None]:
    """(path, time) from the child's answer; anything else is no checkpoint."""
    if not isinstance(found, dict):
        return None, None
    path, mtime = found.get("path"), found.get("mtime")
    ok = isinstance(mtime, (int, float)) and not isinstance(mtime, bool) and mtime == mtime
    when = float(mtime) if ok and isinstance(mtime, (int, float)) else None
    return (path if isinstance(path, str) else None), when


def judge(
    ckpt_dir: str,
    found: object,
    end: float,
    start: float | None,
    gpus: int | None,
    max_age_s: float,
) -> Freshness:
    """The freshness of one end from the child's answer (pure)."""
    path, when = _answer(found)
    age = max(0.0, end - when) if when is not None else None
    frm = when if when is not None else start
    if start is not None and frm is not None and start > frm:
        frm = start  # an older checkpoint's work before this run was lost in the run before
    at_risk = max(0.0, end - frm) if frm is not None else None
    hours = gpus * at_risk / 3600.0 if gpus is not None and at_risk is not None else None
    return Freshness(ckpt_dir=ckpt_dir, max_age_s=max_age_s, path=path, mtime=when, age_s=age,
                     at_risk_s=at_risk, gpu_hours=hours,
                     stale=at_risk is not None and at_risk > max_age_s)  # fmt: skip


def measure(
    ckpt_dir: str,
    uid: int | None,
    gid: int | None,
    end: float | None,
    start: float | None,
    gpus: int | None,
    max_age_s: float,
    timeout: float,
    run_as: Callable[..., object] | None = None,
) -> Freshness:
    """Look the newest complete checkpoint up as the job's user and judge it; never raises."""
    end = time.time() if end is None else end
    if not os.path.isabs(ckpt_dir):
        return Freshness(ckpt_dir=ckpt_dir, max_age_s=max_age_s,
                         error="the checkpoint directory is not an absolute path")  # fmt: skip
    if run_as is None:
        from gpugate.userfiles import as_user

        run_as = as_user
    try:
        found = run_as(uid, gid, TASK, {"ckpt_dir": ckpt_dir}, timeout)
    except Exception as exc:  # not mounted here, unreadable, timed out: say so, judge nothing
        return Freshness(ckpt_dir=ckpt_dir, max_age_s=max_age_s, error=str(exc)[:300])
    return judge(ckpt_dir, found, end, start, gpus, max_age_s)


def span(seconds: float) -> str:
    """A duration as people read it: `40 s`, `42 min`, `3.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def message(f: Freshness) -> str | None:
    """What the user is told (AdminComment, decisive.txt) when the end was stale; else None."""
    if not f.stale or f.at_risk_s is None:
        return None
    policy = f"(policy: {span(f.max_age_s)})"
    if f.age_s is None:
        return f"no complete checkpoint in {f.ckpt_dir} after {span(f.at_risk_s)} {policy}"
    return f"newest complete checkpoint was {span(f.age_s)} old at the end {policy}"

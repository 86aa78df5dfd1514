"""Find the newest complete training checkpoint under a directory.

A job that died is requeued from its latest checkpoint, and the newest checkpoint is often the
one that was being written when the job died. So each candidate is judged by its framework's
commit artefact, the thing written last (docs/gpu-facts.md 7): the ZIP central directory of a
`torch.save` file, DCP's `.metadata`, DeepSpeed's `latest`, Megatron's tracker file, the HF
Trainer's `trainer_state.json`. Only metadata and file ends are read: the time does not grow
with the size of the checkpoint.

A checkpoint whose format proves it complete is taken at once, however recently written: the
commit artefact cannot exist before the data it commits. The settle time (SETTLE_S) holds back
only what no format proves: a plain pickle judged by its last byte, or a directory whose
files cannot tell their own end.

The directory belongs to the job's user and this may run as root: a symlink that leaves the
directory is refused, files are opened with `open_regular` (no symlinks, no FIFOs), listings
are capped, and nothing is read deeper than the layout needs. Where a path component could be
swapped under us, run it as the job's user through `userfiles.as_user` (results `to_dict()`).
"""

from __future__ import annotations

import os
import struct
import time

from gpugate.checkpoints.layouts import LAYOUTS
from gpugate.checkpoints.listing import (
    MAX_ENTRIES,
    PARTIAL,
    CheckpointDirError,
    Found,
    Incomplete,
    ScanContext,
    entry_mtime,
    inside,
)
from gpugate.record import Record
from gpugate.userfiles import UserFileError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.checkpoints.layouts import Check

__all__ = [
    "SETTLE_S",
    "Checkpoint",
    "CheckpointDirError",
    "Scan",
    "find_checkpoints",
    "latest_complete",
    "scan",
]

SETTLE_S = 60.0  # an unproven checkpoint touched more recently than this may still be being written


class Checkpoint(Record):
    """One candidate: where, which layout, its step, complete or not, and why."""

    path: str
    layout: str
    step: int | None
    complete: bool
    why: str
    mtime: float


class Scan(Record):
    """The candidates looked at (newest first) and notes such as a capped listing."""

    directory: str
    checkpoints: tuple = ()
    notes: tuple = ()


# --- the public API ------------------------------------------------------------------------


def scan(
    directory: str,
    settle_s: float = SETTLE_S,
    max_entries: int = MAX_ENTRIES,
    stop_at_complete: bool = False,
    now: float | None = None,
) -> Scan:
    """Judge the checkpoints under `directory`, newest first (stopping at a complete one if asked)."""
    shown = os.path.abspath(directory)
    root = os.path.realpath(directory)
    if not os.path.exists(root):
        raise CheckpointDirError(f"{shown}: no such directory")
    if not os.path.isdir(root):
        raise CheckpointDirError(f"{shown}: not a directory")
    ctx = ScanContext(shown, root, settle_s, max_entries, time.time() if now is None else now)
    pending = []
    for layout, find in LAYOUTS:
        for name, step, check in find(ctx):
            ctx.claimed.add(name)
            pending.append((layout, name, step, check))
    # A file without a step in its name may have one in its pickle (Lightning's last.ckpt): judge
    # those first, so that every candidate has its rank before the newest-first walk.
    judged = {p[1]: _evaluate(ctx, *p) for p in pending if p[2] is None}
    pending.sort(key=lambda p: _rank_pending(ctx, judged, p), reverse=True)
    found: list[Checkpoint] = []
    paths: set[str] = set()
    for p in pending:
        cp = judged.get(p[1]) or _evaluate(ctx, *p)
        if cp.path not in paths:  # a symlink to another candidate is that candidate
            paths.add(cp.path)
            found.append(cp)
        if stop_at_complete and cp.complete:
            break
    found.sort(key=_rank, reverse=True)
    if not pending and (".metadata" in ctx.entries or "trainer_state.json" in ctx.entries):
        ctx.notes.append(f"{shown} itself looks like one checkpoint: pass the directory above it")
    return Scan(directory=shown, checkpoints=tuple(found), notes=tuple(ctx.notes))


def find_checkpoints(directory: str, settle_s: float = SETTLE_S) -> list[Checkpoint]:
    """Every checkpoint candidate under `directory`, judged, newest first."""
    return list(scan(directory, settle_s).checkpoints)


def latest_complete(directory: str, settle_s: float = SETTLE_S) -> Checkpoint | None:
    """The newest complete checkpoint under `directory`, or None."""
    found = scan(directory, settle_s, stop_at_complete=True).checkpoints
    return next((cp for cp in found if cp.complete), None)


def _rank(cp: Checkpoint) -> tuple:
    # Newest = highest step, then mtime; candidates with no known step rank below numbered ones.
    return (cp.step is not None, cp.step or 0, cp.mtime)


def _rank_pending(ctx: ScanContext, judged: dict, p: tuple) -> tuple:
    if p[1] in judged:
        return _rank(judged[p[1]])
    return (p[2] is not None, p[2] or 0, entry_mtime(ctx.entries.get(p[1])))


def _evaluate(
    ctx: ScanContext, layout: str, name: str, step: int | None, check: Check
) -> Checkpoint:
    """Run one candidate's check, then the generic in-progress rules; never raises."""
    path = os.path.join(ctx.root, name)
    shown = os.path.join(ctx.shown, name)
    entry = ctx.entries.get(name)
    mtime = entry_mtime(entry)
    try:
        if entry is not None and entry.is_symlink():
            path = inside(ctx, path)
            shown = os.path.join(ctx.shown, os.path.relpath(path, ctx.root))
        found = check(ctx, path, step)
        _settled(ctx, name, found)
    except Incomplete as exc:
        why = str(exc)
    except UserFileError as exc:
        why = str(exc).replace(ctx.root + os.sep, "")
    except OSError as exc:
        why = f"{os.path.relpath(exc.filename or path, ctx.root)}: {exc.strerror or exc}"
    # A malformed file we did not foresee: offsets past 2**63 (OverflowError in pread), a ZIP64
    # extra field shorter than it says (StopIteration), JSON nested 100k deep (RecursionError).
    except (ValueError, struct.error, OverflowError, StopIteration, RecursionError) as exc:
        why = f"not understood: {exc}"
    else:
        step = found.step if step is None else step
        return Checkpoint(
            path=shown, layout=layout, step=step, complete=True, why=found.why, mtime=found.mtime
        )
    return Checkpoint(path=shown, layout=layout, step=step, complete=False, why=why, mtime=mtime)


def _settled(ctx: ScanContext, name: str, found: Found) -> None:
    """Refuse a complete-looking checkpoint that a writer may still be working on."""
    for suffix in PARTIAL:
        if name + suffix in ctx.entries:
            raise Incomplete(f"{name}{suffix} exists: a save is in progress or was interrupted")
    if found.proven:
        return  # its commit artefact is written last: nothing of it is still being written
    age = ctx.now - found.mtime
    if age < ctx.settle_s:
        raise Incomplete(
            f"modified {age:.0f} s ago (settle time {ctx.settle_s:g} s): may still be being written"
        )


def latest_checkpoint_path(ckpt_dir: str) -> str | None:
    """The newest complete checkpoint's path under `ckpt_dir` (a child task, as the user)."""
    found = latest_complete(ckpt_dir, settle_s=0)  # the writer is gone: nothing in flight
    return found.path if found else None

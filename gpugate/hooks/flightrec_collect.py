"""The epilog's flight-recorder collection: this node's PyTorch dumps of the job, as its user.

PyTorch's flight recorder writes one dump per rank (the file is a prefix + the global rank):
into the job's NCCL directory where the TaskProlog pointed it (`<dir>/<job id>/fr_rank_<r>`),
or at PyTorch's default `/tmp/nccl_trace_rank_<r>` for a job that overrode the prefix away or
ran without the TaskProlog. The dumps are pickles the user's job wrote: they are listed,
opened (no symlink, regular files only, the job's user's own, written since the job started),
capped and parsed in the reader child that runs as the job's user, with gpugate.flightrec's
restricted reader (plain data only): never as root, never with a general unpickler. A dump it
refuses is an error entry (its error, size and sha256), never a crash, and never kept.

A dump's bytes never leave the child: a pickle in the bundle, root's and the evidence group's,
would be run as the admin by PyTorch's own analyzer (torchfrtrace calls pickle.load). What the
bundle keeps of an accepted dump is its plain data as JSON that root writes itself
(`flightrec/<name>.json`, never PyTorch's dump name), beside the records in flightrec.json.

At the shared default place (`/tmp`, every user's) a candidate is a name `<prefix><rank>`
that is this user's regular file (lstat, before anything counts against `fr_max_dumps`):
other users' files, readable or not, neither use up the cap nor cost an open (issue 41: sixteen
unreadable `nccl_trace_rank_!NN`, which sort first, kept every other job's dumps unread). The
listing of a directory stops after SCAN_MAX entries, at root's look for candidates too, so
millions of files in /tmp cost a bounded time and never the job's whole collection.

The dumps at the default location are removed once read (accepted or refused), and only those
the child read (the job's user's, written since the job started): /tmp is shared, and a leftover
`/tmp/nccl_trace_rank_0` of one user keeps another user's rank 0 from writing its own (the
sticky bit), and would be found again by that user's next job. The job's own directory goes
with the epilog's cleanup (task_prolog.remove_nccl_dir).
"""

from __future__ import annotations

import json
import os
import stat

from gpugate.flightrec.records import DumpsAnswer, FlightrecFile, Refusal
from gpugate.hooks.task_prolog import FR_DEFAULT_PREFIX, FR_PREFIX
from gpugate.store.nccl_dir import nccl_job_dir
from gpugate.store.state import StateError, job_dir
from gpugate.text import printable
from gpugate.userfiles import UserFileError, open_regular, read_fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.config.schema import Config
    from gpugate.slurm.hookenv import HookEnv
    from gpugate.store.summary import SummaryJob

TASK = "gpugate.hooks.flightrec_collect:read_dumps"
# The accepted dumps travel back as JSON: 32 MiB of it stays well inside the reader's answer
# cap (gpugate.userfiles.ANSWER_MAX, 64 MiB) with the records beside them.
KEPT_TOTAL_MAX = 32 << 20
# Entries of one directory looked at (names only; the default place's matching ones lstat'ed):
# /tmp may hold millions of files, and the reader shares the epilog's deadline.
SCAN_MAX = 100_000
BUNDLE_DIR = "flightrec"  # accepted dumps as JSON: flightrec/<safe name>.json
JSON_MEMBER = "flightrec.json"
NOTE = (
    "The flight-recorder dumps were written by the job's user: pickles, which can run any code "
    "when unpickled. gpugate read them in a restricted reader as that user and kept only "
    "their parsed plain data as JSON (flightrec/*.json; a refused dump: its error and sha256). "
    "Never unpickle a raw dump (torchfrtrace, pickle.load, torch.load): it runs the user's "
    "code as you."
)


def search_places(config: Config, job_id: str | None) -> list[list[str]]:
    """The (directory, file-name prefix) pairs where this job's dumps may be on this node."""
    places = []
    job_dir = nccl_job_dir(config, job_id)
    if job_dir:
        places.append([job_dir, FR_PREFIX])
    places.append(list(os.path.split(FR_DEFAULT_PREFIX)))
    return places


def job_started(config: Config, env: HookEnv) -> float | None:
    """When the job started here: SLURM_JOB_START_TIME (23.x+), else its prolog's baseline."""
    if env.start_time:
        return float(env.start_time)

    try:  # 22.05 has no start time: the baseline is written by this job's prolog
        return os.stat(
            os.path.join(job_dir(config.state_dir, env.job_id or ""), "baseline.json")
        ).st_mtime
    except (OSError, StateError):
        return None


def collect_dumps(config: Config, env: HookEnv, job: SummaryJob, timeout: float) -> dict[str, Any]:
    """This node's flight-recorder dumps of the job, read in the child as the job's user.

    Returns `{"records", "errors", "searched", "truncated", "kept"}`: each record tagged with
    this node; `kept` maps a bundle member name to the JSON text root wrote from an accepted
    dump's plain data (within the caps). The child's answer is read as a DumpsAnswer first: a
    malformed one is a refusal of the whole collection (`*`), as a child that failed is.
    """
    from gpugate.userfiles import UserFileError, as_user

    ep = config.epilog
    places = search_places(config, env.job_id)
    kwargs = {
        "places": places, "since": job_started(config, env), "max_dumps": ep.fr_max_dumps,
        "max_bytes": int(ep.fr_max_dump_mib * 1024 * 1024),
        "remove_from": os.path.dirname(FR_DEFAULT_PREFIX),
    }  # fmt: skip
    uid = env.uid if env.uid is not None else job.uid
    gid = env.gid if env.gid is not None else job.gid
    empty = {"records": [], "errors": [], "searched": [d + "/" + p + "*" for d, p in places]}
    if not _candidates(places):
        return {**empty, "truncated": False, "kept": {}}  # no dump: no child to start
    try:
        got = DumpsAnswer.from_json(as_user(uid, gid, TASK, kwargs, timeout), "the reader's answer")
    except (UserFileError, ValueError) as exc:
        return {**empty, "errors": [Refusal(name="*", error=str(exc)).to_json()],
                "truncated": False, "kept": {}}  # fmt: skip
    records = [dict(r, node=env.node) for r in got.records]
    errors = [e.to_json() for e in got.errors]
    kept = _rewrite(got.kept, errors)
    return {**empty, "records": records, "errors": errors, "truncated": got.truncated,
            "kept": kept}  # fmt: skip


def _rewrite(answer: dict[str, Any], errors: list[dict[str, Any]]) -> dict[str, str]:
    """Member name -> JSON text written here, by root, from the plain data the child sent.

    The child runs as the user: whatever it answered is parsed JSON, and json.dumps of it is
    JSON text again (it starts with `{`, which no unpickler accepts), never the user's bytes.
    """

    kept: dict[str, str] = {}
    for name, plain in answer.items():
        member = _member(str(name), kept)
        try:
            if not isinstance(plain, dict):
                raise ValueError("not an object")
            kept[member] = json.dumps(plain, separators=(",", ":"))
        except (ValueError, RecursionError) as exc:
            error = f"the reader sent an unusable dump: {exc}"
            errors.append(Refusal(name=str(name), error=error).to_json())
    return kept


def _member(name: str, taken: dict[str, str]) -> str:
    """`<safe name>.json`, unique among `taken` (two names may clean up alike)."""
    base = _safe(name)
    member, n = f"{base}.json", 1
    while member in taken:
        member, n = f"{base}-{n}.json", n + 1
    return member


def _candidates(places: list[list[str]]) -> bool:
    """Whether any place holds a name with its prefix (names only: root opens nothing here)."""
    return any(dump_names(directory, prefix, first=True)[0] for directory, prefix in places)


def dump_names(
    directory: str, prefix: str, limit: int | None = None, first: bool = False
) -> tuple[list[str], bool]:
    """(the names `<prefix><rank>` in `directory`, sorted; whether the listing stopped at
    `limit` entries, SCAN_MAX by default). Names only: nothing is stat'ed or opened."""
    limit = SCAN_MAX if limit is None else limit
    names: list[str] = []
    try:
        with os.scandir(directory) as entries:
            for seen, entry in enumerate(entries):
                if seen >= limit:
                    return sorted(names), True
                rank = entry.name[len(prefix) :]
                if entry.name.startswith(prefix) and rank.isascii() and rank.isdigit():
                    names.append(entry.name)
                    if first:
                        break
    except OSError:
        pass  # no directory: nothing dumped there
    return sorted(names), False


def bundle_files(flightrec: dict[str, Any] | None) -> dict[str, str | bytes]:
    """The bundle members: `flightrec.json` and the accepted dumps as `flightrec/<name>.json`."""

    if not flightrec or not (flightrec.get("records") or flightrec.get("errors")):
        return {}
    kept = flightrec.get("kept") or {}
    files: dict[str, str | bytes] = {f"{BUNDLE_DIR}/{name}": text for name, text in kept.items()}
    doc = FlightrecFile(
        records=flightrec.get("records") or [],
        errors=[Refusal.from_json(e, JSON_MEMBER) for e in flightrec.get("errors") or []],
        searched=flightrec.get("searched") or [], truncated=flightrec.get("truncated") is True,
        kept=sorted(f"{BUNDLE_DIR}/{name}" for name in kept), note=NOTE,
    )  # fmt: skip
    files[JSON_MEMBER] = json.dumps(doc.to_json(), indent=1, default=str)
    return files


def decisive_lines(flightrec: dict[str, Any] | None) -> list[str]:
    """One line per refused or unread dump, for decisive.txt (the user's text made printable)."""
    return [
        f"gpugate: flight-recorder dump {printable(str(e.get('name')))} refused: "
        f"{printable(str(e.get('error')))}"
        for e in (flightrec or {}).get("errors") or []
    ]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80].lstrip(".") or "dump"


# ---- the child's side (as the job's user) ---------------------------------------------------


def read_dumps(
    places: list[list[str]],
    since: float | None,
    max_dumps: int,
    max_bytes: int,
    remove_from: str | None = None,
    kept_total: int = KEPT_TOTAL_MAX,
) -> dict[str, Any]:
    """In the child, as the job's user: find, cap, parse (restricted) and return the dumps.

    Only regular files of this user (the child's uid: the job's), written at or after `since`,
    count; others at the shared default location are other jobs' and are skipped. JSON in,
    JSON out: an accepted dump comes back as its plain data, a refused one as an error with
    its sha256; no dump's bytes come back. The answer is a DumpsAnswer's JSON.
    """
    out: dict[str, Any] = {
        "records": [],
        "errors": [],
        "kept": {},
        "kept_bytes": 0,
        "truncated": False,
    }
    _read_places(places, since, max_dumps, max_bytes, remove_from, kept_total, out)
    return DumpsAnswer(**out).to_json()


def _read_places(
    places: list[list[str]],
    since: float | None,
    max_dumps: int,
    max_bytes: int,
    remove_from: str | None,
    kept_total: int,
    out: dict[str, Any],
) -> None:
    """read_dumps' walk over the places, into `out` (DumpsAnswer's fields)."""
    found = 0
    for directory, prefix in places:
        names, cut = dump_names(directory, prefix)
        if cut:
            out["truncated"] = True
            out["errors"].append(Refusal(name=f"{prefix}*", error=f"more than {SCAN_MAX} "
                                         "entries in the directory: the rest not looked at"))  # fmt: skip
        shared = directory == remove_from
        for name in names:
            if shared and not _mine(os.path.join(directory, name)):
                continue  # another user's (readable or not): costs no open, counts for nothing
            if found >= max_dumps:
                out["truncated"] = True
                return
            status = _read_one(os.path.join(directory, name), since, max_bytes, kept_total, out)
            found += status is not None
            if remove_from and directory == remove_from and status == READ:
                _unlink(os.path.join(directory, name))


def _mine(path: str) -> bool:
    """Whether `path` is this user's own regular file (lstat: no link followed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


READ = "read"  # _read_one: the job's dump, read (accepted or refused)
UNREAD = "unread"  # the job's candidate, not read (not a regular file, over the cap)


def _read_one(
    path: str, since: float | None, max_bytes: int, kept_total: int, out: dict[str, Any]
) -> str | None:
    """Read one candidate into `out`: READ, UNREAD, or None when it is not the job's."""

    name = os.path.basename(path)
    try:
        fd = open_regular(path)
    except UserFileError as exc:
        out["errors"].append(Refusal(name=name, error=str(exc)))
        return UNREAD
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or (since is not None and st.st_mtime < since - 1):
            return None  # another user's, or an earlier job's (mtime has whole seconds on some fs)
        if st.st_size > max_bytes:
            out["truncated"] = True
            error = f"{st.st_size} bytes, over the cap of {max_bytes} bytes; not read"
            out["errors"].append(Refusal(name=name, error=error))
            return UNREAD
        data = read_fd(fd, max_bytes)
    finally:
        os.close(fd)
    _parse(data, name, kept_total, out)
    return READ


def _parse(data: bytes, name: str, kept_total: int, out: dict[str, Any]) -> None:
    """Parse one dump with the restricted reader (gpugate.flightrec.reader) into `out`."""
    import hashlib

    from gpugate.flightrec.reader import DumpError, read_dump_kept

    digest = hashlib.sha256(data).hexdigest()
    try:
        record, plain = read_dump_kept(data, name)
    except DumpError as exc:
        error = str(exc)
    except Exception as exc:  # the reader's own bug must not lose the other dumps
        error = f"{type(exc).__name__}: {exc}"
    else:
        out["records"].append(dict(record, sha256=digest))
        size = len(json.dumps(plain))
        if out["kept_bytes"] + size <= kept_total:
            out["kept"][name] = plain
            out["kept_bytes"] += size
        else:
            out["truncated"] = True
        return
    out["errors"].append(Refusal(name=name, error=error, bytes=len(data), sha256=digest))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # left behind: the next job's epilog skips it (written before that job started)

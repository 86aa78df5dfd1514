"""Each framework's checkpoint layout: how its candidates are named and how each is judged.

A candidate is judged by its framework's commit artefact, the thing written last: the ZIP
central directory of a `torch.save` file (torchfile.py), DCP's `.metadata`, DeepSpeed's
`latest`, Megatron's tracker file, the HF Trainer's `trainer_state.json`. A layout is a finder
(which names in DIR are its candidates, and their steps) and a check per candidate; LAYOUTS
lists them in the order they claim names. discover.py walks them.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat

from gpugate.checkpoints.listing import (
    MAX_ENTRIES,
    PARTIAL,
    Found,
    Incomplete,
    ScanContext,
    dcp_marked,
    dir_entries,
    entry_mtime,
    inside,
    last_number,
    looks_dcp,
    open_in,
    read_capped,
    read_tag,
)
from gpugate.checkpoints.torchfile import read_torch, torch_in
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Set
    from typing import Any

    Check = Callable[["ScanContext", str, "int | None"], "Found"]
    Candidate = tuple[str, "int | None", Check]

_MAX_JSON = 64 << 20  # trainer_state.json grows with log_history

# --- the layouts, one finder each, tried in this order --------------------------------------
# A finder yields (name in DIR, step from the name or None, check). Earlier layouts claim their
# names: DeepSpeed's global_step dirs and Megatron's iter dirs are not mistaken for bare DCP
# directories, Lightning's `*.ckpt` directories are its own.


def _never(why: str) -> Check:
    """A check for a candidate already known to be incomplete."""

    def check(ctx: ScanContext, path: str, step: int | None) -> Found:
        raise Incomplete(why)

    return check


def _prefixed(prefix: str, check: Check, proves: bool = False) -> Check:
    """`check`, with `prefix` in front of its reason either way; `proves`: the tracker that
    names this candidate is written after all its files, so their being there is proof."""

    def wrapped(ctx: ScanContext, path: str, step: int | None) -> Found:
        try:
            found = check(ctx, path, step)
        except Incomplete as exc:
            raise Incomplete(f"{prefix}; {exc}") from None
        return found.replace(why=f"{prefix}; {found.why}", proven=found.proven or proves)

    return wrapped


def _tracked(
    ctx: ScanContext,
    tracker: str,
    tag: str | None,
    tag_step: int | None,
    problem: str | None,
    dirs: dict[str, int | None],
    check: Check,
) -> Iterator[Candidate]:
    """Candidates of a layout whose tracker file names the newest complete directory.

    DeepSpeed and Megatron write the tracker after every rank's files, so a directory newer
    than the one it names is a save that did not finish; older ones are judged on their files.
    """
    if problem:
        yield tracker, tag_step, _never(problem)
    elif tag is not None and tag not in dirs:
        yield tracker, tag_step, _never(f"{tracker} names {tag}, which does not exist")
    for name, step in dirs.items():
        if name == tag:
            yield name, step, _prefixed(f"named in {tracker}", check, proves=True)
        elif tag is None:
            yield name, step, _never(f"no {tracker} names it (it is written after the files)")
        elif step is not None and tag_step is not None and step > tag_step:
            yield (
                name,
                step,
                _never(f"newer than {tag} named in {tracker}: the save did not finish"),
            )
        else:
            yield name, step, _prefixed(f"older than {tag} named in {tracker}", check)


_DS_DIR = lazy(r"global_step(\d+)")


def _find_deepspeed(ctx: ScanContext) -> Iterator[Candidate]:
    """DeepSpeed: `latest` holds the tag (`global_step<N>`) of the newest complete save."""
    dirs: dict[str, int | None] = {n: int(m[1]) for n, m in ctx.unclaimed(_DS_DIR, "dir")}
    latest = ctx.entries.get("latest")
    if not dirs and not (latest and latest.is_file(follow_symlinks=False)):
        return
    tag, problem = read_tag(ctx.root, "latest") if latest else (None, None)
    if tag and tag in ctx.entries and tag not in ctx.claimed:
        dirs.setdefault(tag, last_number(tag))
    tag_step = last_number(tag) if tag else None
    yield from _tracked(ctx, "latest", tag, tag_step, problem, dirs, _check_deepspeed_dir)


_MEGATRON_DIR = lazy(r"iter_(\d+)")
_MEGATRON_TMP = lazy(r"(?:iter_(\d+)|release)_tmp")
_MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


def _find_megatron(ctx: ScanContext) -> Iterator[Candidate]:
    """Megatron-LM: the tracker holds the iteration (or `release`) of the newest complete save."""
    dirs: dict[str, int | None] = {n: int(m[1]) for n, m in ctx.unclaimed(_MEGATRON_DIR, "dir")}
    staging = list(ctx.unclaimed(_MEGATRON_TMP, "dir"))
    tracked = _MEGATRON_TRACKER in ctx.entries
    if not (dirs or staging or tracked):
        return
    if tracked and "release" in ctx.entries:
        dirs["release"] = None
    tag = tag_step = problem = None
    if tracked:
        text, problem = read_tag(ctx.root, _MEGATRON_TRACKER)
        if text == "release":
            tag = "release"
        elif text is not None and text.isdecimal():  # what int() takes ("²" is a digit)
            tag_step = int(text)
            tag = next((n for n, s in dirs.items() if s == tag_step), f"iter_{tag_step:07d}")
        elif text is not None:
            problem = f"{_MEGATRON_TRACKER} holds {text[:40]!r}: not an iteration or `release`"
    for name, m in staging:
        step = int(m[1]) if m[1] else None
        yield name, step, _never("staging directory (*_tmp): renamed only when the save is done")
    yield from _tracked(ctx, _MEGATRON_TRACKER, tag, tag_step, problem, dirs, _check_megatron_dir)


_HF_DIR = lazy(r"(tmp-)?checkpoint-(\d+)")


def _find_huggingface(ctx: ScanContext) -> Iterator[Candidate]:
    """Hugging Face Trainer: `checkpoint-<global_step>/`; `tmp-checkpoint-*` is a staging dir."""
    for name, m in ctx.unclaimed(_HF_DIR, "dir"):
        if m[1]:
            yield name, int(m[2]), _never("staging directory: renamed to checkpoint-N when done")
        else:
            yield name, int(m[2]), _check_huggingface


_LIGHTNING_STEP = lazy(r"step=(\d+)")


def _find_lightning(ctx: ScanContext) -> Iterator[Candidate]:
    """PyTorch Lightning: `*.ckpt` files (torch ZIPs) or directories (DCP or DeepSpeed)."""

    def step_of(name: str) -> int | None:
        # `epoch=3-step=400.ckpt`; other numbers in custom names (val_loss=0.25) are not steps.
        m = _LIGHTNING_STEP.search(name)
        return int(m[1]) if m else None

    return _find_files(ctx, (".ckpt",), step_of, _check_lightning, "any")


_TORCH_SUFFIXES = (".pt", ".pth", ".pth.tar", ".pt.tar")


def _find_torch(ctx: ScanContext) -> Iterator[Candidate]:
    """Plain `torch.save` files; the step is the last number in the name (`ckpt_1200.pt`)."""

    def step_of(name: str) -> int | None:
        stem = name[: -len(next(s for s in _TORCH_SUFFIXES if name.endswith(s)))]
        return last_number(stem)

    return _find_files(ctx, _TORCH_SUFFIXES, step_of, _check_torch_file, "file")


_ANY = lazy(r".+")


def _find_dcp(ctx: ScanContext) -> Iterator[Candidate]:
    """Any other directory holding DCP's `.metadata`, `.metadata.tmp` or `*.distcp` files."""
    for name, _ in ctx.unclaimed(_ANY, "dir"):
        path = os.path.join(ctx.root, name)
        if os.path.islink(path):
            try:
                path = inside(ctx, path)
            except (Incomplete, OSError):
                continue  # not known to be a checkpoint: a link leaving DIR is not even looked at
        if looks_dcp(ctx, path):
            yield name, last_number(name), _check_dcp


def _find_files(
    ctx: ScanContext,
    suffixes: tuple[str, ...],
    step_of: Callable[[str], int | None],
    check: Check,
    kind: str,
) -> Iterator[Candidate]:
    """File candidates by suffix; a lone `X.tmp`/`X.partial` is a save that never finished."""
    pattern = re.compile(
        "|".join(f".+{re.escape(s)}" for s in suffixes)
        + "|"
        + "|".join(f".+{re.escape(s)}{re.escape(p)}" for s in suffixes for p in PARTIAL)
    )
    for name, _ in ctx.unclaimed(pattern, kind):
        base = next((name[: -len(p)] for p in PARTIAL if name.endswith(p)), None)
        if base is None:
            yield name, step_of(name), check
        elif base not in ctx.entries:  # else the finished-looking `base` is flagged by _settled
            yield name, step_of(base), _never(f"a save that never finished ({base} missing)")


# --- checks, one per layout ----------------------------------------------------------------


def _check_torch_file(ctx: ScanContext, path: str, step: int | None) -> Found:
    """A plain `torch.save` file; a step missing from the name is looked up in its pickle."""
    keys = ("global_step", "step", "iteration") if step is None else ()
    mtime, ints, what, proven = read_torch(path, keys)
    found = next((ints[k] for k in keys if k in ints), None)
    return Found(why=what, mtime=mtime, step=found, proven=proven)


def _check_lightning(ctx: ScanContext, path: str, step: int | None) -> Found:
    """A Lightning `.ckpt`: a torch ZIP file, or a directory in DeepSpeed or DCP layout."""
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        mtime, ints, what, proven = read_torch(path, ("global_step",) if step is None else ())
        return Found(why=what, mtime=mtime, step=ints.get("global_step"), proven=proven)
    names = dir_entries(ctx, path)
    if "latest" in names:  # Lightning's DeepSpeed strategy: save_checkpoint(path, tag="checkpoint")
        tag, problem = read_tag(path, "latest")
        if problem:
            raise Incomplete(problem)
        if tag not in names or not names[tag].is_dir(follow_symlinks=False):
            raise Incomplete(f"latest names {tag}, which is not a directory here")
        found = _check_deepspeed_dir(ctx, os.path.join(path, tag), step)
        return found.replace(why=f"DeepSpeed directory, tag {tag}: {found.why}")
    if dcp_marked(names):
        return _check_dcp(ctx, path, step)
    raise Incomplete("a *.ckpt directory with neither DeepSpeed's latest nor DCP's .metadata")


def _check_dcp(ctx: ScanContext, path: str, step: int | None) -> Found:
    """torch.distributed.checkpoint: complete iff `.metadata` exists and `.metadata.tmp` not."""
    # FileSystemWriter.finish() runs after every rank's .distcp files are written: it pickles the
    # metadata into .metadata.tmp, fsyncs, and renames it to .metadata.
    meta = os.path.join(path, ".metadata")
    if os.path.lexists(meta + ".tmp"):
        raise Incomplete(".metadata.tmp present: the coordinator had not renamed it yet")
    if not os.path.lexists(meta):
        raise Incomplete("no .metadata (written in finish(), after every rank's data)")
    fd = open_in(path, ".metadata")
    try:
        st = os.fstat(fd)
        last = os.pread(fd, 1, max(0, st.st_size - 1))
    finally:
        os.close(fd)
    if last != b".":
        raise Incomplete(".metadata does not end with the pickle STOP opcode: cut short")
    # The rename is atomic and comes last: `.metadata` proves the save finished.
    why = "DCP .metadata present (written after every rank's data)"
    return Found(why=why, mtime=st.st_mtime, proven=True)


def _check_huggingface(ctx: ScanContext, path: str, step: int | None) -> Found:
    """HF Trainer: `trainer_state.json`, written after weights/optimizer/scheduler, must parse."""
    names = dir_entries(ctx, path)
    if "trainer_state.json" not in names:
        raise Incomplete("no trainer_state.json (the Trainer writes it after weights/optimizer)")
    fd = open_in(path, "trainer_state.json")
    try:
        data = read_capped(fd, _MAX_JSON)
    finally:
        os.close(fd)
    if len(data) > _MAX_JSON:
        raise Incomplete(f"trainer_state.json is larger than {_MAX_JSON >> 20} MiB: not read")
    try:
        state = json.loads(data)
    except ValueError:
        raise Incomplete("trainer_state.json is not valid JSON: cut short") from None
    global_step = state.get("global_step") if isinstance(state, dict) else None
    if global_step is not None and global_step != step:
        raise Incomplete(f"trainer_state.json says global_step {global_step}, not {step}")
    # The Trainer writes weights, optimizer and scheduler before trainer_state.json; older
    # Trainers (before 4.36) wrote the rng_state*.pth files after it, one per process. So every
    # rng state that is there must be a whole torch.save file (its ZIP end record read); one
    # not created yet is no harm (the Trainer resumes without it, with a warning).
    rng = [n for n in sorted(names) if n.startswith("rng_state") and n.endswith(".pth")]
    proven = True
    for name in rng:
        proven = torch_in(path, name)[3] and proven
    mtime = max(entry_mtime(e) for e in names.values())
    why = f"trainer_state.json parses (global_step {global_step}); {len(rng)} rng states whole"
    return Found(why=why, mtime=mtime, proven=proven)


_DS_STATES = lazy(r"(?:bf16_)?(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_(model|optim)_states\.pt")


def _check_deepspeed_dir(ctx: ScanContext, path: str, step: int | None) -> Found:
    """A DeepSpeed tag directory: model states (written first), then every ZeRO shard."""
    names = dir_entries(ctx, path)
    parsed = {n: _DS_STATES.fullmatch(n) for n in sorted(names) if n.endswith("_states.pt")}
    model = [n for n, m in parsed.items() if m and m[3] == "model"]
    if not model:
        raise Incomplete("no *mp_rank_*_model_states.pt (DeepSpeed writes the model states first)")
    mtime, world, proven = 0.0, None, True
    for name in parsed:  # every *_states.pt, layer_* and expert files included
        m_time, ints, _, whole = torch_in(
            path, name, ("dp_world_size",) if name == model[0] else ()
        )
        mtime, world = max(mtime, m_time), world or ints.get("dp_world_size")
        proven = proven and whole
    n_mp = 1 + max(int(m[2]) for m in parsed.values() if m)
    shards = 0
    for kind in ("model", "optim"):
        # ZeRO names one file per data-parallel rank (dp_world_size of them) per model-parallel
        # rank; ZeRO-3 does it for the model states too.
        grid = {(int(m[2]), int(m[1])) for m in parsed.values() if m and m[3] == kind and m[1]}
        plain = {(int(m[2]),) for m in parsed.values() if m and m[3] == kind and not m[1]}
        if grid:
            n_dp = world or 1 + max(dp for _, dp in grid)
            _require_grid(grid, [n_mp, n_dp], lambda i, k=kind: f"dp {i[1]} mp {i[0]:02d} {k}")
            shards += len(grid)
        elif plain:
            _require_grid(plain, [n_mp], lambda i: f"mp_rank_{i[0]:02d}_model_states.pt")
    source = f"dp_world_size {world} from {model[0]}" if world else "dp ranks counted"
    why = f"{len(parsed)} *_states.pt files complete, {shards} ZeRO shards ({source})"
    # Each file proves its own end; the set is proven whole only when dp_world_size says how
    # many there must be (counted ranks miss a last rank that has not created its file yet).
    # The directory `latest` names is proven by `latest` itself (see _tracked).
    return Found(why=why, mtime=mtime, proven=proven and world is not None)


_MEGATRON_RANK = lazy(r"mp_rank_(\d+)((?:_\d+){0,2})")


def _check_megatron_dir(ctx: ScanContext, path: str, step: int | None) -> Found:
    """Megatron: every mp_rank_* directory's model_optim_rng.pt, or a torch_dist `.metadata`."""
    names = dir_entries(ctx, path)
    if dcp_marked(names):
        return _check_dcp(ctx, path, step)
    ranks = {}
    for name in names:
        if _MEGATRON_RANK.fullmatch(name):
            ranks[tuple(int(x) for x in name[len("mp_rank_") :].split("_"))] = name
    if not ranks:
        raise Incomplete("no mp_rank_* directories and no torch_dist .metadata")
    mtime, tp, proven = 0.0, None, True
    for _, name in sorted(ranks.items()):
        if not names[name].is_dir(follow_symlinks=False):
            raise Incomplete(f"{name} is not a directory (symlinks are not followed)")
        # `args` is the first key of the state dict: the tensor-parallel size is near the start.
        keys = ("tensor_model_parallel_size",) if tp is None else ()
        m_time, ints, _, whole = torch_in(path, f"{name}/model_optim_rng.pt", keys)
        tp = tp or ints.get("tensor_model_parallel_size") or 0
        mtime, proven = max(mtime, m_time), proven and whole
        if os.path.lexists(os.path.join(path, name, "distrib_optim.pt")):
            m_time, _, _, whole = torch_in(path, f"{name}/distrib_optim.pt")
            mtime, proven = max(mtime, m_time), proven and whole
    lengths = {len(i) for i in ranks}
    if len(lengths) > 1:
        raise Incomplete("mp_rank_* directories are named inconsistently")
    sizes = [1 + max(i[d] for i in ranks) for d in range(lengths.pop())]
    if tp and sizes[0] > tp:
        raise Incomplete(f"mp_rank_{sizes[0] - 1:02d}: beyond tensor_model_parallel_size {tp}")
    sizes[0] = tp or sizes[0]
    _require_grid(
        set(ranks), sizes, lambda i: f"mp_rank_{i[0]:02d}" + "".join(f"_{x:03d}" for x in i[1:])
    )
    why = f"{len(ranks)} mp_rank_* directories with complete model_optim_rng.pt"
    # As for DeepSpeed: proven whole when every file proves its end and the tensor-parallel
    # size read from the files fixes how many there must be (pipeline ranks are counted, so
    # only the tracker proves a pipeline-parallel directory).
    return Found(why=why, mtime=mtime, proven=proven and bool(tp) and len(sizes) == 1)


def _require_grid(
    present: Set[tuple[int, ...]], sizes: list[int], name: Callable[..., Any]
) -> None:
    """Every rank index combination below `sizes` must be present (up to 5 missing named)."""
    import math

    total = math.prod(sizes)
    if total > 100 * MAX_ENTRIES:
        raise Incomplete(f"rank numbers {sizes} do not form a plausible grid")
    missing = [i for i in itertools.product(*map(range, sizes)) if i not in present]
    if not missing:
        return
    shown = ", ".join(name(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
    raise Incomplete(f"{len(missing)} of {total} rank files missing: {shown}")


# The layouts in the order they claim names (see the finders above).
LAYOUTS: tuple[tuple[str, Callable[[ScanContext], Iterable[Candidate]]], ...] = (
    ("deepspeed", _find_deepspeed),
    ("megatron", _find_megatron),
    ("huggingface", _find_huggingface),
    ("lightning", _find_lightning),
    ("dcp", _find_dcp),
    ("torch", _find_torch),
)

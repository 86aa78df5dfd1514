"""Ranking: from the signals collected over the logs to one root cause.

Ranking is data: `TIERS` (categories.py) orders the categories from the most specific root cause to the most
generic symptom, `FALLOUT` says which categories are mere fallout once Slurm killed the job,
and each signature's strength says whether a line proves a failure (see `signatures`). Lines of
a job's own files that claim a hardware fault are kept apart as claims, never ranked.
"""

from __future__ import annotations

import sys

from gpugate.checks import xid as X
from gpugate.diagnosis import nccl_warn
from gpugate.diagnosis import origin as O
from gpugate.diagnosis import signatures as S
from gpugate.diagnosis.categories import EXPLAIN, HARDWARE_CATEGORIES, SYMPTOM_CATEGORIES, TIERS
from gpugate.diagnosis.confidence import assess, note
from gpugate.diagnosis.verdict import LOG_FILE, Diagnosis, Evidence, FileScan, claim_text
from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Set
    from typing import Any

MINOR_TIER = 10
# Lines after Slurm's kill line (same file) in these categories are the kill's fallout.
FALLOUT = frozenset({"nccl_timeout", "nccl_error", "cuda_oom", "illegal_memory_access", "other"})
KILLS = frozenset({"slurm_time_limit", "slurm_cancelled"})
# Guesses that a scheduler's kill line (anywhere in the inputs) explains instead: a
# store/rendezvous timeout (ranks that Slurm stopped or never started); an unexplained SIGKILL
# is `other` already (outcomes.exit_outcome), the kill line's fallout.
YIELD_TO_SCHEDULER = frozenset({"c10d.store_timeout"})
SCHEDULER = KILLS | {"slurm_node_failure"}
# Xids that follow an application Xid on the same GPU as its consequence (NVIDIA's Xid
# catalog lists user-application errors among 109's causes; gpu-failure-reference.md 1.2).
CONSEQUENCE_XIDS = frozenset({109})
KEEP_PER_GROUP = 200  # signals kept per (file, signature): enough for ranks, bounded memory
EVIDENCE_MAX = 8


class Signal(Record):
    """A match at a place: (file index, line) plus what the line said."""

    file: int
    line: int
    match: S.Match

    @property
    def tier(self) -> int:
        """Where this signal ranks (see TIERS)."""
        if self.match.strength == S.MINOR:
            return MINOR_TIER
        return TIERS.get(self.match.category or "other", 0)


def is_claim(m: S.Match) -> bool:
    """Whether a line claims a hardware fault (an Xid, SXid, ECC or NVLink error, a lost GPU)."""
    return m.xid is not None or m.category in HARDWARE_CATEGORIES


class Collector:
    """Keeps a bounded sample of signals and the torchrun "Root Cause" ranks.

    Signals from the files in `untrusted` that claim a hardware fault are kept apart in
    `claims`: they are never ranked as evidence (see is_claim).
    """

    def __init__(self, untrusted: frozenset[Any] | set[Any] = frozenset()) -> None:
        self.untrusted = frozenset(untrusted)
        self.claims: list[Signal] = []
        self.signals: list[Signal] = []
        self.counts: dict[str, int] = {}
        self.roots: list[tuple[int, int, int | None]] = []  # (file, line, rank)
        self.table_ranks: list[tuple[int, int, int | None]] = []  # rank rows outside a Root Cause
        # ranks the others waited for: PyTorch's desync report, Horovod's stall report ("missing
        # ranks"), c10d's monitoredBarrier (launchers.missing_ranks)
        self.culprits: set[int] = set()
        self.culprit_from: set[str] = set()  # which reports named them
        # the process an MPI launcher says ended the job: mpirun's first non-zero exit, Hydra's
        # banner (one rank per banner)
        self.first_exits: list[tuple[int, int, int | None]] = []
        self._first_exit_pending: dict[int, int] = {}  # file -> line of mpirun's header
        self.srun_labelled: set[int] = set()  # files whose srun --label tasks are the ranks
        self.tails: dict[int, bytes] = {}  # file -> its last TAIL_BYTES (ending.py reads them)
        self.srun_mixed: set[int] = set()  # files where a task's label and its rank differ
        self._desync_pending: set[int] = set()
        self.completed: dict[int, int] = {}  # file -> last line saying the run finished
        self.launch: dict[int, dict[str, int]] = {}  # file -> torchrun's max_nodes, nproc_per_node
        self.tracebacks: list[tuple[int, int, int]] = []  # (file, line, rank) of prefixed ones
        self.rank_hosts: dict[int, str] = {}  # rank -> host, from torchrun's failure tables
        # NCCL WARN lines under a rank prefix naming an origin kind (origin.nccl_kind) -> ranks
        self.nccl_kinds: dict[str, set[int]] = {}
        # (file, host prefix) -> torchrun's rendezvous results (global ranks of local 0, 1, ...)
        self.global_ranks: dict[tuple[int, str | None], set[tuple[int, ...]]] = {}
        self.prefix_hosts: dict[int, set[str]] = {}  # rank -> hosts its NCCL-prefixed lines name
        self._host: dict[int, tuple[int, str]] = {}  # file -> (line, host) of the last host row
        self._kept: dict[tuple[int, str], int] = {}
        self._root_pending: set[int] = set()
        self._last: tuple[int, int, str] | None = None

    def add(self, file: int, line: int, m: S.Match) -> None:
        """Record one match (fragments of the same line repeating a match are ignored)."""
        key = (file, line, m.signature)
        if key == self._last:
            return
        self._last = key
        if m.rank is not None and (":" in m.text[:80] or "prefix_host" in m.fields):
            # `gpu-d2: [rank5]: ...` (pdsh) or `[rank5]:gpu-d2:4242:4300 [5] NCCL ...`: rank 5's node
            host = m.fields.get("prefix_host") or O.line_host(m.text)
            if host is not None and len(self.prefix_hosts.setdefault(m.rank, set())) < 4:
                self.prefix_hosts[m.rank].add(host)
        if "missing" in m.fields:  # a detector's line: the ranks it names did not arrive
            self.culprits.update(int(r) for r in m.fields["missing"].split(", "))
            self.culprit_from.add("a stall or barrier report")
        if "srun_label" in m.fields:
            # `0: [rank3]: ...`: srun runs one task per node (an agent), not one per rank.
            (self.srun_mixed if "label_rank" in m.fields else self.srun_labelled).add(file)
        if m.strength == S.CONTEXT:
            self._context(file, line, m)
            return
        claim = file in self.untrusted and is_claim(m)
        if not claim:
            cat = m.category or "other"
            self.counts[cat] = self.counts.get(cat, 0) + 1
        group = (file, m.signature)
        if self._kept.get(group, 0) < KEEP_PER_GROUP:
            self._kept[group] = self._kept.get(group, 0) + 1
            (self.claims if claim else self.signals).append(Signal(file=file, line=line, match=m))

    def face_value(self) -> Collector:
        """The same signals with the claims taken at their word (what the job's output says)."""
        view = Collector()
        view.signals = self.signals + self.claims
        view.counts, view.roots, view.completed = self.counts, self.roots, self.completed
        view.launch, view.table_ranks, view.culprits = self.launch, self.table_ranks, self.culprits
        view.culprit_from = self.culprit_from
        view.tracebacks, view.rank_hosts = self.tracebacks, self.rank_hosts
        view.nccl_kinds, view.prefix_hosts = self.nccl_kinds, self.prefix_hosts
        view.global_ranks, view.first_exits = self.global_ranks, self.first_exits
        view.srun_labelled, view.srun_mixed = self.srun_labelled, self.srun_mixed
        return view

    def _context(self, file: int, line: int, m: S.Match) -> None:
        # torchrun prints "Root Cause (first observed failure):" and, a few lines below,
        # "rank : N (local_rank: M)" of that failure.
        if m.signature == "torchrun.root_cause" and "root_rank" in m.fields:
            self.roots.append((file, line, int(m.fields["root_rank"])))  # collapsed onto one line
            self._table_host(file, line, m, int(m.fields["root_rank"]))
        elif m.signature == "torchrun.root_cause":
            self._root_pending.add(file)
        elif m.signature == "torchrun.rank_field" and file in self._root_pending:
            self._root_pending.discard(file)
            self.roots.append((file, line, m.rank))
            self._table_host(file, line, m)
        elif m.signature == "torchrun.rank_field":
            self.table_ranks.append((file, line, m.rank))  # a "Failures:" row, or a fragment
            self._table_host(file, line, m)
        elif m.signature == "torchrun.host_field":
            self._host[file] = (line, m.fields["host"])
        elif m.signature == "python.traceback" and m.rank is not None:
            if len(self.tracebacks) < KEEP_PER_GROUP:
                self.tracebacks.append((file, line, m.rank))
        elif m.signature == "nccl.warn" and m.rank is not None:
            kind = O.nccl_kind(m.text)  # NCCL chatter, but under a rank's prefix it says whose
            if kind is not None:
                self.nccl_kinds.setdefault(kind, set()).add(m.rank)
        elif m.signature == "torchrun.global_ranks":
            ranks = tuple(int(r) for r in m.fields["ranks"].replace(" ", "").split(",") if r)
            # Per host prefix: a log merging several nodes' agents holds one result per node.
            key = (file, m.fields.get("prefix_host"))
            self.global_ranks.setdefault(key, set()).add(ranks)
        elif m.signature == "lightning.member":
            self.launch.setdefault(file, {})["world"] = int(m.fields["world"])
        elif m.signature == "lightning.visible":
            devices = [d for d in m.fields["devices"].replace(" ", "").split(",") if d]
            self.launch.setdefault(file, {})["visible"] = len(devices)
        elif m.signature == "deepspeed.launch_info":
            self.launch.setdefault(file, {}).update(
                max_nodes=int(m.fields["nnodes"]), nproc_per_node=int(m.fields["nprocs"])
            )
        elif m.signature in S.COMPLETED:
            self.completed[file] = line
        elif m.signature == "torch.desync_header":
            self._desync_pending.add(file)
        elif m.signature == "torch.desync_rank" and file in self._desync_pending:
            self.culprits.add(int(m.fields["culprit"]))
            self.culprit_from.add("PyTorch's desync report")
        elif m.signature == "hydra.bad_rank":
            self.first_exits.append((file, line, m.rank))
        elif m.signature == "mpirun.first_exit":
            self._first_exit_pending[file] = line
        elif m.signature == "mpirun.process_name" and 0 < line - self._first_exit_pending.get(
            file, -9) <= 3:  # fmt: skip
            self.first_exits.append((file, line, m.rank))
        elif m.signature == "torchrun.launch_config":
            self.launch.setdefault(file, {})[m.fields["key"]] = int(m.fields["n"])

    def _table_host(self, file: int, line: int, m: S.Match, rank: int | None = None) -> None:
        """The host of a table row: on the row itself (collapsed) or on the row just above."""
        rank = m.rank if rank is None else rank
        host = O.table_host(m.text)
        last = self._host.get(file)
        if host is None and last is not None and 0 < line - last[0] <= 2:
            host = last[1]
        if rank is not None and host is not None:
            self.rank_hosts.setdefault(rank, host)

    def local_to_global(self, file: int, local: int, host: str | None = None) -> int | None:
        """The global rank of a local rank an agent in `file` named: by its node's rendezvous
        result; the local rank itself when the launch was one node or is not known; None when
        it ran on one of several nodes that cannot be told apart."""
        results = [r for (f, h), rs in self.global_ranks.items() if f == file for r in rs
                   if h == host or host is None]  # fmt: skip
        if results:
            if len(set(results)) > 1:
                return None  # several nodes' (or elastic restarts') results: which one is it?
            ranks = results[0]
            return ranks[local] if 0 <= local < len(ranks) else None
        if self.launch.get(file, {}).get("max_nodes", 1) > 1:
            return None  # several nodes: local rank n is rank n on one of them only
        return local

    def srun_tasks_ranks(self) -> set[int]:
        """Files where srun's task numbers are ranks: srun --label prefixes, one task per rank."""
        return self.srun_labelled - self.srun_mixed

    def per_gpu_files(self) -> set[int]:
        """Files whose launch was one node, one process per GPU (GPU n is rank n): torchrun's or
        DeepSpeed's launch configuration, or Lightning's world size equal to the visible GPUs."""
        return {f for f, c in self.launch.items()
                if (c.get("max_nodes") == 1 and c.get("nproc_per_node", 0) > 1)
                or c.get("world", 0) == c.get("visible", 0) > 1}  # fmt: skip


def rank_signals(
    col: Collector,
    names: list[str],
    files: tuple[FileScan, ...] = (),
    sources: list[str] | None = None,
) -> Diagnosis:
    """Pick the root cause from the collected signals (see TIERS, FALLOUT, strengths).

    `sources` names each input's source (default: all LOG_FILE); the claims that untrusted
    inputs made are reported beside the verdict, with what the verdict would be at their word.
    """
    sources = list(sources) if sources is not None else [LOG_FILE] * len(names)
    verdict = _rank(col, names, files, sources)
    if not col.claims:
        return verdict
    said = _rank(col.face_value(), names, files, sources)
    claims = [_to_evidence(s, names, sources)
              for s in sorted(col.claims, key=lambda s: (s.file, s.line))[:EVIDENCE_MAX]]  # fmt: skip
    said_what = sorted({claim_text(e) for e in claims})
    note = f" The job's own output has {len(col.claims)} line(s) that are not trusted: "
    return verdict.replace(
        summary=verdict.summary + note + "; ".join(said_what) + ".",
        untrusted=tuple(claims),
        job_output_category=said.category,
        job_output_xid=said.xid,
    )


def _rank(
    col: Collector, names: list[str], files: tuple[FileScan, ...], sources: list[str]
) -> Diagnosis:
    signals = _srun_tasks(col.signals, col.srun_tasks_ranks())
    signals = _consequences(_enomem_of_nccl(_yield_to_scheduler(signals)))
    kill = _first_line(signals, lambda s: s.match.category in KILLS and _fatal(s))
    live = [s for s in signals if not _is_fallout(s.file, s.line, s.match.category, kill)]
    # Without a Root Cause block, a table (or a fragment of one) holding a single failure's
    # rank row names it (_failing_rank wants one distinct rank).
    roots = [r for r in col.roots or col.table_ranks or col.first_exits
             if not _is_fallout(r[0], r[1], "other", kill)]  # fmt: skip
    decisive = [s for s in live if s.match.strength in (S.FATAL, S.MINOR)]
    if not decisive:
        return _no_failure(col, files)
    first_fatal = _first_line(decisive, _fatal)
    live = [s for s in live if s.match.strength != S.PRECURSOR or _before(s, first_fatal)]
    top = max(s.tier for s in live)
    if top <= MINOR_TIER and all(s.line < col.completed.get(s.file, 0) for s in live):
        return _no_failure(col, files)  # generic errors, then the run finished: handled
    tier = sorted(
        (s for s in live if s.tier == top), key=lambda s: (s.match.xid is None, s.file, s.line)
    )
    primary = tier[0]
    category = primary.match.category or "other"
    winners = [s for s in tier if s.match.category == primary.match.category]
    xid, xid_signal = _root_xid(live, top, category)
    table = (
        "the Root Cause of torchrun's failure table"
        if col.roots
        else "the only rank in torchrun's failure table"
        if col.table_ranks
        else "the one process the MPI launcher (mpirun, Hydra) says ended the job"
    )
    # Ranks whose traceback shows but no failure line (a fragment cut it off): each may be an
    # origin of its own, so a rank's own NCCL error no longer names the one origin.
    unexplained = {r for _, _, r in col.tracebacks} - {s.match.rank for s in live}
    origin, root_line = _failing_rank(
        winners, roots, category, col.per_gpu_files(), table, col.nccl_kinds, col.local_to_global,
        unexplained,
    )  # fmt: skip
    waited = category in SYMPTOM_CATEGORIES or (origin.rank is None and category not in SCHEDULER)
    if waited and len(col.culprits) == 1:
        culprit = next(iter(col.culprits))  # the rank the others waited for
        said = " and ".join(sorted(col.culprit_from))
        origin = O.Origin(rank=culprit, confidence=O.HIGH, reason=f"rank {culprit}: the one "
                          f"rank {said} says the others waited for",
                          ).with_alternative(origin.rank, origin.reason or "")  # fmt: skip
        root_line = None
    if origin.rank is None and root_line is None and category not in SYMPTOM_CATEGORIES:
        origin = _watchdog_rank(live, winners)
    if origin.rank is None and root_line is None and category not in SYMPTOM_CATEGORIES:
        origin = _traceback_rank(winners, col.tracebacks)
    if origin.rank is not None and root_line is None and roots:
        origin = origin.with_alternative(_one_rank(roots), f"{table} names it")
    rank = origin.rank
    if rank is not None:
        node = origin.node or _node(origin.rank, col.rank_hosts, col.prefix_hosts)
        origin = origin.replace(node=node)
    evidence = _evidence(winners, xid_signal, root_line, names, sources)
    sure = assess(live, winners, top, rank, names, sources)
    return Diagnosis(
        category=category,
        xid=xid,
        failing_rank=rank,
        rank_reason=origin.reason,
        rank_confidence=origin.confidence,
        rank_alternatives=origin.alternatives,
        failing_node=origin.node,
        summary=_summary(category, primary, winners, xid, rank) + note(sure),
        confidence=sure.level,
        alternatives=sure.alternatives,
        advice=EXPLAIN[category][1],
        evidence=tuple(evidence),
        signals=dict(col.counts),
        files=files,
        decided_by=sources[primary.file],
    )


def _srun_tasks(signals: list[Signal], files: Set[int]) -> list[Signal]:
    """srun's own `task N: ...` line names rank N in the files where tasks are ranks."""
    return [s.replace(match=s.match.replace(rank=s.match.fields["srun_task"]))
            if s.match.rank is None and "srun_task" in s.match.fields and s.file in files else s
            for s in signals]  # fmt: skip


def _fatal(s: Signal) -> bool:
    return s.match.strength == S.FATAL


def _yield_to_scheduler(signals: list[Signal]) -> list[Signal]:
    """With a scheduler kill line anywhere, the guesses it explains become `other`."""
    if not any(s.match.category in SCHEDULER and _fatal(s) for s in signals):
        return signals
    return [s.replace(match=s.match.replace(category="other"))
            if s.match.signature in YIELD_TO_SCHEDULER or s.match.fields.get("inferred") else s
            for s in signals]  # fmt: skip


def _enomem_of_nccl(signals: list[Signal]) -> list[Signal]:
    """Beside NCCL's RDMA ENOMEM (nccl_warn.ENOMEM_NOTE), a bare "Cannot allocate memory" is
    its echo up the call chain (a Python exception), not the host's RAM: minor, `other`."""
    if not any(str(s.match.fields.get("detail", "")).endswith(nccl_warn.ENOMEM_NOTE)
               for s in signals):  # fmt: skip
        return signals
    return [s.replace(match=s.match.replace(category="other", strength=S.MINOR))
            if s.match.fields.get("enomem") else s for s in signals]  # fmt: skip


def _consequences(signals: list[Signal]) -> list[Signal]:
    """An Xid in CONSEQUENCE_XIDS after an application Xid on the same GPU is minor."""
    app: set[tuple[int, str]] = set()
    out = []
    for s in sorted(signals, key=lambda s: (s.file, s.line)):
        pci = s.match.fields.get("pci")
        if pci and s.match.xid in X.APP_XIDS:
            app.add((s.file, pci))
        elif pci and s.match.xid in CONSEQUENCE_XIDS and (s.file, pci) in app:
            s = s.replace(match=s.match.replace(strength=S.MINOR))
        out.append(s)
    return out


def _first_line(signals: Iterable[Signal], pred: Callable[[Signal], bool]) -> dict[int, int]:
    """file -> first line where pred(signal) holds."""
    out: dict[int, int] = {}
    for s in signals:
        if pred(s) and s.line < out.get(s.file, sys.maxsize):
            out[s.file] = s.line
    return out


def _is_fallout(file: int, line: int, category: str | None, kill: dict[int, int]) -> bool:
    return (category or "other") in FALLOUT and line > kill.get(file, sys.maxsize)


def _before(s: Signal, first_fatal: dict[int, int]) -> bool:
    return s.line < first_fatal.get(s.file, sys.maxsize)


def _root_xid(live: list[Signal], top: int, category: str) -> tuple[int | None, Signal | None]:
    """The first Xid of the winning category, else of its tier (an ECC diagnosis names its ECC
    Xid, never an application Xid), else the first fatal Xid (by place), else any."""
    with_xid = sorted((s for s in live if s.match.xid is not None), key=lambda s: (s.file, s.line))
    same = [s for s in with_xid if s.match.category == category and s.tier == top]
    if same:
        return same[0].match.xid, same[0]
    if category in HARDWARE_CATEGORIES:
        # A hardware verdict from a line without a code: an app Xid beside it explains nothing.
        with_xid = [s for s in with_xid if s.match.category != "gpu_xid_user_app"]
    for wanted in (lambda s: s.tier == top, _fatal):
        for s in with_xid:
            if wanted(s):
                return s.match.xid, s
    if with_xid:
        return with_xid[0].match.xid, with_xid[0]
    return None, None


def _failing_rank(
    winners: list[Signal],
    roots: list[Any],
    category: str,
    per_gpu: Set[int] = frozenset(),
    table: str = "torchrun's failure table",
    warned: dict[str, set[int]] | None = None,
    to_global: Callable[[int, int, str | None], int | None] = lambda file, local, host: local,
    unexplained: Set[int] = frozenset(),
) -> tuple[O.Origin, tuple[Any, ...] | None]:
    """The rank where the failure began (with its reason), or none when the text names no
    single origin; and the table row that named it, if one did.

    A symptom (NCCL timeout or error) is printed by its victims: the rank on those lines is a
    reporter, and only torchrun's Root Cause names an origin (when no other rank reports the
    symptom), or an NCCL error that is the rank's own (see origin.nccl_kind). Otherwise: the
    one rank the decisive lines name; else the Root Cause; else the one local rank torchrun's
    agent named (a single node: local rank = rank), or the one GPU an OOM names under a
    one-node, process-per-GPU launch.
    """
    one = _one_rank(roots)
    root = (one, roots[0]) if one is not None else (None, None)
    by_table = O.Origin(rank=one, reason=f"rank {one}: {table}", confidence=O.HIGH)
    named = {s.match.rank for s in winners if s.match.rank is not None}
    if category in SYMPTOM_CATEGORIES:
        mine = category == "nccl_error" and not unexplained
        own = _nccl_origin(winners, named, warned or {}) if mine else O.NONE
        if own.rank is not None:
            return own.with_alternative(one, f"{table} names it"), None
        if one is not None and named <= {one}:
            # Every rank timing out beside a Root Cause: that rank is just the first victim seen.
            return by_table.replace(confidence=O.MEDIUM), root[1]
        return O.NONE, None
    if len(named) == 1:
        rank = named.pop()
        return O.Origin(rank=rank, confidence=O.HIGH,
                        reason=f"rank {rank}: the only rank on the decisive {category} lines"), None  # fmt: skip
    if not named and one is not None:
        return by_table, root[1]
    if named:
        return O.NONE, None
    local = {to_global(s.file, int(s.match.fields["local_rank"]), s.match.fields.get("prefix_host"))
             for s in winners if "local_rank" in s.match.fields}  # fmt: skip
    gpus = {int(s.match.fields["gpu"]) for s in winners
            if "gpu" in s.match.fields and s.file in per_gpu}  # fmt: skip
    if None in local or len(local | gpus) != 1:  # both shapes, when present, must agree
        return O.NONE, None
    found = next(iter(local | gpus))
    assert found is not None
    rank = found
    why = (
        "the one local rank torchrun's agent says failed, mapped by its rendezvous (or one node)"
        if local
        else f"the OOM names GPU {rank} under a one-node launch of one process per GPU"
    )
    # The agent's own host prefix (pdsh) is the node that ran its local rank.
    hosts = {s.match.fields.get("prefix_host") for s in winners if "local_rank" in s.match.fields}
    node = next(iter(hosts)) if len(hosts) == 1 else None
    return O.Origin(rank=rank, confidence=O.MEDIUM, reason=f"rank {rank}: {why}", node=node), None


def _one_rank(roots: list[Any]) -> int | None:
    """The rank of the table rows when they name one rank, else None."""
    ranks = {r[2] for r in roots}
    return ranks.pop() if len(ranks) == 1 else None


def _nccl_origin(winners: list[Signal], named: set[int], warned: dict[str, set[int]]) -> O.Origin:
    """An NCCL error that is its reporter's own failure, printed under one rank's prefix.

    A CUDA error inside NCCL (ncclUnhandledCudaError, "invalid device pointer") is the rank's
    own even when other ranks report its fallout; an OFI/libfabric failure names its reporter
    only when that rank is the only one reporting NCCL errors.
    """
    kinds = {k: set(v) for k, v in warned.items()}  # NCCL WARN lines under a rank's prefix
    for s in winners:
        kind = O.nccl_kind(s.match.text) if s.match.rank is not None else None
        if kind is not None and s.match.rank is not None:
            kinds.setdefault(kind, set()).add(s.match.rank)
    own = kinds.get("own", set())
    if len(own) == 1:
        rank = next(iter(own))
        return O.Origin(rank=rank, confidence=O.HIGH, reason=f"rank {rank}: its own failure inside "
                        "NCCL (a CUDA error, or no algorithm/protocol for its call), not a "
                        "symptom of another rank")  # fmt: skip
    lone = kinds.get("one", set())
    if not own and len(lone) == 1 and named == lone:
        rank = next(iter(lone))
        return O.Origin(rank=rank, confidence=O.MEDIUM, reason=f"rank {rank}: the only rank "
                        "reporting the NCCL failure (an OFI/libfabric error)")  # fmt: skip
    return O.NONE


def _watchdog_rank(live: list[Signal], winners: list[Signal]) -> O.Origin:
    """The rank whose NCCL watchdog reported the winning error, when the error line names none.

    `[PG ID 2 PG GUID 3 Rank 0] Process group watchdog thread terminated with exception: <the
    rank's own CUDA error>` is that rank's error coming back through its watchdog.
    """
    if any(s.match.rank is not None for s in winners):
        return O.NONE  # the winners named several ranks: no single origin
    ranks = {s.match.rank for s in live if s.match.signature == "nccl.watchdog_exception"}
    ranks.discard(None)
    if len(ranks) != 1:
        return O.NONE
    rank = ranks.pop()
    assert rank is not None
    return O.Origin(rank=rank, confidence=O.HIGH,
                    reason=f"rank {rank}: its NCCL watchdog reported the error")  # fmt: skip


TRACEBACK_WINDOW = 100  # lines after an unprefixed error line where its rank's traceback follows


def _traceback_rank(winners: list[Signal], tracebacks: list[tuple[int, int, int]]) -> O.Origin:
    """The one rank whose prefixed traceback follows the (unprefixed) decisive line.

    PyTorch >= 2.4 prefixes each rank's stderr (`[rank1]: Traceback ...`) while a logger's copy
    of the same error has no prefix: the traceback right after it says which rank raised it.
    """
    if not winners or any(s.match.rank is not None for s in winners):
        return O.NONE
    first = min(winners, key=lambda s: (s.file, s.line))
    ranks = {r for f, line, r in tracebacks
             if f == first.file and 0 < line - first.line <= TRACEBACK_WINDOW}  # fmt: skip
    if len(ranks) != 1:
        return O.NONE
    rank = ranks.pop()
    return O.Origin(rank=rank, confidence=O.MEDIUM, reason=f"rank {rank}: the only rank whose "
                    "traceback follows the error line")  # fmt: skip


def _node(rank: int | None, table: dict[int, str], prefixed: dict[int, set[str]]) -> str | None:
    """The node of the failing rank where the log names it: torchrun's table row, else the one
    host NCCL's `host:pid:tid [dev]` prefix shows on that rank's lines."""
    if rank is None:
        return None
    if rank in table:
        return table[rank]
    hosts = prefixed.get(rank, set())
    return next(iter(hosts)) if len(hosts) == 1 else None


def _to_evidence(s: Signal, names: list[str], sources: list[str]) -> Evidence:
    return Evidence(file=names[s.file], line=s.line, text=s.match.text,
                    signature=s.match.signature, category=s.match.category,
                    source=sources[s.file], xid=s.match.xid)  # fmt: skip


def _evidence(winners: list[Signal], xid_signal: Signal | None, root: tuple[Any, ...] | None,
              names: list[str], sources: list[str]) -> list[Evidence]:  # fmt: skip
    """Distinct decisive lines, most telling and earliest first, plus the root Xid; capped."""
    chosen: list[Signal] = []
    seen: set[str] = set()
    for s in sorted(winners, key=lambda s: (-s.match.specificity, s.file, s.line)):
        if s.match.text not in seen:
            seen.add(s.match.text)
            chosen.append(s)
    if xid_signal is not None and xid_signal not in chosen:
        chosen.insert(0, xid_signal)
    out = [_to_evidence(s, names, sources) for s in chosen[:EVIDENCE_MAX]]
    if root is not None:
        out.append(Evidence(file=names[root[0]], line=root[1], text=f"rank : {root[2]} (torchrun "
                            "Root Cause)", signature="torchrun.rank_field", category=None,
                            source=sources[root[0]]))  # fmt: skip
    return out


def _summary(category: str, primary: Signal, winners: list[Signal], xid: int | None,
             rank: int | None) -> str:  # fmt: skip
    """One sentence: what happened, where, how often."""
    text = EXPLAIN[category][0]
    detail = primary.match.fields.get("detail") if category == "nccl_error" else None
    if detail:
        text += f": {detail}"
    said = primary.match.fields.get("said")
    if said:
        text += f" ({said.strip()})"
    if category == "other" and any(s.match.fields.get("inferred") == "sigkill" for s in winners):
        text += (
            " (a process was SIGKILLed and no line says why: the kernel's OOM killer is the "
            "usual sender, look for it in the node's kernel log or the job's MaxRSS in sacct)"
        )
    if xid is not None:
        text += f"; root Xid {xid} ({X.lookup(xid).meaning})"
    if rank is not None:
        text += f"; failing rank {rank}"
    else:
        ranks = {s.match.rank for s in winners if s.match.rank is not None}
        if len(ranks) > 1:
            text += f"; reported by {len(ranks)} ranks"
    return text[0].upper() + text[1:] + "."


def _no_failure(col: Collector, files: tuple[FileScan, ...]) -> Diagnosis:
    # Sure when nothing matched at all; medium when failure-like lines were seen and judged
    # handled (an error before the run finished, minor lines after Slurm's kill line).
    seen = bool(col.counts)
    return Diagnosis(
        category="no_failure",
        confidence="medium" if seen else "high",
        summary=EXPLAIN["no_failure"][0].capitalize()
        + "."
        + (" Confidence medium: failure-like lines were seen and judged handled." if seen else ""),
        advice=EXPLAIN["no_failure"][1],
        signals=dict(col.counts),
        files=files,
    )

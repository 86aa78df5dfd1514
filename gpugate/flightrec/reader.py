"""Read one PyTorch flight-recorder dump safely and reduce it to a small JSON-able record.

A dump is written by the user's job: a pickle (`_dump_fr_trace()`, what the NCCL watchdog writes
to TORCH_FR_DUMP_TEMP_FILE + rank) or its JSON form (`_dump_fr_trace_json()`). The unpickler here
resolves no global at all, so a pickle can only build dict/list/tuple/str/bytes/int/float/bool/None;
every field read afterwards is type-checked. What gpugate keeps of a dump is never its bytes: the
record (summarize) and, for an accepted dump, its plain data written again as JSON (as_json). Field names and their meaning: torch 2.14.1,
torch/distributed/flight_recorder/components/{loader,types,builder}.py and the dumps themselves
(tests/fixtures/flightrec, made by PyTorch's own recorder).
"""

from __future__ import annotations

import io
import json
import pickle
import re

from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

MAX_BYTES = 32 << 20  # a 20,000-entry NCCL dump is a few MiB; more is not a flight recorder
MAX_DEPTH = 32  # entries -> entry -> frames -> frame -> value is 5 deep
MAX_NODES = 4_000_000  # memo references can make a small pickle expand: cap what we walk
KEEP_PER_PG = 64  # the last collectives per process group are what a culprit needs
PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))
BACKENDS = ("nccl", "ncclx", "xccl", "gloo", "rccl", "rcclx", "mccl", "hccl")  # types.py Op
# A frame inside torch itself is not where the user's code called the collective.
_TORCH_FRAME = lazy(r"[/\\]torch[/\\](distributed|nn|_dynamo|utils)[/\\]")


class DumpError(ValueError):
    """A dump that is refused or is not a flight-recorder dump; the message says why."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain containers only: any global (hence any call) is refused."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise DumpError(f"refused: the pickle names the global {module}.{name}")

    def persistent_load(self, pid: object) -> NoReturn:
        raise DumpError("refused: the pickle uses a persistent id")


def _check_plain(obj: object) -> None:
    """Walk OBJ without recursion: plain types only, bounded depth and size."""
    stack = [(obj, 1)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise DumpError(f"refused: more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise DumpError(f"refused: nested deeper than {MAX_DEPTH}")
        if not isinstance(item, PLAIN):
            raise DumpError(f"refused: the pickle holds a {type(item).__name__}")
        if isinstance(item, dict):
            stack.extend((k, depth + 1) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)


def load_dump(data: bytes) -> dict[str, Any]:
    """The dump's top-level dict from pickle or JSON bytes; DumpError for anything else."""
    if not isinstance(data, (bytes, bytearray)):
        raise DumpError("not a flight-recorder dump: not bytes")
    if len(data) > MAX_BYTES:
        raise DumpError(f"over {MAX_BYTES >> 20} MiB")
    head = bytes(data[:1])
    try:
        if head == b"\x80":  # PROTO opcode: protocol 2 and later
            obj = _PlainUnpickler(io.BytesIO(data)).load()
        elif head in (b"{", b"[") or head.isspace():
            obj = json.loads(data)
        else:
            raise DumpError("not a flight-recorder dump: neither a pickle (protocol 2-5) nor JSON")
    except DumpError:
        raise
    except RecursionError:
        raise DumpError(f"refused: nested deeper than {MAX_DEPTH}") from None
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, IndexError, KeyError) as e:
        raise DumpError(f"not a flight-recorder dump: {type(e).__name__}: {e}") from None
    except MemoryError:
        raise DumpError("refused: the dump expands beyond memory") from None
    _check_plain(obj)
    if not isinstance(obj, dict):
        raise DumpError("not a flight-recorder dump: the top level is not a dict")
    if "entries" not in obj:
        raise DumpError("not a flight-recorder dump: no 'entries'")
    if not isinstance(obj["entries"], list):
        raise DumpError("not a flight-recorder dump: 'entries' is not a list")
    return obj


def rank_from_name(name: str) -> int | None:
    """The global rank in a dump's file name (its trailing digits), or None."""
    m = re.search(r"(\d+)$", name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m and len(m.group(1)) <= 9 else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _seq(v: object) -> int | None:
    """A last_* collective number; -1 is 'none yet'; the JSON form writes them as strings."""
    if isinstance(v, str) and re.fullmatch(r"-?\d{1,18}", v):
        v = int(v)
    n = _int(v)
    return n if n is not None and n >= 0 else None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _ranks(text: object) -> list[int] | None:
    """pg_config's "ranks" is a string such as "[0, 1]" (builder.py reads it with literal_eval)."""
    if isinstance(text, list):
        items = text
    elif isinstance(text, str) and re.fullmatch(r"\[\s*(\d+\s*(,\s*\d+\s*)*)?\]", text):
        items = [int(x) for x in re.findall(r"\d+", text)]
    else:
        return None
    return sorted({x for x in items if _int(x) is not None and x >= 0}) or None


def _frame(frames: object) -> str | None:
    """The first frame outside torch: "file:line name"."""
    if not isinstance(frames, list):
        return None
    for f in frames:
        if not isinstance(f, dict):
            continue
        file, line, name = _str(f.get("filename")), _int(f.get("line")), _str(f.get("name"))
        if file is not None and not _TORCH_FRAME.search(file):
            return f"{file}:{line if line is not None else '?'} {name or '?'}"
    return None


def _op(profiling_name: str | None) -> tuple[str | None, str | None]:
    """("all_reduce", "gloo") from "gloo:all_reduce"; p2p keeps its peers ("send 0->1")."""
    if profiling_name is None:
        return None, None
    backend, sep, op = profiling_name.partition(":")
    if sep and backend in BACKENDS:
        return op, backend
    return profiling_name, None


def _sizes(v: object) -> list[list[int]] | None:
    """input_sizes: one shape (a list of ints) per tensor; anything else is dropped."""
    if not isinstance(v, list):
        return None
    shapes = [s for s in v if isinstance(s, list) and all(_int(d) is not None for d in s)]
    return shapes if len(shapes) == len(v) else None


def _entry(e: dict[str, Any]) -> dict[str, Any] | None:
    """One entry of the record, or None when it names no process group or sequence number."""
    pg = e.get("pg_id")
    pg_id = str(pg) if _int(pg) is not None else _str(pg)
    group = e.get("process_group")
    if pg_id is None and isinstance(group, (list, tuple)) and group:
        pg_id = _str(group[0])
    seq = _int(e.get("collective_seq_id"))
    if pg_id is None or seq is None:
        return None
    op, backend = _op(_str(e.get("profiling_name")))
    return {
        "pg_id": pg_id,
        "seq": seq,
        "p2p_seq": _int(e.get("p2p_seq_id")),
        "op": op,
        "backend": backend,
        "state": _str(e.get("state")),
        "retired": e.get("retired") if isinstance(e.get("retired"), bool) else None,
        "is_p2p": e.get("is_p2p") is True,
        "time_created_ns": _int(e.get("time_created_ns")),
        # the JSON form writes 0 where the pickle has None (not discovered)
        "time_started_ns": _int(e.get("time_discovered_started_ns")) or None,
        "time_completed_ns": _int(e.get("time_discovered_completed_ns")) or None,
        "timeout_ms": _int(e.get("timeout_ms")),
        "sizes": _sizes(e.get("input_sizes")),
        "frame": _frame(e.get("frames")),
    }


def _pg_names(entries: list[Any]) -> dict[str, tuple[str, str]]:
    """pg id -> (name, desc) from the entries' process_group [name, desc]."""
    names: dict[str, tuple[str, str]] = {}
    for e in entries:
        group = e.get("process_group") if isinstance(e, dict) else None
        pg = e.get("pg_id") if isinstance(e, dict) else None
        pg_id = str(pg) if _int(pg) is not None else _str(pg)
        if pg_id is not None and isinstance(group, (list, tuple)) and len(group) == 2:
            name, desc = _str(group[0]), _str(group[1])
            if name is not None and desc is not None:
                names.setdefault(pg_id, (name, desc))
    return names


def _pg_ranks(config: dict[str, Any], name: str, desc: str, alone: bool) -> list[int] | None:
    """The pg's ranks from pg_config, which is keyed by pg NAME.

    Gloo in torch 2.14.1 registers every group under the empty name (the last one wins), so a
    config whose key matches no name is used only when the dump holds this one group alone.
    """
    conf = config.get(name)
    if not isinstance(conf, dict):
        found = [c for c in config.values() if isinstance(c, dict) and c.get("desc") == desc]
        conf = found[0] if len(found) == 1 and desc else None
    if conf is None and alone and len(config) == 1:
        conf = next(iter(config.values()))
    return _ranks(conf.get("ranks")) if isinstance(conf, dict) else None


def _pgs(dump: dict[str, Any], notes: list[str]) -> dict[str, dict[str, Any]]:
    """The record's process groups: pg_status (keyed by pg ID) joined with pg_config (by name)."""
    names = _pg_names(dump["entries"])
    status = dump.get("pg_status")
    status = status if isinstance(status, dict) else {}
    config = dump.get("pg_config")
    config = config if isinstance(config, dict) else {}
    ids = sorted({str(k) for k in status} | set(names), key=lambda k: (len(k), k))
    pgs = {}
    for pg_id in ids:
        name, desc = names.get(pg_id, (pg_id, ""))
        st = status.get(pg_id)
        st = st if isinstance(st, dict) else {}
        ranks = _pg_ranks(config, name, desc, len(ids) == 1)
        if ranks is None:
            notes.append(f"process group {pg_id}: its ranks are not in pg_config")
        pgs[pg_id] = {
            "name": name,
            "desc": desc,
            "ranks": ranks or [],
            "last_enqueued": _seq(st.get("last_enqueued_collective")),
            "last_started": _seq(st.get("last_started_collective")),
            "last_completed": _seq(st.get("last_completed_collective")),
        }
    return pgs


def summarize(dump: dict[str, Any], name: str) -> dict[str, Any]:
    """The compact record of one rank's dump (see the module docstring for the sources)."""
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise DumpError("not a flight-recorder dump: no 'entries'")
    notes: list[str] = []
    entries, dropped = [], 0
    for e in dump["entries"]:
        got = _entry(e) if isinstance(e, dict) else None
        if got is None:
            dropped += 1
        else:
            entries.append(got)
    if dropped:
        notes.append(f"{dropped} entries without a process group or sequence number dropped")
    kept: dict[str, list[dict[str, Any]]] = {}
    for e in entries:  # the ring buffer is in record order: keep each group's newest
        kept.setdefault(e["pg_id"], []).append(e)
    entries = [e for group in kept.values() for e in group[-KEEP_PER_PG:]]
    version = _str(dump.get("version"))
    if version is None:
        notes.append("no version string")
    return {
        "name": name,
        "rank": rank_from_name(name),
        "version": version or "",
        "pgs": _pgs(dump, notes),
        "entries": entries,
        "notes": notes,
    }


def read_dump(data: bytes, name: str) -> dict[str, Any]:
    """summarize(load_dump(data), name): the record of one dump file's bytes."""
    return summarize(load_dump(data), name)


def read_dump_kept(data: bytes, name: str) -> tuple[dict[str, Any], object]:
    """(the record, the dump as JSON-able plain data) of one dump file's bytes."""
    dump = load_dump(data)
    return summarize(dump, name), as_json(dump)


def as_json(obj: object) -> object:
    """Plain data (what load_dump returns, depth-checked) as JSON values: tuples become lists,
    keys strings; bytes are dropped (`{"dropped_bytes": N}`): no user bytes are kept, and
    no field PyTorch's analyzers read is bytes."""
    if isinstance(obj, dict):
        return {_key(k): as_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_json(v) for v in obj]
    if isinstance(obj, (bytes, bytearray)):
        return {"dropped_bytes": len(obj)}
    return obj


def _key(k: object) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, (bytes, bytearray)):
        return bytes(k).decode("utf-8", "backslashreplace")
    return json.dumps(as_json(k))  # 3 -> "3", None -> "null", (1, 2) -> "[1, 2]"

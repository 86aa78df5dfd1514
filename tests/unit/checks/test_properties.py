"""Property-based tests of every parser that reads hostile input as root on a GPU node.

gpugate runs before and after every job: a crash or a hang in a parser is a cluster outage.
Each parser here gets random, truncated, binary and enormous input, and near-misses glued
from real fragments (Xid lines, `Key=Value` runs, ZIP records, JSON with the real keys holding
random types). The property is always the same shape: a safe result or the parser's own,
documented error; never another exception type, a hang or unbounded memory.

- kernel log: `parse_kmsg_record` gives None or a record that `format_record` prints;
  `read_kmsg` reads any file; `filter_lines` keeps at most `max_lines` lines, each taken
  from the input; `parse_xid`/`normalize_pci`/`needs_drain` give None or a sane event; the
  kernel checks never crash on any log.
- sysfs/procfs values and `ping` output: typed results (state names, rates, counters,
  meminfo, modules, mountinfo, ping summary), never an exception.
- snapshots: `facts_from_dict` gives Facts or SnapshotError for any JSON-like data; the whole
  checklist runs on every snapshot it accepts without a "check crashed" finding;
  `parse_yaml` gives data or YamlError.
- Slurm output: the text and JSON parsers give records or ValueError; `hostlist_expand`
  gives names (capped) or HostlistError, quickly; drain reasons and comments are one
  printable, capped line starting with `gpugate:`.
- job logs: `diagnose_bytes` always returns a category from the closed set.
- checkpoints: directories of random names, trackers, trainer states and torch files cut
  short or corrupted (ZIP records with random offsets) give checkpoints inside the directory
  (complete ones really inside) and no exception but CheckpointDirError.
- config: `load_config` gives a Config or ConfigError for random documents (real keys with
  random values, and random text), and the checklist runs on every config that loads.
- hook environment, evidence and state readers: a HookEnv for any environment; None or a
  value for any file content.
- enormous inputs: a 50 MB kernel log, 10 MB single lines and hostlist bombs finish well
  within generous time bounds.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import tempfile
import time
import zipfile
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING

import pytest
import yaml
from factories import make_facts, make_gpu, make_ib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpugate.checkpoints.discover import CheckpointDirError, find_checkpoints, latest_complete
from gpugate.checks import findings as F
from gpugate.checks.facts import Facts, SnapshotError, facts_from_dict
from gpugate.checks.run import run_checks
from gpugate.checks.sources.host import parse_meminfo, parse_modules
from gpugate.checks.sources.infiniband import parse_rate, parse_state, read_counters
from gpugate.checks.sources.kernel_log import (
    BUDGETS,
    filter_lines,
    format_record,
    parse_kmsg_record,
    read_kmsg,
    read_log_file,
)
from gpugate.checks.sources.mounts import parse_mountinfo
from gpugate.checks.sources.peers import parse_ping
from gpugate.checks.xid import needs_drain, normalize_pci, parse_xid
from gpugate.config import PACKAGED_FILE, ConfigError, load_config
from gpugate.config.schema import Config
from gpugate.diagnosis.categories import CATEGORIES
from gpugate.diagnosis.engine import diagnose_bytes
from gpugate.diagnosis.signatures import SIGNATURES
from gpugate.diagnosis.verdict import Diagnosis
from gpugate.slurm.hookenv import HookEnv, comment_tokens, from_environ
from gpugate.slurm.hostlist import HostlistError, hostlist_expand
from gpugate.slurm.parse_json import parse_jobs_json, parse_nodes_json, parse_sinfo_json
from gpugate.slurm.parse_text import parse_show_job_text, parse_show_node_text
from gpugate.slurm.reasons import (
    COMMENT_MAX,
    GPUGATE_PREFIX,
    REASON_MAX,
    admin_comment,
    clean_text,
    drain_reason,
)
from gpugate.slurm.records import JobInfo, NodeInfo
from gpugate.store.evidence import read_summary
from gpugate.store.state import Baseline, load_baseline, load_kernel_pos
from gpugate.yamlio import YamlError, parse_yaml

pytestmark = pytest.mark.slow  # over 5 s alone (pytest --durations); out of `make test-fast`

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

# ----------------------------------------------------------------------------------- settings

# deadline=None: the machine running the suite is shared and loaded; "no hang" is proved by
# the explicit time bounds of the enormous-input tests at the end. GPUGATE_PROPERTY_SCALE=20
# runs twenty times the examples (a soak before a release; the default fits CI's budget).
_SCALE = int(os.environ.get("GPUGATE_PROPERTY_SCALE", "1"))
_LENIENT = [HealthCheck.too_slow, HealthCheck.data_too_large]
QUICK = settings(max_examples=100 * _SCALE, deadline=None, suppress_health_check=_LENIENT)
SLOW = settings(max_examples=30 * _SCALE, deadline=None, suppress_health_check=_LENIENT)
HUGE_S = 30.0  # bound for each enormous input: minutes-long hangs, not speed, are the target

# ------------------------------------------------------------------------- helper strategies

# Numbers as text: ordinary, signed, huge (past int()'s 4300-digit limit), and characters
# that str.isdigit() accepts but int() does not ("²"), or that \d matches ("٣").
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(4290, 4400).map(lambda n: "9" * n),
    st.sampled_from(["", "-", "+1", "0x1f", "1e3", "1.5", "1.2.3", ".", "nan", "inf", "²", "٣"]),
)
JUNK = st.text(max_size=12)
JUNK_BYTES = st.binary(max_size=24)


def glued(fragments: Sequence[str], max_parts: int = 10) -> st.SearchStrategy[str]:
    """Text glued from real fragments, numbers and junk: parsers see near-misses."""
    part = st.one_of(st.sampled_from(list(fragments)), NUMBERS, JUNK)
    return st.lists(part, max_size=max_parts).map("".join)


def glued_lines(fragments: Sequence[str], max_lines: int = 12) -> st.SearchStrategy[str]:
    """Several glued lines, joined by newlines."""
    return st.lists(glued(fragments), max_size=max_lines).map("\n".join)


def ascii_bytes(text: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """Text as UTF-8 bytes, sometimes with random bytes spliced in (invalid UTF-8 included)."""
    return st.tuples(text, JUNK_BYTES, st.integers(0, 64)).map(
        lambda t: t[0].encode()[: t[2]] + t[1] + t[0].encode()[t[2] :]
    )


JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=16)
)
JSON_LIKE = st.recursive(
    JSON_SCALARS,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4)
    ),
    max_leaves=16,
)


def mapping_with(keys: Sequence[str], values: st.SearchStrategy) -> st.SearchStrategy[dict]:
    """Dicts with some of the real keys (and a stray one) holding random values."""
    return st.dictionaries(st.sampled_from([*keys, "x"]), values, max_size=len(keys))


def _tempdir() -> tempfile.TemporaryDirectory:
    # Not pytest's tmp_path: one fresh directory per example, not per test function.
    return tempfile.TemporaryDirectory(prefix="gpugate-prop-")


@contextmanager
def written(name: str, data: bytes) -> Iterator[str]:
    """A temporary directory holding one file `name` with `data`; yields the directory."""
    with _tempdir() as d:
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        yield d


@contextmanager
def time_bound(what: str, seconds: float = HUGE_S) -> Iterator[None]:
    """Fail when the block took longer than `seconds` (a hang that ended is still a hang)."""
    start = time.monotonic()
    yield
    took = time.monotonic() - start
    assert took < seconds, f"{what} took {took:.1f} s (bound {seconds:g} s)"


@cache
def default_config() -> Config:
    """The packaged defaults; loaded lazily, after conftest has set the private YAML cache."""
    return load_config("/dev/null")


def assert_no_crash(findings: list[F.Finding]) -> None:
    """run_checks turns a raising check into an 'unknown' finding: none may say so."""
    crashed = [f.message for f in findings if "check crashed" in f.message]
    assert not crashed, crashed
    assert all(f.status in F.SEVERITY for f in findings)


# ------------------------------------------------------------------------------- kernel log

PCI_TEXT = st.one_of(
    st.sampled_from(["PCI:0000:18:00", "0000:9B:00.0", "00000000:3b:00", "<redacted>", ""]),
    JUNK,
)
# Timestamps the kernel checks read (dmesg, dmesg -T, --time-format iso, journalctl), with
# random numbers in every field.
TIMESTAMPS = st.one_of(
    st.just(""),
    st.builds("[{:>12}] ".format, NUMBERS),
    st.builds("[{}.{}] ".format, NUMBERS, NUMBERS),
    st.builds("[Mon {} {} {}:{}:{} {}] ".format, st.sampled_from(["Jan", "Feb", "Foo"]), *[NUMBERS] * 5),
    st.builds("{}-{}-{}T{}:{}:{} ".format, *[st.integers(0, 99999).map(str)] * 6),
    st.builds("{} {} {}:{}:{} node kernel: ".format, st.sampled_from(["Jan", "Dec", "Xyz"]), *[NUMBERS] * 4),
)  # fmt: skip
XID_TAIL = glued(
    ["pid=4242", ", name=python", "caused by previous Xid ", "Fatal", "Nonfatal", " to ", "(None)",
     "GPU has fallen off the bus.", "Link 02", ", "]
)  # fmt: skip
XID_LINES = st.builds(
    "{}NVRM: Xid ({}): {}{}{}".format,
    TIMESTAMPS,
    PCI_TEXT,
    st.one_of(st.sampled_from(["13", "31", "43", "45", "48", "79", "145", "154"]), NUMBERS),
    st.sampled_from([", ", ",", " ", ""]),
    XID_TAIL,
)
KERNEL_FRAGMENTS = [
    "NVRM: Xid (", "PCI:0000:18:00", "): ", "SXid (", "fallen off the bus", "NVRM: The NVIDIA GPU ",
    "NVRM: GPU at PCI:", "NVRM: GPU 0000:18:00.0: ", "RmInitAdapter failed", "rm_init_adapter failed",
    "NV_ERR_RESET_REQUIRED", " invoked oom-killer", "Out of memory: Killed process ", "Memory cgroup ",
    "python", "(", ")", "mlx5_core 0000:29:00.0 mlx5_0: ", "Link up", "AER: Corrected error",
    "PCIe Bus Error", "nvidia-peermem", "\\x0a", "[", "]", " ", "\t", "\r", "\n", ":", ",",
]  # fmt: skip
KERNEL_LINES = st.one_of(
    XID_LINES,
    st.builds("{}{}".format, TIMESTAMPS, glued(KERNEL_FRAGMENTS)),
    st.builds("  {}".format, glued(KERNEL_FRAGMENTS)),  # a continuation line
    st.text(max_size=80),
)
KMSG_RECORDS = st.builds(
    lambda head, message, props: head + b";" + message + b"".join(b"\n" + p for p in props),
    st.lists(NUMBERS.map(str.encode) | JUNK_BYTES, max_size=6).map(b",".join),
    ascii_bytes(KERNEL_LINES),
    st.lists(st.sampled_from([b" SUBSYSTEM=pci", b" DEVICE=+pci:0000:18:00.0", b" =x", b"x=y"]) | JUNK_BYTES, max_size=3),
)  # fmt: skip


@QUICK
@given(st.one_of(KMSG_RECORDS, st.binary(max_size=200)))
def test_kmsg_record_is_none_or_printable(raw: bytes) -> None:
    record = parse_kmsg_record(raw)
    if record is None:
        return
    assert all(isinstance(v, int) for v in (record.prio, record.seq, record.usec))
    assert isinstance(record.message, str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in record.properties.items())
    lines = format_record(record)
    assert lines and lines[0].startswith("[") and all(isinstance(x, str) for x in lines)


@SLOW
@given(st.lists(KMSG_RECORDS, max_size=20), st.none() | st.integers(-5, 10**20), st.integers(0, 30))
def test_read_kmsg_reads_any_file(records: list[bytes], since: int | None, max_lines: int) -> None:
    with written("kmsg", b"\n".join(records)) as d:
        lines, last_seq = read_kmsg(os.path.join(d, "kmsg"), since, max_lines)
    assert len(lines) <= max_lines and all(isinstance(x, str) for x in lines)
    assert last_seq is None or isinstance(last_seq, int)


@QUICK
@given(st.lists(KERNEL_LINES, max_size=30), st.none() | st.integers(0, 40))
def test_filter_lines_keeps_input_lines_only(lines: list[str], max_lines: int | None) -> None:
    kept = filter_lines(lines, max_lines)
    # Each budget (OOM, application Xids, hardware) keeps up to max_lines of its own (38a7900).
    assert max_lines is None or len(kept) <= max_lines * len(BUDGETS)
    # Each kept line is an input line (without its line end, maybe cut to a sane length).
    assert all(any(src.startswith(line) for src in lines) for line in kept)


@QUICK
@given(st.one_of(XID_LINES, KERNEL_LINES))
def test_parse_xid_is_none_or_a_sane_event(line: str) -> None:
    event = parse_xid(line)
    if event is None:
        return
    assert "Xid" in line and isinstance(event.code, int) and event.code >= 0
    assert event.caused_by is None or isinstance(event.caused_by, int)
    assert event.pci is None or event.pci == normalize_pci(event.pci)
    assert isinstance(needs_drain(event), bool)


@QUICK
@given(st.one_of(PCI_TEXT, glued(["0000", ":", "18", "9B", ".0", "PCI:", "ffffffff"])))
def test_normalize_pci_is_none_or_canonical(text: str) -> None:
    pci = normalize_pci(text)
    assert pci is None or (len(pci) == 10 and pci == pci.lower() and pci.count(":") == 2)


KERNEL_CHECKS = ["kernel.xid", "kernel.gpu_bus", "kernel.oom"]


@QUICK
@given(st.lists(KERNEL_LINES, max_size=25))
def test_kernel_checks_never_crash(lines: list[str]) -> None:
    facts = make_facts(kernel_log=tuple(lines))
    assert_no_crash(run_checks(facts, default_config(), only=KERNEL_CHECKS))


# ------------------------------------------------------------------------------ sysfs values

IB_TEXT = st.none() | glued(
    ["4: ACTIVE", "5: LinkUp", ": ", "400", " Gb/sec", " (4X NDR)", "2.5", "\n", " "]
)


@QUICK
@given(IB_TEXT)
def test_ib_state_and_rate(text: str | None) -> None:
    state = parse_state(text)
    assert state is None or (isinstance(state, str) and state == state.strip())
    rate = parse_rate(text)
    assert rate is None or (isinstance(rate, float) and not rate < 0)


SAFE_NAME = st.text(
    st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1, max_size=20
).filter(lambda n: n not in (".", ".."))


@SLOW
@given(st.dictionaries(SAFE_NAME, ascii_bytes(NUMBERS) | JUNK_BYTES, max_size=6))
def test_ib_counters_are_non_negative_ints(files: dict[str, bytes]) -> None:
    with _tempdir() as d:
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        counters = read_counters(d)
    assert set(counters) <= set(files)
    assert all(isinstance(v, int) and v >= 0 for v in counters.values())


MEMINFO = glued_lines(["MemTotal:", "MemAvailable:", "SwapTotal:", "SwapFree:", " kB", "  ", ":"])


@QUICK
@given(MEMINFO)
def test_meminfo_gives_int_mib(text: str) -> None:
    memory = parse_meminfo(text)
    assert set(memory) <= {"total_mib", "available_mib", "swap_total_mib", "swap_used_mib"}
    assert all(isinstance(v, int) for v in memory.values())


@QUICK
@given(
    st.one_of(
        glued_lines(["nvidia ", "mlx5_core ", "56623104 ", "- Live 0x0", " ", "\t"]), st.text()
    )
)
def test_modules_are_names(text: str) -> None:
    assert all(name and not any(c.isspace() for c in name) for name in parse_modules(text))


MOUNTINFO = glued_lines(
    ["36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue", " - ", " ",
     "\\040", "\\134", "\\777", "nfs4", "rw", "ro"]
)  # fmt: skip


@QUICK
@given(MOUNTINFO)
def test_mountinfo_gives_a_table(text: str) -> None:
    for point, entry in parse_mountinfo(text).items():
        assert isinstance(point, str)
        assert set(entry) == {"fstype", "source", "options", "super_options"}


PING = glued_lines(
    ["100 packets transmitted, ", "99 received", " packets received", "rtt min/avg/max/mdev = ",
     "round-trip min/avg/max/stddev = ", "0.1/", "0.2/", "/", " ms", ", 1% packet loss"]
)  # fmt: skip


@QUICK
@given(PING)
def test_ping_summary(text: str) -> None:
    out = parse_ping(text)
    assert set(out) <= {"sent", "received", "avg_ms"}
    assert all(isinstance(out[k], int) for k in ("sent", "received") if k in out)
    assert "avg_ms" not in out or isinstance(out["avg_ms"], float)


# -------------------------------------------------------------------------------- snapshots


@QUICK
@given(st.one_of(JSON_LIKE, mapping_with(list(Facts._fields), JSON_LIKE)))
def test_facts_from_dict_accepts_or_refuses_clearly(data: object) -> None:
    try:
        facts = facts_from_dict(data)
    except SnapshotError:
        return
    assert isinstance(facts, Facts)


def _paths(tree: object, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into a plain dict/list tree, inner nodes included (the root excluded)."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list):
        items = enumerate(tree)
    else:
        return
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


# One GPU, one port, one mount: every field once, so each mutation hits a distinct one.
HEALTHY = make_facts(gpus=[make_gpu(0)], infiniband=(make_ib(0),), peers=()).to_dict()
HEALTHY_PATHS = list(_paths(HEALTHY))
PEERS = st.lists(
    st.fixed_dictionaries(
        {"node": st.text(max_size=8)},
        optional={"sent": st.integers(-5, 2**64), "received": st.integers(-5, 2**64),
                  "avg_ms": st.floats(), "error": st.text(max_size=8)},
    ),
    max_size=3,
)  # fmt: skip
# Plausible values for fields that are None in the healthy snapshot (by field name).
FOR_NONE = {
    "peers": PEERS,
    "retired_pages_pending": st.booleans(),
    "kernel_log_seq": st.integers(),
    "boot_id": st.text(max_size=8),
    "error": st.text(max_size=8),
}


def _plausible(path: tuple) -> st.SearchStrategy:
    """A value of the healthy value's type (any size or sign), or anything at all."""
    healthy: object = HEALTHY
    for key in path:
        healthy = healthy[key]  # type: ignore[index]
    if isinstance(healthy, bool):
        same = st.booleans()
    elif isinstance(healthy, int):
        same = st.integers(-(2**70), 2**70)
    elif isinstance(healthy, float):
        same = st.floats()
    elif isinstance(healthy, str):
        same = st.one_of(st.text(max_size=20), NUMBERS, KERNEL_LINES)
    elif isinstance(healthy, list) and path[-1] == "kernel_log":
        same = st.lists(KERNEL_LINES, max_size=8)
    elif isinstance(healthy, list) and healthy and isinstance(healthy[0], bool):
        same = st.lists(st.booleans(), max_size=20)
    elif isinstance(healthy, list) and healthy and isinstance(healthy[0], str):
        same = st.lists(st.text(max_size=12), max_size=6)
    elif isinstance(healthy, dict) and all(isinstance(v, int) for v in healthy.values()):
        same = st.dictionaries(st.text(max_size=10), st.integers(-(2**70), 2**70), max_size=4)
    else:
        same = FOR_NONE.get(path[-1], JSON_LIKE)
    if isinstance(healthy, list):  # the right container holding the wrong things
        return st.one_of(same, st.lists(JSON_SCALARS, min_size=1, max_size=4), JSON_LIKE)
    if isinstance(healthy, dict):
        return st.one_of(
            same, st.dictionaries(st.text(max_size=8), JSON_SCALARS, min_size=1), JSON_LIKE
        )
    return st.one_of(same, JSON_LIKE)


@st.composite
def mutated_snapshots(draw: st.DrawFn) -> dict:
    """The healthy snapshot with a few random fields replaced by random values."""
    doc = json.loads(json.dumps(HEALTHY))
    for path in draw(st.lists(st.sampled_from(HEALTHY_PATHS), max_size=6)):
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = draw(_plausible(path))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation replaced a parent of this path
    return doc


@QUICK
@given(mutated_snapshots())
def test_checklist_never_crashes_on_accepted_snapshots(doc: dict) -> None:
    try:
        facts = facts_from_dict(doc)
    except SnapshotError:
        return
    assert_no_crash(run_checks(facts, default_config()))


YAML_FRAGMENTS = [
    "a: ", "- ", "  ", "\n", "[", "]", "{", "}", ": ", "&x ", "*x", "!!binary ", "!!int ", "!!float ",
    "!!timestamp ", "!!set ", "!!python/object:os.system ", "2020-13-45", "2001-12-14t21:59:43.10-99:99",
    "0b_", "0x_", "1:_", "? ", "<<: ", "'", '"', "#", "|\n", "%YAML 1.1\n", "---\n", "...\n", "\t",
]  # fmt: skip


@QUICK
@given(st.one_of(glued(YAML_FRAGMENTS, 16), st.text()))
def test_parse_yaml_gives_data_or_yaml_error(text: str) -> None:
    try:
        parse_yaml(text)
    except YamlError:
        pass


# ----------------------------------------------------------------------------- Slurm output

NODE_KEYS = ["NodeName", "State", "Reason", "Partitions", "Comment", "Arch", "CPUTot", "Gres"]
JOB_KEYS = ["JobId", "UserId", "JobState", "Reason", "NodeList", "BatchHost", "StdOut", "StdErr",
            "WorkDir", "ExitCode", "Restarts", "Comment", "AdminComment", "ExcNodeList", "Requeue",
            "Partition", "JobName"]  # fmt: skip
KV_VALUES = glued(
    ["IDLE", "+DRAIN", "*", "~", "gpugate: gpu.ecc: x", " [root@2024-01-02T03:04:05]", "[a@b]",
     " [x@0001-01-01T00:00:00]", " [x@9999-12-31T23:59:61]", " [@]", "(null)", "alice(1000)",
     "0:9", "gpu-[01-03]", "n[1-999999999]", "x[", "]", " ", "=", ","]
)  # fmt: skip


def kv_text(keys: list[str]) -> st.SearchStrategy[str]:
    """`scontrol show` output: records of `Key=Value` runs, one-line or spread over lines."""
    pair = st.builds("{}={}".format, st.sampled_from(keys), KV_VALUES)
    record = st.builds(
        lambda first, pairs: f"{keys[0]}={first} " + " ".join(pairs),
        KV_VALUES,
        st.lists(pair, max_size=8),
    )
    sep = st.sampled_from([" ", "\n   ", "\n"])
    return st.lists(st.tuples(record, sep), max_size=4).map(
        lambda rs: "\n".join(r.replace(" ", s, 3) for r, s in rs)
    )


@QUICK
@given(st.one_of(kv_text(NODE_KEYS), st.text()))
def test_show_node_text_gives_nodes(text: str) -> None:
    assert all(isinstance(n, NodeInfo) for n in parse_show_node_text(text))


@QUICK
@given(st.one_of(kv_text(JOB_KEYS), st.text()))
def test_show_job_text_gives_a_job_or_value_error(text: str) -> None:
    try:
        assert isinstance(parse_show_job_text(text), JobInfo)
    except ValueError:
        pass


NODE_RECORD = mapping_with(
    [
        "name",
        "state",
        "state_flags",
        "reason",
        "reason_set_by_user",
        "reason_changed_at",
        "partitions",
    ],
    JSON_LIKE,
)
SINFO_RECORD = mapping_with(["node", "nodes", "reason", "partition"], JSON_LIKE | NODE_RECORD)
JOB_RECORD = mapping_with(
    ["job_id", "job_state", "exit_code", "state_description", "state_reason", "user_name", "user_id",
     "nodes", "batch_host", "restart_cnt", "excluded_nodes", "requeue", "partition", "comment"],
    JSON_LIKE | KV_VALUES,
)  # fmt: skip
SLURM_JSON = st.one_of(
    st.fixed_dictionaries({"nodes": st.lists(NODE_RECORD, max_size=3) | JSON_LIKE}),
    st.fixed_dictionaries({"sinfo": st.lists(SINFO_RECORD, max_size=3) | JSON_LIKE}),
    st.fixed_dictionaries({"jobs": st.lists(JOB_RECORD, max_size=3) | JSON_LIKE}),
    JSON_LIKE,
).map(json.dumps)
TRUNCATED_JSON = st.tuples(SLURM_JSON, st.integers(0, 200)).map(lambda t: t[0][: t[1]])


@QUICK
@given(st.one_of(SLURM_JSON, TRUNCATED_JSON, st.just("[" * 100_000), st.text()))
def test_slurm_json_gives_records_or_value_error(text: str) -> None:
    for parse, kind in (
        (parse_nodes_json, NodeInfo),
        (parse_sinfo_json, NodeInfo),
        (parse_jobs_json, JobInfo),
    ):
        try:
            assert all(isinstance(r, kind) for r in parse(text))
        except ValueError:
            pass


HOSTLIST = glued(
    ["gpu-", "n", "[", "]", "-", ",", "01", "1-3", "1-100000", "1-999999999", " ", "(null)"], 14
)
HOSTS_MAX = 100_000


@QUICK
@given(st.one_of(HOSTLIST, st.text()))
def test_hostlist_expand_gives_names_or_hostlist_error(expr: str) -> None:
    try:
        names = hostlist_expand(expr)
    except HostlistError:
        return
    assert len(names) <= HOSTS_MAX and all(isinstance(n, str) and n for n in names)


def assert_one_capped_line(text: str, limit: int) -> None:
    assert text.startswith(GPUGATE_PREFIX) and len(text) <= limit
    assert text.isascii() and text.isprintable() and text == text.strip()


@QUICK
@given(st.text(), st.one_of(st.text(), st.binary(max_size=40), JSON_LIKE))
def test_reasons_and_comments_are_one_capped_printable_line(check_id: str, detail: object) -> None:
    assert_one_capped_line(drain_reason(check_id, detail), REASON_MAX)  # type: ignore[arg-type]
    assert_one_capped_line(admin_comment(detail), COMMENT_MAX)  # type: ignore[arg-type]
    cleaned = clean_text(detail, 50)
    assert len(cleaned) <= 50 and cleaned.isascii() and cleaned.isprintable()


# --------------------------------------------------------------------------------- job logs

ANSI = ["\x1b[31m", "\x1b[0m", "\x1b]0;title\x07", "\x1b[", "[0;31m", "\x1bc"]
RANKS = [
    "[rank3]: ",
    "[rank: 0] ",
    "[1,3]<stderr>: ",
    "[default5]: ",
    "10.0.0.1: ",
    "(pid=42) ",
    "7: ",
]
JOB_LOG_FRAGMENTS = [s.example for s in SIGNATURES] + ANSI + RANKS + ["\r", "\n", "\r\n", " "]
JOB_LOGS = st.one_of(
    ascii_bytes(glued(JOB_LOG_FRAGMENTS, 20)),
    st.binary(max_size=400),
    st.lists(st.sampled_from(JOB_LOG_FRAGMENTS).map(str.encode) | JUNK_BYTES, max_size=30).map(
        b"".join
    ),
)


def assert_diagnosis(diagnosis: Diagnosis) -> None:
    assert diagnosis.category in CATEGORIES
    json.dumps(diagnosis.to_json())  # the --json output is always serialisable


@QUICK
@given(JOB_LOGS)
def test_diagnose_bytes_gives_a_known_category(data: bytes) -> None:
    assert_diagnosis(diagnose_bytes(data))


# ------------------------------------------------------------------------------ checkpoints


def _torch_zip(step: int = 5) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"global_step": step}, protocol=2))
        z.writestr("archive/data/0", b"\0" * 64)
    return buf.getvalue()


TORCH_ZIP = _torch_zip()
LEGACY_MAGIC = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19."
U16, U32, U64 = st.integers(0, 2**16 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
MAXED = st.sampled_from([0xFFFFFFFF, 0]) | U32  # 0xFFFFFFFF: "see the ZIP64 extra field"


@st.composite
def zip_tails(draw: st.DrawFn) -> bytes:
    """A ZIP's end: one central directory entry for */data.pkl with random (often maxed)
    sizes and a random ZIP64 extra field, maybe a ZIP64 locator pointing anywhere, and an
    end record whose numbers are right or random."""
    name = draw(st.sampled_from([b"archive/data.pkl", b"a/b/data.pkl", b"x"]))
    zip64 = st.builds(
        lambda n, q: struct.pack("<HH", 1, n) + q, st.integers(0, 24), st.binary(max_size=24)
    )
    extra = draw(st.binary(max_size=40) | zip64)
    csize, usize, offset = draw(MAXED), draw(MAXED), draw(MAXED)
    cd = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 0, 0, 0, 0, 0, 0, 0, csize, usize,
                     len(name), len(extra), 0, 0, 0, 0, offset) + name + extra  # fmt: skip
    body = b"PK\x03\x04" + draw(st.binary(max_size=40))
    locator = draw(
        st.just(b"")
        | st.builds(lambda a, b: struct.pack("<4sLQL", b"PK\x06\x07", 0, a, b), U64, U32)
    )
    count = draw(st.just(1) | U16)
    cd_size, cd_offset = draw(st.just(len(cd)) | U32), draw(st.just(len(body)) | U32)
    return (
        body
        + cd
        + locator
        + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, cd_size, cd_offset, 0)
    )


TORCH_FILES = st.one_of(
    st.integers(0, len(TORCH_ZIP)).map(lambda n: TORCH_ZIP[:n]),  # cut short
    st.tuples(st.integers(0, len(TORCH_ZIP) - 1), st.binary(min_size=1, max_size=8)).map(
        lambda t: TORCH_ZIP[: t[0]] + t[1] + TORCH_ZIP[t[0] + len(t[1]) :]  # bytes overwritten
    ),
    zip_tails(),
    st.binary(max_size=200).map(lambda b: LEGACY_MAGIC + b),
    st.binary(max_size=64).map(lambda b: b"\x80" + b + b"."),
    st.binary(max_size=64),
)
TAGS = st.one_of(
    st.sampled_from(["global_step5", "release", "10", "²", "٣", "../x", "/", "\0", ".", ""]).map(
        str.encode
    ),
    glued(["global_step5", "iter_0000010", "release", "10", "\n", " "]).map(str.encode),
    st.binary(max_size=16),
)
TRAINER_STATES = st.one_of(
    st.sampled_from(
        [b"[" * 100_000, b"{", b'{"global_step": 20}', b'{"global_step": "20"}', b"\xff"]
    ),
    st.builds('{{"global_step": {}}}'.format, NUMBERS).map(str.encode),
    JSON_LIKE.map(lambda v: json.dumps(v).encode()),
)
# Directories of many layouts at once: names of every framework, each with content of its kind
# or anything, plus symlinks inside, outside and in loops.
LAYOUT_FILES = {
    "latest": TAGS, "latest_checkpointed_iteration.txt": TAGS, "dir.ckpt/latest": TAGS,
    "checkpoint-20/trainer_state.json": TRAINER_STATES, "trainer_state.json": TRAINER_STATES,
    "global_step5/mp_rank_00_model_states.pt": TORCH_FILES,
    "global_step5/zero_pp_rank_0_mp_rank_00_optim_states.pt": TORCH_FILES,
    "global_step7/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": TORCH_FILES,
    "iter_0000010/mp_rank_00/model_optim_rng.pt": TORCH_FILES,
    "iter_0000010/mp_rank_01_002/model_optim_rng.pt": TORCH_FILES,
    "release/mp_rank_00/model_optim_rng.pt": TORCH_FILES,
    "dir.ckpt/checkpoint/mp_rank_00_model_states.pt": TORCH_FILES,
    "epoch=1-step=40.ckpt": TORCH_FILES, "last.ckpt": TORCH_FILES, "model_50.pt": TORCH_FILES,
    "weights.pth.tar": TORCH_FILES, "iter_0000010/.metadata": TORCH_FILES,
    "dcp_70/.metadata": TORCH_FILES, ".metadata": TORCH_FILES,
    "model_60.pt.tmp": JUNK_BYTES, "model_50.pt.partial": JUNK_BYTES, "dcp_70/__0_0.distcp": JUNK_BYTES,
    "dcp_80/.metadata.tmp": JUNK_BYTES, "iter_0000011_tmp/x": JUNK_BYTES, "tmp-checkpoint-30/x": JUNK_BYTES,
}  # fmt: skip
LAYOUT_ENTRIES = st.one_of(
    st.sampled_from(sorted(LAYOUT_FILES)).flatmap(
        lambda n: st.tuples(st.just(n), LAYOUT_FILES[n] | JUNK_BYTES)
    ),
    st.tuples(SAFE_NAME, JUNK_BYTES),
)
LINKS = st.tuples(
    st.sampled_from(["loop", "global_step9", "iter_0000012", "link.pt", "checkpoint-9"]),
    st.sampled_from(
        ["/", "/etc/passwd", "..", "../..", "global_step5", "model_50.pt", "missing", "loop"]
    ),
)


def assert_checkpoints_inside(
    files: list[tuple[str, bytes]], links: list[tuple[str, str]] = ()
) -> None:
    """Scan a fresh directory holding `files` and `links`: nothing but CheckpointDirError is
    raised, every checkpoint is named inside it, and complete ones really lie inside it."""
    with _tempdir() as d:
        for rel, data in files:
            try:
                os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
                with open(os.path.join(d, rel), "wb") as f:
                    f.write(data)
            except OSError:
                continue  # a parent is a file: that layout just does not arise
        for rel, target in links:
            try:
                os.symlink(target, os.path.join(d, rel))
            except FileExistsError:
                continue
        try:
            found = find_checkpoints(d, settle_s=0)
            latest = latest_complete(d, settle_s=0)
        except CheckpointDirError:
            return
        real = os.path.realpath(d)
        for cp in found:
            assert cp.path.startswith(d + os.sep)
            assert not cp.complete or os.path.realpath(cp.path).startswith(real + os.sep)
        assert latest is None or (latest.complete and latest.path in {cp.path for cp in found})


@SLOW
@given(st.sampled_from(["model.pt", "last.ckpt", "model_50.pt", "w.pth.tar"]), TORCH_FILES)
def test_checkpoint_torch_files(name: str, data: bytes) -> None:
    assert_checkpoints_inside([(name, data)])


@SLOW
@given(st.booleans(), TAGS)
def test_checkpoint_tracker_files(deepspeed: bool, tag: bytes) -> None:
    if deepspeed:
        assert_checkpoints_inside(
            [("latest", tag), ("global_step5/mp_rank_00_model_states.pt", TORCH_ZIP)]
        )
    else:
        rank_file = "iter_0000010/mp_rank_00/model_optim_rng.pt"
        assert_checkpoints_inside(
            [("latest_checkpointed_iteration.txt", tag), (rank_file, TORCH_ZIP)]
        )


@SLOW
@given(TRAINER_STATES)
def test_checkpoint_trainer_state(data: bytes) -> None:
    assert_checkpoints_inside([("checkpoint-20/trainer_state.json", data)])


@SLOW
@given(st.lists(LAYOUT_ENTRIES, max_size=8), st.lists(LINKS, max_size=3))
def test_checkpoint_directories(
    files: list[tuple[str, bytes]], links: list[tuple[str, str]]
) -> None:
    assert_checkpoints_inside(files, links)


def test_checkpoint_dir_errors_are_checkpoint_dir_errors() -> None:
    with written("file", b"x") as d:
        for path in (os.path.join(d, "file"), os.path.join(d, "missing")):
            with pytest.raises(CheckpointDirError):
                latest_complete(path)


# ----------------------------------------------------------------------------------- config

CONFIG_PATHS: list[tuple[str, ...]] = list(
    p for p in _paths(yaml.safe_load(open(PACKAGED_FILE, encoding="utf-8")))  # noqa: SIM115
    if all(isinstance(k, str) for k in p)
)  # fmt: skip
CONFIG_VALUES = st.one_of(
    JSON_SCALARS, JSON_LIKE, st.sampled_from(["auto", "warn", "cli", "allow", "max", -1, 1e308])
)


@st.composite
def config_documents(draw: st.DrawFn) -> str:
    """A site file setting a few real keys (at any depth) to random values."""
    doc: dict = {}
    for path in draw(st.lists(st.sampled_from(CONFIG_PATHS), max_size=5)):
        node = doc
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = draw(CONFIG_VALUES)
    return yaml.safe_dump(doc)


@SLOW
@given(st.one_of(config_documents(), glued([*YAML_FRAGMENTS, "sources:", "checks:", "  gpu:"], 12)))
def test_load_config_gives_config_or_config_error(text: str) -> None:
    with written("gpugate.yaml", text.encode("utf-8", "surrogatepass")) as d:
        try:
            config = load_config(os.path.join(d, "gpugate.yaml"))
        except ConfigError:
            return
    # A config that loads runs the checklist (thresholds, versions, choices) without a crash.
    assert_no_crash(run_checks(make_facts(), config))


# ------------------------------------------------------------------------ hook environment

HOOK_KEYS = [
    "SLURMD_NODENAME", "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_USER", "SLURM_JOB_UID", "SLURM_JOB_GID",
    "SLURM_JOB_GPUS", "SLURM_JOB_COMMENT", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NUM_NODES",
    "SLURM_JOB_RESTART_COUNT", "SLURM_RESTART_COUNT", "SLURM_JOB_WORK_DIR", "SLURM_JOB_STDOUT",
    "SLURM_JOB_EXIT_CODE", "SLURM_JOB_EXIT_CODE2", "SLURM_JOB_DERIVED_EC", "SLURM_SCRIPT_CONTEXT",
    "SLURM_JOB_START_TIME", "SLURM_JOB_END_TIME",
]  # fmt: skip
COMMENTS = glued(
    ["gpugate:", "skip", "ckpt=", "/data/run1", "requeue", "restarts=", " ", ",", ";", "="]
)


@QUICK
@given(
    st.dictionaries(st.sampled_from(HOOK_KEYS), st.one_of(NUMBERS, COMMENTS, st.text(max_size=20)))
)
def test_from_environ_reads_any_environment(environ: dict[str, str]) -> None:
    env = from_environ(environ)
    assert isinstance(env, HookEnv) and isinstance(env.restart_count, int)
    for field in ("uid", "gid", "num_nodes", "exit_code", "derived_ec", "start_time", "end_time"):
        assert getattr(env, field) is None or isinstance(getattr(env, field), int)
    assert env.gpus is None or all(isinstance(g, int) for g in env.gpus)


@QUICK
@given(st.one_of(COMMENTS, st.text()))
def test_comment_tokens(comment: str) -> None:
    tokens = comment_tokens(comment)
    assert all(k and k.replace("_", "").isalpha() and isinstance(v, str) for k, v in tokens.items())


# ------------------------------------------------------------- evidence and state readers

STATE_FILES = st.one_of(
    st.binary(max_size=100),
    JSON_LIKE.map(lambda v: json.dumps(v).encode()),
    mapping_with(["seq", "boot_id", "job_id", "gpus"], JSON_LIKE).map(
        lambda v: json.dumps(v).encode()
    ),
    st.sampled_from(
        [b"[" * 100_000, b'{"seq": Infinity}', b'{"seq": NaN}', b'{"seq": "1e3"}', b"\xff\xfe"]
    ),
)


@QUICK
@given(STATE_FILES)
def test_state_and_evidence_readers_give_none_or_a_value(data: bytes) -> None:
    with written("summary.json", data) as d:
        summary = read_summary(d)
    assert summary is None or isinstance(summary, dict)
    with written("kernel-log.pos", data) as d:
        _, seq = load_kernel_pos(d)
    assert seq is None or isinstance(seq, int)
    with _tempdir() as d:
        os.makedirs(os.path.join(d, "jobs", "77"))
        with open(os.path.join(d, "jobs", "77", "baseline.json"), "wb") as f:
            f.write(data)
        baseline = load_baseline(d, "77")
    assert baseline is None or isinstance(baseline, Baseline)


# ----------------------------------------------------------------------- enormous inputs

MB = 1 << 20
CHATTER = [
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    'audit: type=1400 audit(1700000000.123:42): apparmor="STATUS" operation="profile_load"',
    "mlx5_core 0000:29:00.0: firmware version: 28.39.1002",
    "pcieport 0000:00:01.0: AER: enabled with IRQ 27",
]


def _kernel_log_chunk() -> bytes:
    """~50 KiB of a kernel log: chatter, a few relevant lines, a multi-line message."""
    lines = []
    for i in range(600):
        if i % 50 == 0:
            lines.append(f"[{i}.000001] NVRM: Xid (PCI:0000:18:00): 13, pid={i}, name=python, x")
        elif i % 77 == 0:
            lines.append(f"[{i}.000002] NVRM: The NVIDIA GPU 0000:b3:00.0\n    NVRM: fallen off")
        else:
            lines.append(f"[{i}.000003] {CHATTER[i % len(CHATTER)]}")
    return ("\n".join(lines) + "\n").encode()


def test_50mb_kernel_log_is_filtered_in_bounded_time_and_lines() -> None:
    chunk = _kernel_log_chunk()
    with _tempdir() as d:
        path = os.path.join(d, "kern.log")
        with open(path, "wb") as f:
            for _ in range(50 * MB // len(chunk) + 1):
                f.write(chunk)
        with time_bound("50 MB kernel log", 2 * HUGE_S):  # ~3 MB/s on a slow, loaded CI core
            lines = read_log_file(path, max_lines=2000)
    assert 0 < len(lines) <= 2000 * len(BUDGETS)  # each budget capped apart (OOM, app Xid)
    facts = make_facts(kernel_log=tuple(lines))
    with time_bound("kernel checks on 6000 lines"):
        assert_no_crash(run_checks(facts, default_config(), only=KERNEL_CHECKS))


# Single 10 MB lines (made when used), among them regex worst cases: one anchor repeated
# without what must follow it (each start scans to the end of the line unless lines are cut).
TEN_MB_LINES = {
    "random": lambda: os.urandom(5 * MB).hex(),
    "xid storm": lambda: "NVRM: Xid (" * (10 * MB // 11),
    "mlx5 storm": lambda: "mlx5 " * (2 * MB),
    "no spaces": lambda: "NVRM: Xid (PCI:0000:18:00): 79, " + "x" * (10 * MB),
}


@pytest.mark.parametrize("kind", list(TEN_MB_LINES))
def test_10mb_single_line_through_the_kernel_log(kind: str) -> None:
    line = TEN_MB_LINES[kind]()
    with time_bound(f"10 MB line ({kind})"):
        kept = filter_lines([line, "  continued"], max_lines=10)
        assert_no_crash(
            run_checks(make_facts(kernel_log=tuple(kept)), default_config(), only=KERNEL_CHECKS)
        )
        record = parse_kmsg_record(b"3,1,2,-;" + line.encode())
        assert record is not None and len(format_record(record)) == 1
    with written("kern.log", line.encode()) as d, time_bound(f"10 MB log file ({kind})"):
        assert len(read_log_file(os.path.join(d, "kern.log"), max_lines=10)) <= 10


def test_10mb_single_line_through_the_job_log_and_reasons() -> None:
    line = ("RuntimeError: CUDA error: " + "\x1b[31m" * 3 + "x" * (10 * MB)).encode() + b"\xff\n"
    with time_bound("10 MB job-log line"):
        assert_diagnosis(diagnose_bytes(line))
    with time_bound("10 MB drain reason"):
        assert_one_capped_line(drain_reason("gpu.ecc", line.decode("utf-8", "replace")), REASON_MAX)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"x" * (4 * MB), id="4mb-line-no-anchor"),
        pytest.param(b"rror " * (MB // 5) + b"\n", id="1mb-line-of-anchors"),
        pytest.param(b"\rNCCL error: unhandled system error" * (MB // 36), id="1mb-cr-storm"),
        pytest.param(b"\xff\xfe\x80" * MB, id="3mb-invalid-utf8"),
    ],
)
def test_big_job_logs_finish(data: bytes) -> None:
    with time_bound(f"{len(data) >> 10} KiB job log"):
        assert_diagnosis(diagnose_bytes(data))


@pytest.mark.parametrize(
    "expr",
    [
        "n[1-999999999]",
        "a[1-100000]b[1-100000]",
        "n[" + ",".join(["1-99999"] * 200) + "]",
        ",".join(["n[1-99999]"] * 200),
        "x[1]" * 5000,
        "n[1-" + "9" * 5000 + "]",
        "[" * 100_000,
    ],
    ids=[
        "one-huge-range",
        "product",
        "many-ranges",
        "many-items",
        "deep",
        "huge-number",
        "brackets",
    ],
)
def test_hostlist_bombs_are_refused_quickly(expr: str) -> None:
    with time_bound(f"hostlist {expr[:20]!r}", 10.0), pytest.raises(HostlistError):
        hostlist_expand(expr)

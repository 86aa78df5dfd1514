"""The scan's cost class does not follow the number of signatures (issue 30).

Counted structure, never time: however many anchors the table holds, the grep engine starts one
grep with one ERE, the Python engine makes one pass of one compiled alternation per chunk, and
the signatures' patterns are tried only on lines that hold a prefilter key.
"""

from __future__ import annotations

import itertools
import subprocess

import pytest

from gpugate.diagnosis import engine as D
from gpugate.diagnosis import scan
from gpugate.diagnosis import signatures as S

# Fifty made-up anchors in the shape of failure wordings (lower-case words, spaces), the kind a
# new family adds; none is in the table.
NOUNS = [
    "shard",
    "queue",
    "bucket",
    "stream",
    "tensor",
    "engine",
    "worker",
    "socket",
    "fabric",
    "cache",
]
VERBS = ["overflowed", "went stale", "lost its peer", "was evicted", "refused work"]
SYNTHETIC = tuple(f"{n} {v}" for n, v in itertools.product(NOUNS, VERBS))

NOISE = "".join(
    f"[rank{i % 8}]: iteration {i} | lm loss: 2.{i:04d} | grad norm: 0.{i:03d} | tokens/s: 812\n"
    for i in range(3000)
)
FAILURE = (
    "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 "
    "has a total capacity of 79.1 GiB\n"
    "[rank1]: the shard overflowed while the bucket went stale\n"  # synthetic anchors only
)


def _with_anchors(monkeypatch: pytest.MonkeyPatch, anchors: tuple[str, ...]) -> None:
    """Make the scan search the keys of these anchors (what a larger table would give)."""
    keys = S.prefilter_keys(anchors)
    monkeypatch.setattr(S, "KEYS", keys)
    monkeypatch.setattr(S, "KEY_BYTES", tuple(k.encode() for k in keys))
    monkeypatch.setattr(S, "GREP_ERE", S.grep_ere(keys))
    monkeypatch.setattr(S, "KEY_RE", S.key_regex(keys))


class _CountingRegex:
    """Wraps the keys' compiled alternation and counts its passes."""

    def __init__(self, rx):
        self.rx, self.calls = rx, 0

    def search(self, *args):
        self.calls += 1
        return self.rx.search(*args)


def _structure(monkeypatch, tmp_path, anchors, engine):
    """(grep processes, ERE patterns given to grep, key-regex calls, lines matched, verdict)."""
    _with_anchors(monkeypatch, anchors)
    log = tmp_path / "job.log"
    log.write_text(NOISE + FAILURE + NOISE)
    popens: list[list[str]] = []
    real_popen = subprocess.Popen

    def spy_popen(argv, *a, **kw):
        popens.append(list(argv))
        return real_popen(argv, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", spy_popen)
    counter = _CountingRegex(S.KEY_RE)
    monkeypatch.setattr(S, "KEY_RE", counter)
    matched: list[bytes] = []
    real_match = S.match_segment

    def spy_match(segment):
        matched.append(segment)
        return real_match(segment)

    monkeypatch.setattr(S, "match_segment", spy_match)
    d = D.diagnose([str(log)], engine=engine)
    monkeypatch.undo()
    greps = [a for a in popens if a and a[0].endswith("grep")]
    patterns = sum(a.count("-E") + a.count("-e") + a.count("-f") for a in greps)
    return len(greps), patterns, counter.calls, matched, (d.category, d.failing_rank)


@pytest.mark.parametrize("engine", ["grep", "python"])
def test_fifty_more_signatures_keep_the_scan_structure(monkeypatch, tmp_path, engine):
    if engine == "grep" and scan._find_grep() is None:
        pytest.skip("no grep")
    base = _structure(monkeypatch, tmp_path, S.ANCHORS, engine)
    grown = _structure(monkeypatch, tmp_path, S.ANCHORS + SYNTHETIC, engine)
    greps, patterns, passes, _, verdict = base
    assert verdict == ("cuda_oom", 3)
    if engine == "grep":
        assert (greps, patterns, passes) == (1, 1, 0)  # one grep, one ERE, no Python pass
    else:
        # One search per line holding a key, plus the one that finds no more: the number of
        # keys does not enter.
        assert greps == 0 and passes == 2
    # Fifty more anchors: one line more holds a key (the synthetic one), nothing else changes.
    assert grown[:2] == base[:2]
    assert grown[2] - base[2] == (0 if engine == "grep" else 1)
    assert grown[4] == verdict


@pytest.mark.parametrize("engine", ["grep", "python"])
def test_patterns_run_only_on_lines_holding_a_key(monkeypatch, tmp_path, engine):
    *_, matched, _ = _structure(monkeypatch, tmp_path, S.ANCHORS, engine)
    assert matched, "the failure lines reach the patterns"
    assert all(any(k in seg for k in S.KEY_BYTES) for seg in matched)
    # ...and only the failure lines: 6,000 noise lines never reach a regex.
    assert len(matched) == 1


def test_keys_start_on_a_cheap_cover_of_bytes_and_new_anchors_reuse_it():
    for anchors in (S.ANCHORS, S.ANCHORS + SYNTHETIC):
        starts = S.start_bytes(anchors)
        keys = S.prefilter_keys(anchors)
        # Every anchor holds a key (the keys' lines are a superset), none holds another key,
        # and every key starts on a chosen byte, KEY_MIN bytes long unless its anchor is shorter.
        assert all(any(k in a for k in keys) for a in anchors)
        assert not any(a != b and a in b for a in keys for b in keys)
        assert all(k.encode()[0] in starts for k in keys)
        assert all(len(S.prefilter_key(a, starts)) >= min(S.KEY_MIN, len(a)) for a in anchors)
        # The cover costs no more than starting each key on its anchor's own rarest byte.
        own = {min((a.encode()[i] for i in S._starts(a.encode())), key=S._weight) for a in anchors}
        assert sum(map(S._weight, starts)) <= sum(map(S._weight, own))
    # Fifty new wordings (a table almost twice as large) add little: the cost is per start
    # byte, not per key, and most new anchors reuse a byte already paid for.
    before = sum(map(S._weight, S.start_bytes(S.ANCHORS)))
    after = sum(map(S._weight, S.start_bytes(S.ANCHORS + SYNTHETIC)))
    assert after <= 1.25 * before, (before, after)


def test_a_key_never_starts_inside_a_utf8_character():
    anchors = ("Speicher erschöpft", "énorme échec", "メモリ不足")
    for key in S.prefilter_keys(anchors):
        assert any(key in a for a in anchors)
        assert len(key.encode()) >= S.KEY_MIN


def test_a_large_file_split_between_two_greps_gives_the_same_lines(monkeypatch, tmp_path):
    if scan._find_grep() is None:
        pytest.skip("no grep")
    log = tmp_path / "job.log"
    log.write_text(NOISE + FAILURE + NOISE + FAILURE.replace("rank3", "rank5") + NOISE)
    whole = D.diagnose([str(log)], engine="grep")
    greps: list[list[str]] = []
    real_popen = subprocess.Popen

    def spy_popen(argv, *a, **kw):
        greps.append(list(argv))
        return real_popen(argv, *a, **kw)

    monkeypatch.setattr(scan, "SPLIT_MIN", 0)  # every file is large
    monkeypatch.setattr(subprocess, "Popen", spy_popen)
    split = D.diagnose([str(log)], engine="grep")
    assert len(greps) == 2 and all(a.count("-E") == 1 for a in greps)
    assert split.evidence == whole.evidence and split.failing_rank == whole.failing_rank
    # The hits themselves, line numbers included, one by one.
    with open(log, "rb") as f:
        size = log.stat().st_size
        mid = scan.split_point(f.fileno(), size)
        assert mid is not None and 0 < mid < size
        one = list(scan.grep_hits("-", "grep", size, stdin=f))
        assert list(scan.split_grep_hits(f.fileno(), "grep", size, mid)) == one


def test_a_split_scan_stopped_early_leaves_no_grep_running(monkeypatch, tmp_path):
    if scan._find_grep() is None:
        pytest.skip("no grep")
    log = tmp_path / "job.log"
    # The first half's grep has more to say than a pipe holds: it blocks on its output, and
    # must be killed before its feeder is waited for.
    log.write_text(FAILURE * 2000 + NOISE * 4 + FAILURE)
    procs: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def spy_popen(argv, *a, **kw):
        procs.append(real_popen(argv, *a, **kw))
        return procs[-1]

    monkeypatch.setattr(subprocess, "Popen", spy_popen)
    with open(log, "rb") as f:
        size = log.stat().st_size
        hits = scan.split_grep_hits(f.fileno(), "grep", size, scan.split_point(f.fileno(), size))
        assert next(hits)[0] == 1
        hits.close()
    assert len(procs) == 2 and all(p.poll() is not None for p in procs)

"""gpugate.regex.lazy: a module constant that behaves as re.compile's pattern, compiled late."""

from __future__ import annotations

import re

from gpugate.regex import lazy


def test_a_lazy_pattern_compiles_on_first_use_and_behaves_as_compiled():
    pattern = lazy(r"Xid \((\S+)\): (\d+)", re.IGNORECASE)
    assert "_compiled" not in vars(pattern)  # nothing compiled at import
    line = "NVRM: xid (PCI:0000:1b:00): 79, pid=1"
    real = re.compile(r"Xid \((\S+)\): (\d+)", re.IGNORECASE)
    assert pattern.search(line).groups() == real.search(line).groups()
    assert "_compiled" in vars(pattern)
    assert pattern.pattern == real.pattern and pattern.flags == real.flags
    assert [m.group(2) for m in pattern.finditer(line)] == ["79"]
    assert pattern.sub("X", line) == real.sub("X", line)


def test_bytes_patterns_too():
    pattern = lazy(rb"\\x([0-9a-f]{2})")
    assert pattern.sub(lambda m: bytes([int(m.group(1), 16)]), b"a\\x41b") == b"aAb"


# --- the plain parsers that keep `re` off a healthy run agree with the patterns they spare ---
def _samples() -> list[str]:
    import random

    rng = random.Random(27)
    alphabet = "0123456789abcdefABCDEFgxyz:.- _/()PCI"
    made = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) for _ in range(4000)]
    return [
        *made,
        "00000000:18:00.0", "0000:9b:00", "00000000:9B:00.0", "000000000:18:00.0", "000:18:00.0",
        "0000:18:00.", "0000:18:00.00", "0000:1:00.0", "0000:18:0g.0", "PCI:0000:9B:00",
        "18:00.0", "", "0000:18:00:00", "abcd:ef:01.f", "H100 80GB HBM3", "NVIDIA GH200 480GB",
        "a-b_c  d", "é100",
    ]  # fmt: skip


def test_plain_pci_answers_as_the_pattern_does():
    from gpugate.checks.xid import _PCI_RE, plain_pci

    fast = 0
    for text in _samples():
        plain = plain_pci(text)
        if plain is None:
            continue  # normalize_pci asks the pattern
        fast += 1
        m = re.compile(_PCI_RE.pattern).search(text)
        assert m is not None, text
        assert plain == f"{m.group(1)[-4:].lower()}:{m.group(2).lower()}:{m.group(3).lower()}"
    assert fast >= 4  # NVML's forms among the crafted samples


def test_board_words_are_the_patterns_words():
    from gpugate.checks.boards import words

    for text in _samples():
        assert words(text) == tuple(w.upper() for w in re.findall(r"[A-Za-z0-9]+", text)), text

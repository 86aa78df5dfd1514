"""Line cleaning: one raw log line to the text a signature reads, and the rank its prefix names.

Launchers put their own prefixes in front of every line (srun --label, mpirun --tag-output,
torchrun --tee, pdsh, Ray), a pasted log may carry a quote's `> `, terminals leave ANSI codes
and `\r` progress bars. All of that is peeled off here, once, for both scanning engines
(docs/gpu-facts.md section 6).
"""

from __future__ import annotations

import re

from gpugate.regex import lazy

# ANSI/VT100 escapes: CSI sequences (colours, cursor moves), OSC titles, two-byte escapes.
_ANSI_RE = lazy(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_CONTROL_RE = lazy(r"[\x00-\x08\x0b-\x1f\x7f]+")
# Prefixes launchers put in front of every line (docs/gpu-facts.md 6), peeled off one by one.
# `[rankN]:`, `[rank: N]`, mpirun's `[job,N]<stderr>:` and torchrun's `[defaultN]:` name a rank.
_PREFIX_RE = lazy(
    r"""\s*(?:
      \[rank(?P<rank>\d+)\]:\s?                      # [rank3]:  (PyTorch >= 2.2)
    | \[rank:\ (?P<rank_l>\d+)\]\s?                   # [rank: 0] (Lightning)
    | \[\d+,(?P<rank_m>\d+)\]<std(?:out|err)>:\s?      # [1,3]<stderr>: (mpirun --tag-output)
    | \[[A-Za-z_]+(?P<rank_t>\d+)\]:\s?                # [default3]: torchrun --tee (local rank:
                                                      # the global one on the usual single node)
    | (?:\d{1,3}\.){3}\d{1,3}:\s                      # 192.168.1.2: (pdsh / DeepSpeed)
    | (?!(?i:rank|gpu|cuda|device|step|epoch|iter|layer)\d)   # not a counter's "step100: "
      (?P<host>[A-Za-z][A-Za-z0-9-]*\d[A-Za-z0-9-]*     # gpu-a1: (pdsh, DeepSpeed's multi-node
        (?:\.[A-Za-z0-9-]+)*):\                      # runner): a host name with a digit
    | \([\w.-]*\s?pid=\d+(?:,\s*ip=[\d.]+)?\)\s?       # (pid=42) (RayWorker pid=42, ip=1.2.3.4)
    | \d{1,5}:\s                                      # srun --label task number
    | \[[0-9;]*m                                      # a colour code whose ESC got lost
    | >(?:\ |$)                                        # "> " quoting a pasted log (e-mail,
                                                      # Markdown, GitHub issues)
    )""",
    re.X,
)


_GLUED_RANK_RE = lazy(r"\[rank\d+\]:(?!.*\[rank\d+\]:)")


def clean(segment: bytes) -> tuple[str, int | None]:
    """Decoded text without ANSI codes, control bytes and launcher prefixes; and the rank."""
    text, rank, _ = clean_prefixed(segment)
    return text, rank


def clean_prefixed(segment: bytes) -> tuple[str, int | None, str | None]:
    """clean(), and the host a launcher's prefix named (pdsh's `gpu-a1: `), if one did."""
    text = segment.decode("utf-8", "replace")
    if "\x1b" in text:
        text = _ANSI_RE.sub("", text)
    text = _CONTROL_RE.sub("", text).rstrip()
    rank, host = None, None
    glued = _GLUED_RANK_RE.search(text) if "[rank" in text else None
    if glued is not None and glued.start() > 0:
        # `100%|####| 10/10 [00:01<00:00][rank3]:Traceback`: a progress bar without its newline;
        # `gpu-a1: [rank3]: ...`: pdsh's host in front of the rank (kept: the rank's node).
        head = _PREFIX_RE.match(text[: glued.start()])
        if head is not None and head.end() == glued.start():
            host = head.group("host")
        text = text[glued.start() :]
    while True:
        m = _PREFIX_RE.match(text)
        if not m or m.end() == 0:
            break
        found = m.group("rank") or m.group("rank_l") or m.group("rank_m") or m.group("rank_t")
        if found is not None and rank is None:
            rank = int(found)
        if m.group("host") is not None and host is None:
            host = m.group("host")
        text = text[m.end() :]
    return text, rank, host

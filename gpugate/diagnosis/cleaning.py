"""Line cleaning: one raw log line to the text a signature reads, and the rank its prefix names.

Launchers put their own prefixes in front of every line (srun --label, mpirun --tag-output,
torchrun --tee, pdsh, Ray), a pasted log may carry a quote's `> `, terminals leave ANSI codes
and `\r` progress bars. All of that is peeled off here, once, for both scanning engines
(docs/gpu-facts.md section 6).
"""

from __future__ import annotations

import re

from gpugate.record import Record
from gpugate.regex import lazy

# ANSI/VT100 escapes: CSI sequences (colours, cursor moves), OSC titles, two-byte escapes.
_ANSI_RE = lazy(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_CONTROL_RE = lazy(r"[\x00-\x08\x0b-\x1f\x7f]+")
# Prefixes launchers put in front of every line (docs/gpu-facts.md 6), peeled off one by one.
# `[rankN]:`, `[rank: N]`, mpirun's `[job,N]<stderr>:`, torchrun's `[defaultN]:`, srun --label's
# `N: ` (the task id: Slurm's rank) and vLLM's `(VllmWorker rank=N pid=M)` name a rank.
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
    | \([\w.-]*\s?(?:rank=(?P<rank_v>\d+)\s)?       # (pid=42) (RayWorkerWrapper pid=42,
      pid=\d+(?:,\s*ip=[\d.]+)?\)\s?                  # ip=1.2.3.4) (VllmWorker rank=3 pid=406)
    | (?P<rank_s>\d{1,5}):(?:\s|$)                     # srun --label task number
    | (?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\ \d\d-\d\d\ [\d:.]{8,15}\ \[?[\w.-]+\.py:\d+\][ ]
                                                      # vLLM's logger header (vllm/logger.py:
                                                      # "ERROR 07-23 19:34:51 [x.py:487] ")
    | \[[0-9;]*m                                      # a colour code whose ESC got lost
    | >(?:\ |$)                                        # "> " quoting a pasted log (e-mail,
                                                      # Markdown, GitHub issues)
    )""",
    re.X,
)


_RANK_GROUPS = ("rank", "rank_l", "rank_m", "rank_t", "rank_v")
# Slurm's own lines (slurmstepd, srun) reach the log through a task's stream, under that task's
# label: the label names the relaying task, never the origin (their own words may name one).
_SLURM_OWN_RE = lazy(r"(?:slurmstepd(?:-[\w.-]+)?|srun): ")

_GLUED_RANK_RE = lazy(r"\[rank\d+\]:(?!.*\[rank\d+\]:)")


class Cleaned(Record):
    """A cleaned line: its text, the rank and host its prefixes named, and srun's task label.

    `task` is srun --label's task number when the line carried one; `rank` prefers an inner
    rank prefix (`0: [rank3]: ...` is torchrun's rank 3 under srun's task 0, one task per node).
    """

    text: str
    rank: int | None = None
    host: str | None = None
    task: int | None = None


def clean(segment: bytes) -> tuple[str, int | None]:
    """Decoded text without ANSI codes, control bytes and launcher prefixes; and the rank."""
    line = clean_line(segment)
    return line.text, line.rank


def clean_prefixed(segment: bytes) -> tuple[str, int | None, str | None]:
    """clean(), and the host a launcher's prefix named (pdsh's `gpu-a1: `), if one did."""
    line = clean_line(segment)
    return line.text, line.rank, line.host


def clean_line(segment: bytes) -> Cleaned:
    """clean_prefixed() as a record, with srun --label's task number kept apart."""
    text = segment.decode("utf-8", "replace")
    if "\x1b" in text:
        text = _ANSI_RE.sub("", text)
    text = _CONTROL_RE.sub("", text).rstrip()
    rank, host, task = None, None, None
    glued = _GLUED_RANK_RE.search(text) if "[rank" in text else None
    if glued is not None and glued.start() > 0:
        # `100%|####| 10/10 [00:01<00:00][rank3]:Traceback`: a progress bar without its newline;
        # `gpu-a1: [rank3]: ...`: pdsh's host in front of the rank (kept: the rank's node).
        head = _PREFIX_RE.match(text[: glued.start()])
        if head is not None and head.end() == glued.start():
            host = head.group("host")
            task = int(head.group("rank_s")) if head.group("rank_s") else None
        text = text[glued.start() :]
    while True:
        m = _PREFIX_RE.match(text)
        if not m or m.end() == 0:
            break
        if m.group("rank_s") is not None and task is None and rank is None:
            task = int(m.group("rank_s"))
        else:
            found = next((g for g in map(m.group, _RANK_GROUPS) if g is not None), None)
            if found is not None and rank is None:
                rank = int(found)
        if m.group("host") is not None and host is None:
            host = m.group("host")
        text = text[m.end() :]
    if _SLURM_OWN_RE.match(text):
        rank = None  # the relaying task's label; the task number stays (srun --label was on)
    elif rank is None:
        rank = task
    return Cleaned(text=text, rank=rank, host=host, task=task)

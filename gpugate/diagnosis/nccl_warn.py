"""NCCL's `WARN` lines by kind: which ones are errors NCCL returned, and what each one means.

NCCL prints `host:pid:tid [dev] file.cc:line NCCL WARN <message>` when a call fails, then the
error's way up as `NCCL INFO file.cc:line -> N` lines; it also prints WARN for things it works
around (no libibverbs: falls back to sockets; a deprecated variable; a retried connect). Only the
kinds below are failures (nccl_error); any other WARN is chatter and decides nothing, so a
healthy run's warnings never make a failure. The kind and, for an InfiniBand completion error,
its status name go into the summary: "status 12" is what `NCCL_IB_TIMEOUT`/`NCCL_IB_RETRY_CNT`
are tuned for (the seed article), and an admin should not have to look it up.

NCCL 2.0-2.3 printed `file.h:line WARN <message>` without the word NCCL; both forms are read.
"""

from __future__ import annotations

import re

from gpugate.regex import lazy

# InfiniBand work-completion status codes: libibverbs `enum ibv_wc_status` (rdma-core
# libibverbs/verbs.h; ibv_wc_status_str() gives the same meanings).
IB_WC_STATUS: dict[int, str] = {
    1: "local length error",
    2: "local QP operation error",
    3: "local EE context operation error",
    4: "local protection error",
    5: "work request flushed (the QP was already in error)",
    6: "memory window bind error",
    7: "bad response",
    8: "local access error",
    9: "remote invalid request",
    10: "remote access error",
    11: "remote operation error",
    12: "transport retry counter exceeded (peer or link unreachable: NCCL_IB_TIMEOUT/RETRY_CNT)",
    13: "RNR retry counter exceeded (receiver not ready)",
    14: "local RDD violation",
    15: "remote invalid RD request",
    16: "remote abort",
    17: "invalid EE context number",
    18: "invalid EE context state",
    19: "fatal error",
    20: "response timeout",
    21: "general error",
}

# IB async events that are news, not faults (rdma-core `enum ibv_event_type`): a port coming
# up, the subnet manager's routine changes.
BENIGN_ASYNC = ("port active", "client reregistration", "lid change", "pkey change",
                "gid table change", "sm change", "path migrated", "last wqe reached")  # fmt: skip

# The WARN line itself: `NCCL WARN msg` (2.4+) or `file.h:185 WARN msg` (2.0-2.3).
WARN_RE = lazy(r"(?:\bNCCL WARN|\.(?:cc|cu|h|c):\d+ WARN) (?P<msg>.*)")
_COMPLETION = lazy(
    # NCCL <= 2.26: "with error 12, ... vendor err 129"; 2.27+: "with status=IBV_WC_..._ERR(12)
    # ... vendor_err=129".
    r"Got completion from peer (?P<peer>\S+) with (?:error |status=)(?:IBV_WC_\w+\()?(?P<status>\d+)"
    r"(?:.*?vendor[ _]err[ =](?P<vendor>\d+))?"
)
# "Got async event : port error" (NCCL <= 2.24); "async fatal event on QP (0x1f): invalid
# request local work queue error" (2.25+).
_ASYNC = lazy(
    r"Got async (?:error )?event ?: ?(?P<event>[^,(\n]+)|"
    r"async (?P<fatal>fatal )?event on (?P<on>\w+)[^:]*: ?(?P<what>[^,\n]+)",
    re.I,
)
# ENOMEM from the verbs or fabric layer (ibv_create_cq, ibv_reg_mr, fi_mr_reg): NCCL could not
# pin or map memory for the NIC; the usual cause is the locked-memory limit (`ulimit -l`) or the
# NIC's own resources, not the host running out of RAM (labels-43b 583, 584).
_ENOMEM = lazy(r"Cannot allocate memory|\bENOMEM\b")
ENOMEM_NOTE = (": Cannot allocate memory (ENOMEM from the RDMA stack: the locked-memory limit, "
               "ulimit -l, or the NIC's resources; not the host's RAM)")  # fmt: skip
_RETRIED = lazy(r"\b[Rr]etry(?:ing)?\b|will retry|[Rr]etrying")

VERBS = "InfiniBand verbs call failed"
NO_ALGORITHM = (
    "no algorithm/protocol available (NCCL_ALGO/NCCL_PROTO, e.g. CollNet/SHARP unusable here)"
)
REGISTRATION = "network memory registration failed"
# (kind, pattern of the message) in order: the first that matches names the kind.
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((k, lazy(p)) for k, p in (
    ("duplicate GPU (two ranks on one device)", r"Duplicate GPU detected"),
    ("CUDA failure inside NCCL", r"Cuda failure|CUDA failure|failed to open CUDA IPC handle|"
                                 r"cuda\w+ failed|CUDA driver is a stub"),
    (VERBS, r"Call to ibv_\w+ failed|ibv_\w+ failed|NET/IB ?: .*failed"),
    ("proxy failure", r"\[Proxy Service \d+\] Failed|Proxy Call .*failed|[Pp]roxy.*failed"),
    ("socket connection failure",
     r"socket\w*(?:Connect|Progress|Accept|Poll|Recv|Send|Wait)\w*:|Connect to \S+ failed|"
     r"Call to (?:connect|accept|recv|send) failed|Connection (?:closed|reset|refused|abort)|"
     r"connection abort|No route to host|Network is unreachable|Socket recv failed|"
     r"Net : Connection closed|Broken pipe|Message truncated|[Ss]ocket (?:creation|\w+) failed"),
    ("peer process exited", r"remote process exited|peer (?:process )?(?:exited|closed)"),
    # NCCL's shared-memory transport (src/misc/shmutils.cc: "Error: failed to extend %s to %ld
    # bytes", "Error while creating/attaching to shared memory segment %s (size %ld)"; before
    # 2.12 include/shm.h's "Call to posix_fallocate failed"): /dev/shm too small, a container's
    # default 64 MB, or a segment gone before its peer attached (labels-43a 540; labels-43c 616,
    # 621, 622).
    ("shared memory (/dev/shm) failure",
     r"failed to extend /dev/shm/|[Ee]rror while (?:creating|attaching to) shared memory segment"
     r"|Call to posix_fallocate failed"),
    # enqueue.cc: no algorithm/protocol pair can run this collective under the NCCL_ALGO /
    # NCCL_PROTO settings (e.g. NCCL_ALGO=CollNet where CollNet/SHARP is unusable), then
    # ncclInternalError (labels-43c 600, 601).
    (NO_ALGORITHM, r"no algorithm/protocol available"),
    # The aws-ofi-nccl plugin (register_mr_buffers: "NET/OFI Unable to register memory (type =
    # %d) for device %d. RC: %d, Error: %s"): the fabric would not pin the buffer (labels-43b 584).
    (REGISTRATION, r"[Uu]nable to register memory"),
    # NCCL's topology XML (src/graph/xml.h xmlGetAttrStr: "Attribute %s of node %s not found"),
    # then ncclInternalError up the init chain (labels-43b 553).
    ("topology detection failed", r"Attribute \S+ of node \S+ not found"),
    ("bootstrap failure", r"[Bb]ootstrap\w* ?:?.*(?:failed|[Ee]rror|timeout|timed out)"),
    ("invalid usage", r"[Ii]nvalid (?:usage|config|argument|rank|comm|value|device)|"
                      r"ncclInvalid\w+|mismatch"),
    ("NCCL system or internal error", r"unhandled system error|[Ss]ystem error|internal error|"
                                      r"ncclSystemError|ncclInternalError"),
    ("NCCL timeout", r"[Tt]imeout|timed out"),
    ("UNDELIVERABLE message", r"UNDELIVERABLE"),
))  # fmt: skip


def classify(message: str) -> str | None:
    """The failure kind of a WARN message (with its meaning), or None for chatter."""
    m = _COMPLETION.search(message)
    if m:
        code = int(m.group("status"))
        what = IB_WC_STATUS.get(code, "unknown status")
        vendor = f", vendor err {m.group('vendor')}" if m.group("vendor") else ""
        return f"InfiniBand completion error status {code}: {what}{vendor}"
    if _RETRIED.search(message):
        return None  # NCCL tries again: not (yet) a failure
    m = _ASYNC.search(message)
    if m:
        event = (
            m.group("event") or f"{m.group('fatal') or ''}{m.group('on')}: {m.group('what')}"
        ).strip()
        return (
            None if event.lower().startswith(BENIGN_ASYNC) else f"InfiniBand async event: {event}"
        )
    for kind, pattern in KINDS:
        if pattern.search(message):
            rdma = kind in (VERBS, REGISTRATION) and _ENOMEM.search(message)
            return kind + (ENOMEM_NOTE if rdma else "")
    return None

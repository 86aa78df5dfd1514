"""The failing rank from the origin (issue 30): each shape, its reason and confidence, its node.

Fixtures under fixtures/diagnosis/origin/ are written for these tests, each in the format of
the program and version its name and its row below cite. The rule they guard: a rank is named
only where the text names the origin, high confidence only when the origin line itself names
the one rank, and never a wrong rank at high confidence (corpus logs included).
"""

from __future__ import annotations

import csv
import json
import os
import shutil

import paths
import pytest

from gpugate.commands import diagnose as cmd
from gpugate.diagnosis import engine as D
from gpugate.slurm.layout import node_of_rank, tasks_per_node, valid_spec

HERE = str(paths.TESTS)
FIXTURES = os.path.join(HERE, "fixtures", "diagnosis")
ORIGIN = os.path.join(FIXTURES, "origin")
CORPUS = os.path.join(os.path.dirname(HERE), "..", "shared", "corpus")
ENGINES = ["python"] + (["grep"] if shutil.which("grep") else [])

# (fixture, category, rank, rank_confidence, failing_node, words of the reason)
ORIGINS = [
    # PyTorch 2.4 torchrun: each rank's stderr prefixed `[rank1]: ` (the traceback), while the
    # application's logger printed the OOM (c10/cuda/CUDACachingAllocator.cpp's "Tried to
    # allocate ... GPU 1 has a total capacity of ...") without a prefix; the traceback's own
    # exception line is missing from the excerpt.
    ("rank-unprefixed-oom-then-rank-traceback--2.4.log", "cuda_oom", 1, "medium", None,
     "traceback follows"),
    # PyTorch 2.3 torch/distributed/elastic/multiprocessing/errors/__init__.py ChildFailedError
    # table (`host      : ${hostname}`, `rank      : ${rank} (local_rank: ${local_rank})`)
    # collapsed onto one line by a Markdown paste (`_` and the column spaces lost).
    ("torchrun-table-collapsed-rank-host--2.3.log", "other", 2, "high", "gpu-c3",
     "torchrun's failure table"),
    # DeepSpeed 0.14 deepspeed/launcher/launch.py "nnodes=1, num_local_procs=4, node_rank=0":
    # one node, a process per GPU, so the OOM's "GPU 2" is local rank 2 = rank 2 (medium).
    ("rank-oom-gpu-deepspeed-one-node--0.14.log", "cuda_oom", 2, "medium", None, "GPU 2"),
    # Lightning 2.1 "Initializing distributed: GLOBAL_RANK: %d, MEMBER: %d/%d" (lightning/fabric/
    # utilities/distributed.py) and "LOCAL_RANK: %d - CUDA_VISIBLE_DEVICES: [%s]" (lightning/
    # pytorch/accelerators/cuda.py): 4 processes, 4 visible GPUs, so GPU 1 is rank 1 (medium).
    ("rank-oom-gpu-lightning-one-node--2.1.log", "cuda_oom", 1, "medium", None, "GPU 1"),
    # The same on the second of two nodes (world 8, 4 GPUs visible): GPU 1 is local rank 1 of
    # an unknown node, so no rank.
    ("rank-oom-gpu-lightning-two-nodes--2.1.log", "cuda_oom", None, None, None, None),
    # DeepSpeed 0.14's multi-node runner (deepspeed/launcher/multinode_runner.py PDSHRunner):
    # pdsh puts `host: ` before every line, here before PyTorch's `[rank9]: `: rank 9 on gpu-b2.
    ("rank-pdsh-host-prefix--0.14.log", "illegal_memory_access", 9, "high", "gpu-b2", "only rank"),
    # PyTorch 2.1 torchrun on the second of two nodes: launcher/api.py's launch configs
    # (max_nodes 2), agent/server/api.py's "Rendezvous complete for workers. Result:" with
    # "global_ranks=[4, 5, 6, 7]", then multiprocessing/api.py's "failed (exitcode: -11)
    # local_rank: 1": local rank 1 of this node is rank 5.
    ("torchrun-agent-local-rank-two-nodes--2.1.log", "other", 5, "medium", None, "rendezvous"),
    # The same without the rendezvous lines: local rank 1 of one of two nodes, no rank.
    ("torchrun-agent-local-rank-two-nodes-no-rendezvous--2.1.log", "other", None, None, None, None),
    # Both nodes' agents merged by pdsh (`host: ` before every line): gpu-e2's rendezvous maps
    # its local rank 1 to rank 5, and its prefix names the node.
    ("torchrun-agents-merged-pdsh--2.1.log", "other", 5, "medium", "gpu-e2", "rendezvous"),
    # The same merged without host prefixes: two rendezvous results, no telling whose: none.
    ("torchrun-agents-merged-unprefixed--2.1.log", "other", None, None, None, None),
    # A PyTorch 2.4 `[rankN]:` log pasted as a quote (`> ` before every line, GitHub/e-mail).
    ("rank-quoted-paste--2.4.log", "illegal_memory_access", 3, "high", None, "only rank"),
    # DeepSpeed 0.14 launch.py sigkill_handler: "Killing subprocess %d" for *every* process in
    # launch order (local rank 0 first, whichever failed) and `cmd` (the launch loop's last
    # command) "exits with return code = -11": neither names the failed rank, so none.
    ("deepspeed-launcher-kill-order--0.14.log", "other", None, None, None, None),
    # PyTorch 2.4 ProcessGroupNCCL watchdog "NCCL error: unhandled cuda error ..., NCCL version
    # 2.21.5" with NCCL's "ncclUnhandledCudaError: Call to CUDA function failed. Last error: Cuda
    # failure 'invalid device pointer'" under [rank2]; the others' "remote process exited" is
    # its fallout.
    ("nccl-own-cuda-error-one-rank--2.21.log", "nccl_error", 2, "high", None, "own failure inside NCCL (a CUDA error"),
    # aws-ofi-nccl (NCCL 2.18 net plugin) "NCCL WARN NET/OFI Request %p completed with error.
    # RC: %d. Error: %d (%s). Completed length: %ld, Request: %s" under one rank's prefix and
    # NCCL's `host:pid:tid [dev]` prefix: that rank, on that host.
    ("nccl-ofi-error-one-rank--2.18.log", "nccl_error", 5, "medium", "gpu-d2", "OFI"),
    # The origin line ([rank3]: ... illegal memory access) and torchrun's Root Cause (rank 1,
    # the first process to exit) disagree: the origin line wins, the table is the alternative.
    ("rank-origin-line-beats-table--2.3.log", "illegal_memory_access", 3, "high", None,
     "only rank"),
]  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("fixture", "category", "rank", "sure", "node", "why"), ORIGINS, ids=[o[0] for o in ORIGINS]
)
def test_origin_shape(engine, fixture, category, rank, sure, node, why):
    d = D.diagnose([os.path.join(ORIGIN, fixture)], engine=engine)
    got = (d.category, d.failing_rank, d.rank_confidence, d.failing_node)
    assert got == (category, rank, sure, node), d.to_json()
    if rank is None:
        assert d.rank_reason is None and not d.rank_alternatives
    else:
        assert d.rank_reason.startswith(f"rank {rank}: ") and why in d.rank_reason


def test_every_origin_fixture_is_in_the_table():
    assert {n for n in os.listdir(ORIGIN) if n.endswith(".log")} == {o[0] for o in ORIGINS}


def test_two_shapes_disagreeing_keep_the_other_as_an_alternative():
    d = D.diagnose([os.path.join(ORIGIN, "rank-origin-line-beats-table--2.3.log")])
    assert d.failing_rank == 3
    assert [a["rank"] for a in d.rank_alternatives] == [1]
    assert "torchrun" in d.rank_alternatives[0]["reason"]
    out = d.to_json()
    assert out["rank_alternatives"] == [dict(a) for a in d.rank_alternatives]
    assert {"failing_rank", "failing_node", "rank_reason", "rank_confidence"} <= set(out)


def test_a_victim_only_log_names_no_rank():
    # Every rank's watchdog timing out: each is a victim, none the origin.
    d = D.diagnose([os.path.join(FIXTURES, "pg-timeout--2.3.log")])
    assert d.category == "nccl_timeout"
    assert (d.failing_rank, d.rank_confidence, d.failing_node) == (None, None, None)


def _labelled() -> list[tuple[str, int | None]]:
    """(path, labelled rank) of every fixture with a rank label and every corpus log."""
    from diagnosis_families import FAMILIES

    rows = [(os.path.join(FIXTURES, f[0]), f[3]) for f in FAMILIES]
    rows += [(os.path.join(ORIGIN, o[0]), o[2]) for o in ORIGINS]
    if os.path.isdir(CORPUS):
        for name in sorted(os.listdir(CORPUS)):
            if name.startswith("labels") and name.endswith(".csv"):
                with open(os.path.join(CORPUS, name), newline="") as f:
                    for row in csv.DictReader(f):
                        want = int(row["failing_rank"]) if row["failing_rank"].strip() else None
                        rows.append((os.path.join(CORPUS, "logs", row["file"]), want))
    return rows


def test_never_a_wrong_rank_at_high_confidence():
    """Over every labelled log: a high-confidence rank is the labelled one; any rank named is
    the labelled one or (labelled null) at most medium."""
    wrong = []
    for path, want in _labelled():
        d = D.diagnose([path], engine="python")
        if d.failing_rank is None:
            continue
        if d.failing_rank != want and (d.rank_confidence == "high" or want is not None):
            wrong.append((os.path.basename(path), d.failing_rank, want, d.rank_reason))
    assert not wrong


# --- rank -> node ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "nodelist", "per_node", "node"),
    [
        (0, "gpu[01-04]", "8(x4)", "gpu01"),
        (9, "gpu[01-04]", "8(x4)", "gpu02"),
        (31, "gpu[01-04]", "8(x4)", "gpu04"),
        (32, "gpu[01-04]", "8(x4)", None),  # beyond the layout
        (5, "a,b,c,d", "2(x3),1", "c"),
        (6, "a,b,c,d", "2(x3),1", "d"),
        (9, "gpu[01-04]", 8, "gpu02"),
        (9, "gpu[01-04]", "8", "gpu02"),  # a bare count: every node
        (3, ["n1", "n2"], "2", "n2"),
        (3, "gpu7", None, "gpu7"),  # one node: no count needed
        (3, "gpu[7-8]", None, None),  # several nodes, no layout: unknown
        (3, "gpu[7-8]", "8(x3)", None),  # the layout names another number of nodes
        (3, "gpu[7-8]", "x", None),
        (None, "gpu[7-8]", "8", None),
        (-1, "gpu[7-8]", "8", None),
    ],
)
def test_node_of_rank(rank, nodelist, per_node, node):
    assert node_of_rank(rank, nodelist, per_node) == node


def test_tasks_per_node_forms():
    assert tasks_per_node("2(x3),1", 4) == [2, 2, 2, 1]
    assert tasks_per_node("4", 3) == [4, 4, 4]
    assert tasks_per_node("0", 2) is None
    assert valid_spec("8(x4)") and valid_spec("2(x3),1") and valid_spec("8")
    assert not valid_spec("x") and not valid_spec("0") and not valid_spec("8(x)")


def test_diagnose_cli_gives_the_node_from_the_layout(capsys):
    log = os.path.join(ORIGIN, "rank-quoted-paste--2.4.log")
    assert cmd.main(["--json", "--nodelist", "gpu[01-02]", "--tasks-per-node", "2(x2)", log]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["failing_rank"], out["failing_node"], out["rank_confidence"]) == (
        3,
        "gpu02",
        "high",
    )
    assert cmd.main(["--json", log]) == 0
    assert json.loads(capsys.readouterr().out)["failing_node"] is None


def test_the_log_names_the_node_before_the_layout(capsys):
    log = os.path.join(ORIGIN, "torchrun-table-collapsed-rank-host--2.3.log")
    assert cmd.main(["--json", "--nodelist", "n[1-4]", "--tasks-per-node", "1", log]) == 0
    assert json.loads(capsys.readouterr().out)["failing_node"] == "gpu-c3"


def test_diagnose_cli_refuses_a_bad_layout(capsys):
    log = os.path.join(ORIGIN, "rank-quoted-paste--2.4.log")
    with pytest.raises(SystemExit):
        cmd.main(["--nodelist", "n[1-2]", "--tasks-per-node", "eight", log])
    with pytest.raises(SystemExit):
        cmd.main(["--tasks-per-node", "8", log])


def test_tracebacks_of_two_ranks_after_the_error_name_no_rank():
    text = (
        "2024-11-07 09:13:58 | ERROR | step failed: CUDA out of memory. Tried to allocate 3.52 GiB.\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/home/alice/train.py", line 214, in <module>\n'
        "[rank2]: Traceback (most recent call last):\n"
        '[rank2]:   File "/home/alice/train.py", line 214, in <module>\n'
    )
    d = D.diagnose_bytes(text.encode())
    assert (d.category, d.failing_rank, d.rank_reason) == ("cuda_oom", None, None)
    one = D.diagnose_bytes(text.encode().rsplit(b"[rank2]", 2)[0])
    assert (one.failing_rank, one.rank_confidence) == (1, "medium")


def test_a_traceback_far_below_the_error_is_not_its_rank():
    text = "RuntimeError: CUDA out of memory. Tried to allocate 3.52 GiB.\n" + "step\n" * 150
    text += "[rank1]: Traceback (most recent call last):\n"
    assert D.diagnose_bytes(text.encode()).failing_rank is None

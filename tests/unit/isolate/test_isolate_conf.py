"""slurm.conf and gres.conf rewritten to take one GPU out of one node, and to put it back."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.isolate.conf import (
    NodeGpus,
    Unsupported,
    gpu_file,
    put_back,
    read_node_gpus,
    read_text,
    take_out,
    write_conf,
)
from gpugate.slurm.hostlist import HostlistError, hostlist_compress, hostlist_expand

DEV = "/dev/nvidia"
ALL8 = tuple(f"{DEV}{i}" for i in range(8))

SLURM = """\
# cluster
ClusterName=c
NodeName=n1 CPUs=2 RealMemory=1000 Gres=gpu:8 State=UNKNOWN  # the GPU node
NodeName=n2 CPUs=2 Gres=gpu:8
PartitionName=debug Nodes=n[1-2] Default=YES
"""
GRES = """\
AutoDetect=off
# per node
NodeName=n1 Name=gpu File=/dev/nvidia[0-7]  # eight
NodeName=n2 Name=gpu File=/dev/nvidia[0-7]
"""


def roundtrip(slurm: str, gres: str, node: str, path: str) -> tuple[str, str, str]:
    """take_out then put_back; asserts the count and the files, in their order, come back
    (every node's: Slurm numbers a node's GPUs in gres.conf's order)."""
    before = read_node_gpus(slurm, gres, node)
    s2, g2, line = take_out(slurm, gres, node, path)
    mid = read_node_gpus(s2, g2, node)
    assert mid.count == before.count - 1
    assert set(mid.files) == set(before.files) - {path}
    s3, g3 = put_back(s2, g2, node, line)
    after = read_node_gpus(s3, g3, node)
    assert after.count == before.count
    assert after.files == before.files
    return s2, g2, line


# --- the simple shape ------------------------------------------------------------------------


def test_reads_the_nodes_count_and_files():
    assert read_node_gpus(SLURM, GRES, "n1") == NodeGpus(node="n1", count=8, files=ALL8)


def test_take_out_changes_only_the_nodes_count_and_file_and_keeps_comments():
    s2, g2, line = take_out(SLURM, GRES, "n1", "/dev/nvidia3")
    assert s2 == SLURM.replace("RealMemory=1000 Gres=gpu:8", "RealMemory=1000 Gres=gpu:7")
    assert g2 == GRES.replace(
        "File=/dev/nvidia[0-7]  # eight", "File=/dev/nvidia[0-2,4-7]  # eight"
    )
    assert line == "NodeName=n1 Name=gpu File=/dev/nvidia3"
    assert read_node_gpus(s2, g2, "n2") == read_node_gpus(SLURM, GRES, "n2")


@pytest.mark.parametrize("minor", range(8))
def test_a_range_line_round_trips_byte_for_byte(minor):
    s2, g2, line = roundtrip(SLURM, GRES, "n1", f"/dev/nvidia{minor}")
    assert put_back(s2, g2, "n1", line) == (SLURM, GRES)


def test_put_back_restores_slurms_numbering():
    # Reported: the line went after the node's others, so Slurm's index 3 stayed nvidia4.
    s2, g2, line = take_out(SLURM, GRES, "n1", "/dev/nvidia3")
    s3, g3 = put_back(s2, g2, "n1", line)
    assert read_node_gpus(s3, g3, "n1").files == ALL8
    assert read_node_gpus(s3, g3, "n1").files.index("/dev/nvidia4") == 4


def test_two_gpus_out_come_back_in_either_order():
    s2, g2, line3 = take_out(SLURM, GRES, "n1", "/dev/nvidia3")
    s2, g2, line6 = take_out(s2, g2, "n1", "/dev/nvidia6")
    assert "File=/dev/nvidia[0-2,4-5,7]  # eight" in g2
    for first, second in ((line3, line6), (line6, line3)):
        assert put_back(*put_back(s2, g2, "n1", first), "n1", second) == (SLURM, GRES)


PER_DEVICE = "".join(f"NodeName=n1 Name=gpu File=/dev/nvidia{i}\n" for i in range(8))


@pytest.mark.parametrize("minor", [0, 3, 7])
def test_per_device_lines_round_trip_byte_for_byte(minor):
    s2, g2, line = roundtrip(SLURM, PER_DEVICE, "n1", f"/dev/nvidia{minor}")
    assert put_back(s2, g2, "n1", line) == (SLURM, PER_DEVICE)


def test_two_per_device_lines_out_and_back():
    s2, g2, line1 = take_out(SLURM, PER_DEVICE, "n1", "/dev/nvidia1")
    s2, g2, line2 = take_out(s2, g2, "n1", "/dev/nvidia2")
    assert put_back(*put_back(s2, g2, "n1", line2), "n1", line1) == (SLURM, PER_DEVICE)


def test_other_nodes_lines_between_stay_where_they_are():
    gres = (
        "AutoDetect=off\n"
        "NodeName=n1 Name=gpu File=/dev/nvidia[0-3] Cores=0-1\n"
        "NodeName=n2 Name=gpu File=/dev/nvidia[0-7]\n"
        "# n1's second socket\n"
        "NodeName=n1 Name=gpu File=/dev/nvidia[4-7] Cores=2-3\n"
        "NodeName=n3 Name=gpu File=/dev/nvidia[0-7]\n"
    )
    slurm = SLURM + "NodeName=n3 Gres=gpu:8\n"
    for minor in range(8):
        s2, g2, line = roundtrip(slurm, gres, "n1", f"/dev/nvidia{minor}")
        assert put_back(s2, g2, "n1", line) == (slurm, gres)
        # The other nodes' lines never moved, in the middle either.
        for other in ("n2", "n3"):
            assert read_node_gpus(s2, g2, other) == read_node_gpus(slurm, gres, other)


def test_an_edited_range_around_the_place_is_split_not_joined():
    # An admin gave n1's remaining files other Cores meanwhile: the file goes back between
    # the halves on a line of its own, the order still ascending.
    s2, g2, line = take_out(SLURM, GRES, "n1", "/dev/nvidia3")
    g2 = g2.replace("File=/dev/nvidia[0-2,4-7]  # eight", "File=/dev/nvidia[0-2,4-7] Cores=0  # x")
    _, g3 = put_back(s2, g2, "n1", line)
    assert g3.splitlines()[2:5] == [
        "NodeName=n1 Name=gpu File=/dev/nvidia[0-2] Cores=0  # x",
        "NodeName=n1 Name=gpu File=/dev/nvidia3",
        "NodeName=n1 Name=gpu File=/dev/nvidia[4-7] Cores=0",
    ]
    assert read_node_gpus(SLURM, g3, "n1").files == ALL8


def test_a_file_without_a_device_number_goes_after_the_nodes_lines():
    gres = "NodeName=n1 Name=gpu File=/dev/gpua,/dev/gpub\n"
    slurm = "NodeName=n1 Gres=gpu:2\n"
    s2, g2, line = take_out(slurm, gres, "n1", "/dev/gpua")
    s3, g3 = put_back(s2, g2, "n1", line)
    assert read_node_gpus(s3, g3, "n1").files == ("/dev/gpub", "/dev/gpua")


def test_put_back_refuses_a_file_already_listed():
    with pytest.raises(Unsupported, match=r"/dev/nvidia3 is already listed for node n1"):
        put_back(SLURM, GRES, "n1", "NodeName=n1 Name=gpu File=/dev/nvidia3")


@pytest.mark.parametrize(
    "line",
    [
        "NodeName=n2 Name=gpu File=/dev/nvidia3",  # another node
        "NodeName=n1 Name=mps File=/dev/nvidia3",
        "NodeName=n1 Name=gpu File=/dev/nvidia[3-4]",
        "NodeName=n1 Name=gpu File=/dev/nvidia3 Links=0,-1",
        "NodeName=n1 Name=gpu File=/dev/nvidia3\nNodeName=n1 Name=gpu File=/dev/nvidia4",
    ],
)
def test_put_back_refuses_a_line_take_out_would_not_write(line):
    s2, g2, _ = take_out(SLURM, GRES, "n1", "/dev/nvidia3")
    with pytest.raises(Unsupported, match="put back"):
        put_back(s2, g2, "n1", line)


def test_put_back_refuses_to_append_after_a_continued_line():
    s2, g2, line = take_out(SLURM, GRES, "n1", "/dev/nvidia3")
    g2 = g2.replace("/dev/nvidia[0-2,4-7]  # eight", "/dev/nvidia[0-2,4-7] \\")
    g2 = g2.replace("NodeName=n2 Name=gpu File=/dev/nvidia[0-7]", "  Cores=0-1")
    assert read_node_gpus(s2, g2, "n1").count == 7
    with pytest.raises(Unsupported, match=r"gres.conf line 3: continued"):
        put_back(s2, g2, "n1", line)


def test_keys_are_case_insensitive():
    slurm = "nodename=n1 cpus=2 GRES=gpu:8\n"
    gres = "autodetect=off\nnodename=n1 name=gpu file=/dev/nvidia[0-7]\n"
    s2, g2, _ = roundtrip(slurm, gres, "n1", "/dev/nvidia0")
    assert s2 == "nodename=n1 cpus=2 GRES=gpu:7\n"
    assert g2 == "autodetect=off\nnodename=n1 name=gpu file=/dev/nvidia[1-7]\n"


def test_the_localslurm_shape():
    # tests/slurm/localslurm.py writes these lines (its _node_line and gres_conf_text).
    slurm = (
        "NodeName=n1 NodeHostname=h NodeAddr=127.0.0.1 Port=6818 CPUs=2 RealMemory=1000 "
        "Gres=gpu:8 State=UNKNOWN\n"
        "NodeName=n2 NodeHostname=h NodeAddr=127.0.0.1 Port=6819 CPUs=2 RealMemory=1000 "
        "Gres=gpu:8 State=UNKNOWN\n"
    )
    gres = (
        "AutoDetect=off\n"
        "NodeName=n1 Name=gpu File=/tmp/x/dev/n1/nvidia[0-7]\n"
        "NodeName=n2 Name=gpu File=/tmp/x/dev/n2/nvidia[0-7]\n"
    )
    gpus = read_node_gpus(slurm, gres, "n1")
    path = gpu_file(gpus, 3)
    assert path == "/tmp/x/dev/n1/nvidia3"
    s2, g2, _ = roundtrip(slurm, gres, "n1", path)
    assert "Port=6818 CPUs=2 RealMemory=1000 Gres=gpu:7 State=UNKNOWN\n" in s2
    assert "NodeName=n1 Name=gpu File=/tmp/x/dev/n1/nvidia[0-2,4-7]\n" in g2
    assert s2.splitlines()[1] == slurm.splitlines()[1]
    assert g2.splitlines()[2] == gres.splitlines()[2]


# --- slurm.conf shapes ---------------------------------------------------------------------


def test_other_gres_in_the_same_word_are_kept():
    slurm = "NodeName=n1 Gres=nic:2,gpu:8,bandwidth:10G Feature=a\n"
    s2, _, _ = roundtrip(slurm, GRES, "n1", "/dev/nvidia5")
    assert s2 == "NodeName=n1 Gres=nic:2,gpu:7,bandwidth:10G Feature=a\n"


def test_a_typed_gpu_keeps_its_type():
    slurm = "NodeName=n1 Gres=gpu:h100:8\n"
    gres = "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[0-7]\n"
    s2, g2, line = roundtrip(slurm, gres, "n1", "/dev/nvidia7")
    assert s2 == "NodeName=n1 Gres=gpu:h100:7\n"
    assert g2 == "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[0-6]\n"
    assert line == "NodeName=n1 Name=gpu File=/dev/nvidia7 Type=h100"


def test_a_node_inside_a_range_gets_a_line_of_its_own():
    slurm = "# nodes\nNodeName=gpu[01-64] CPUs=64 Gres=gpu:8 Weight=10 # all of them\nX=1\n"
    gres = "NodeName=gpu[01-64] Name=gpu File=/dev/nvidia[0-7] Cores=0-31\n"
    before = {n: read_node_gpus(slurm, gres, n) for n in ("gpu01", "gpu16", "gpu18", "gpu64")}
    s2, g2, line = roundtrip(slurm, gres, "gpu17", "/dev/nvidia3")
    assert s2.splitlines() == [
        "# nodes",
        "NodeName=gpu[01-16,18-64] CPUs=64 Gres=gpu:8 Weight=10 # all of them",
        "NodeName=gpu17 CPUs=64 Gres=gpu:7 Weight=10",
        "X=1",
    ]
    assert g2.splitlines() == [
        "NodeName=gpu[01-16,18-64] Name=gpu File=/dev/nvidia[0-7] Cores=0-31",
        "NodeName=gpu17 Name=gpu File=/dev/nvidia[0-2,4-7] Cores=0-31",
    ]
    assert line == "NodeName=gpu17 Name=gpu File=/dev/nvidia3 Cores=0-31"
    for node, gpus in before.items():
        assert read_node_gpus(s2, g2, node) == gpus


def test_a_node_in_a_comma_list_and_its_paired_addresses_are_split():
    slurm = "NodeName=a,b,c NodeAddr=10.0.0.[1-3] NodeHostname=h Gres=gpu:4\n"
    gres = "NodeName=a,b,c Name=gpu File=/dev/nvidia0,/dev/nvidia1,/dev/nvidia2,/dev/nvidia3\n"
    s2, g2, _ = roundtrip(slurm, gres, "b", "/dev/nvidia1")
    assert s2.splitlines() == [
        "NodeName=a,c NodeAddr=10.0.0.[1,3] NodeHostname=h Gres=gpu:4",
        "NodeName=b NodeAddr=10.0.0.2 NodeHostname=h Gres=gpu:3",
    ]
    assert g2.splitlines()[1] == "NodeName=b Name=gpu File=/dev/nvidia[0,2-3]"
    assert read_node_gpus(s2, g2, "c") == read_node_gpus(slurm, gres, "c")


def test_ports_of_several_slurmd_on_one_host_are_split_too():
    slurm = "NodeName=n[1-3] NodeHostname=h NodeAddr=127.0.0.1 Port=[17001-17003] Gres=gpu:8\n"
    gres = "NodeName=n[1-3] Name=gpu File=/dev/nvidia[0-7]\n"
    s2, _, _ = roundtrip(slurm, gres, "n2", "/dev/nvidia1")
    assert s2.splitlines() == [
        "NodeName=n[1,3] NodeHostname=h NodeAddr=127.0.0.1 Port=[17001,17003] Gres=gpu:8",
        "NodeName=n2 NodeHostname=h NodeAddr=127.0.0.1 Port=17002 Gres=gpu:7",
    ]


def test_unpaired_addresses_are_refused():
    slurm = "NodeName=a,b,c NodeAddr=10.0.0.[1-2] Gres=gpu:4\n"
    gres = "NodeName=a,b,c Name=gpu File=/dev/nvidia[0-3]\n"
    with pytest.raises(Unsupported, match=r"slurm.conf line 1: NodeAddr=10.0.0.\[1-2\] does not"):
        take_out(slurm, gres, "b", "/dev/nvidia1")


@pytest.mark.parametrize(
    ("slurm", "message"),
    [
        ("NodeName=n2 Gres=gpu:8\n", r"slurm.conf: no NodeName= line for node n1 \(Include files are not followed\)"),
        ("Include /etc/slurm/nodes.conf\n", r"Include files are not followed, and this file has some"),
        ("NodeName=n1 CPUs=2\n", r"slurm.conf line 1: no gpu in node n1's Gres="),
        ("NodeName=n1 Gres=nic:2\n", r"slurm.conf line 1: no gpu in node n1's Gres="),
        ("NodeName=DEFAULT Gres=gpu:8\nNodeName=n1 CPUs=2\n", r"slurm.conf line 2: node n1 takes its Gres= from NodeName=DEFAULT \(line 1\)"),
        ("NodeName=n1 Gres=gpu:a100:4,gpu:v100:4\n", r"slurm.conf line 1: several gpu entries"),
        ("NodeName=n1 CPUs=2 \\\n  Gres=gpu:8\n", r"slurm.conf line 1: continued with '\\'"),
        ("NodeName=n1 Gres=gpu:8\nNodeName=n[1-2] CPUs=1\n", r"node n1 is on several NodeName= lines \(1, 2\)"),
        ("NodeName=n1 Gres=gpu:many\n", r"slurm.conf line 1: cannot read the gpu count"),
        ("NodeName=n[1-x] Gres=gpu:8\n", r"slurm.conf line 1: cannot read NodeName=n\[1-x\]"),
    ],
)  # fmt: skip
def test_slurm_conf_shapes_refused(slurm, message):
    with pytest.raises(Unsupported, match=message):
        take_out(slurm, GRES, "n1", "/dev/nvidia3")


def test_a_default_gres_is_fine_when_the_node_has_its_own():
    slurm = "NodeName=DEFAULT Gres=gpu:4\nNodeName=n1 Gres=gpu:8\n"
    s2, _, _ = roundtrip(slurm, GRES, "n1", "/dev/nvidia3")
    assert s2 == "NodeName=DEFAULT Gres=gpu:4\nNodeName=n1 Gres=gpu:7\n"


@pytest.mark.parametrize("count", [0, 1])
def test_a_count_of_zero_or_one_is_refused(count):
    slurm = f"NodeName=n1 Gres=gpu:{count}\n"
    gres = "NodeName=n1 Name=gpu File=/dev/nvidia0\n" if count else "NodeName=n1 Name=mps\n"
    with pytest.raises(Unsupported, match=r"Gres=gpu:1: no GPU would be left|no gpu line"):
        take_out(slurm, gres, "n1", "/dev/nvidia0")


# --- gres.conf shapes ----------------------------------------------------------------------


def test_per_socket_lines_with_cores():
    gres = (
        "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-31\n"
        "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[4-7] Cores=32-63\n"
    )
    slurm = "NodeName=n1 Gres=gpu:h100:8\n"
    s2, g2, line = roundtrip(slurm, gres, "n1", "/dev/nvidia5")
    assert g2.splitlines() == [
        "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-31",
        "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[4,6-7] Cores=32-63",
    ]
    assert line == "NodeName=n1 Name=gpu File=/dev/nvidia5 Type=h100 Cores=32-63"
    assert put_back(s2, g2, "n1", line) == (slurm, gres)  # back into its socket's range


def test_one_line_per_gpu_loses_the_line():
    gres = "".join(f"NodeName=n1 Name=gpu File=/dev/nvidia{i}\n" for i in range(8))
    _, g2, line = roundtrip(SLURM, gres, "n1", "/dev/nvidia3")
    assert "nvidia3" not in g2 and len(g2.splitlines()) == 7
    assert line == "NodeName=n1 Name=gpu File=/dev/nvidia3"


def test_a_gres_line_shared_by_nodes_is_split():
    gres = "AutoDetect=off\nNodeName=n[1-2] Name=gpu File=/dev/nvidia[0-7] # both\n"
    s2, g2, line = roundtrip(SLURM, gres, "n1", "/dev/nvidia0")
    assert g2.splitlines() == [
        "AutoDetect=off",
        "NodeName=n2 Name=gpu File=/dev/nvidia[0-7] # both",
        "NodeName=n1 Name=gpu File=/dev/nvidia[1-7]",
    ]
    assert read_node_gpus(s2, g2, "n2") == read_node_gpus(SLURM, gres, "n2")
    # Back in its place on the node's own line (the split stays: a line of its own is fine).
    assert put_back(s2, g2, "n1", line)[1].splitlines()[2] == "NodeName=n1 Name=gpu File=/dev/nvidia[0-7]"  # fmt: skip


def test_count_with_file_follows_the_files():
    gres = "NodeName=n1 Name=gpu Count=8 File=/dev/nvidia[0-7]\n"
    _, g2, _ = roundtrip(SLURM, gres, "n1", "/dev/nvidia2")
    assert g2 == "NodeName=n1 Name=gpu Count=7 File=/dev/nvidia[0-1,3-7]\n"


def test_an_autodetect_line_for_another_node_does_not_matter():
    gres = "NodeName=n2 AutoDetect=nvml\nNodeName=n1 Name=gpu File=/dev/nvidia[0-7]\n"
    roundtrip(SLURM, gres, "n1", "/dev/nvidia2")


def test_the_nodes_own_autodetect_off_wins_over_a_global_nvml():
    gres = (
        "AutoDetect=nvml\nNodeName=n1 AutoDetect=off\nNodeName=n1 Name=gpu File=/dev/nvidia[0-7]\n"
    )
    roundtrip(SLURM, gres, "n1", "/dev/nvidia2")


@pytest.mark.parametrize(
    ("gres", "message"),
    [
        ("AutoDetect=nvml\nNodeName=n1 Name=gpu File=/dev/nvidia[0-7]\n", r"gres.conf line 1: AutoDetect=nvml finds the GPU again"),
        ("AutoDetect=off\nAutoDetect=nvml\nNodeName=n1 Name=gpu File=/dev/nvidia[0-7]\n", r"gres.conf line 2: AutoDetect=nvml finds"),
        ("NodeName=n1 AutoDetect=off\nNodeName=n[1-2] AutoDetect=nvml\nNodeName=n1 Name=gpu File=/dev/nvidia[0-7]\n", r"gres.conf line 2: AutoDetect=nvml finds"),
        ("autodetect=rsmi\nNodeName=n1 Name=gpu File=/dev/nvidia[0-7]\n", r"line 1: AutoDetect=rsmi finds"),
        ("NodeName=n1 Name=gpu File=/dev/nvidia[0-7] AutoDetect=nvidia\n", r"line 1: AutoDetect=nvidia finds"),
        ("NodeName=n1 AutoDetect=oneapi\nNodeName=n1 Name=gpu File=/dev/nvidia[0-7]\n", r"line 1: AutoDetect=oneapi finds"),
        ("Name=gpu File=/dev/nvidia[0-7]\n", r"gres.conf line 1: a gpu line without NodeName= applies to every node"),
        ("NodeName=n1 Name=gpu File=/dev/nvidia[0-7] Links=-1,0,0,0,0,0,0,0\n", r"gres.conf line 1: Links=-1,0,0,0,0,0,0,0 is positional"),
        ("NodeName=n1 Name=gpu Count=8\n", r"gres.conf line 1: no File="),
        ("NodeName=n1 Name=gpu MultipleFiles=/dev/nvidia[0-7]\n", r"gres.conf line 1: MultipleFiles="),
        ("NodeName=n2 Name=gpu File=/dev/nvidia[0-7]\n", r"gres.conf: no gpu line for node n1 \(Include"),
        ("NodeName=n1 Name=gpu File=/dev/nvidia[0-6]\n", r"slurm.conf gives node n1 Gres=gpu:8 but gres.conf lists 7 gpu file"),
        ("NodeName=n1 Name=gpu File=/dev/nvidia[0-7]\nNodeName=n1 Name=mps Count=800 File=/dev/nvidia[0-7]\n", r"gres.conf line 2: Name=mps uses /dev/nvidia3 too"),
        ("NodeName=n1 Name=gpu File=/dev/nvidia[0-7] \\\n  Cores=0-1\n", r"gres.conf line 1: continued"),
        ("Name=gpu NodeName=n1 File=/dev/nvidia[0-7]\n", r"gres.conf line 1: NodeName= must come first"),
        ("NodeName=n1 Name=gpu File=/dev/nvidia[0-7] Count=9\n", r"Count=9 does not match its 8 files"),
        ("NodeName=n1 Name=gpu File=/dev/nvidia[0-7] Bogus=1\n", r"unknown word 'Bogus=1'"),
        ("NodeName=n1 Name=gpu File=/dev/nvidia[0-3,3-6]\n", r"lists a gpu file twice"),
    ],
)  # fmt: skip
def test_gres_conf_shapes_refused(gres, message):
    with pytest.raises(Unsupported, match=message):
        take_out(SLURM, gres, "n1", "/dev/nvidia3")


def test_a_path_that_is_not_the_nodes_is_refused():
    with pytest.raises(Unsupported, match=r"/dev/nvidia9 is not one of node n1's gpu files"):
        take_out(SLURM, GRES, "n1", "/dev/nvidia9")


def test_a_crlf_file_keeps_its_line_endings():
    slurm = "NodeName=a,b Gres=gpu:8\r\n"
    gres = "NodeName=a,b Name=gpu File=/dev/nvidia[0-7]\r\n"
    s2, g2, _ = roundtrip(slurm, gres, "a", "/dev/nvidia1")
    assert s2 == "NodeName=b Gres=gpu:8\r\nNodeName=a Gres=gpu:7\r\n"
    assert g2 == "NodeName=b Name=gpu File=/dev/nvidia[0-7]\r\nNodeName=a Name=gpu File=/dev/nvidia[0,2-7]\r\n"  # fmt: skip


# --- gpu_file --------------------------------------------------------------------------------


def test_gpu_file_matches_the_basename_exactly():
    gpus = NodeGpus(node="n1", count=3, files=("/dev/nvidia1", "/dev/nvidia10", "/x/nvidia11"))
    assert gpu_file(gpus, 1) == "/dev/nvidia1"
    assert gpu_file(gpus, 10) == "/dev/nvidia10"
    with pytest.raises(Unsupported, match="node n1: none of its gpu files is nvidia2"):
        gpu_file(gpus, 2)
    twice = NodeGpus(node="n1", count=2, files=("/a/nvidia1", "/b/nvidia1"))
    with pytest.raises(Unsupported, match="several"):
        gpu_file(twice, 1)


# --- hostlist_compress -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        ([f"gpu{i:02d}" for i in range(1, 65) if i != 17], "gpu[01-16,18-64]"),
        ([f"/dev/nvidia{i}" for i in range(8) if i != 3], "/dev/nvidia[0-2,4-7]"),
        (["a", "b", "c"], "a,b,c"),
        (["n8", "n9", "n10"], "n[8-10]"),
        (["n08", "n09", "n10"], "n[08-10]"),
        (["n1"], "n1"),
        (["n3", "n1", "n2"], "n[3,1-2]"),  # order kept, never sorted
        (["rack1-n01", "rack1-n02", "rack2-n01"], "rack1-n[01-02],rack2-n01"),
    ],
)
def test_hostlist_compress_reads_back_in_order(names, expr):
    assert hostlist_compress(names) == expr
    assert hostlist_expand(expr) == names


_NAMES = st.lists(
    st.builds(
        lambda head, n, width: f"{head}{n:0{width}d}",
        st.sampled_from(["gpu", "n", "rack1-n", "/dev/nvidia", "10.0.0."]),
        st.integers(0, 120),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=30,
    unique=True,
)


@settings(max_examples=300, deadline=None)
@given(_NAMES)
def test_hostlist_compress_always_reads_back_as_the_same_list(names):
    assert hostlist_expand(hostlist_compress(names)) == names


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 12), st.data())
def test_any_node_of_a_shared_line_round_trips_and_spares_the_others(size, data):
    nodes = [f"gpu{i:02d}" for i in range(1, size + 1)]
    node = data.draw(st.sampled_from(nodes))
    minor = data.draw(st.integers(0, 7))
    slurm = f"NodeName=gpu[01-{size:02d}] CPUs=8 Gres=gpu:8 # rack 1\nPartitionName=p Nodes=ALL\n"
    gres = f"AutoDetect=off\nNodeName=gpu[01-{size:02d}] Name=gpu File=/dev/nvidia[0-7]\n"
    before = {n: read_node_gpus(slurm, gres, n) for n in nodes}
    s2, g2, _ = roundtrip(slurm, gres, node, f"/dev/nvidia{minor}")
    for other in nodes:
        if other != node:
            assert read_node_gpus(s2, g2, other) == before[other]


def test_hostlist_compress_refuses_a_name_a_hostlist_cannot_hold():
    with pytest.raises(HostlistError):
        hostlist_compress(["a,b"])


# --- files -----------------------------------------------------------------------------------


def test_write_conf_replaces_atomically_and_keeps_mode(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("old\n")
    os.chmod(conf, 0o640)
    inode = conf.stat().st_ino
    write_conf(str(conf), "new\n")
    assert read_text(str(conf)) == "new\n"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o640
    assert conf.stat().st_ino != inode  # a new file renamed over, never rewritten in place
    assert sorted(os.listdir(tmp_path)) == ["slurm.conf"]  # no temporary file left


def test_write_conf_keeps_owner_and_group(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another owner")
    conf = tmp_path / "gres.conf"
    conf.write_text("old\n")
    os.chown(conf, 12345, 54321)
    write_conf(str(conf), "new\n")
    assert (conf.stat().st_uid, conf.stat().st_gid) == (12345, 54321)


def test_write_conf_and_read_text_refuse_a_symlink_and_a_fifo(tmp_path):
    target = tmp_path / "real.conf"
    target.write_text("keep\n")
    link = tmp_path / "slurm.conf"
    link.symlink_to(target)
    with pytest.raises(Unsupported, match=r"slurm\.conf: a symlink"):
        write_conf(str(link), "new\n")
    with pytest.raises(Unsupported, match=r"slurm\.conf: is a symlink"):
        read_text(str(link))
    assert target.read_text() == "keep\n"
    fifo = tmp_path / "gres.conf"
    os.mkfifo(fifo)
    with pytest.raises(Unsupported, match=r"gres\.conf: not a regular file"):
        write_conf(str(fifo), "new\n")
    with pytest.raises(Unsupported, match="not a regular file"):
        read_text(str(fifo))


def test_read_text_refuses_what_it_could_not_write_back(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_bytes(b"# caf\xe9\n")
    with pytest.raises(Unsupported, match="not UTF-8"):
        read_text(str(conf))

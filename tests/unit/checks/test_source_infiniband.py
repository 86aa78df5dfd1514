"""The InfiniBand source over committed sysfs trees (a real H100 node, and a broken one)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import paths
import pytest
from factories import default_config

from gpugate.checks.facts import facts_from_dict
from gpugate.checks.sources import infiniband as ib

FIXTURES = paths.FIXTURES


def config(sysfs_root: Path):
    cfg = default_config()
    return cfg.replace(sources=cfg.sources.replace(sysfs_root=str(sysfs_root)))


def ports(sysfs_root: Path) -> list[dict]:
    data = ib.read_infiniband(config(sysfs_root))
    facts_from_dict(data)  # the snapshot contract accepts it
    return data["infiniband"]


@pytest.mark.parametrize(
    ("text", "value"),
    [("4: ACTIVE\n", "ACTIVE"), ("5: LinkUp", "LinkUp"), ("7: Phy Test\n", "Phy Test"),
     ("1: DOWN", "DOWN"), ("ACTIVE", "ACTIVE"), ("", None), (None, None)],
)  # fmt: skip
def test_parse_state(text, value):
    assert ib.parse_state(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [("400 Gb/sec (4X NDR)\n", 400.0), ("2.5 Gb/sec (1X SDR)", 2.5), ("200 Gb/sec (2X NDR)", 200.0),
     ("40 Gb/sec (4X QDR)", 40.0), ("", None), ("unknown", None), (None, None)],
)  # fmt: skip
def test_parse_rate(text, value):
    assert ib.parse_rate(text) == value


def test_real_h100_node():
    found = ports(FIXTURES / "sys-ib-h100")
    names = [p["device"] for p in found]
    assert names == ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8",
                     "mlx5_9", "mlx5_bond_0"]  # fmt: skip
    assert all(p["port"] == 1 and p["state"] == "ACTIVE" and p["phys_state"] == "LinkUp"
               for p in found)  # fmt: skip
    assert [p["rate_gbps"] for p in found] == [400.0] * 8 + [200.0]
    assert [p["link_layer"] for p in found] == ["InfiniBand"] * 8 + ["Ethernet"]
    mlx5_0, mlx5_1 = found[0]["counters"], found[1]["counters"]
    assert len(mlx5_0) == 21
    assert mlx5_0["port_rcv_errors"] == 14
    assert mlx5_0["port_rcv_data"] == 230539874932483
    assert mlx5_1["link_downed"] == 255  # an 8-bit counter at its maximum


def test_broken_node():
    found = {p["device"]: p for p in ports(FIXTURES / "sys-ib-down")}
    assert list(found) == ["mlx5_0", "mlx5_1", "mlx5_10"]  # mlx5_10 after mlx5_1, not before
    down = found["mlx5_1"]
    assert (down["state"], down["phys_state"], down["rate_gbps"]) == ("DOWN", "Polling", 40.0)
    assert down["counters"] == {"link_downed": 255, "link_error_recovery": 3, "symbol_error": 12}
    # "N/A (no PMA)" is no number: left out, not zero.
    assert found["mlx5_0"]["counters"] == {"link_downed": 0, "symbol_error": 0}
    assert found["mlx5_10"]["counters"] == {}
    assert found["mlx5_10"]["link_layer"] == "Ethernet"


def test_no_infiniband_on_this_node(tmp_path):
    assert ports(tmp_path) == []


def test_unreadable_files_are_unknown(tmp_path):
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").mkdir()  # reading a directory fails like an unreadable attribute
    (found,) = ports(tmp_path)
    assert found == {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": None,
                     "rate_gbps": None, "link_layer": None, "counters": {}}  # fmt: skip


def test_committed_tree_matches_the_listing():
    """The committed tree is what make_sys_ib.py writes from the real listing (if present)."""
    spec = importlib.util.spec_from_file_location("make_sys_ib", FIXTURES / "make_sys_ib.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    listing = Path(gen.LISTING)
    if not listing.exists():
        pytest.skip(f"{listing} not present")
    root = FIXTURES / "sys-ib-h100" / "class" / "infiniband"
    expected = {}
    for line in listing.read_text().splitlines():
        relpath, _, value = line.partition(":")
        if gen.kept(relpath):
            expected[relpath] = value + "\n"
    committed = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}
    assert committed == expected

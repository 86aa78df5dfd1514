"""What the GPU board cannot know is the site's: Slurm's Gres count, learned profiles, classes."""

from __future__ import annotations

import time

import pytest
from factories import make_facts, make_gpu, make_ib, only, site

from gpugate.checks.facts import Pcie, load_snapshot
from gpugate.checks.run import run_checks
from gpugate.cli import main as cli_main
from gpugate.config import ConfigError, load_config
from gpugate.record import to_plain
from gpugate.slurm import choose
from gpugate.slurm.parse_text import parse_show_node_text
from gpugate.slurm.records import NodeInfo, gres_gpu_count
from gpugate.yamlio import dump_yaml, parse_yaml

SNAPSHOTS = "config/snapshots"


# Slurm's Gres=gpu:N


@pytest.mark.parametrize(
    ("gres", "count"),
    [
        ("gpu:8(S:0-1)", 8),
        ("gpu:h100:4(S:0),gpu:a100:2(S:1)", 6),
        ("gpu:4,nic:2", 4),
        ("gpu:a100:4(IDX:0-3)", 4),
        ("(null)", None),
        ("nic:2", None),
        ("", None),
        (None, None),
        ({"gpu:h100": 8}, 8),
        ("gpu:99999999999", None),
    ],
)
def test_gres_gpu_count_reads_every_way_slurm_writes_it(gres, count):
    assert gres_gpu_count(gres) == count


def test_scontrol_show_node_carries_the_configured_gpus():
    text = (
        "NodeName=gpu01 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUTot=64 "
        "Gres=gpu:h100:8(S:0-1) NodeAddr=gpu01 State=IDLE Partitions=batch\n"
        "NodeName=cpu01 Arch=x86_64 Gres=(null) State=IDLE Partitions=cpu\n"
    )
    gpu, cpu = parse_show_node_text(text)
    assert (gpu.gres_gpus, cpu.gres_gpus) == (8, None)


class _Slurm:
    def __init__(self, node: NodeInfo | Exception):
        self.answer, self.asked = node, 0

    def node(self, name):
        self.asked += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_configured_gpus_is_best_effort():
    slurm = _Slurm(NodeInfo(name="gpu01", state="IDLE", gres_gpus=4))
    assert choose.configured_gpus("gpu01", slurm) == 4
    assert choose.configured_gpus("gpu01", _Slurm(RuntimeError("slurmctld down"))) is None
    assert choose.configured_gpus("", slurm) is None


def test_with_slurm_gres_asks_only_live_and_when_the_site_sets_no_count(tmp_path):
    slurm = _Slurm(NodeInfo(name="gpu01", state="IDLE", gres_gpus=4))
    facts = make_facts()
    live = site(tmp_path, f"state_dir: {tmp_path / 'state'}\n")
    (tmp_path / "state").mkdir()
    assert choose.with_slurm_gres(live, "gpu01", facts, slurm).slurm_gres_gpus == 4
    pinned = site(tmp_path, "expect:\n  gpu_count: 8\n")
    assert choose.with_slurm_gres(pinned, "gpu01", facts, slurm).slurm_gres_gpus is None
    replay = site(tmp_path, "facts_file: /x.yaml\n")
    assert choose.with_slurm_gres(replay, "gpu01", facts, slurm).slurm_gres_gpus is None
    assert slurm.asked == 1


def test_slurms_answer_is_kept_ten_minutes_per_node(tmp_path):
    # One slurmctld RPC per node per GRES_CACHE_S, not one per job start.
    asked = []

    def ask():
        asked.append(1)
        return 8

    assert choose.cached_gpus(str(tmp_path), "gpu01", ask) == 8
    assert choose.cached_gpus(str(tmp_path), "gpu01", ask) == 8
    assert len(asked) == 1
    assert choose.cached_gpus(str(tmp_path), "gpu02", ask) == 8  # another node's answer
    assert len(asked) == 2
    later = time.time() + choose.GRES_CACHE_S + 1
    assert choose.cached_gpus(str(tmp_path), "gpu02", ask, now=later) == 8  # stale: asked again
    assert len(asked) == 3
    for bad in ('{"node": "gpu02", "gpus": true, "at": 0}', "[]", "\x00{", '{"at": "x"}'):
        (tmp_path / "slurm-gres.json").write_text(bad)
        assert choose.cached_gpus(str(tmp_path), "gpu02", ask) == 8
    assert len(asked) == 7
    assert choose.cached_gpus(str(tmp_path), "gpu02", lambda: None) == 8  # the last answer kept


# gpu.count: the site, then Slurm, then the PCI bus; never the board's guess


def test_one_gpu_a100_node_passes_without_a_board_guess_of_eight():
    a100 = make_gpu(0, name="NVIDIA A100-SXM4-80GB")
    f = only("gpu.count", make_facts(gpus=[a100], pci_gpu_count=1))
    assert f.status == "ok" and "as many as on the PCI bus" in f.message


def test_gpu_count_comes_from_slurm_gres_before_anything_else():
    f = only("gpu.count", make_facts(gpus=[make_gpu(i) for i in range(7)], slurm_gres_gpus=8))
    assert (f.status, f.value, f.limit) == ("fail", 7, 8)
    assert "Slurm Gres=gpu says 8" in f.message
    f = only("gpu.count", make_facts(slurm_gres_gpus=8))
    assert f.status == "ok" and "Slurm Gres=gpu: 8" in f.message


def test_the_sites_expect_gpu_count_wins_over_slurm(tmp_path):
    config = site(tmp_path, "expect:\n  gpu_count: 4\n")
    facts = make_facts(gpus=[make_gpu(i) for i in range(4)], pci_gpu_count=4, slurm_gres_gpus=8)
    f = only("gpu.count", facts, config)
    assert f.status == "ok" and "expect.gpu_count: 4" in f.message


def test_without_any_count_nvml_must_see_the_pci_bus_or_it_reports_what_it_sees():
    # HGX A100 ships with 4 or 8 GPUs: its board names no count.
    a100 = [make_gpu(i, name="NVIDIA A100-SXM4-80GB") for i in range(7)]
    f = only("gpu.count", make_facts(gpus=a100))
    assert f.status == "fail" and "8 NVIDIA GPUs on the PCI bus but NVML sees 7" in f.message
    f = only("gpu.count", make_facts(gpus=a100, pci_gpu_count=None))
    assert (f.status, f.value) == ("ok", 7) and "no expected count" in f.message


def test_a_board_sold_in_one_count_is_the_last_word():
    facts = make_facts(gpus=[make_gpu(i) for i in range(7)], pci_gpu_count=7)
    f = only("gpu.count", facts)
    assert (f.status, f.limit) == ("fail", 8) and "board h100-sxm-8 says 8" in f.message
    assert only("gpu.count", facts.replace(slurm_gres_gpus=7)).status == "ok"


def test_nvml_down_with_gpus_on_the_bus_fails():
    facts = make_facts(source_errors={"nvml": "NVMLError_DriverNotLoaded"}).replace(gpus=None)
    f = only("gpu.count", facts)
    assert f.status == "fail" and "8 on the PCI bus" in f.message


def test_nvml_refusing_to_start_is_failed_once_by_gpu_driver_not_again_by_gpu_count():
    facts = make_facts(nvml_error="driver_not_loaded").replace(gpus=None)
    assert only("gpu.count", facts).status == "unknown"
    assert only("gpu.driver", facts).status == "fail"


def test_a_replayed_snapshot_may_carry_slurms_count(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text(dump_yaml({"node": "gpu01", "slurm_gres_gpus": 4, "pci_gpu_count": 0}))
    assert load_snapshot(str(path)).slurm_gres_gpus == 4


# CPU-only nodes


def test_a_cpu_only_node_is_not_judged_by_gpu_rules():
    facts = make_facts(gpus=(), pci_gpu_count=0, kernel_modules=("mlx5_ib",))
    facts = facts.replace(source_errors={"nvml": "NVMLError_LibraryNotFound"})
    findings = run_checks(facts, load_config("/dev/null"))
    gpu_rules = [f for f in findings if f.check.startswith(("gpu.", "pcie.", "nvlink."))]
    assert gpu_rules and all(f.status == "ok" for f in gpu_rules)
    assert all("not judged by GPU rules" in f.message for f in gpu_rules)
    assert {f.status for f in findings} == {"ok"}
    # No driver at all on a CPU node (NVML cannot load): the same.
    findings = run_checks(facts.replace(gpus=None), load_config("/dev/null"))
    assert {f.status for f in findings} == {"ok"}


def test_a_node_slurm_gives_gpus_is_judged_even_with_none_on_the_bus():
    facts = make_facts(gpus=(), pci_gpu_count=0, slurm_gres_gpus=8)
    assert only("gpu.count", facts).status == "fail"


# Node classes


CLASSES = """
classes:
  - nodes: "cpu[01-64]"
    expect: {gpu_count: 0}
  - nodes: "a100-[001-016]"
    expect: {gpu_count: 4, ib_ports: 4, ib_rate_gbps: 200}
  - partitions: [strict]
    checks: {gpu: {require_persistence_mode: true}}
"""


def test_classes_overlay_the_config_per_node_set_and_partition(tmp_path, monkeypatch):
    path = tmp_path / "site.yaml"
    path.write_text("expect:\n  ib_rate_gbps: 400\n" + CLASSES)
    monkeypatch.delenv("SLURM_JOB_PARTITION", raising=False)
    monkeypatch.setenv("SLURMD_NODENAME", "a100-007")
    config = load_config(str(path))
    assert (config.expect.gpu_count, config.expect.ib_ports) == (4, 4)
    assert config.expect.ib_rate_gbps == 200.0
    assert not config.checks.gpu.require_persistence_mode
    monkeypatch.setenv("SLURMD_NODENAME", "cpu12")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "strict")
    config = load_config(str(path))
    assert (config.expect.gpu_count, config.expect.ib_rate_gbps) == (0, 400.0)
    assert config.checks.gpu.require_persistence_mode
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node-01")
    monkeypatch.delenv("SLURM_JOB_PARTITION")
    assert load_config(str(path)).expect.gpu_count is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("classes: {nodes: x}\n", "classes: expected a list"),
        ("classes: [{expect: {gpu_count: 0}}]\n", "classes[0]: names no nodes"),
        ("classes: [{nodes: 'cpu[01-'}]\n", "classes[0].nodes"),
        ("classes: [{partitions: cpu}]\n", "classes[0].partitions: expected a list"),
        ("classes: [{nodes: cpu01, expect: {gpu_cuont: 0}}]\n", "classes[0].expect.gpu_cuont"),
        ("classes: [{nodes: cpu01, expect: {gpu_count: two}}]\n", "classes[0].expect.gpu_count"),
    ],
)
def test_classes_are_validated_like_the_site_file(tmp_path, text, says):
    path = tmp_path / "site.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"site\.yaml: " + says.replace("[", r"\[")):
        load_config(str(path))


# gpugate profile --from FACTS.yaml


def _profile(tmp_path, facts_yaml: str, *extra: str) -> dict:
    out = tmp_path / "class.yaml"
    assert cli_main(["profile", "--from", facts_yaml, "-o", str(out), *extra]) == 0
    return parse_yaml(out.read_text())


def test_profile_learns_a_healthy_node_as_a_loadable_site_config(tmp_path):
    learned = _profile(tmp_path, f"{SNAPSHOTS}/h100-healthy.yaml")
    assert learned["expect"] == {
        "gpu_count": 8,
        "nvlinks_per_gpu": 18,
        "pcie_gen": 5,
        "pcie_width": 16,
        "nvswitch": True,
        "ib_ports": 8,
        "ib_rate_gbps": 400.0,
    }
    assert learned["checks"]["gpu"]["driver_version"] == "550.54.15"
    config = load_config(str(tmp_path / "class.yaml"))
    facts = load_snapshot(f"{SNAPSHOTS}/h100-healthy.yaml")
    assert {f.status for f in run_checks(facts, config)} == {"ok"}


def test_a_card_in_a_slot_wired_x8_is_not_degraded_once_learned(tmp_path):
    x8 = Pcie(gen=4, max_gen=4, width=8, max_width=8, replay_errors=0)
    gpus = [make_gpu(i, name="NVIDIA L40S", pcie=x8, nvlink_active=(), fabric_state=None)
            for i in range(2)]  # fmt: skip
    hdr = tuple(make_ib(i, rate_gbps=200.0) for i in range(2))
    facts = make_facts(gpus=gpus, pci_gpu_count=2, infiniband=hdr)
    snap = tmp_path / "good.yaml"
    snap.write_text(dump_yaml(to_plain(facts)))
    learned = _profile(tmp_path, str(snap))
    assert learned["expect"]["pcie_width"] == 8 and learned["expect"]["gpu_count"] == 2
    assert (learned["expect"]["ib_ports"], learned["expect"]["ib_rate_gbps"]) == (2, 200.0)
    config = load_config(str(tmp_path / "class.yaml"))
    assert only("pcie.link", facts, config).status == "ok"
    assert only("ib.ports", facts, config).status == "ok"
    # A GPU of that class that fell to x4 is degraded all the same.
    x4 = x8.replace(width=4)
    worse = facts.replace(gpus=(gpus[0].replace(pcie=x4), gpus[1]))
    assert only("pcie.link", worse, config).status == "fail"


def test_profile_of_a_cpu_only_node_expects_no_gpu(tmp_path):
    snap = tmp_path / "cpu.yaml"
    snap.write_text(dump_yaml({"node": "cpu01", "pci_gpu_count": 0, "infiniband": []}))
    assert _profile(tmp_path, str(snap))["expect"] == {"gpu_count": 0, "ib_ports": 0}


def test_profile_as_a_node_class_applies_to_those_nodes_only(tmp_path, monkeypatch):
    learned = _profile(tmp_path, f"{SNAPSHOTS}/h100-healthy.yaml", "--nodes", "gpu[01-16]")
    (cls,) = learned["classes"]
    assert cls["nodes"] == "gpu[01-16]" and cls["expect"]["gpu_count"] == 8
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    assert load_config(str(tmp_path / "class.yaml")).expect.ib_ports == 8
    monkeypatch.setenv("SLURMD_NODENAME", "cpu07")
    assert load_config(str(tmp_path / "class.yaml")).expect.ib_ports is None
    bad = ["profile", "--from", f"{SNAPSHOTS}/h100-healthy.yaml", "--nodes", "gpu[01-"]
    assert cli_main(bad) == 2


def test_profile_is_in_the_command_table(capsys):
    assert cli_main(["--help"]) == 0
    assert "profile" in capsys.readouterr().out

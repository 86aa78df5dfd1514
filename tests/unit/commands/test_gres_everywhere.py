"""`gpugate check` (live) and `gpugate resume` judge the GPU count by Slurm's Gres, as the prolog.

The same with_slurm_gres(): the node-local cache (state_dir/slurm-gres.json), the bounded ask,
and, when Slurm is away or does not know the node, the same fall-back (the board's guess).
"""

from __future__ import annotations

import json

import pytest
from factories import make_facts, make_gpu, run_command, site
from fakes import NODE, FakeSlurm, drained

from gpugate.admin import resume as R
from gpugate.commands import check as C
from gpugate.slurm.control import SlurmError

# Four H100 SXM GPUs: the board guess (h100-sxm-8) says 8, slurm.conf says gpu:4.
FOUR = make_facts(gpus=[make_gpu(i) for i in range(4)], pci_gpu_count=4, node=NODE)


def slurm_with(gres: int | None, reason: str = "") -> FakeSlurm:
    """A FakeSlurm holding NODE, configured `Gres=gpu:<gres>` (drained with `reason` if given)."""
    info = drained(NODE, reason) if reason else drained(NODE, "x").replace(flags=(), reason="")
    return FakeSlurm([info.replace(gres_gpus=gres)])


@pytest.fixture
def live(tmp_path, monkeypatch):
    """This machine is NODE with four GPUs; the site's state_dir in tmp_path."""
    (tmp_path / "state").mkdir()
    cfg = tmp_path / "site.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nevidence_dir: {tmp_path / 'ev'}\n")
    for module in (C, R):
        monkeypatch.setattr(module, "node_name", lambda: NODE)
        monkeypatch.setattr(module, "gather", lambda *a, **k: FOUR)
    return cfg


def check_count(cfg, slurm: FakeSlurm, capsys) -> dict:
    """`gpugate check --only gpu.count --json` live, Slurm's Gres answered by `slurm`."""
    run_command(["check", "--config", str(cfg), "--only", "gpu.count", "--json"], slurm=slurm)
    [finding] = json.loads(capsys.readouterr().out)["findings"]
    return finding


def test_live_check_passes_a_node_slurm_gives_four_gpus_and_keeps_the_answer(
    live, capsys, tmp_path
):
    finding = check_count(live, slurm_with(4), capsys)
    assert finding["status"] == "ok" and "Slurm Gres" in finding["message"]
    kept = json.loads((tmp_path / "state" / "slurm-gres.json").read_text())
    assert kept["node"] == NODE and kept["gpus"] == 4  # the prolog's cache, now warm
    # Within ten minutes the cache answers: Slurm is not asked again.
    away = slurm_with(4)
    away.errors["node"] = SlurmError("slurmctld down")
    assert check_count(live, away, capsys)["status"] == "ok"


@pytest.mark.parametrize("why", ["slurmctld down", "node unknown"])
def test_live_check_falls_back_to_the_board_as_the_prolog_does(why, live, capsys):
    slurm = FakeSlurm([]) if why == "node unknown" else slurm_with(4)  # NodeNotFound, or:
    if why == "slurmctld down":
        slurm.errors["node"] = SlurmError(why)
    finding = check_count(live, slurm, capsys)
    assert finding["status"] == "fail" and "says 8" in finding["message"]


class Unasked(FakeSlurm):
    """A Slurm that fails the test when asked for a node."""

    def node(self, name):
        pytest.fail(f"Slurm was asked for {name}")


def test_a_replayed_snapshot_is_judged_as_it_is(live, capsys):
    argv = ["check", "--config", str(live), "--facts", "any.yaml", "--only", "gpu.count"]
    run_command(argv, slurm=Unasked())
    assert "says 8" in capsys.readouterr().out


def test_resume_sees_slurms_count(live):
    config = site(live.parent, live.read_text())
    reason = "gpugate: gpu.count: 4 GPUs seen, board h100-sxm-8 says 8"
    slurm = slurm_with(4, reason)
    attempt = R.check_then_resume(config, slurm, slurm.node(NODE), R.Request(node=NODE))
    assert attempt.resumed and slurm.resumed == [NODE], attempt
    # Without a Gres count (and no answer kept) the board's guess decides, as in the prolog.
    (live.parent / "state" / "slurm-gres.json").unlink()
    slurm = slurm_with(None, reason)
    attempt = R.check_then_resume(config, slurm, slurm.node(NODE), R.Request(node=NODE))
    assert not attempt.resumed and "says 8" in attempt.why

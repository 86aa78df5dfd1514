"""Xids outside NVIDIA's catalog reach `gpugate nodes`: the prolog notes them in the history
(unknown-xids.jsonl, beside drains.jsonl), the listing shows them per node (a column, and
`unknown_xids` in --json). They warn and never drain, so no drain entry could carry them."""

from __future__ import annotations

import copy
import json

import pytest
from factories import make_facts
from slurm_recorded import fixture

from gpugate.admin import nodes as A
from gpugate.cli import main
from gpugate.store import history as H
from gpugate.yamlio import dump_yaml

NODE, OTHER = "gpu-node-01", "gpu-node-02"
NOW = 1_790_000_000.0
XID_999 = "[ 1843.30] NVRM: Xid (PCI:0000:b3:00): 999, pid='<unknown>', name=<unknown>, new"


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site whose prolog replays a snapshot of NODE; Slurm's listing of NODE and OTHER."""
    snap = tmp_path / f"{NODE}.yaml"
    snap.write_text(dump_yaml(make_facts(kernel_log=[XID_999]).to_dict()))
    cfg = tmp_path / "site.yaml"
    cfg.write_text(
        f"facts_file: {snap}\nstate_dir: {tmp_path / 'state'}\n"
        f"evidence_dir: {tmp_path / 'ev'}\nadmin:\n  metrics_file: null\n"
        "task_prolog:\n  nccl_debug_dir: null\n"
    )  # nccl_debug_dir: null, never the host's /var/lib/gpugate/nccl
    monkeypatch.setenv("GPUGATE_CONFIG", str(cfg))
    doc = json.loads(fixture("22.05/sinfo.drained.json"))
    first = doc["nodes"][0]
    first.update(name=NODE, reason="")
    doc["nodes"].append({**copy.deepcopy(first), "name": OTHER})
    (tmp_path / "sinfo.json").write_text(json.dumps(doc))
    return tmp_path


def run_prolog(monkeypatch, job: str) -> None:
    env = {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": job, "SLURM_JOB_UID": "0"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["prolog"]) == 0  # reported, not drained


def nodes(site, capsys, *extra: str) -> str:
    assert main(["nodes", "--sinfo-json", str(site / "sinfo.json"), *extra]) == 0
    return capsys.readouterr().out


def test_a_prologs_unknown_xid_is_shown_by_gpugate_nodes(site, monkeypatch, capsys):
    run_prolog(monkeypatch, "77")
    capsys.readouterr()
    by = {r["node"]: r for r in json.loads(nodes(site, capsys, "--json"))["nodes"]}
    assert by[NODE]["unknown_xids"] == [999] and by[NODE]["drains"] == 0
    assert by[OTHER]["unknown_xids"] == []
    head, *lines = nodes(site, capsys).splitlines()
    column = head.index("UNKNOWN XIDS")
    shown = {line.split()[0]: line[column:].split()[0] for line in lines if len(line) > column}
    assert shown.get(NODE) == "999" and OTHER not in shown


def test_one_entry_for_jobs_starting_together_a_new_one_later(tmp_path):
    state = str(tmp_path)
    assert H.record_unknown_xids(state, NODE, [999, 999], when=NOW, job="1").xids == [999]
    assert H.record_unknown_xids(state, NODE, [999], when=NOW + 5, job="2") is None
    assert H.record_unknown_xids(state, NODE, [], when=NOW + 6) is None
    assert H.record_unknown_xids(state, NODE, [999], when=NOW + H.SAME_EVENT_S, job="3")
    assert H.record_unknown_xids(state, OTHER, [1000, 998], when=NOW + 7).xids == [998, 1000]
    assert [e.job for e in H.unknown_xids(state, NODE)] == ["1", "3"]


def test_old_reports_leave_the_window_and_hostile_lines_are_skipped(tmp_path, capsys):
    state = tmp_path
    H.record_unknown_xids(str(state), NODE, [999], when=NOW - 40 * 86400)
    H.record_unknown_xids(str(state), OTHER, [1001], when=NOW - 86400)
    with open(state / H.UNKNOWN_XIDS, "a") as fh:
        fh.write('{"node": "gpu-node-03", "when": 1, "xids": ["x"]}\n[]\n{"node": 5}\n')
    entries = H.unknown_xids(str(state))
    assert [e.node for e in entries] == [NODE, OTHER]
    assert "skipped 3 malformed entries" in capsys.readouterr().err
    assert A.unknown_by_node(entries, NOW - 30 * 86400) == {OTHER: (1001,)}


def test_a_history_that_cannot_be_written_never_fails_the_hook(tmp_path, capsys):
    from factories import site as make_site

    blocker = tmp_path / "file"
    blocker.write_text("")  # history_dir under a file: cannot be created
    config = make_site(
        tmp_path, f"state_dir: {tmp_path / 's'}\nadmin:\n  history_dir: {blocker / 'h'}\n"
    )
    H.note_unknown_xids(config, NODE, [999], job="1", hook="prolog")  # no exception
    assert "could not record the unknown Xids of gpu-node-01" in capsys.readouterr().err

"""The `gpugate` command: dispatch, exit codes, `facts` written and replayed by `check`."""

from __future__ import annotations

import json
import os
import shutil

import paths
import pytest
from factories import default_config, make_facts, run_command

from gpugate.checks import findings as F
from gpugate.cli import main
from gpugate.gate.policy import decide
from gpugate.yamlio import parse_yaml

FIXTURES = str(paths.FIXTURES)


def test_usage_and_unknown_command(capsys):
    assert main([]) == 2
    assert main(["--help"]) == 0 and "check" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_bad_config_is_exit_2_naming_the_key(tmp_path, capsys):
    site = tmp_path / "site.yaml"
    site.write_text("checks:\n  gpu:\n    nope: 1\n")
    assert main(["check", "--config", str(site), "--facts", "x.yaml"]) == 2
    assert "checks.gpu.nope: unknown key" in capsys.readouterr().err


def test_check_names_the_node_and_takes_node(tmp_path, capsys, monkeypatch):
    # Slurm's NodeName is not the host name: facts_file's {node} finds no file for the host.
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    snap = os.path.join(paths.SNAPSHOTS, "h100-healthy.yaml")
    shutil.copy(snap, tmp_path / "gpu-07.yaml")
    site = tmp_path / "site.yaml"
    site.write_text(f"state_dir: {tmp_path / 'state'}\nfacts_file: {tmp_path}/{{node}}.yaml\n")
    host = os.uname().nodename.split(".")[0]
    assert main(["check", "--config", str(site)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}/{host}.yaml: cannot read" in err
    assert "give --node NAME or set SLURMD_NODENAME=NAME" in err
    assert main(["check", "--config", str(site), "--node", "gpu-07", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "ok"
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-07")
    assert main(["check", "--config", str(site)]) == 0


def test_bad_snapshot_is_exit_2_naming_the_key(tmp_path, capsys):
    snap = tmp_path / "s.yaml"
    snap.write_text("gpus:\n  - index: zero\n")
    assert main(["check", "--config", "/dev/null", "--facts", str(snap)]) == 2
    assert "gpus[0].index: expected an integer" in capsys.readouterr().err


def test_facts_on_this_machine_are_written_and_replayed(tmp_path, capsys):
    """No GPU here: NVML's failure is recorded in the snapshot, not raised."""
    site = tmp_path / "site.yaml"
    site.write_text(
        f"sources:\n  sysfs_root: {FIXTURES}/sys-ib-h100\n  proc_root: {FIXTURES}/proc-h100\n"
        f"  kernel_log_file: {FIXTURES}/kernel-log/dmesg.txt\n"
    )
    out = tmp_path / "node.yaml"
    assert main(["facts", "-o", str(out), "--config", str(site)]) == 0
    snap = parse_yaml(out.read_text())
    for key in (
        "node",
        "collected_at",
        "infiniband",
        "kernel_log",
        "limits",
        "memory",
        "source_errors",
    ):
        assert key in snap, key
    assert len(snap["infiniband"]) == 9 and snap["memory"]["total_mib"] > 0
    assert "nvml" in snap["source_errors"]
    capsys.readouterr()
    code = main(["check", "--config", str(site), "--facts", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code in (0, 1) and report["status"] in ("ok", "warn", "fail")
    lost = [f for f in report["findings"] if f["check"] == "gpu.count"]
    assert lost and lost[0]["status"] in ("unknown", "fail")


def test_policy_maps_unknown_warn_only_and_report_only():
    config = default_config()
    u = F.unknown("gpu.count", "NVML facts missing")
    f = F.fail("gpu.ecc", "GPU3 aggregate uncorrected ECC 120 > 100", gpu=3)
    assert decide([u], config.policy).status == "warn"
    assert decide([u], config.policy.replace(unknown="fail")).status == "fail"
    assert decide([u], config.policy.replace(unknown="ok")).action == "allow"
    assert decide([f], config.policy).action == "drain"
    assert decide([f], config.policy.replace(warn_only=["gpu.ecc"])).status == "warn"
    only = decide([f], config.policy.replace(report_only=True))
    assert (only.status, only.action) == ("fail", "warn")


def test_check_table_puts_problems_first(tmp_path, capsys):
    from gpugate.yamlio import dump_yaml

    snap = tmp_path / "s.yaml"
    snap.write_text(dump_yaml(make_facts(gpus={6: {"temperature_c": 91.0}}).to_dict()))
    assert main(["check", "--config", "/dev/null", "--facts", str(snap)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("gpu-node-01: FAIL")
    assert lines[1].split()[0] == "FAIL" and "GPU6" in lines[1]


# ------------------------------------------------------- bad names and ids: one line, exit 2

BAD_NODES = ["a,b", "../../etc", "a[1-100000000]", "", "-5", "gpu\n01", "x" * 300, "\x1b[2Jn",
             "a\u202eb", ".hidden", "a b"]  # fmt: skip
BAD_JOBS = ["abc", "-5", "1_2_3", "", "../../etc", "a,b", "a[1-100000000]", "0", "99999999999",
            "12\n", "1_"]  # fmt: skip


def said_once(capsys, argv: list[str], code: int, runner=None) -> str:
    """Run the CLI (Slurm's commands answered by `runner`, when given, through the real CLI
    backend); exactly one line on stderr, the exit code, no traceback."""
    if runner is None:
        assert main(argv) == code
    else:
        from gpugate.slurm.cli import CliBackend

        assert run_command(argv, make_slurm=lambda config: CliBackend(runner=runner)) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err and "\x1b" not in err and "\u202e" not in err
    return err


@pytest.fixture
def site_dirs(tmp_path, monkeypatch):
    cfg = tmp_path / "gpugate.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nevidence_dir: {tmp_path / 'ev'}\n")
    monkeypatch.setenv("GPUGATE_CONFIG", str(cfg))
    return tmp_path


@pytest.mark.parametrize("node", BAD_NODES)
def test_bad_node_names_are_refused_in_one_line(node, site_dirs, capsys):
    from slurm_recorded import FakeRunner

    if node != "-5":  # a job id's shape for `evidence`: tested below
        assert "not a node name" in said_once(capsys, ["evidence", node], 2) or node == ""
    # Any call to Slurm would fail the test (`evidence` never asks Slurm).
    assert "node name" in said_once(capsys, ["resume", node], 2, FakeRunner())
    assert "node name" in said_once(capsys, ["evidence", "--node", node], 2)


@pytest.mark.parametrize("job", BAD_JOBS)
def test_bad_job_ids_are_refused_in_one_line(job, site_dirs, capsys):
    from slurm_recorded import FakeRunner

    assert "job id" in said_once(capsys, ["requeue", job], 2, FakeRunner())
    # `evidence` takes a node too: digits and '_' are a job id, a plain word a node.
    code = 1 if job == "abc" else 2
    said_once(capsys, ["evidence", job], code)


def test_unknown_node_and_job_are_one_line_and_exit_1(site_dirs, capsys):
    from slurm_recorded import FakeRunner

    runner = FakeRunner()
    runner.fail(("scontrol", "-o", "show", "node", "gpu-77"), stderr="Node gpu-77 not found\n")
    runner.fail(("scontrol", "-o", "show", "job", "4242"),
                stderr="slurm_load_jobs error: Invalid job id specified\n")  # fmt: skip
    runner.fail(("scontrol", "-o", "show", "node", "gpu-78"), status="timeout", rc=None,
                stderr="Unable to contact slurm controller\n(connect failure)\n")  # fmt: skip
    assert "does not know node gpu-77" in said_once(capsys, ["resume", "gpu-77"], 1, runner)
    assert "does not know job 4242" in said_once(capsys, ["requeue", "4242"], 1, runner)
    assert "cannot read node gpu-78" in said_once(capsys, ["resume", "gpu-78"], 1, runner)
    assert "no evidence bundles for node gpu-77" in said_once(capsys, ["evidence", "gpu-77"], 1)
    assert "no evidence bundles for job 4242" in said_once(capsys, ["evidence", "4242"], 1)


@pytest.mark.parametrize(
    "argv",
    [["latest", ""], ["latest", "/tmp/a\nb"], ["list", "/tmp/\x1b[2Ja"], ["latest", "/nonexistent"],
     ["latest", "/tmp", "--settle-s", "nan"], ["latest", "/tmp", "--settle-s", "-1"]],
)  # fmt: skip
def test_checkpoint_bad_arguments_are_one_line_and_exit_2(argv, capsys):
    said_once(capsys, ["checkpoint", *argv], 2)


def test_evidence_of_a_node_reads_its_index_not_every_job(site_dirs, capsys, monkeypatch):
    import glob

    from gpugate.store.evidence import write_bundle

    ev = str(site_dirs / "ev")
    mine = [write_bundle(ev, str(j), "gpu-07", 0, {}, {"node": "gpu-07"}) for j in (5, 6)]
    for j in range(7, 40):
        write_bundle(ev, str(j), "gpu-08", 0, {}, {"node": "gpu-08"})

    def no_listing(*a, **k):
        raise AssertionError("listed every job directory")

    monkeypatch.setattr(glob, "glob", no_listing)
    monkeypatch.setattr(os, "listdir", no_listing)
    monkeypatch.setattr(os, "scandir", no_listing)
    assert main(["evidence", "gpu-07", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(b["path"] for b in out["bundles"]) == sorted(mine)


def test_evidence_without_an_index_scans_and_says_so(site_dirs, capsys):
    from gpugate.store.evidence import index_path, write_bundle

    ev = str(site_dirs / "ev")
    path = write_bundle(ev, "5", "gpu-07", 0, {}, {"node": "gpu-07"})
    os.unlink(index_path(ev, "gpu-07"))
    assert main(["evidence", "gpu-07", "--json"]) == 0
    captured = capsys.readouterr()
    assert [b["path"] for b in json.loads(captured.out)["bundles"]] == [path]
    assert "no index for gpu-07" in captured.err and captured.err.count("\n") == 1


def test_an_internal_error_is_one_line_and_exit_3(monkeypatch, capsys):
    from gpugate import cli

    def broken(argv):
        raise KeyError("\x1b[2Jbug")

    assert cli.run_guarded(broken, [], "nodes") == cli.EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: KeyError" in err
    assert "Traceback" not in err and "\x1b" not in err
    monkeypatch.setenv("GPUGATE_TRACEBACK", "1")
    with pytest.raises(KeyError):
        cli.run_guarded(broken, [], "nodes")


# --- quick_options: the hooks' and a replayed check's arguments without argparse ---------------
QUICK_ACCEPTED = [
    [],
    ["--config", "/etc/site.yaml"],
    ["--config=/etc/site.yaml"],
    ["--config="],
    ["--config", "a", "--config", "b"],
    ["--facts", "snap.yaml", "--json"],
    ["--json", "--facts=snap.yaml", "--only", "gpu.ecc", "--only=gpu.count", "--config", "c"],
]
QUICK_REFUSED = [
    ["-h"],
    ["--help"],
    ["--conf", "x"],  # an abbreviation: argparse's to accept
    ["--config"],  # a missing value: argparse's error
    ["--config", "-x"],
    ["--json=yes"],
    ["positional"],
    ["--"],
    ["--unknown"],
]


@pytest.mark.parametrize("argv", QUICK_ACCEPTED, ids=lambda a: " ".join(a) or "none")
def test_quick_options_give_what_argparse_gives(argv):
    from gpugate.cli import quick_options
    from gpugate.commands import check

    quick = quick_options(argv, **check.OPTIONS)
    assert quick is not None
    assert vars(quick) == vars(check.parser().parse_args(argv))


@pytest.mark.parametrize("argv", QUICK_REFUSED, ids=lambda a: " ".join(a))
def test_quick_options_leave_the_rest_to_argparse(argv):
    from gpugate.cli import quick_options
    from gpugate.commands import check

    assert quick_options(argv, **check.OPTIONS) is None


def test_a_hooks_quick_arguments_are_its_parsers():
    from gpugate.cli import make_parser, quick_options
    from gpugate.commands import hook_args

    for argv in ([], ["--config", "x"], ["--config=y"]):
        p = make_parser("gpugate prolog", "")
        p.add_argument("--config", metavar="FILE")
        assert vars(hook_args("prolog", argv)) == vars(p.parse_args(argv))
    assert quick_options(["--config"], values=("--config",)) is None

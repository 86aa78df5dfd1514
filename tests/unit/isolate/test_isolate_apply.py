"""The isolation's sequence against an in-memory Slurm that reads the files as Slurm does.

The fake's `scontrol reconfigure` answers as the measured versions do (docs/slurm-facts.md):
24.11 takes the count both files give; 22.05 keeps its own and marks the node INVALID_REG.
The real Slurm runs in tests/e2e/test_e2e_isolate.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fakes import FakeSlurm
from isolate_site import fake_devices, gpu_config

from gpugate.checks.facts import Gpu
from gpugate.checks.findings import fail
from gpugate.fsutil import FileLock, lock_file
from gpugate.isolate import apply, conf, probe, quiet, state
from gpugate.isolate.comment import IsolatedGpu, parse_comment
from gpugate.slurm.reasons import drain_reason
from gpugate.slurm.records import NodeInfo
from gpugate.store.locks import ISOLATE

NODE = "n1"
SLURM_CONF = (
    "ClusterName=c\nGresTypes=gpu\n"
    "NodeName=n1 CPUs=2 RealMemory=1000 Gres=gpu:8 State=UNKNOWN\n"
    "NodeName=n2 CPUs=2 RealMemory=1000 Gres=gpu:8 State=UNKNOWN\n"
)
GRES_CONF = "AutoDetect=off\nNodeName=n1 Name=gpu File={dev}/nvidia[0-7]\n"
# `scontrol show config` (its lines as src/api/config_info.c prints them) of a confined site
SHOWN = (
    "SlurmctldParameters     = (null)\nTaskPlugin              = task/cgroup,task/affinity\n"
    "\nCgroup Support Configuration:\nConstrainDevices        = yes\n"
)
ECC3 = fail("gpu.ecc", "GPU3 volatile uncorrectable ECC 2 (limit 0)", gpu=3)


class FakeCli:
    """What the isolation asks of scontrol: the version, and reconfigure."""

    def __init__(self, slurm: FakeSlurm, version: tuple[int, int], conf_path: Path) -> None:
        self.slurm, self.v, self.conf_path = slurm, version, conf_path
        self.commands: list[tuple[str, ...]] = []
        self.gres_path = conf_path.parent / "gres.conf"
        self.invalid = False  # answer INVALID_REG whatever the files say
        self.shown = SHOWN  # `scontrol show config`
        # squeue's answers about the controller's scripts, in turn (an exception is raised);
        # `quiet` once they are used up. `timeline`: every squeue answer and reconfigure.
        self.busy: list[list[tuple[str, str]] | Exception] = []
        self.quiet: list[tuple[str, str]] = []
        self.timeline: list[object] = []

    def script_jobs(self) -> list[tuple[str, str]]:
        answer = self.busy.pop(0) if self.busy else self.quiet
        self.timeline.append(answer)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def version(self) -> tuple[int, int]:
        return self.v

    def scontrol(self, *args: str) -> str:
        if args == ("show", "config"):
            return self.shown
        self.commands.append(args)
        self.timeline.append(args)
        assert args == ("reconfigure",)
        info = self.slurm.infos[NODE]
        gpus = conf.read_node_gpus(self.conf_path.read_text(), self.gres_path.read_text(), NODE)
        if self.v >= (24, 11) and not self.invalid:
            self.slurm.infos[NODE] = info.replace(gres_gpus=gpus.count)
        elif gpus.count != info.gres_gpus or self.invalid:
            self.slurm.infos[NODE] = info.replace(flags=(*info.flags, "INVALID_REG"))
        return ""


class Slurm(FakeSlurm):
    """FakeSlurm with the CLI part the isolation uses."""

    fake_cli: FakeCli

    @property
    def cli(self) -> FakeCli:  # type: ignore[override]  # the two calls the isolation makes
        return self.fake_cli


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    dev = tmp_path / "dev"
    dev.mkdir()
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text(SLURM_CONF)
    (etc / "gres.conf").write_text(GRES_CONF.format(dev=dev))
    (etc / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nConstrainDevices=yes\n")
    devices = fake_devices(tmp_path)
    config = gpu_config(tmp_path, etc / "slurm.conf", devices, settle_s=2, wait_idle_s=2,
                        quiet_s=1)  # fmt: skip
    monkeypatch.setattr(apply, "POLL_S", 0.01)
    monkeypatch.setattr(quiet, "POLL_S", 0.01)
    monkeypatch.setattr(quiet, "HOLD_S", 0.05)
    monkeypatch.setenv("SLURMD_NODENAME", NODE)
    drained = NodeInfo(name=NODE, state="IDLE", flags=("DRAIN",), gres_gpus=8, partitions=("gpu",),
                       reason=drain_reason("gpu.ecc", "GPU3 bad"))  # fmt: skip
    slurm = Slurm([drained, NodeInfo(name="n2", state="IDLE", gres_gpus=8, partitions=("gpu",))])
    slurm.fake_cli = FakeCli(slurm, (24, 11), etc / "slurm.conf")
    return config, slurm, etc, devices / "slurm"


def by_rule_file(group: str, minor: int, scratch: str) -> str | None:
    """The proof as the fake tree answers it: denied while the group's devices.deny holds the
    GPU's rule (the real kernel's answer: test_isolate_probe.py)."""
    assert os.path.isdir(scratch)
    deny = Path(group, "devices.deny").read_text()
    return None if deny == f"c 195:{minor} rwm" else f"fake kernel: devices.deny is {deny!r}"


def requested(config) -> None:
    gpu = IsolatedGpu(index=3, minor=3, serial="S3", since=1, why=ECC3.message)
    record = state.Isolation(node=NODE, state=state.REQUESTED, gpus=(state.Isolated(gpu=gpu),))
    state.save(config, record)


def test_the_sequence_takes_the_gpu_out_and_resumes(site) -> None:
    config, slurm, etc, group = site
    requested(config)
    done = apply.apply(config, slurm, NODE, by_rule_file)
    assert done.state == state.APPLIED, done.why
    gpus = conf.read_node_gpus(
        (etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text(), NODE
    )
    assert gpus.count == 7 and not any(f.endswith("/nvidia3") for f in gpus.files)
    assert "Gres=gpu:8" in (etc / "slurm.conf").read_text()  # n2 untouched
    assert (group / "devices.deny").read_text() == "c 195:3 rwm"
    assert slurm.fake_cli.commands == [("reconfigure",)]
    assert slurm.resumed == [NODE]
    (comment,) = [c for n, c in slurm.node_comments if n == NODE]
    assert parse_comment(comment)[0].index == 3
    assert done.gpus[0].line.endswith("/nvidia3")
    assert state.load_local(config) == done


def test_slurms_wrong_answer_puts_everything_back_and_keeps_the_drain(site) -> None:
    config, slurm, etc, group = site
    slurm.fake_cli.invalid = True
    requested(config)
    before = ((etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text())
    done = apply.apply(config, slurm, NODE, by_rule_file)
    assert done.state == state.FAILED and "INVALID_REG" in done.why
    assert ((etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text()) == before
    assert slurm.fake_cli.commands == [("reconfigure",), ("reconfigure",)]
    assert (group / "devices.allow").read_text() == "c 195:3 rwm"
    assert slurm.resumed == []
    assert slurm.drains[-1][1].startswith("gpugate: isolate: GPU3 not isolated (")


def test_a_node_resumed_meanwhile_is_left_alone(site) -> None:
    config, slurm, _etc, _group = site
    requested(config)
    slurm.infos[NODE] = slurm.infos[NODE].replace(flags=(), reason="")
    done = apply.apply(config, slurm, NODE, by_rule_file)
    assert done.state == state.FAILED and "no longer drained by gpugate" in done.why
    assert slurm.drains == [] and slurm.fake_cli.commands == []
    assert state.load_local(config) is None


def test_jobs_still_running_past_the_wait_fail_it_safely(site) -> None:
    config, slurm, _etc, _group = site
    requested(config)
    slurm.infos[NODE] = slurm.infos[NODE].replace(state="MIXED")
    done = apply.apply(config, slurm, NODE, by_rule_file)
    assert done.state == state.FAILED and "still ran jobs" in done.why
    assert slurm.fake_cli.commands == [] and slurm.resumed == []


def test_putting_back_restores_the_count_device_and_comment(site) -> None:
    config, slurm, etc, group = site
    requested(config)
    apply.apply(config, slurm, NODE, by_rule_file)
    said = apply.restore(config, slurm, NODE)
    assert said == "GPU 3 back in service"
    gpus = conf.read_node_gpus(
        (etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text(), NODE
    )
    assert gpus.count == 8 and any(f.endswith("/nvidia3") for f in gpus.files)
    assert (group / "devices.allow").read_text() == "c 195:3 rwm"
    assert slurm.node_comments[-1] == (NODE, "")
    assert state.load_local(config) is None
    assert state.load(state.shared_path(config, NODE)) is None
    assert slurm.infos[NODE].gres_gpus == 8
    assert slurm.infos[NODE].drained  # the resume itself is `gpugate resume`'s, after checks


def test_request_on_22_05_keeps_the_drain_and_says_why(site) -> None:
    config, slurm, _etc, _group = site
    slurm.fake_cli.v = (22, 5)
    gpus = tuple(Gpu(index=i, serial=f"S{i}", minor_number=i) for i in range(8))
    said = apply.request(config, slurm, NODE, [ECC3], gpus)
    assert said.startswith("node drained, not isolated: Slurm 22.5")
    assert state.load_local(config) is None


def test_request_starts_the_background_step(site, monkeypatch: pytest.MonkeyPatch) -> None:
    config, slurm, _etc, _group = site
    started: list[str] = []
    monkeypatch.setattr(apply, "_spawn", lambda config, node: started.append(node) or 4242)
    gpus = tuple(Gpu(index=i, serial=f"S{i}", minor_number=i) for i in range(8))
    said = apply.request(config, slurm, NODE, [ECC3], gpus)
    assert said == f"isolating GPU 3 (gpugate isolate apply {NODE}, pid 4242)"
    assert started == [NODE]
    assert state.load_local(config).state == state.REQUESTED


def test_an_unsupported_gres_conf_is_a_site_problem(site) -> None:
    config, slurm, etc, _group = site
    (etc / "gres.conf").write_text("AutoDetect=nvml\n")
    why = apply.site_problem(config, slurm, NODE)
    assert why and "AutoDetect" in why


def test_a_gpu_put_back_behind_gpugates_back_is_caught(site) -> None:
    config, slurm, etc, _group = site
    requested(config)
    before = (etc / "gres.conf").read_text()
    apply.apply(config, slurm, NODE, by_rule_file)
    assert apply.listed_again(config, NODE) is None
    (etc / "gres.conf").write_text(before)  # configuration management reverting the edit
    (etc / "slurm.conf").write_text(SLURM_CONF)
    why = apply.listed_again(config, NODE)
    assert why and "GPU 3 isolated by gpugate" in why and "gpugate resume n1" in why


def test_putting_back_runs_only_on_the_node(site, monkeypatch: pytest.MonkeyPatch) -> None:
    config, slurm, _etc, _group = site
    requested(config)
    apply.apply(config, slurm, NODE, by_rule_file)
    monkeypatch.setenv("SLURMD_NODENAME", "admin-host")
    with pytest.raises(apply.IsolationFailed, match="run it on n1 itself"):
        apply.restore(config, slurm, NODE)
    assert state.load(state.shared_path(config, NODE)) is not None


def test_a_failed_put_back_leaves_files_and_rule_as_they_were(site) -> None:
    config, slurm, etc, group = site
    requested(config)
    apply.apply(config, slurm, NODE, by_rule_file)
    isolated = ((etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text())
    slurm.fake_cli.invalid = True  # Slurm answers INVALID_REG to the count going up
    (group / "devices.deny").write_text("")
    with pytest.raises(apply.IsolationFailed, match="GPU 3 not put back"):
        apply.restore(config, slurm, NODE)
    assert ((etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text()) == isolated
    assert (group / "devices.deny").read_text() == "c 195:3 rwm"
    assert state.load_local(config).state == state.APPLIED


def test_one_isolation_at_a_time_per_node(site, monkeypatch: pytest.MonkeyPatch) -> None:
    config, slurm, _etc, _group = site
    monkeypatch.setattr(apply, "_spawn", lambda config, node: 1)
    gpus = tuple(Gpu(index=i, serial=f"S{i}", minor_number=i) for i in range(8))
    assert apply.request(config, slurm, NODE, [ECC3], gpus).startswith("isolating GPU 3")
    again = apply.request(config, slurm, NODE, [fail("gpu.ecc", "GPU5 ECC", gpu=5)], gpus)
    assert again == "node drained, not isolated: an isolation is already requested here"
    held = FileLock(lock_file(config.state_dir, ISOLATE), wait_s=0)
    with held, pytest.raises(apply.IsolationFailed, match="another `gpugate isolate apply` runs"):
        apply.apply(config, slurm, NODE, by_rule_file)
    assert apply.apply(config, slurm, NODE, by_rule_file).state == state.APPLIED


def test_a_configless_site_is_not_isolated(site) -> None:
    config, slurm, _etc, _group = site
    slurm.fake_cli.shown = "SlurmctldParameters     = enable_configless,idle_on_node_suspend\n"
    why = apply.site_problem(config, slurm, NODE)
    assert why and why.startswith("configless Slurm")
    slurm.fake_cli.shown = SHOWN
    assert apply.site_problem(config, slurm, NODE) is None


def test_a_resume_that_fails_last_undoes_everything_and_the_comment(site) -> None:
    config, slurm, etc, group = site
    requested(config)
    before = ((etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text())
    slurm.errors["resume"] = RuntimeError("slurmctld went away")
    done = apply.apply(config, slurm, NODE, by_rule_file)
    assert done.state == state.FAILED and "slurmctld went away" in done.why
    assert ((etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text()) == before
    assert slurm.node_comments[-1] == (NODE, "")
    assert (group / "devices.allow").read_text() == "c 195:3 rwm"
    assert slurm.node(NODE).drained


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_dry_run_says_each_change_and_makes_none(site, tmp_path, monkeypatch, capsys) -> None:
    from gpugate.commands import isolate as command

    config, slurm, etc, group = site
    requested(config)
    before = _tree(tmp_path)
    monkeypatch.setattr(command, "ask_slurm_for", lambda *a: (config, slurm, slurm.node(NODE)))
    assert command.main(["apply", NODE, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert _tree(tmp_path) == before  # no file, rule, record or lock written
    assert slurm.fake_cli.commands == [] and slurm.resumed == [] and slurm.node_comments == []
    assert slurm.drains == []
    assert out[0] == f"gpugate isolate: {NODE}: dry run, nothing changed; apply would:"
    assert out[1].startswith(f"  would wait until {NODE} is idle and still drained by gpugate")
    assert out[2].startswith("  would wait until no job is CONFIGURING or COMPLETING anywhere")
    assert (
        f"  would deny GPU 3's device to slurmd's jobs: write 'c 195:3 rwm' into {group}/devices.deny"
        in out
    )
    dev = tmp_path / "dev"
    gres = out.index(f"  would write {etc / 'gres.conf'}:")
    assert out[gres + 1 : gres + 3] == [
        f"    - NodeName=n1 Name=gpu File={dev}/nvidia[0-7]",
        f"    + NodeName=n1 Name=gpu File={dev}/nvidia[0-2,4-7]",
    ]
    conf_at = out.index(f"  would write {etc / 'slurm.conf'}:")
    assert out[conf_at + 1 : conf_at + 3] == [
        "    - NodeName=n1 CPUs=2 RealMemory=1000 Gres=gpu:8 State=UNKNOWN",
        "    + NodeName=n1 CPUs=2 RealMemory=1000 Gres=gpu:7 State=UNKNOWN",
    ]
    assert out[conf_at + 3 :][:2] == [
        "  would scontrol reconfigure",
        f"  would wait for Slurm to report {NODE} Gres=gpu:7, registered, at most 2 s",
    ]
    assert f"  would resume {NODE}" in out
    # Then done for real, the same changes are made.
    assert apply.apply(config, slurm, NODE, by_rule_file).state == state.APPLIED
    assert "Gres=gpu:7" in (etc / "slurm.conf").read_text()


def test_a_dry_run_says_when_apply_would_fail(site, tmp_path, monkeypatch, capsys) -> None:
    from gpugate.commands import isolate as command

    config, slurm, _, _ = site
    before = _tree(tmp_path)
    monkeypatch.setattr(command, "ask_slurm_for", lambda *a: (config, slurm, slurm.node(NODE)))
    assert command.main(["apply", NODE, "--dry-run"]) == 1  # nothing requested here
    err = capsys.readouterr().err
    assert f"would fail: {NODE}: no isolation requested here; the node would stay drained" in err
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ("its open got ENXIO, not EPERM", "its open got ENXIO, not EPERM"),
        (probe.ProbeError("no answer"), "the proof could not run: no answer"),
    ],
)
def test_a_deny_the_node_does_not_prove_undoes_and_keeps_the_drain(site, answer, said) -> None:
    config, slurm, etc, group = site
    requested(config)
    before = ((etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text())
    asked: list[tuple[str, int]] = []

    def not_denied(where: str, minor: int, scratch: str) -> str | None:
        asked.append((where, minor))
        if isinstance(answer, Exception):
            raise answer
        return answer

    done = apply.apply(config, slurm, NODE, not_denied)
    assert asked == [(str(group), 3)]  # slurmd's group, after the count was read back
    assert done.state == state.FAILED
    assert done.why == f"IsolationFailed: GPU 3's device is not denied to jobs: {said}"
    assert ((etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text()) == before
    assert slurm.fake_cli.commands == [("reconfigure",), ("reconfigure",)]
    assert (group / "devices.allow").read_text() == "c 195:3 rwm"
    assert slurm.resumed == [] and slurm.node_comments == [] and slurm.node(NODE).drained
    assert slurm.drains[-1][1].startswith("gpugate: isolate: GPU3 not isolated (")
    assert state.load_local(config).state == state.FAILED


# --- no reconfigure while slurmctld may run its own scripts (issue 44, isolate/quiet.py) ---------


def _files(etc: Path) -> tuple[str, str]:
    return (etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text()


EPILOG_RUNS = [("14", "COMPLETING")]


def test_a_controller_that_stays_busy_gets_no_reconfigure_and_nothing_changes(site) -> None:
    config, slurm, etc, group = site
    slurm.fake_cli.quiet = EPILOG_RUNS  # EpilogSlurmctld of job 14 never ends
    requested(config)
    before = _files(etc)
    done = apply.apply(config, slurm, NODE, by_rule_file)
    assert done.state == state.FAILED
    assert "ControllerBusy" in done.why and "job 14 COMPLETING" in done.why
    assert slurm.fake_cli.commands == []  # no reconfigure at all
    assert _files(etc) == before
    assert (group / "devices.deny").read_text() == ""  # nothing denied, nothing to lift
    assert slurm.resumed == []
    assert slurm.drains[-1][1].startswith("gpugate: isolate: GPU3 not isolated (ControllerBusy")
    assert state.load_local(config).state == state.FAILED


def test_the_reconfigure_waits_until_the_scripts_are_done_and_stay_done(site) -> None:
    config, slurm, _etc, _group = site
    down = RuntimeError("squeue: slurmctld restarting")
    configuring = [("15", "CONFIGURING")]
    # Busy, a moment of quiet, busy again, the controller away, then quiet for good.
    slurm.fake_cli.busy = [EPILOG_RUNS, [], configuring, down, EPILOG_RUNS]
    requested(config)
    done = apply.apply(config, slurm, NODE, by_rule_file)
    assert done.state == state.APPLIED, done.why
    line = slurm.fake_cli.timeline
    at = line.index(("reconfigure",))
    assert line[:5] == [EPILOG_RUNS, [], configuring, down, EPILOG_RUNS]
    assert at > 6 and all(answer == [] for answer in line[5:at])  # quiet polls, HOLD_S long
    assert slurm.fake_cli.commands == [("reconfigure",)]


def test_another_gpugate_reconfigure_holding_the_lock_is_waited_for(site) -> None:
    from gpugate.store.dirs import history_dir
    from gpugate.store.locks import RECONFIGURE

    config, slurm, etc, _group = site
    requested(config)
    before = _files(etc)
    with FileLock(lock_file(history_dir(config), RECONFIGURE), wait_s=0) as held:
        assert held.held
        done = apply.apply(config, slurm, NODE, by_rule_file)
    assert done.state == state.FAILED and "another gpugate reconfigure held" in done.why
    assert slurm.fake_cli.commands == [] and _files(etc) == before
    requested(config)
    assert (
        apply.apply(config, slurm, NODE, by_rule_file).state == state.APPLIED
    )  # the lock released


def test_no_reconfigure_lock_no_reconfigure(site) -> None:
    config, slurm, etc, _group = site
    history = Path(config.admin.history_dir)
    history.mkdir(mode=0o700, exist_ok=True)
    (history / "locks").write_text("not a directory")
    requested(config)
    before = _files(etc)
    done = apply.apply(config, slurm, NODE, by_rule_file)
    assert done.state == state.FAILED and "no gpugate reconfigure lock" in done.why
    assert slurm.fake_cli.commands == [] and _files(etc) == before


def test_an_undo_the_controller_does_not_allow_keeps_the_gpu_out_safely(site) -> None:
    config, slurm, etc, group = site
    slurm.errors["resume"] = RuntimeError("slurmctld went away")  # fails past the reconfigure
    requested(config)
    original = _files(etc)

    def busy_after_the_reconfigure() -> list[tuple[str, str]]:
        return EPILOG_RUNS if slurm.fake_cli.commands else []

    slurm.fake_cli.script_jobs = busy_after_the_reconfigure  # type: ignore[method-assign]
    done = apply.apply(config, slurm, NODE, by_rule_file)
    # Slurm was told Gres=gpu:7: the files stay so, the device denied, no second reconfigure.
    assert slurm.fake_cli.commands == [("reconfigure",)]
    isolated = _files(etc)
    assert isolated != original and "Gres=gpu:7" in isolated[0]
    assert (group / "devices.deny").read_text() == "c 195:3 rwm"
    assert (group / "devices.allow").read_text() == ""
    assert done.state == state.APPLIED and done.gpus[0].line.endswith("/nvidia3")
    assert "not undone: the controller stayed busy" in done.why
    assert state.load_local(config) == done
    assert slurm.node(NODE).drained and slurm.resumed == []
    assert slurm.drains[-1][1].startswith("gpugate: isolate: GPU3 out, node not resumed (")
    assert "not undone" in slurm.drains[-1][1]
    # Once the controller is quiet, `gpugate resume` puts the GPU back properly.
    slurm.fake_cli.script_jobs = lambda: []  # type: ignore[method-assign]
    assert apply.restore(config, slurm, NODE) == "GPU 3 back in service"
    assert conf.read_node_gpus(*_files(etc), NODE).count == 8
    assert slurm.infos[NODE].gres_gpus == 8
    assert (group / "devices.allow").read_text() == "c 195:3 rwm"


def test_putting_back_waits_for_a_quiet_controller_or_changes_nothing(site) -> None:
    config, slurm, etc, group = site
    requested(config)
    apply.apply(config, slurm, NODE, by_rule_file)
    isolated = _files(etc)
    (group / "devices.allow").write_text("")
    slurm.fake_cli.quiet = [("21", "CONFIGURING")]  # a PrologSlurmctld that runs on
    with pytest.raises(apply.IsolationFailed, match="job 21 CONFIGURING"):
        apply.restore(config, slurm, NODE)
    assert slurm.fake_cli.commands == [("reconfigure",)]  # the isolation's own, no other
    assert _files(etc) == isolated
    assert (group / "devices.allow").read_text() == ""  # the device never allowed
    assert state.load_local(config).state == state.APPLIED


def test_a_failed_put_back_the_controller_will_not_reload_leaves_the_isolated_files(site) -> None:
    config, slurm, etc, group = site
    requested(config)
    apply.apply(config, slurm, NODE, by_rule_file)
    isolated = _files(etc)
    slurm.fake_cli.invalid = True  # Slurm answers INVALID_REG to the count going up

    def busy_after_the_put_back() -> list[tuple[str, str]]:
        return EPILOG_RUNS if len(slurm.fake_cli.commands) > 1 else []

    slurm.fake_cli.script_jobs = busy_after_the_put_back  # type: ignore[method-assign]
    (group / "devices.deny").write_text("")
    with pytest.raises(apply.IsolationFailed, match="GPU 3 not put back"):
        apply.restore(config, slurm, NODE)
    # No reconfigure back: the isolated files are written again for Slurm's next restart,
    # the device denied again, the node drained, the record still applied.
    assert slurm.fake_cli.commands == [("reconfigure",), ("reconfigure",)]
    assert _files(etc) == isolated
    assert (group / "devices.deny").read_text() == "c 195:3 rwm"
    assert slurm.node(NODE).drained
    assert state.load_local(config).state == state.APPLIED


def test_the_quiet_wait_names_what_it_saw() -> None:
    class Cli:
        def __init__(self, answer) -> None:
            self.answer = answer

        def script_jobs(self) -> list[tuple[str, str]]:
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    import time

    many = [(str(n), "COMPLETING") for n in range(8)]
    with pytest.raises(quiet.ControllerBusy, match=r"job 4 COMPLETING \(\+3 more\)$"):
        quiet.wait_quiet(Cli(many), time.monotonic() + 0.05)
    with pytest.raises(quiet.ControllerBusy, match="squeue: RuntimeError: down"):
        quiet.wait_quiet(Cli(RuntimeError("down")), time.monotonic() + 0.05)
    with pytest.raises(quiet.ControllerBusy, match="quiet for only"):
        quiet.wait_quiet(Cli([]), time.monotonic())  # HOLD_S not reached


# --- put-back asked on another host (isolate/remote.py), and done by the node itself -------

HEALTH = "HealthCheckInterval     = 60 sec\nHealthCheckProgram      = /usr/libexec/gpugate/health\n"


def isolated_and_asked(site, monkeypatch: pytest.MonkeyPatch, **shown: str):
    """GPU 3 isolated on n1, then `gpugate resume n1` asked on admin1 by alice: its answer."""
    from gpugate.isolate import remote

    config, slurm, _etc, _group = site
    requested(config)
    apply.apply(config, slurm, NODE, by_rule_file)
    slurm.fake_cli.shown = SHOWN + shown.get("health", HEALTH)
    monkeypatch.setenv("SLURMD_NODENAME", "admin1")
    said = remote.ask_put_back(config, slurm, NODE, "alice", "admin1", "GPU3 replaced")
    monkeypatch.setenv("SLURMD_NODENAME", NODE)
    return said


def test_a_put_back_asked_elsewhere_is_recorded_and_the_node_drained_saying_who(
    site, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, slurm, _etc, group = site
    said = isolated_and_asked(site, monkeypatch)  # isolated: it was in service with 7 GPUs
    assert "health check (/usr/libexec/gpugate/health, every 60 s)" in said
    asked = state.load(state.shared_path(config, NODE)).put_back
    assert (asked.who, asked.host, asked.why, asked.started) == ("alice", "admin1", "GPU3 replaced", 0.0)  # fmt: skip
    assert slurm.drains[-1] == (NODE, "gpugate: isolate: putting back GPU 3 (asked by alice on admin1)")  # fmt: skip
    # Nothing of the node's changed from the admin host: the GPU is still out and denied.
    assert (
        slurm.infos[NODE].gres_gpus == 7 and (group / "devices.deny").read_text() == "c 195:3 rwm"
    )
    assert state.load_local(config).put_back is None  # the node's own copy is the node's
    assert "not gpugate's" not in said


def test_a_health_check_of_another_program_is_named_with_what_it_must_run(
    site, monkeypatch: pytest.MonkeyPatch
) -> None:
    health = "HealthCheckInterval     = 300 sec\nHealthCheckProgram      = /usr/sbin/nhc\n"
    said = isolated_and_asked(site, monkeypatch, health=health)
    assert (
        "(HealthCheckProgram is /usr/sbin/nhc, not gpugate's: it must run `gpugate health`" in said
    )


@pytest.mark.parametrize(
    ("health", "what"),
    [("HealthCheckProgram      = (null)\nHealthCheckInterval     = 0 sec\n", "no HealthCheckProgram"),
     ("HealthCheckProgram      = /x/health\nHealthCheckInterval     = 0 sec\n", "HealthCheckInterval=0")],
)  # fmt: skip
def test_without_a_health_check_the_admin_host_refuses_with_the_fix(
    site, monkeypatch: pytest.MonkeyPatch, health, what
) -> None:
    from gpugate.isolate import remote

    config, slurm, _etc, _group = site
    with pytest.raises(remote.Refused, match=f"{what}.*Run `gpugate resume n1` on n1 itself"):
        isolated_and_asked(site, monkeypatch, health=health)
    assert state.load(state.shared_path(config, NODE)).put_back is None
    assert slurm.drains == []  # the node not drained for a request nobody will act on
    assert not slurm.infos[NODE].drained and slurm.infos[NODE].gres_gpus == 7


def test_an_admins_drain_is_not_replaced_by_a_put_back_request(
    site, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpugate.isolate import remote

    config, slurm, _etc, _group = site
    requested(config)
    apply.apply(config, slurm, NODE, by_rule_file)
    slurm.infos[NODE] = slurm.infos[NODE].replace(flags=("DRAIN",), reason="IT-4461 PSU")
    slurm.fake_cli.shown = SHOWN + HEALTH
    with pytest.raises(remote.Refused, match="IT-4461 PSU"):
        remote.ask_put_back(config, slurm, NODE, "alice", "admin1")
    assert state.load(state.shared_path(config, NODE)).put_back is None


def test_gpugate_resume_elsewhere_asks_and_says_so(site, monkeypatch: pytest.MonkeyPatch, capsys):
    from gpugate.commands import resume

    config, slurm, _etc, _group = site
    requested(config)
    apply.apply(config, slurm, NODE, by_rule_file)
    slurm.fake_cli.shown = SHOWN + HEALTH
    monkeypatch.setenv("SLURMD_NODENAME", "admin1")
    assert resume.ask_node(config, slurm, NODE, "GPU3 replaced") == 0
    assert "put-back asked; n1 is drained meanwhile" in capsys.readouterr().out
    assert state.load(state.shared_path(config, NODE)).put_back.host == "admin1"
    slurm.fake_cli.shown = SHOWN
    assert resume.ask_node(config, slurm, NODE, "again") == 1  # refused, with the fix
    assert "on n1 itself" in capsys.readouterr().err


def test_the_nodes_health_check_starts_the_put_back_once(site, monkeypatch: pytest.MonkeyPatch):
    from gpugate.hooks.health import put_back_asked

    config, _slurm, _etc, _group = site
    isolated_and_asked(site, monkeypatch)
    started: list = []
    monkeypatch.setattr(
        apply, "spawn", lambda c, node, action: started.append((node, action)) or 77
    )
    busy = put_back_asked(config, NODE, any_job=True, status="ok")
    assert "waits for the node's jobs to end" in busy.result.message and started == []
    dry = put_back_asked(config, NODE, any_job=False, status="ok", dry_run=True)
    assert (
        dry.result.message.startswith("would start gpugate isolate put-back n1") and started == []
    )
    first = put_back_asked(config, NODE, any_job=False, status="ok")
    assert started == [(NODE, "put-back")] and "(pid 77)" in first.result.message
    assert state.load(state.shared_path(config, NODE)).put_back.started > 0
    again = put_back_asked(config, NODE, any_job=False, status="ok")  # the next health run
    assert again.result.action == "keep" and "under way" in again.result.message
    assert started == [(NODE, "put-back")]


def test_nothing_asked_nothing_started(site, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpugate.hooks.health import put_back_asked

    config, slurm, _etc, _group = site
    assert put_back_asked(config, NODE, any_job=False, status="ok") is None  # nothing isolated
    requested(config)
    apply.apply(config, slurm, NODE, by_rule_file)
    assert put_back_asked(config, NODE, any_job=False, status="ok") is None  # none asked


def node_checks(monkeypatch: pytest.MonkeyPatch, facts) -> None:
    """The node's checks as `gpugate resume` gathers them, from `facts`."""
    import gpugate.admin.resume as resume

    monkeypatch.setattr(
        resume, "node_facts", lambda config, node, f, slurm=None: (facts, "this node")
    )


def test_the_asked_put_back_runs_the_local_resume_and_resumes(site, monkeypatch, capsys) -> None:
    from factories import make_facts

    from gpugate.commands.isolate import put_back
    from gpugate.store.history import resumes

    config, slurm, _etc, group = site
    isolated_and_asked(site, monkeypatch)
    node_checks(monkeypatch, make_facts())
    assert put_back(config, slurm, NODE) == 0
    assert "GPU 3 back; resumed" in capsys.readouterr().out
    assert slurm.infos[NODE].gres_gpus == 8 and not slurm.infos[NODE].drained
    assert (group / "devices.allow").read_text() == "c 195:3 rwm"
    assert state.load(state.shared_path(config, NODE)) is None and state.load_local(config) is None
    (entry,) = [e for e in resumes(config.admin.history_dir, NODE) if e.resumed]
    assert entry.who == "alice on admin1 (gpugate health on n1)" and entry.why == "GPU3 replaced"
    assert put_back(config, slurm, NODE) == 1  # asked once, done once


def test_a_put_back_the_node_refuses_ends_the_request_and_says_why(site, monkeypatch) -> None:
    from factories import make_facts

    from gpugate.commands.isolate import put_back

    config, slurm, _etc, group = site
    isolated_and_asked(site, monkeypatch)
    node_checks(monkeypatch, make_facts(gpus={3: {"ecc_aggregate_uncorrected": 120}}))
    assert put_back(config, slurm, NODE) == 1
    record = state.load(state.shared_path(config, NODE))
    assert record.state == state.APPLIED and record.put_back is None  # still out, not asked
    _node, reason = slurm.drains[-1]
    assert reason.startswith("gpugate: isolate: GPU 3 not put back (asked by alice on admin1): ")
    assert "still fails its checks" in reason and slurm.infos[NODE].drained
    assert (
        slurm.infos[NODE].gres_gpus == 7 and (group / "devices.deny").read_text() == "c 195:3 rwm"
    )

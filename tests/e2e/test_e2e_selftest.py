"""End to end: `gpugate selftest` against a real local Slurm finds what would lose requeues.

The site is the test install of every end-to-end test (tests/slurm/gpugate_site.py): the five
wrappers beside a hook.env, slurm.conf at a private path, nodes of 8 GPUs and 2 CPUs. Each
problem the issue met on a default site is made here (no nohold_on_prolog_fail, hook.env without
SLURM_CONF, evidence and controller_dir closed to slurm; and a qualify geometry the nodes cannot
run), found by selftest with its fix, the fix applied as an admin would, and selftest then
passes (issue 26, deliver 4).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from pathlib import Path

import pytest
from e2e import Site, SlurmSite, SlurmSites, installed_hooks, slurm_or_skip

from gpugate.admin import selftest as S
from gpugate.admin.sitecheck import controller_dir_of
from gpugate.commands import selftest as selftest_command
from gpugate.config import load_config

pytestmark = pytest.mark.slurm

slurm_or_skip()

from localslurm import JOB_USER, LocalSlurm  # noqa: E402

NODE = "gpu-node-01"


@pytest.fixture(scope="module")
def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
    return slurm_site([NODE])  # Slurm's defaults: JobRequeue=1, no nohold_on_prolog_fail.


@pytest.fixture
def host(monkeypatch, tmp_path, cluster: LocalSlurm) -> S.Host:
    """The admin's shell names the private slurm.conf; nothing of this host's /etc/gpugate
    (on the installed hooks, /etc/gpugate/hook.env is the throwaway root's: the site's own)."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf_path))
    hook_env = S.SYSTEM_HOOK_ENV if installed_hooks() else str(tmp_path / "no-system-hook.env")
    return S.Host(hook_env=hook_env, config=str(tmp_path / "no-system-gpugate.yaml"))


def selftest(site: Site, host: S.Host, capsys, *args: str) -> tuple[int, dict]:
    """`gpugate selftest --json` on the site's wrappers: exit code, report."""
    argv = ["--hooks-dir", str(site.hooks), "--user", JOB_USER, "--json", "--node", NODE, *args]
    code = selftest_command.main(argv, host=host)
    return code, json.loads(capsys.readouterr().out)


def problems(report: dict, hook: str) -> list[dict]:
    if hook == "site":
        return report["site"]["problems"]
    return next(h["problems"] for h in report["hooks"] if h["hook"] == hook)


def hook_env(site: Site, slurm_conf_line: str) -> None:
    """hook.env as the site's install writes it, with this SLURM_CONF line (or none): beside
    the test wrappers, or the package's /etc/gpugate/hook.env, never in /usr/libexec/gpugate
    (a file left there outlived the module and pointed later modules' hooks at its config)."""
    text = site.hook_env_text()
    if not installed_hooks():
        # The site's copy: the TaskProlog runs it as the job user, who may not reach this
        # checkout's virtualenv (a clone in 0700 `mktemp -d`, issue 40).
        text = f"GPUGATE_BIN={site.gpugate}\n" + text
    site.hook_env.write_text(text + slurm_conf_line)


def admin_types(fix: str) -> None:
    """Run a fix as the admin would paste it into a root shell."""
    subprocess.run(["/bin/sh", "-ec", fix], check=True, timeout=30)


def test_no_nohold_on_prolog_fail_and_no_slurm_conf_in_hook_env(site, cluster, host, capsys):
    """The site of the issue: slurm.conf elsewhere, hook.env without it, refused jobs held."""
    hook_env(site, "")
    code, report = selftest(site, host, capsys, "--slurm-user", "root")  # SlurmUser's reach: below
    assert code == 1 and report["ok"] is False
    (held,) = problems(report, "site")
    assert "lacks nohold_on_prolog_fail" in held["what"]
    assert "SchedulerParameters=batch_sched_delay=0,nohold_on_prolog_fail" in held["fix"]
    # The test nodes have 8 GPUs in Gres and 2 CPUs: one rank per GPU cannot be placed. qualify
    # then runs 2 ranks: a warning, nothing breaks.
    (geometry,) = report["site"]["warnings"]
    assert "one rank per Gres GPU asks 8 tasks of gpu-node-01" in geometry["what"]
    assert geometry["fix"].startswith("set qualify.ntasks_per_node: 2 ")
    for hook in ("health", "epilog-slurmctld"):
        fixes = [p["fix"] for p in problems(report, hook)]
        assert f"add the line SLURM_CONF={cluster.conf_path} to /etc/gpugate/hook.env" in fixes
    for hook in ("prolog", "epilog", "task-prolog"):  # slurmd gives these SLURM_CONF
        assert problems(report, hook) == [], problems(report, hook)

    # The fixes: a plain SLURM_CONF= line (the documented spelling), the scheduler option,
    # the ranks per node.
    hook_env(site, f"SLURM_CONF={cluster.conf_path}\n")
    site.write_config("qualify:\n  ntasks_per_node: 2\n")
    text = cluster.conf_path.read_text()
    cluster.conf_path.write_text(text.replace(
        "SchedulerParameters=batch_sched_delay=0",
        "SchedulerParameters=batch_sched_delay=0,nohold_on_prolog_fail"))  # fmt: skip
    cluster.run(["scontrol", "reconfigure"])
    code, report = selftest(site, host, capsys, "--slurm-user", "root")
    assert code == 0, json.dumps(report, indent=1)
    assert {h["hook"]: h["status"] for h in report["hooks"]} == dict.fromkeys(S.HOOK_USERS, "ok")


def test_a_slurm_user_that_cannot_reach_the_evidence(site, cluster, host, capsys):
    """Acceptance: the evidence closed to `slurm` fails selftest and says how to fix it."""
    try:
        pwd.getpwnam("slurm")
    except KeyError:
        pytest.skip("no slurm account on this host (Debian's slurm packages create it)")
    hook_env(site, f"SLURM_CONF={cluster.conf_path}\n")
    (site.evidence / "controller-view").mkdir(exist_ok=True)
    site.evidence.chmod(0o700)
    # What a root SlurmUser left behind (or nothing yet): root's, closed to slurm.
    controller = Path(controller_dir_of(load_config(str(site.config))))
    controller.mkdir(exist_ok=True)
    os.chown(controller, 0, 0)
    controller.chmod(0o755)
    code, report = selftest(site, host, capsys, "--slurm-user", "slurm")
    assert code == 1
    found = {p["what"]: p["fix"] for p in problems(report, "epilog-slurmctld")}
    reach = next(w for w in found if "cannot reach the nodes' decision records" in w)
    assert found[reach] == f"chmod o+x {site.evidence}"
    record = next(w for w in found if "cannot record its decisions" in w)
    assert found[record] == f"install -d -o slurm -g slurm -m 0750 {controller}"
    for fix in (found[reach], found[record]):
        admin_types(fix)
    code, report = selftest(site, host, capsys, "--slurm-user", "slurm")
    ctl = problems(report, "epilog-slurmctld")
    assert not [p for p in ctl if "decision records" in p["what"] or "controller_dir" in
                p["what"]], ctl  # fmt: skip

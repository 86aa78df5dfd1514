"""`gpugate selftest`: run each installed hook wrapper as Slurm would, and say what would break.

Gather (the wrappers, hook.env, the launcher's `#!`, the config, the accounts), check (pure
functions over those facts, each problem with its fix), then run each wrapper as its Slurm
user with GPUGATE_SELFTEST=1, in which mode a hook loads its config and takes no action.
Mode bits are judged for the hook's user by hand: `os.access` answers only for this process.
"""

from __future__ import annotations

import grp
import os
import stat
from dataclasses import dataclass, field

from gpugate.admin.access import Account, Caution, Problem, account, denied
from gpugate.admin.backendcheck import check_backend
from gpugate.admin.isolatecheck import check_isolation
from gpugate.admin.qualifysteps import check_qualify_steps
from gpugate.admin.sitecheck import (
    SlurmFacts,
    check_controller_access,
    check_health_periodic,
    check_job_requeue,
    check_node_known,
    check_prolog_hold,
    check_qualify_geometry,
    check_slurm_conf_reaches,
    check_slurm_read,
    controller_dir_of,
    gather_slurm,
)
from gpugate.config import ConfigError, load_config
from gpugate.gate.suspicion import allowance_note
from gpugate.node import node_name
from gpugate.runner import TIMEOUT, run

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpugate.config.schema import Config

__all__ = ["Account", "HookReport", "Host", "Problem", "account", "denied", "selftest"]

SYSTEM_HOOK_ENV = "/etc/gpugate/hook.env"
DEFAULT_BIN = "/opt/gpugate/bin/gpugate"
DEFAULT_CONFIG = "/etc/gpugate/gpugate.yaml"
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
# The PATH the wrapper sets (slurm_hooks/gpugate-hook): slurmd gives hooks none.
WRAPPER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOOK_TIMEOUT_S = 60.0
HOOK_ENV_TIMEOUT_S = 10.0
FAKE_JOB_ID = "4294967000"  # no real job: the hooks take no action in selftest mode anyway
# hook -> who Slurm runs it as: root, the job's user, or SlurmUser (on the controller).
HOOK_USERS = {
    "prolog": "root",
    "epilog": "root",
    "health": "root",
    "task-prolog": "job",
    "epilog-slurmctld": "slurm",
}
# What the hook prints in selftest mode (gpugate.commands.guarded.selftest_dry_run).
OK_MARK = "selftest ok"


@dataclass(frozen=True)
class Host:
    """What selftest reads of this host besides the hooks directory: the system hook.env, the
    system config, the running Slurm (tests give their own: nothing of the machine's)."""

    hook_env: str = SYSTEM_HOOK_ENV  # sourced first by every wrapper
    config: str = DEFAULT_CONFIG  # what a hook loads without GPUGATE_CONFIG, if present
    gather_slurm: Callable[[str | None], SlurmFacts] = gather_slurm  # called with SLURM_CONF


HOST = Host()


@dataclass
class HookReport:
    """One hook's verdict: ok, broken (with problems), or skipped (with why)."""

    hook: str
    user: str
    status: str = "ok"
    problems: list[Problem] = field(default_factory=list)
    note: str = ""
    # What costs no promise (a qualify geometry the nodes cannot run): status "warning".
    warnings: list[Problem] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"hook": self.hook, "user": self.user, "status": self.status, "note": self.note,
                "problems": [{"what": p.what, "fix": p.fix} for p in self.problems],
                "warnings": [{"what": p.what, "fix": p.fix} for p in self.warnings]}  # fmt: skip


def trusted_hook_env(path: str) -> bool:
    """A hook.env selftest may source: a regular file of root's (or this process's own user's),
    writable by its owner alone; check_hook_env reports any other."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    mine = st.st_uid in (0, os.geteuid())
    return stat.S_ISREG(st.st_mode) and mine and not st.st_mode & 0o022


def read_hook_env(
    paths: list[str], hook: str = "", timeout: float = HOOK_ENV_TIMEOUT_S
) -> tuple[dict[str, str], str]:
    """What the wrapper exports to gpugate from these hook.env files, read as it reads them
    (/bin/sh, `set -a`, `.` in order, `$hook` set); and why the shell failed, or ""."""
    files = [p for p in paths if trusted_hook_env(p)]
    if not files:
        return {}, ""
    # The wrapper's own lines, with a clean environment: PATH as it sets it, no Slurm variables.
    argv = ["env", "-i", f"PATH={WRAPPER_PATH}", "/bin/sh", "-c", _SOURCE_HOOK_ENV, "sh", hook,
            *files]  # fmt: skip
    done = run(argv, timeout)
    if not done.ok:
        said = [ln for ln in done.stderr.splitlines() if ln.strip()][-1:]
        return {}, (said[0] if said else done.describe())
    _, mark, exported = done.stdout.partition(_MARK)
    values = {}
    for entry in exported.split("\0") if mark else ():
        name, eq, value = entry.partition("=")
        if eq and name not in _SHELL_OWN:
            values[name] = value
    if values.get("PATH") == WRAPPER_PATH:
        del values["PATH"]  # the wrapper's, not hook.env's
    return values, ""


# `set -a` exports each assignment, as in slurm_hooks/gpugate-hook; a file that fails to be
# sourced stops the shell there, as it stops the wrapper (the hook then fails).
_MARK = "\0gpugate-hook-env\0"
_SOURCE_HOOK_ENV = (
    'hook=$1; shift; cd / || exit 1; set -a; for f in "$@"; do [ -f "$f" ] && . "$f"; done; '
    "set +a; printf '\\0gpugate-hook-env\\0'; exec env -0"
)
# What sh itself exports, and the wrapper's loop variable (`set -a` exports it too).
_SHELL_OWN = {"PWD", "OLDPWD", "SHLVL", "_", "f"}


def interpreter(launcher: str) -> str | None:
    """The program a launcher's `#!` line runs (for `env`, the command, unresolved); or None."""
    try:
        with open(launcher, "rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        rest = [w for w in words[1:] if not w.startswith("-")]
        return rest[0] if rest else words[0]
    return words[0]


def _on_path(command: str, path: str) -> str | None:
    """`command` as the wrapper's PATH finds it."""
    for directory in path.split(":"):
        candidate = os.path.join(directory, command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def check_launcher(bin_path: str, who: Account) -> list[Problem]:
    """The launcher and its `#!` interpreter, runnable by `who`."""
    why = denied(bin_path, who, 1) or denied(bin_path, who, 4)
    if why:
        return [Problem(f"the launcher {bin_path} is not runnable by {who.name}: {why}",
                        f"install gpugate where {who.name} may read and run it (chmod 0755 "
                        "the launcher, o+x its directories) or set GPUGATE_BIN in hook.env")]  # fmt: skip
    interp = interpreter(bin_path)
    if interp is None:
        return []
    found = interp if "/" in interp else _on_path(interp, WRAPPER_PATH)
    if found is None:
        return [Problem(f"{bin_path}'s interpreter {interp} is not on the hooks' PATH "
                        f"({WRAPPER_PATH})", f"install {interp} or give {bin_path} a #! with "
                        "its full path")]  # fmt: skip
    why = denied(found, who, 1)
    if why:
        return [Problem(f"{bin_path}'s interpreter {found} is not executable for {who.name}: {why}",
                        "build gpugate's virtualenv from a python every user may run (e.g. "
                        "/usr/bin/python3, not one under a private home), or open the "
                        "directories on its path (chmod o+x)")]  # fmt: skip
    return []


def check_hook_env(paths: list[str]) -> list[Problem]:
    """Each hook.env the wrapper sources must be root's own and writable by root only."""
    problems = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid != 0 or st.st_mode & 0o022:
            problems.append(Problem(
                f"{path} is not root's own (owner {st.st_uid}, mode {st.st_mode & 0o7777:04o}): "
                "whoever may write it chooses what the hooks run as root",
                f"chown root:root {path} && chmod 0644 {path}"))  # fmt: skip
    return problems


def check_hook_env_readable(paths: list[str], hook: str, who: Account) -> list[Problem]:
    """The hook's user reads each hook.env: the wrapper's `.` of an unreadable one stops its
    shell, and the hook fails (the TaskProlog, run as the job's user, fails the job)."""
    problems = []
    for path in paths:
        if os.path.isfile(path):
            why = denied(path, who, 4)
            if why:
                problems.append(Problem(f"{path} is not readable by {who.name}, who runs {hook}: "
                                        f"{why}; the wrapper stops there and {hook} fails",
                                        f"chmod 0644 {path} (no secrets in hook.env)"))  # fmt: skip
    return problems


def check_state_dir(state_dir: str, hook: str, who: Account) -> list[Problem]:
    """root's hooks write the state directory; the TaskProlog reads its task file through it."""
    if HOOK_USERS[hook] == "job":
        task_dir = os.path.join(state_dir, "task")
        if not os.path.isdir(state_dir):
            return []  # the first prolog creates it, open to be traversed (STATE_DIR_MODE)
        why = denied(task_dir if os.path.isdir(task_dir) else state_dir, who, 1)
        if why:
            return [Problem(f"state_dir {state_dir} is not traversable by the job user {who.name}: "
                            f"{why}; the TaskProlog cannot read the job's task file",
                            f"chmod o+x {state_dir} (and the directories above it); "
                            "the task files stay readable by their job's user only")]  # fmt: skip
        return []
    if who.uid != 0:
        return []
    place = state_dir
    while not os.path.exists(place) and place != os.path.dirname(place):
        place = os.path.dirname(place)  # the hooks create it: its nearest parent must be writable
    if os.geteuid() == 0 and not os.access(place, os.W_OK | os.X_OK):
        return [Problem(f"state_dir {state_dir} is not writable by root ({place}: read-only "
                        "file system or immutable)", "set state_dir to a local, writable "
                        "directory (default /var/lib/gpugate)")]  # fmt: skip
    return []


def check_slurmctld(
    env: dict[str, str], config: Config | None, who: Account, slurm: SlurmFacts
) -> list[Problem]:
    """EpilogSlurmctld reads slurm.conf as SlurmUser; epilog.evidence_group names a group."""
    problems = []
    conf = env.get("SLURM_CONF")
    named = f"SLURM_CONF={conf} in hook.env"
    if not conf and (slurm.bare_path or slurm.error):
        conf = slurm.bare_path or DEFAULT_SLURM_CONF  # what its scontrol reads without one
        named = f"{conf}, which scontrol reads without SLURM_CONF"
    why = denied(conf, who, 4) if conf else None  # none at all: check_slurm_conf_reaches says
    if why:
        problems.append(Problem(
            f"EpilogSlurmctld (as {who.name} on the controller) cannot read {named}: {why}; "
            "its scontrol calls would fail",
            f"make {conf} readable by {who.name} (chmod 0644, o+x its directories), or put "
            "the line SLURM_CONF=/path/to/slurm.conf (the one slurmctld reads) in "
            "/etc/gpugate/hook.env"))  # fmt: skip
    # The controller reads only the nodes' decision records, never the bundles: the group is
    # the admins' (gpugate evidence), but the node epilog's chgrp needs it to exist.
    group = getattr(getattr(config, "epilog", None), "evidence_group", None)
    if group:
        try:
            grp.getgrnam(group)
        except KeyError:
            problems.append(Problem(f"epilog.evidence_group {group!r} is no group on this host",
                                    f"groupadd {group}, or fix epilog.evidence_group"))  # fmt: skip
    return problems


def check_config(path: str | None, who: Account) -> tuple[Config | None, list[Problem]]:
    """The config the hooks will load (as this process) and whether `who` may read it."""

    problems = []
    if path and os.path.exists(path):
        why = denied(path, who, 4)
        if why:
            problems.append(Problem(f"config {path} is unreadable by {who.name}: {why}",
                                    f"chmod 0644 {path} (and o+x its directories); "
                                    "secrets do not belong in gpugate.yaml"))  # fmt: skip
    try:
        return load_config(path), problems
    except (ConfigError, OSError) as exc:
        return None, [*problems, Problem(f"config unusable: {exc}", "fix the file it names")]
    except Exception as exc:  # a YAML error or worse: the hooks would allow every job unchecked
        return None, [*problems, Problem(f"config unusable: {type(exc).__name__}: {exc}",
                                         "fix the file it names")]  # fmt: skip


def run_wrapper(wrapper: str, who: Account, node: str, timeout: float) -> Problem | None:
    """Run the wrapper as `who` with a harmless, Slurm-like environment; the problem or None."""
    env = ["GPUGATE_SELFTEST=1", f"SLURM_JOB_ID={FAKE_JOB_ID}", f"SLURM_JOB_USER={who.name}",
           f"SLURM_JOB_UID={who.uid}", f"SLURMD_NODENAME={node}"]  # fmt: skip
    argv = ["env", "-i", *env, wrapper]  # slurmd passes only its own variables
    if who.uid != os.geteuid():
        argv = ["runuser", "-u", who.name, "--", *argv]
    done = run(argv, timeout)
    if done.status == TIMEOUT:
        return Problem(f"{wrapper} did not finish within {timeout:.0f}s as {who.name}",
                       f"run it by hand: runuser -u {who.name} -- env GPUGATE_SELFTEST=1 {wrapper}")  # fmt: skip
    if done.returncode == 0 and OK_MARK in done.stderr:
        return None
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    if lines:
        said = lines[-1]
    elif done.ok:
        said = f"it exited 0 without gpugate's {OK_MARK!r}: is GPUGATE_BIN gpugate?"
    else:
        said = f"{done.status} (exit {done.returncode}) and nothing on stderr"
    if "selftest: cannot gather" in said or "selftest: facts source" in said:
        fix = ("give this node its facts: the file facts_file names for it (`gpugate facts -o "
               "PATH` on the node writes one), or the failed source; and name the node as "
               "Slurm does (gpugate selftest --node NAME, else SLURMD_NODENAME)")  # fmt: skip
    elif "is not executable for" in said or "is not readable" in said:
        fix = ("give gpugate an interpreter every hook user may run (a virtualenv built from "
               "/usr/bin/python3 under /opt), or open the directories on its path")  # fmt: skip
    elif "not found;" in said:
        fix = "install gpugate, or set GPUGATE_BIN=/path/to/gpugate in hook.env"
    else:
        fix = f"run it by hand: runuser -u {who.name} -- env GPUGATE_SELFTEST=1 {wrapper}"
    return Problem(f"{wrapper} as {who.name}: {said}", fix)


def selftest(
    hooks_dir: str,
    users: dict[str, str | None],
    node: str | None = None,
    timeout: float = HOOK_TIMEOUT_S,
    slurm: SlurmFacts | None = None,
    host: Host = HOST,
) -> list[HookReport]:
    """Each installed hook wrapper of `hooks_dir`, judged and run as `users[role]`, then the
    site's Slurm settings (`site`); `users["slurm"]` None: SlurmUser from `scontrol show config`.
    `node`: Slurm's name of this node (None: SLURMD_NODENAME, else the short host name), given
    to the hooks as slurmd would; `slurm`: the facts of the running Slurm (None: gathered here
    by `host`); `host`: where this host's system files are."""
    node = node or node_name()
    env_files = [host.hook_env, os.path.join(hooks_dir, "hook.env")]  # the wrapper's order
    env_problems = check_hook_env(env_files)
    envs = {hook: read_hook_env(env_files, hook) for hook in HOOK_USERS}
    if slurm is None:
        # With hook.env's SLURM_CONF where the controller's hook has one: what the hooks read.
        slurm = host.gather_slurm(envs["epilog-slurmctld"][0].get("SLURM_CONF"))
    users = {**users, "slurm": users.get("slurm") or slurm.slurm_user}
    reports = []
    for hook, role in HOOK_USERS.items():
        wrapper = os.path.join(hooks_dir, f"gpugate-{hook}")
        name = users.get(role) or ""
        report = HookReport(hook, name or f"({role})")
        reports.append(report)
        if not os.path.lexists(wrapper):
            report.status, report.note = "skipped", f"{wrapper} is not installed"
            continue
        try:
            who = account(name)
        except KeyError:
            report.status = "skipped"
            report.note = f"no user {name!r} on this host" if name else f"no {role} user known"
            continue
        env, env_error = envs[hook]
        report.problems = judge(hook, wrapper, who, env, env_problems, slurm, host.config)
        report.problems += check_hook_env_readable(env_files, hook, who)
        if env_error:
            report.problems.append(Problem(
                f"the wrapper's /bin/sh stops in hook.env ({env_error}): {hook} would fail",
                f"fix that line of {' or '.join(env_files)}; plain NAME=value lines are "
                "enough"))  # fmt: skip
        if who.uid != os.geteuid() and os.geteuid() != 0:
            report.note = f"not run: only root may run it as {who.name}"
        else:
            ran = run_wrapper(wrapper, who, node, timeout)
            if ran is not None:
                report.problems.append(ran)
        report.status = "broken" if report.problems else "ok"
    site_config = config_path(envs["epilog-slurmctld"][0], host.config)
    reports.append(site_report(site_config, slurm, node))
    steps = qualify_report(site_config)
    if steps is not None:
        reports.append(steps)
    return reports


def config_path(env: dict[str, str], system: str = DEFAULT_CONFIG) -> str | None:
    """The config a hook loads: hook.env's GPUGATE_CONFIG, else the system one if present."""
    return env.get("GPUGATE_CONFIG") or (system if os.path.exists(system) else None)


def site_report(path: str | None, slurm: SlurmFacts, node: str | None = None) -> HookReport:
    """The site's Slurm settings that gpugate's requeues and `gpugate qualify` rely on.

    One rank per Gres GPU over the nodes' CPUs is a warning (qualify runs fewer ranks; no hook
    breaks and no requeue is lost)."""
    node = node or node_name()
    report = HookReport("site", "slurm.conf")
    report.problems = check_slurm_read(slurm)
    if not slurm.error:
        report.problems += [*check_job_requeue(slurm.conf), *check_prolog_hold(slurm.conf)]
        report.problems += check_node_known(node, slurm)
        report.warnings += check_health_periodic(slurm.conf)
        config, _ = check_config(path, account("root"))  # its problems are the hooks' already
        geometry = check_qualify_geometry(getattr(config, "qualify", None), slurm)
        report.problems += [p for p in geometry if not isinstance(p, Caution)]
        report.warnings += [p for p in geometry if isinstance(p, Caution)]
        kind = getattr(getattr(config, "slurm", None), "backend", "auto")
        report.note, problems = check_backend(kind, slurm.conf.get("SLURM_CONF"))
        report.problems += problems
        isolation, problems = check_isolation(config, slurm.conf.get("SLURM_CONF"), node)
        from gpugate.store.fleet_view import share_note

        shared = share_note(config) if config is not None else ""
        allowance = allowance_note(config) if config is not None else ""
        report.note = "; ".join(n for n in (report.note, isolation, shared, allowance) if n)
        report.problems += problems
        if slurm.nodes_error:
            report.problems.append(Problem(f"cannot list the nodes ({slurm.nodes_error}): the "
                                           "qualify partition is unchecked",
                                           "run gpugate selftest where scontrol works"))  # fmt: skip
    report.status = "broken" if report.problems else "warning" if report.warnings else "ok"
    return report


def has_qualify_section(path: str | None) -> bool:
    """Whether the site's config file has a top-level `qualify:` section (False: unreadable)."""
    import yaml

    try:
        with open(path or "", encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and "qualify" in doc


def qualify_report(path: str | None) -> HookReport | None:
    """Which `gpugate qualify` steps this host can run (None without a qualify: section); a
    step it cannot is a warning with the fix (it would be "not run", never a drain)."""
    if not has_qualify_section(path):  # the defaults hold one: the site's own file decides
        return None
    config, _ = check_config(path, account("root"))  # its problems are the hooks' already
    qc = getattr(config, "qualify", None)
    if qc is None:
        return None
    checks = check_qualify_steps(qc)
    report = HookReport("qualify", "this host")
    runnable = [c.step for c in checks if c.runnable]
    report.problems = [Problem(f"{c.step}: would be \"not run\" in a qualification: {c.why}",
                               c.fix) for c in checks if not c.runnable]  # fmt: skip
    report.status = "warning" if report.problems else "ok"
    notes = [f"runnable: {', '.join(runnable)}"] if runnable else ["no step runnable"]
    notes += [c.why for c in checks if c.runnable and c.step in ("dcgm", "allreduce")]
    report.note = "; ".join(notes)
    return report


def judge(
    hook: str,
    wrapper: str,
    who: Account,
    env: dict[str, str],
    env_problems: list[Problem],
    slurm: SlurmFacts,
    system_config: str = DEFAULT_CONFIG,
) -> list[Problem]:
    """The static checks of one hook for its user (before it is run); `system_config`: the
    config it loads without GPUGATE_CONFIG."""
    problems = list(env_problems)
    why = denied(wrapper, who, 1) or denied(wrapper, who, 4)
    if why:
        problems.append(Problem(f"the wrapper {wrapper} is not runnable by {who.name}: {why}",
                                f"chmod 0755 {wrapper}"))  # fmt: skip
    problems += check_launcher(env.get("GPUGATE_BIN") or DEFAULT_BIN, who)
    config, found = check_config(config_path(env, system_config), who)
    problems += found
    if config is not None:
        problems += check_state_dir(config.state_dir, hook, who)
    problems += check_slurm_conf_reaches(hook, env, slurm)
    if hook == "epilog-slurmctld":
        problems += check_slurmctld(env, config, who, slurm)
        if config is not None:
            evidence_dir = config.evidence_dir
            problems += check_controller_access(evidence_dir, controller_dir_of(config), who)
    return problems

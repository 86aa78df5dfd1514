"""`gpugate selftest`: run each installed hook wrapper as Slurm would, and say what would break.

Gather (the wrappers, hook.env, the launcher's `#!`, the config, the accounts), check (pure
functions over those facts, each problem with its fix), then run each wrapper as its Slurm
user with GPUGATE_SELFTEST=1, in which mode a hook loads its config and takes no action.
Mode bits are judged for the hook's user by hand: `os.access` answers only for this process.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass, field

from gpugate.runner import TIMEOUT, run

SYSTEM_HOOK_ENV = "/etc/gpugate/hook.env"
DEFAULT_BIN = "/opt/gpugate/bin/gpugate"
DEFAULT_CONFIG = "/etc/gpugate/gpugate.yaml"
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
HOOK_TIMEOUT_S = 60.0
FAKE_JOB_ID = "4294967000"  # no real job: the hooks take no action in selftest mode anyway
# hook -> who Slurm runs it as: root, the job's user, or SlurmUser (on the controller).
HOOK_USERS = {
    "prolog": "root",
    "epilog": "root",
    "health": "root",
    "task-prolog": "job",
    "epilog-slurmctld": "slurm",
}
# What the hook prints in selftest mode (gpugate.commands.selftest_dry_run).
OK_MARK = "selftest ok"


@dataclass(frozen=True)
class Account:
    """A local user as the kernel judges it: uid and every group id."""

    name: str
    uid: int
    gids: tuple[int, ...]


@dataclass(frozen=True)
class Problem:
    """One thing that would break, and what to do about it."""

    what: str
    fix: str


@dataclass
class HookReport:
    """One hook's verdict: ok, broken (with problems), or skipped (with why)."""

    hook: str
    user: str
    status: str = "ok"
    problems: list[Problem] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict:
        """The JSON form."""
        return {"hook": self.hook, "user": self.user, "status": self.status, "note": self.note,
                "problems": [{"what": p.what, "fix": p.fix} for p in self.problems]}  # fmt: skip


def account(name: str) -> Account:
    """The account `name`; KeyError when there is none."""
    entry = pwd.getpwnam(name)
    return Account(name, entry.pw_uid, tuple(os.getgrouplist(name, entry.pw_gid)))


def _bits(st: os.stat_result, who: Account) -> int:
    """The rwx bits (as 0o7) that apply to `who` on a file of this stat."""
    if who.uid == st.st_uid:
        return (st.st_mode >> 6) & 7
    if st.st_gid in who.gids:
        return (st.st_mode >> 3) & 7
    return st.st_mode & 7


def denied(path: str, who: Account, want: int) -> str | None:
    """Why `who` may not open `path` for `want` (4 read, 2 write, 1 execute); None if allowed."""
    path = os.path.abspath(path)
    # The directories on the way, of the path as named and of where its links lead.
    for place in dict.fromkeys((path, os.path.realpath(path))):
        parent = os.path.dirname(place)
        while True:
            try:
                st = os.stat(parent)
            except OSError:
                break  # reported below, as the file's own absence
            if who.uid != 0 and not _bits(st, who) & 1:
                return f"{parent} is closed to {who.name} (mode {st.st_mode & 0o7777:04o})"
            if parent == "/":
                break
            parent = os.path.dirname(parent)
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror.lower() if exc.strerror else exc}"
    if who.uid == 0:  # root may do anything but run a file no one may run
        return None if want != 1 or st.st_mode & 0o111 or os.path.isdir(path) else "no x bit"
    if _bits(st, who) & want != want:
        return f"{path} is mode {st.st_mode & 0o7777:04o} owned by {st.st_uid}:{st.st_gid}"
    return None


def read_hook_env(path: str) -> dict[str, str]:
    """The `NAME=value` lines of a hook.env (as the wrapper's `.` would set them, simply)."""
    values: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read(64 * 1024).splitlines()
    except OSError:
        return values
    for line in lines:
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        name, eq, value = line.partition("=")
        if eq and name.isidentifier() and not line.startswith("#"):
            values[name] = value.strip().strip("'\"")
    return values


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


WRAPPER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def check_slurmctld(env: dict[str, str], config: object, who: Account) -> list[Problem]:
    """EpilogSlurmctld: SLURM_CONF for scontrol, the evidence group SlurmUser reads bundles by."""
    problems = []
    conf = env.get("SLURM_CONF")
    named = f"SLURM_CONF={conf} in hook.env" if conf else f"the default {DEFAULT_SLURM_CONF}"
    why = denied(conf or DEFAULT_SLURM_CONF, who, 4)
    if why:
        problems.append(Problem(
            f"EpilogSlurmctld (as {who.name} on the controller) cannot read {named}: {why}; "
            "its scontrol calls would wait out their timeout",
            "put SLURM_CONF=/path/to/slurm.conf in /etc/gpugate/hook.env"))  # fmt: skip
    group = getattr(getattr(config, "epilog", None), "evidence_group", None)
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            problems.append(Problem(f"epilog.evidence_group {group!r} is no group on this host",
                                    f"groupadd {group}, or fix epilog.evidence_group"))  # fmt: skip
        else:
            if gid not in who.gids:
                problems.append(Problem(
                    f"SlurmUser {who.name} is not in epilog.evidence_group {group!r}: "
                    "EpilogSlurmctld cannot read the bundles it decides requeues by",
                    f"usermod -aG {group} {who.name}"))  # fmt: skip
    return problems


def check_config(path: str | None, who: Account) -> tuple[object | None, list[Problem]]:
    """The config the hooks will load (as this process) and whether `who` may read it."""
    from gpugate.config import ConfigError, load_config

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
    if "is not executable for" in said or "is not readable" in said:
        fix = ("give gpugate an interpreter every hook user may run (a virtualenv built from "
               "/usr/bin/python3 under /opt), or open the directories on its path")  # fmt: skip
    elif "not found;" in said:
        fix = "install gpugate, or set GPUGATE_BIN=/path/to/gpugate in hook.env"
    else:
        fix = f"run it by hand: runuser -u {who.name} -- env GPUGATE_SELFTEST=1 {wrapper}"
    return Problem(f"{wrapper} as {who.name}: {said}", fix)


def slurm_user(timeout: float = 15.0) -> str | None:
    """SlurmUser from `scontrol show config` (`SlurmUser = slurm(64030)`), or None."""
    done = run(["scontrol", "show", "config"], timeout)
    if not done.ok:
        return None
    for line in done.stdout.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "SlurmUser" and value.strip():
            return value.strip().split("(")[0] or None
    return None


def selftest(
    hooks_dir: str,
    users: dict[str, str | None],
    system_hook_env: str = SYSTEM_HOOK_ENV,
    node: str = "selftest",
    timeout: float = HOOK_TIMEOUT_S,
) -> list[HookReport]:
    """Each installed hook wrapper of `hooks_dir`, judged and run as `users[role]`."""
    env_files = [system_hook_env, os.path.join(hooks_dir, "hook.env")]
    env: dict[str, str] = {}
    for path in env_files:  # the wrapper's order: the one beside it wins
        env.update(read_hook_env(path))
    env_problems = check_hook_env(env_files)
    config_path = env.get("GPUGATE_CONFIG") or (
        DEFAULT_CONFIG if os.path.exists(DEFAULT_CONFIG) else None
    )
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
        report.problems = judge(hook, wrapper, who, env, config_path, env_problems)
        if who.uid != os.geteuid() and os.geteuid() != 0:
            report.note = f"not run: only root may run it as {who.name}"
        else:
            ran = run_wrapper(wrapper, who, node, timeout)
            if ran is not None:
                report.problems.append(ran)
        report.status = "broken" if report.problems else "ok"
    return reports


def judge(
    hook: str,
    wrapper: str,
    who: Account,
    env: dict[str, str],
    config_path: str | None,
    env_problems: list[Problem],
) -> list[Problem]:
    """The static checks of one hook for its user (before it is run)."""
    problems = list(env_problems)
    why = denied(wrapper, who, 1) or denied(wrapper, who, 4)
    if why:
        problems.append(Problem(f"the wrapper {wrapper} is not runnable by {who.name}: {why}",
                                f"chmod 0755 {wrapper}"))  # fmt: skip
    problems += check_launcher(env.get("GPUGATE_BIN") or DEFAULT_BIN, who)
    config, found = check_config(config_path, who)
    problems += found
    if config is not None:
        problems += check_state_dir(config.state_dir, hook, who)  # type: ignore[attr-defined]
    if hook == "epilog-slurmctld":
        problems += check_slurmctld(env, config, who)
    return problems

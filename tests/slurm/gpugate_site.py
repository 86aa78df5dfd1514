"""gpugate installed as the hooks of a real local Slurm (end-to-end tests and `make demo`).

The hooks are the real wrapper scripts from slurm_hooks/, copied next to a `hook.env` that
points them at this checkout's `gpugate` and at a private config whose `facts_file` replays one
snapshot per node (`<dir>/snapshots/<node>.yaml`): the GPUs are the only simulated part.

Nothing of the host's own gpugate is used (issue 26): the copies of the wrapper read only their
own hook.env, never /etc/gpugate/hook.env, and hook.env points the cache and the fallback state
directory into the site. The TaskProlog and the jobs run as an ordinary user, who may not reach
this checkout (a clone in 0700 /root or `mktemp -d`): the site holds its own copy of gpugate
(`<base>/gpugate/`, 0755, with the dependencies, like the packaged /opt/gpugate) for them.

With GPUGATE_E2E_HOOKS=installed (.ci/second-slurm, inside its throwaway Debian root) the hooks
are the installed package's instead, as a default site has them: /usr/libexec/gpugate/gpugate-*
running the packaged /opt/gpugate/bin/gpugate, with the site's settings in
/etc/gpugate/hook.env (plain `NAME=value` lines, the README's spelling). That file is global:
there, the newest Site is the one the hooks serve.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from jobpython import JobUserCannotRun, as_job_user, job_interpreter
from localslurm import JOB_USER, LocalSlurm, ensure_user, open_path

ROOT = Path(__file__).resolve().parent.parent.parent
SNAPSHOTS = ROOT / "config" / "snapshots"
HOOKS = ("prolog", "epilog", "task-prolog", "epilog-slurmctld", "health")
# Each hook's LocalSlurm argument (its slurm.conf key); a cluster gets all but the health check
# unless a test names its own.
HOOK_ARGUMENTS = {"prolog": "prolog", "epilog": "epilog", "task-prolog": "task_prolog",
                  "epilog-slurmctld": "epilog_slurmctld", "health": "health_check_program"}  # fmt: skip
JOB_HOOKS = ("prolog", "epilog", "task-prolog", "epilog-slurmctld")
# The wrapper reads the system's hook.env, then its own: the tests' copies read only their own.
SYSTEM_HOOK_ENV_LOOP = 'for f in /etc/gpugate/hook.env "${0%/*}/hook.env"; do'
OWN_HOOK_ENV_LOOP = 'for f in "${0%/*}/hook.env"; do'
# The source folders as the wheel installs them: gpugate/ alone, its symlinks to config/ and
# slurm_hooks/ copied as the files they name (copytree follows them).
PACKAGE_DIRS = {"gpugate": "gpugate"}
DEPENDENCIES = ("yaml", "loguru", "pynvml")  # pyproject.toml's, by module
# GPUGATE_E2E_BACKEND=pyslurm runs the suite on the pyslurm backend (`slurm.backend: pyslurm`,
# which fails rather than fall back): .ci/run's second pass, after .ci/pyslurm built it.
BACKEND_VAR = "GPUGATE_E2E_BACKEND"
LAUNCHER = ROOT / "packaging" / "rpm" / "gpugate"  # the packaged one: ../lib first on sys.path


def wrapper_text() -> str:
    """slurm_hooks/gpugate-hook as the tests install it: it never reads /etc/gpugate/hook.env."""
    source = ROOT / "slurm_hooks" / "gpugate-hook"
    return _own_hook_env(source, source.read_text())


def own_hook_env_only(wrapper: Path) -> None:
    """Rewrite a test's copy of the wrapper (never the source) to read only its own hook.env."""
    real = Path(os.path.realpath(wrapper))
    if real.parent == ROOT / "slurm_hooks":
        raise AssertionError(f"{wrapper}: tests run copies of the wrapper, not the source")
    real.write_text(_own_hook_env(wrapper, real.read_text()))


def _own_hook_env(path: Path, text: str) -> str:
    if OWN_HOOK_ENV_LOOP in text and SYSTEM_HOOK_ENV_LOOP not in text:
        return text  # rewritten already
    if SYSTEM_HOOK_ENV_LOOP not in text:  # the wrapper changed: this must follow it
        raise AssertionError(f"{path}: no line {SYSTEM_HOOK_ENV_LOOP!r} to replace")
    return text.replace(SYSTEM_HOOK_ENV_LOOP, OWN_HOOK_ENV_LOOP)


def install_for_jobs(prefix: Path) -> Path:
    """gpugate and its dependencies under PREFIX (lib/, bin/gpugate), readable by every user;
    the launcher's path. Checked by running it as the job user: JobUserCannotRun if it fails."""
    lib = prefix / "lib"
    copy_gpugate(lib)
    interpreter = job_interpreter()
    launcher = prefix / "bin" / "gpugate"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    text = LAUNCHER.read_text().split("\n", 1)[1]
    launcher.write_text(f"#!{interpreter} -Es\n{text}")
    for path in (prefix, *prefix.rglob("*")):  # whatever the clone's umask was
        path.chmod(0o755 if path.is_dir() or path == launcher else 0o644)
    # The checklist on a bundled snapshot imports gpugate and its dependencies, as the user.
    healthy = lib / "gpugate" / "config" / "snapshots" / "h100-healthy.yaml"
    problem = as_job_user(
        [str(launcher), "check", "--facts", str(healthy), "--config", "/dev/null"]
    )
    if problem:
        raise JobUserCannotRun(f"the job user {JOB_USER} cannot run {launcher}: {problem}")
    return launcher


@functools.cache
def gpugate_for_job_user() -> tuple[str, dict[str, str]]:
    """(python, env) that run this checkout's gpugate as the job user, for one test session:
    a Python that user can run and PYTHONPATH to a copy of gpugate and its dependencies in a
    0755 directory under /tmp (the checkout and its virtualenv may be out of that user's reach)."""
    lib = Path(tempfile.mkdtemp(prefix="gpugate-lib-"))
    atexit.register(shutil.rmtree, lib, True)
    copy_gpugate(lib)
    for path in (lib, *lib.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    python = job_interpreter()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib)}
    problem = as_job_user([python, "-s", "-c", "import gpugate.cli, yaml"], env=env)
    if problem:
        raise JobUserCannotRun(f"the job user {JOB_USER} cannot import gpugate from {lib} "
                               f"with {python}: {problem}")  # fmt: skip
    return python, env


def copy_gpugate(lib: Path) -> None:
    """This checkout's gpugate, laid out as installed, and its dependencies, into LIB."""
    for source, target in PACKAGE_DIRS.items():
        shutil.copytree(ROOT / source, lib / target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    if e2e_backend() == "pyslurm":
        copy_distribution("pyslurm", lib)
    for module in DEPENDENCIES:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise JobUserCannotRun(f"{module} is not installed for {sys.executable}")
        if spec.submodule_search_locations:  # a package: its whole folder
            source = Path(spec.origin).parent
            shutil.copytree(source, lib / source.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        else:
            shutil.copy(spec.origin, lib / Path(spec.origin).name)


def copy_distribution(name: str, lib: Path) -> None:
    """An installed distribution's files (its package and its .dist-info, which `slurm.backend:
    auto` reads for the version) into LIB, as `pip install --target` lays them out."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(name)
    except PackageNotFoundError:
        raise JobUserCannotRun(f"{name} is not installed for {sys.executable} "
                               "(.ci/pyslurm builds it)") from None  # fmt: skip
    for file in dist.files or ():
        source = Path(str(dist.locate_file(file)))
        if file.parts[0] in ("..", "/") or "__pycache__" in file.parts or not source.is_file():
            continue  # scripts outside site-packages, byte code
        target = lib / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)


def e2e_backend() -> str:
    """The Slurm backend the end-to-end suite's hooks and commands use: cli, or pyslurm."""
    kind = os.environ.get(BACKEND_VAR, "") or "cli"
    if kind not in ("cli", "pyslurm"):
        raise RuntimeError(f"{BACKEND_VAR}={kind!r}: expected 'cli' or 'pyslurm'")
    return kind


# GPUGATE_E2E_HOOKS=installed: the installed package's wrappers and its /etc/gpugate/hook.env.
HOOKS_MODE_VAR = "GPUGATE_E2E_HOOKS"
INSTALLED_HOOKS = Path("/usr/libexec/gpugate")
INSTALLED_HOOK_ENV = Path("/etc/gpugate/hook.env")
# Installed mode writes /etc/gpugate/hook.env: only where .ci/second-slurm made the root and put
# this marker at its top, never on a host (whose own gpugate it would reconfigure).
THROWAWAY_MARKER = Path("/.gpugate-throwaway-root")


def installed_hooks() -> bool:
    """True when the tests run on the installed package's hooks (GPUGATE_E2E_HOOKS=installed)."""
    mode = os.environ.get(HOOKS_MODE_VAR, "")
    if mode not in ("", "checkout", "installed"):
        raise RuntimeError(f"{HOOKS_MODE_VAR}={mode!r}: expected 'installed' or 'checkout'")
    if mode != "installed":
        return False
    if not THROWAWAY_MARKER.exists():
        raise RuntimeError(
            f"{HOOKS_MODE_VAR}=installed writes {INSTALLED_HOOK_ENV}: it runs only in the "
            f"throwaway root of .ci/second-slurm (no {THROWAWAY_MARKER} here)"
        )
    missing = [h for h in HOOKS if not (INSTALLED_HOOKS / f"gpugate-{h}").exists()]
    if missing:
        raise RuntimeError(f"{HOOKS_MODE_VAR}=installed but the package is not installed: "
                           f"no {INSTALLED_HOOKS}/gpugate-{missing[0]}")  # fmt: skip
    return True


def default_slurm_user() -> str:
    """The SlurmUser of the tests' clusters: `slurm`, as Debian and RHEL ship Slurm (issue 26);
    GPUGATE_E2E_SLURM_USER=root runs the suite the old way, as a second configuration."""
    return os.environ.get("GPUGATE_E2E_SLURM_USER", "slurm")


class Site:
    """A private gpugate install for one test cluster: hooks, config, snapshots, state."""

    def __init__(self, base: Path, config_extra: str = "") -> None:
        self.base = base
        self.hooks = base / "hooks-gpugate"
        self.snapshots = base / "snapshots"
        self.state = base / "state"
        self.evidence = base / "evidence"
        self.config = base / "gpugate.yaml"
        self.metrics = base / "metrics" / "gpugate.prom"
        self.backend = e2e_backend()
        for d in (self.hooks, self.snapshots, self.state, self.evidence, self.metrics.parent):
            d.mkdir(parents=True, exist_ok=True)
        # Jobs run as an ordinary user (localslurm.JOB_USER) and write their output here, like
        # users in a shared /tmp: sticky and world-writable; state and evidence stay root's.
        os.chmod(base, 0o1777)
        open_path(base)
        # The snapshots stand for the GPUs. Jobs in these tests swap their node's snapshot to
        # stand for hardware failing mid-run, so the job user may write there (tests only).
        uid, gid = ensure_user()
        os.chown(self.snapshots, uid, gid)
        # The TaskProlog runs as the job user: gpugate from a copy that user can reach, never by
        # opening the directories above this checkout (an admin's home).
        if installed_hooks():
            # The package's wrappers and launcher; hook.env where the README puts it.
            self.gpugate = Path("/opt/gpugate/bin/gpugate")
            self.hooks = INSTALLED_HOOKS
            stray = INSTALLED_HOOKS / "hook.env"
            if stray.exists():
                # The wrappers read it after /etc/gpugate/hook.env: it would win over this site.
                raise RuntimeError(f"{stray} exists: an earlier test wrote it (write hook.env "
                                   "through Site.hook_env); remove it")  # fmt: skip
            self.hook_env = INSTALLED_HOOK_ENV
            self.hook_env.write_text(self.hook_env_text())
            self.hook_env.chmod(0o644)  # root's, read by the TaskProlog as the job's user
        else:
            self.gpugate = install_for_jobs(base / "gpugate")
            self.hook_env = self.hooks / "hook.env"
            wrapper = wrapper_text()
            for hook in HOOKS:
                (self.hooks / f"gpugate-{hook}").write_text(wrapper)
                (self.hooks / f"gpugate-{hook}").chmod(0o755)
            self.hook_env.write_text(f"GPUGATE_BIN={self.gpugate}\n" + self.hook_env_text())
        self.write_config(config_extra)

    def hook_env_text(self, slurm_conf: str | os.PathLike | None = None) -> str:
        """hook.env lines pointing the wrappers at this site (an installed package's too).

        Plain `NAME=value` lines, as the README writes them: the wrapper exports each (set -a).
        """
        text = (
            f"GPUGATE_CONFIG={self.config}\nGPUGATE_CACHE_DIR={self.base / 'cache'}\n"
            # A hook whose config is unusable logs here, not to the host's /var/lib/gpugate.
            f"GPUGATE_FALLBACK_STATE_DIR={self.state}\n"
        )
        if slurm_conf is not None:
            text += f"SLURM_CONF={slurm_conf}\n"
        return text

    def use_slurm_conf(self, path: str | os.PathLike) -> None:
        """Point the hooks at a private slurm.conf (EpilogSlurmctld gets no SLURM_CONF)."""
        with open(self.hook_env, "a") as fh:
            fh.write(f"SLURM_CONF={path}\n")

    def hook(self, name: str) -> str:
        """Absolute path of one wrapper, for slurm.conf."""
        return str(self.hooks / f"gpugate-{name}")

    def cluster(
        self, nodes: list[str], hooks: Iterable[str] = JOB_HOOKS, **options: object
    ) -> LocalSlurm:
        """A local Slurm (not started) with this site's `hooks` (by default its Prolog, Epilog,
        TaskProlog and EpilogSlurmctld), as an admin installs them; the hooks read its
        slurm.conf."""
        arguments: dict[str, object] = {HOOK_ARGUMENTS[hook]: self.hook(hook) for hook in hooks}
        arguments["prolog_epilog_timeout"] = 60
        arguments["wrap_hooks"] = False
        arguments["slurm_user"] = default_slurm_user()
        arguments.update(options)  # a test's own settle it
        c = LocalSlurm(self.base / "slurm", nodes=nodes, **arguments)
        if c.slurm_user != "root":
            self.controller_for(c.slurm_user)
        self.use_slurm_conf(c.conf_path)
        return c

    def controller_for(self, user: str) -> None:
        """As the package does: state passable, controller_dir the SlurmUser's own."""
        import pwd

        entry = pwd.getpwnam(user)
        self.state.chmod(0o751)
        self.controller.mkdir(mode=0o751, exist_ok=True)
        os.chown(self.controller, entry.pw_uid, entry.pw_gid)

    def write_config(self, extra: str = "") -> None:
        """The site config: replay per-node snapshots, private state and evidence."""
        self.config.write_text(
            f"facts_file: {self.snapshots}/{{node}}.yaml\n"
            f"state_dir: {self.state}\n"
            f"evidence_dir: {self.evidence}\n"
            "task_prolog:\n"
            f"  nccl_debug_dir: {self.base / 'nccl'}\n"
            f"slurm:\n  backend: {self.backend}\n"
            # admin: last, its lines indented: a test's `extra` may continue it.
            "admin:\n"
            f"  metrics_file: {self.metrics}\n" + extra
        )

    def nccl_dir_per_node(self, nodes: list[str], own_state: bool = False) -> None:
        """Give each node its own NCCL directory, `<base>/<node>/nccl`, through hook.env;
        with `own_state`, its own state_dir too (`<base>/<node>/state`: node_state()).

        The local slurmd all run on one host, where the NCCL directory and the state directory
        (node-local on a real cluster) would be shared: the node hooks pick a per-node config by
        SLURMD_NODENAME. The controller keeps the site's config (state_dir: self.state).
        """
        for node in nodes:
            (self.base / node).mkdir()
            (self.base / node).chmod(0o755)  # the job's user reaches its NCCL directory below
            text = self.config.read_text().replace(
                f"nccl_debug_dir: {self.base / 'nccl'}",
                f"nccl_debug_dir: {self.base / node / 'nccl'}",
            )
            if own_state:
                text = text.replace(f"state_dir: {self.state}\n",
                                    f"state_dir: {self.node_state(node)}\n")  # fmt: skip
            (self.base / f"gpugate-{node}.yaml").write_text(text)
        with open(self.hook_env, "a") as fh:
            # The node hooks (prolog, epilog, task prolog) know their node; the controller's not.
            fh.write(
                f'case "$SLURMD_NODENAME" in {"|".join(nodes)}) '
                f"GPUGATE_CONFIG={self.base}/gpugate-$SLURMD_NODENAME.yaml ;; esac\n"
            )

    def node_state(self, node: str) -> Path:
        """The state_dir of `node` under nccl_dir_per_node(own_state=True)."""
        return self.base / node / "state"

    def use_snapshot(self, node: str, name: str) -> None:
        """Make `node` replay the bundled snapshot `name` (e.g. "h100-ecc")."""
        text = (SNAPSHOTS / f"{name}.yaml").read_text().replace("gpu-node-01", node)
        tmp = self.snapshots / f".{node}.tmp"
        tmp.write_text(text)
        tmp.chmod(0o666)  # a job (the job user) may overwrite it: see __init__
        os.replace(tmp, self.snapshots / f"{node}.yaml")

    def add_template(self, name: str, snapshot: str) -> None:
        """The bundled `snapshot` beside the nodes' as `<name>.yaml`, for a job to swap in."""
        (self.snapshots / f"{name}.yaml").write_text((SNAPSHOTS / f"{snapshot}.yaml").read_text())

    def restore(self, cluster: object, nodes: list[str]) -> None:
        """Healthy snapshots, an empty queue, every node resumed and idle: a test's start."""
        for node in nodes:
            self.use_snapshot(node, "h100-healthy")
        for job in cluster.queue():  # type: ignore[attr-defined]
            cluster.run(["scancel", str(job)], check=False)  # type: ignore[attr-defined]
        for node in nodes:
            if cluster.is_drained(node):  # type: ignore[attr-defined]
                cluster.resume(node)  # type: ignore[attr-defined]
        cluster.wait_idle()  # type: ignore[attr-defined]

    @property
    def controller(self) -> Path:
        """The controller's directory (controller_dir's default, <state_dir>/controller)."""
        return self.state / "controller"

    def events(self, state: Path | None = None) -> list[dict]:
        """The hook runs recorded in the state directory (`state`: a node's own) and the
        controller's, by time."""
        import json

        found = []
        for path in ((state or self.state) / "events.jsonl", self.controller / "events.jsonl"):
            if path.exists():
                text = path.read_text().splitlines()
                found += [json.loads(line) for line in text if line.strip()]
        return sorted(found, key=lambda e: e.get("time", ""))

    def flags(self, state: Path | None = None) -> list[dict]:
        """The suspect flags: the controller's (votes, in controller_dir) and the nodes'
        (application Xids, in state_dir; `state`: a node's own)."""
        import json

        found = []
        for path in ((state or self.state) / "suspect-flags.jsonl",
                     self.controller / "suspect-flags.jsonl"):  # fmt: skip
            if path.exists():
                found += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return sorted(found, key=lambda e: e.get("when", 0))

    def wait_event(
        self, hook: str, job: int, timeout: float = 60, state: Path | None = None
    ) -> dict:
        """Wait until `hook` has recorded a run for `job` (in `state`, a node's own state
        directory, or the site's); its newest event."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [
                e for e in self.events(state) if e["hook"] == hook and e.get("job") == str(job)
            ]
            if found:
                return found[-1]
            time.sleep(0.5)
        raise AssertionError(f"no {hook} event for job {job}")

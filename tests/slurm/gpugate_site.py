"""gpugate installed as the hooks of a real local Slurm (end-to-end tests and `make demo`).

The hooks are the real wrapper scripts from slurm_hooks/, copied next to a `hook.env` that
points them at this checkout's `gpugate` and at a private config whose `facts_file` replays one
snapshot per node (`<dir>/snapshots/<node>.yaml`): the GPUs are the only simulated part.

With GPUGATE_E2E_HOOKS=installed (.ci/second-slurm, inside its throwaway Debian root) the hooks
are the installed package's instead, as a default site has them: /usr/libexec/gpugate/gpugate-*
running the packaged /opt/gpugate/bin/gpugate, with the site's settings in
/etc/gpugate/hook.env (plain `NAME=value` lines, the README's spelling). That file is global:
there, the newest Site is the one the hooks serve.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from localslurm import LocalSlurm, ensure_user, open_path

ROOT = Path(__file__).resolve().parent.parent.parent
SNAPSHOTS = ROOT / "config" / "snapshots"
HOOKS = ("prolog", "epilog", "task-prolog", "epilog-slurmctld", "health")
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
        # The TaskProlog runs as the job user with this checkout's interpreter: it must be able
        # to reach it (a pyenv under a 0700 /root, say). Traversal only, nothing listed.
        open_path(Path(os.path.realpath(sys.executable)).parent)
        if installed_hooks():
            # The package's wrappers and launcher; hook.env where the README puts it.
            self.hooks = INSTALLED_HOOKS
            self.hook_env = INSTALLED_HOOK_ENV
            self.hook_env.write_text(self.hook_env_text())
            self.hook_env.chmod(0o644)  # root's, read by the TaskProlog as the job's user
        else:
            self.hook_env = self.hooks / "hook.env"
            gpugate = Path(sys.executable).parent / "gpugate"
            for hook in HOOKS:
                src = ROOT / "slurm_hooks" / f"gpugate-{hook}"
                shutil.copy(src, self.hooks / f"gpugate-{hook}")
            self.hook_env.write_text(f"GPUGATE_BIN={gpugate}\n" + self.hook_env_text())
        self.write_config(config_extra)

    def hook_env_text(self, slurm_conf: str | os.PathLike | None = None) -> str:
        """hook.env lines pointing the wrappers at this site (an installed package's too).

        Plain `NAME=value` lines, as the README writes them: the wrapper exports each (set -a).
        """
        text = f"GPUGATE_CONFIG={self.config}\nGPUGATE_CACHE_DIR={self.base / 'cache'}\n"
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

    def cluster(self, nodes: list[str], **options: object) -> LocalSlurm:
        """A local Slurm (not started) with this site's Prolog, Epilog, TaskProlog and
        EpilogSlurmctld, as an admin installs them; the hooks read its slurm.conf."""
        c = LocalSlurm(
            self.base / "slurm",
            nodes=nodes,
            prolog=self.hook("prolog"),
            epilog=self.hook("epilog"),
            task_prolog=self.hook("task-prolog"),
            epilog_slurmctld=self.hook("epilog-slurmctld"),
            prolog_epilog_timeout=60,
            wrap_hooks=False,
            **options,
        )
        self.use_slurm_conf(c.conf_path)
        return c

    def write_config(self, extra: str = "") -> None:
        """The site config: replay per-node snapshots, private state and evidence."""
        self.config.write_text(
            f"facts_file: {self.snapshots}/{{node}}.yaml\n"
            f"state_dir: {self.state}\n"
            f"evidence_dir: {self.evidence}\n"
            "task_prolog:\n"
            f"  nccl_debug_dir: {self.base / 'nccl'}\n"
            "admin:\n"
            f"  metrics_file: {self.metrics}\n" + extra
        )

    def nccl_dir_per_node(self, nodes: list[str]) -> None:
        """Give each node its own NCCL directory, `<base>/<node>/nccl`, through hook.env.

        The local slurmd all run on one host, where the NCCL directory (node-local on a real
        cluster) would be shared: the node hooks pick a per-node config by SLURMD_NODENAME.
        """
        for node in nodes:
            (self.base / node).mkdir()
            (self.base / node).chmod(0o755)  # the job's user reaches its NCCL directory below
            text = self.config.read_text().replace(
                f"nccl_debug_dir: {self.base / 'nccl'}",
                f"nccl_debug_dir: {self.base / node / 'nccl'}",
            )
            (self.base / f"gpugate-{node}.yaml").write_text(text)
        with open(self.hook_env, "a") as fh:
            # The node hooks (prolog, epilog, task prolog) know their node; the controller's not.
            fh.write(
                f'case "$SLURMD_NODENAME" in {"|".join(nodes)}) '
                f"GPUGATE_CONFIG={self.base}/gpugate-$SLURMD_NODENAME.yaml ;; esac\n"
            )

    def use_snapshot(self, node: str, name: str) -> None:
        """Make `node` replay the bundled snapshot `name` (e.g. "h100-ecc")."""
        text = (SNAPSHOTS / f"{name}.yaml").read_text().replace("gpu-node-01", node)
        tmp = self.snapshots / f".{node}.tmp"
        tmp.write_text(text)
        tmp.chmod(0o666)  # a job (the job user) may overwrite it: see __init__
        os.replace(tmp, self.snapshots / f"{node}.yaml")

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

    def events(self) -> list[dict]:
        """The hook runs recorded in the state directory."""
        import json

        path = self.state / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_event(self, hook: str, job: int, timeout: float = 60) -> dict:
        """Wait until `hook` has recorded a run for `job`; its newest event."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events() if e["hook"] == hook and e.get("job") == str(job)]
            if found:
                return found[-1]
            time.sleep(0.5)
        raise AssertionError(f"no {hook} event for job {job}")

"""pytest glue for the end-to-end tests against the real local Slurm.

`SlurmSites` is what tests/conftest.py's `slurm_site` fixture hands a test module: a factory of
gpugate sites, each with its own local Slurm started, every one stopped when the module ends.
A module names what differs (nodes, snapshots, site-file lines, hooks, SlurmUser, slurm.conf
options) as arguments; tests/conftest.py's `site` and `cluster` fixtures read the module's
`e2e_site`:

    @pytest.fixture(scope="module")
    def e2e_site(slurm_site: SlurmSites) -> SlurmSite:
        return slurm_site(["n1", "n2"], config="requeue:\\n  wait_for_bundles_s: 45\\n")
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import paths
import pytest

sys.path.insert(0, str(paths.SLURM_HARNESS))

from gpugate_site import JOB_HOOKS, SNAPSHOTS, Site, gpugate_for_job_user, installed_hooks
from localslurm import LocalSlurm

__all__ = [
    "PROLOG_ALONE",
    "SNAPSHOTS",
    "Site",
    "SlurmSite",
    "SlurmSites",
    "gpugate_for_job_user",
    "installed_hooks",
    "slurm_or_skip",
    "submit_policy_lua",
]


# gpugate as the Prolog alone, a job it refuses requeued rather than held (the install docs'
# nohold_on_prolog_fail), SlurmUser root: `slurm_site(nodes, **PROLOG_ALONE)`.
PROLOG_ALONE: dict[str, object] = {
    "hooks": ("prolog",),
    "slurm_user": "root",
    "scheduler_parameters": "nohold_on_prolog_fail",
}


def submit_policy_lua(site: Site) -> dict[str, object]:
    """A `prepare` step: gpugate's job_submit.lua from the site file (`gpugate submit-policy
    --lua`), which slurm.conf then names (JobSubmitPlugins=lua)."""
    from gpugate.commands.submit_policy import main as submit_policy

    lua = site.base / "job_submit.lua"
    assert submit_policy(["--config", str(site.config), "--lua", "-o", str(lua)]) == 0
    return {"job_submit_lua": lua}


def slurm_or_skip() -> None:
    """Skip the calling test module unless a real Slurm can be run here (root + apt)."""
    from localslurm import SlurmUnavailable, ensure_available

    try:
        ensure_available()
    except SlurmUnavailable as exc:
        pytest.skip(f"no local Slurm: {exc}", allow_module_level=True)


class SlurmSite(NamedTuple):
    """A gpugate site and its running local Slurm; `with` stops the cluster at the block's end."""

    site: Site
    cluster: LocalSlurm

    def env(self, **extra: str) -> dict[str, str]:
        """An admin's environment on this site: Slurm's clients, the site file, its cache."""
        return dict(self.cluster.env(), GPUGATE_CONFIG=str(self.site.config),
                    GPUGATE_CACHE_DIR=str(self.site.base / "cache"), **extra)  # fmt: skip

    def __enter__(self) -> SlurmSite:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cluster.stop()


class SlurmSites:
    """Makes sites with a started Slurm (a module's, or a test's inside `with`); stops them all."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.name = name  # the tmp directory's, by default (the module's, e2e-<what>)
        self.started: list[LocalSlurm] = []

    def __call__(
        self,
        nodes: Sequence[str],
        *,
        snapshots: str | Mapping[str, str] | None = "h100-healthy",
        templates: Mapping[str, str] | None = None,
        config: str | Callable[[Path], str] = "",
        hooks: Iterable[str] = JOB_HOOKS,
        nccl_per_node: bool = False,
        own_state: bool = False,
        prepare: Callable[[Site], Mapping[str, object] | None] | None = None,
        name: str | None = None,
        **cluster_options: object,
    ) -> SlurmSite:
        """A site on `nodes` with its Slurm started.

        snapshots: the bundled snapshot every node replays, or one per node (None: `prepare`
        writes them); templates: bundled snapshots put beside the nodes' under the names a job
        swaps in (Site.add_template); config: the site file's extra lines, or a function of the
        site's base directory that makes them; hooks: the gpugate hooks slurm.conf names (by
        default the job hooks; "health" for the HealthCheckProgram); nccl_per_node, own_state:
        see Site.nccl_dir_per_node; prepare: run on the site before Slurm starts (templates, job
        scripts), it may return more cluster options (a job_submit.lua it wrote);
        cluster_options: Site.cluster's and LocalSlurm's (slurm_user, scheduler_parameters,
        extra_conf, device_cgroups...).
        """
        base = self.tmp_path_factory.mktemp(name or self.name)
        site = Site(base, config(base) if callable(config) else config)
        per_node = {node: snapshots for node in nodes} if isinstance(snapshots, str) else snapshots
        for node, snapshot in (per_node or {}).items():
            site.use_snapshot(node, snapshot)
        for template, snapshot in (templates or {}).items():
            site.add_template(template, snapshot)
        if nccl_per_node:
            site.nccl_dir_per_node(list(nodes), own_state=own_state)
        made = prepare(site) if prepare is not None else None
        cluster = site.cluster(list(nodes), hooks=hooks, **cluster_options, **(made or {}))
        self.started.append(cluster)
        cluster.start()
        return SlurmSite(site, cluster)

    def stop(self) -> None:
        """Stop every cluster this factory started (stopping one twice is harmless)."""
        for cluster in reversed(self.started):
            cluster.stop()

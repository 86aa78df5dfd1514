"""What this node should have: the board profile picked by GPU model, with site overrides."""

from __future__ import annotations

from gpugate.checks.boards import match_board
from gpugate.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Protocol

    from gpugate.checks.facts import Facts
    from gpugate.config.schema import BoardProfile, Config

    class AppXid(Protocol):
        """One application-class Xid a job raised (gpugate/store/app_xids.py, AppXidEntry)."""

        @property
        def gpu(self) -> str: ...
        @property
        def job(self) -> str: ...
        @property
        def uid(self) -> int | None: ...


class Expected(Record):
    """Expectations for one node; None means "no expectation" (the check reports unknown)."""

    board: str | None = None
    gpu_count: int | None = None
    nvlinks_per_gpu: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    ib_ports: int | None = None
    ib_rate_gbps: float | None = None
    nvswitch: bool | None = None
    c2c: bool | None = None  # GPUs on NVLink-C2C to Grace: NVML's PCIe link is not judged
    # Qualification floors (gpugate/qualify/floors.py): the board's, no `expect:` override
    # (the site's floors are in `qualify:`).
    qualify_busbw_gbps: float | None = None
    qualify_h2d_gbps: float | None = None
    # Where gpu_count came from: "expect.gpu_count" (the site) or "Slurm Gres" (slurm.conf).
    gpu_count_from: str | None = None


class Context(Record):
    """What every check receives besides the facts: the config and the expectations."""

    config: Config
    expected: Expected
    # Application-class Xids this node recorded per job, within the window (the hooks load
    # them: gpugate/store/app_xids.py); kernel.xid's cross-job rule reads them.
    app_xids: tuple[AppXid, ...] = ()


def pick_board(facts: Facts, config: Config) -> tuple[str | None, BoardProfile | None]:
    """The board profile named in the config, or the one whose `match` fits a GPU's model
    family (whole words: gpugate/checks/boards.py)."""
    if config.board != "auto":
        return config.board, config.boards.get(config.board)
    return match_board([g.name for g in facts.gpus or () if g.name], config.boards)


def expectations(facts: Facts, config: Config) -> Expected:
    """Merge the board profile with the site's `expect` overrides."""
    board, profile = pick_board(facts, config)
    values: dict[str, object] = {"board": board}
    for field in Expected._fields:
        if field not in _SITE_ONLY:
            override = getattr(config.expect, field, None)
            values[field] = override if override is not None else getattr(profile, field, None)
    values["gpu_count"], values["gpu_count_from"] = gpu_count(facts, config, board, profile)
    return Expected().replace(**values)  # merged by field name: checked by name at run time


# Not merged like the other fields: how many GPUs a node has is first the site's.
_SITE_ONLY = ("board", "gpu_count", "gpu_count_from")


def gpu_count(
    facts: Facts, config: Config, board: str | None, profile: BoardProfile | None
) -> tuple[int | None, str | None]:
    """How many GPUs this node should have and who says so: the site, else slurm.conf, else
    the board, which names a count only for models sold in one (a GB200 tray has 4; an HGX
    A100 comes with 4 or 8 and its board names none)."""
    if config.expect.gpu_count is not None:
        return config.expect.gpu_count, "expect.gpu_count"
    if facts.slurm_gres_gpus is not None:
        return facts.slurm_gres_gpus, "Slurm Gres=gpu"
    count = getattr(profile, "gpu_count", None)
    return (count, f"board {board}") if count is not None else (None, None)


def make_context(facts: Facts, config: Config, app_xids: Iterable[AppXid] = ()) -> Context:
    """The context the checks run with."""
    return Context(config=config, expected=expectations(facts, config), app_xids=tuple(app_xids))

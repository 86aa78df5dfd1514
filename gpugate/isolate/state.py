"""What is isolated on this node, and what an isolation needs to be undone.

Two copies of one record, `Isolation`:
- the node's own, `<state_dir>/isolated.json`: read by every hook on this node (one stat when
  there is none) to leave the isolated GPUs' findings out of its verdict and to keep their
  devices denied (after a reboot the cgroup rule is gone: the prolog writes it again);
- the shared one, `<history_dir>/isolated/<node>.json`: what `gpugate resume NODE` reads to
  put the GPUs back (each GPU's own gres.conf line), what the views list, and where a
  put-back asked on an admin host waits for the node's health check (remote.py).

Both are root's, written atomically, read without following symlinks.
"""

from __future__ import annotations

import json
import os

from gpugate.checks import findings as F
from gpugate.fsutil import atomic_write, private_dir, read_text
from gpugate.isolate import cgroup
from gpugate.isolate.comment import IsolatedGpu
from gpugate.record import Record
from gpugate.store.dirs import history_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpugate.checks.facts import Gpu
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config

LOCAL_FILE = "isolated.json"
SHARED_DIR = "isolated"
READ_CAP = 1 << 20

# Where an isolation stands.
REQUESTED = "requested"  # the hook drained the node and started `gpugate isolate apply`
APPLIED = "applied"  # Slurm counts one GPU less, the device is denied, the node resumed
FAILED = "failed"  # a step failed: the node stays drained (the record says why)


class Isolated(Record):
    """One isolated GPU and the gres.conf line that puts it back."""

    gpu: IsolatedGpu
    line: str = ""  # its own gres.conf line (gpugate.isolate.conf.take_out); "" until written


class PutBack(Record):
    """A put-back asked on another host (gpugate/isolate/remote.py): by whom, where, when,
    why; `started`: when the node's health check started it (0: not yet)."""

    who: str
    host: str
    asked: float
    why: str = ""
    started: float = 0.0


class Isolation(Record):
    """The isolation of one node: which GPUs, where it stands, why it stopped if it did, and a
    put-back asked from another host (in the shared copy)."""

    node: str
    state: str
    gpus: tuple[Isolated, ...] = ()
    why: str = ""
    updated: float = 0.0
    boot_id: str = ""  # the node's boot when the fault was seen: a reboot since is a repair
    put_back: PutBack | None = None

    def to_json(self) -> dict[str, object]:
        """The record as JSON (the files' format)."""
        out: dict[str, object] = {
            "node": self.node,
            "state": self.state,
            "why": self.why,
            "updated": self.updated,
            "boot_id": self.boot_id,
            "gpus": [{**g.gpu.to_dict(), "line": g.line} for g in self.gpus],
        }
        if self.put_back is not None:
            out["put_back"] = self.put_back.to_dict()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Isolation:
        """The record from its JSON form; ValueError when it is not one."""
        try:
            gpus = tuple(
                Isolated(
                    gpu=IsolatedGpu(
                        index=int(g["index"]),
                        minor=int(g["minor"]),
                        serial=str(g.get("serial") or ""),
                        since=int(g["since"]),
                        why=str(g.get("why") or ""),
                    ),
                    line=str(g.get("line") or ""),
                )
                for g in data["gpus"]
            )
            asked = data.get("put_back")
            put_back = None
            if asked is not None:
                put_back = PutBack(
                    who=str(asked["who"]),
                    host=str(asked["host"]),
                    asked=float(asked["asked"]),
                    why=str(asked.get("why") or ""),
                    started=float(asked.get("started") or 0.0),
                )
            return cls(
                node=str(data["node"]),
                state=str(data["state"]),
                gpus=gpus,
                why=str(data.get("why") or ""),
                updated=float(data.get("updated") or 0.0),
                boot_id=str(data.get("boot_id") or ""),
                put_back=put_back,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not an isolation record: {exc}") from exc


def local_path(config: Config) -> str:
    """This node's own copy."""
    return os.path.join(config.state_dir, LOCAL_FILE)


def shared_path(config: Config, node: str) -> str:
    """The copy `gpugate resume` and the views read, in the history directory."""
    return os.path.join(history_dir(config), SHARED_DIR, f"{node}.json")


def load(path: str) -> Isolation | None:
    """The record at `path`; None when there is none. ValueError when it is unreadable."""
    try:
        text = read_text(path, READ_CAP, follow=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return Isolation.from_json(data)


def load_local(config: Config) -> Isolation | None:
    """This node's isolation, or None (the common case: one failed stat)."""
    return load(local_path(config))


def save(config: Config, record: Isolation, local: bool = True) -> None:
    """Write the shared copy (and this node's, with `local`), atomically, 0644 root's."""
    text = json.dumps(record.to_json(), indent=1) + "\n"
    shared = shared_path(config, record.node)
    private_dir(os.path.dirname(shared), 0o755, gid=-1)
    atomic_write(shared, text, 0o644)
    if local:  # state_dir is the hooks' (made by them, with the site's mode): not tightened here
        atomic_write(local_path(config), text, 0o644)


def forget_local(config: Config) -> None:
    """Remove this node's copy (its GPUs are all back)."""
    try:
        os.unlink(local_path(config))
    except FileNotFoundError:
        pass


def sync(config: Config, node: str) -> None:
    """In the prolog: keep this node's isolated GPUs denied (a reboot clears cgroup rules).
    Cheap when nothing is isolated: one failed stat."""
    try:
        record = load_local(config)
    except ValueError:
        return
    if record is None or record.state != APPLIED or config.isolate is None:
        return
    for item in record.gpus:
        cgroup.deny(config.isolate.cgroup_devices, node, item.gpu.minor)


def forget(config: Config, node: str, here: bool) -> None:
    """Drop both records of `node` (its GPUs are back); this node's copy only when `here`."""
    try:
        os.unlink(shared_path(config, node))
    except FileNotFoundError:
        pass
    if here:
        forget_local(config)


def without_isolated(
    config: Config, found: list[Finding], gpus: tuple[Gpu, ...] | None
) -> list[Finding]:
    """The hooks' findings with those of this node's isolated GPUs turned into warnings: the
    GPU is out of Slurm's service already, so it must not drain (or isolate) the node again.
    `gpus`: the snapshot the findings came from (their `gpu` is its NVML index), in which the
    isolated GPUs are found by device (matches). `gpugate resume` does not use this: a GPU
    goes back only once its own checks pass."""
    if not os.path.exists(local_path(config)):  # the common case: nothing isolated here
        return found
    isolated = isolated_indices(config, gpus)
    if not isolated:
        return found
    return [
        F.warn(f.check, f"GPU{f.gpu} is isolated (out of Slurm's service): {f.message}", gpu=f.gpu)
        if f.gpu in isolated and f.status != F.OK
        else f
        for f in found
    ]


def isolated_indices(config: Config, gpus: tuple[Gpu, ...] | None) -> frozenset[int]:
    """The NVML indices, in `gpus`, of this node's applied isolations (empty when none or
    unreadable)."""
    try:
        record = load_local(config)
    except ValueError:
        return frozenset()
    if record is None or record.state != APPLIED:
        return frozenset()
    return frozenset(i for item in record.gpus for i in indices_now(item.gpu, gpus))


def matches(isolated: IsolatedGpu, gpu: Gpu) -> bool:
    """Whether `gpu` (a snapshot's) is the isolated GPU: by device minor, and by serial where
    both have one; by serial alone where NVML gave no minor.

    Not by NVML index: it is a place in NVML's enumeration, which a reboot or a GPU lost from
    the bus can change (the isolated GPU then sits at another index, and its old one names a
    healthy GPU). The minor is the device file the deny and gres.conf name."""
    serials = bool(isolated.serial) and bool(gpu.serial)
    if serials and isolated.serial != gpu.serial:
        return False  # another board in the slot (replaced): not the GPU isolated
    if gpu.minor_number is not None:
        return gpu.minor_number == isolated.minor
    return serials


def indices_now(isolated: IsolatedGpu, gpus: tuple[Gpu, ...] | None) -> list[int]:
    """The NVML index (in `gpus`) of the isolated GPU, found by device (matches). Not seen so:
    a GPU that tells neither minor nor serial (a lost one tells NVML nothing) at the index
    recorded at isolation time, the only word left; with no snapshot, that index."""
    if not gpus:
        return [isolated.index]
    found = [g.index for g in gpus if matches(isolated, g)]
    if found:
        return found
    return [
        g.index
        for g in gpus
        if g.index == isolated.index and g.minor_number is None and not g.serial
    ]

"""Which of a node's GPUs a job holds, told by device: Slurm's GPU indices read through gres.conf.

Slurm's GPU indices (SLURM_JOB_GPUS in the job and in its prolog and epilog, SLURM_STEP_GPUS,
`scontrol -d show job`'s `GRES=gpu:2(IDX:3-4)`) are places in the node's list of GPU device
files, not NVML indices and not device minors (docs/slurm-facts.md, "Slurm's GPU indices"):
with `AutoDetect=off` that list is gres.conf's `File=` paths in the order the file gives them.
Once gpugate takes /dev/nvidia3 out of that list, place 3 is /dev/nvidia4 (put back, the file
returns to its place by device minor: gpugate/isolate/conf.put_back; a hand-edited gres.conf
may still list files in any order). So on a site that isolates GPUs a finding's GPU is matched to the job by its
device minor (NVML `nvmlDeviceGetMinorNumber`, in the facts the finding came from), never by
comparing a Slurm index with an NVML index.

Elsewhere (no isolation record here and `isolate.unit` not `gpu`) gpugate never changed
gres.conf, and Slurm's index is read as NVML's, as before: no file is read. Even on an
isolating site gres.conf is read only when a finding about one GPU needs its owner, which a
healthy prolog never does.
"""

from __future__ import annotations

import os
import sys

from gpugate.checks.kernel_lines import read_line
from gpugate.checks.xid import normalize_pci
from gpugate.isolate.state import local_path as isolation_file
from gpugate.record import Record
from gpugate.regex import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Iterator

    from gpugate.checks.facts import Facts, Gpu
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config

# A GPU's device file, `/dev/nvidia<minor>` (as gpugate.isolate.conf.gpu_file reads it).
_DEVICE = lazy(r"nvidia(\d+)")


class Order(Record):
    """What Slurm's GPU indices name on this node: NVML's indices (`by_index`: gpugate never
    changed gres.conf here), places in gres.conf's GPU `files`, or neither (unknown)."""

    by_index: bool = False
    files: tuple[str, ...] | None = None


BY_INDEX = Order(by_index=True)
UNKNOWN = Order()


class SlurmGpus:
    """Slurm's GPU indices on this node read into the GPUs of one gather (`gpus`, facts)."""

    def __init__(self, config: Config, node: str | None, gpus: tuple[Gpu, ...] | None) -> None:
        self.config, self.node, self.gpus = config, node, gpus or ()
        self._order: Order | None = None  # gres.conf is read when first needed

    def nvml(self, slurm: Collection[int] | None) -> frozenset[int] | None:
        """The NVML indices (in `gpus`) of the GPUs at Slurm's indices `slurm`, matched by
        device minor; a GPU whose minor is unknown is included (it may be one of them); None
        for None, or where gres.conf cannot tell."""
        if slurm is None or not slurm:
            return None if slurm is None else frozenset()
        order = self.order()
        if order.by_index:  # gres.conf never changed here: Slurm's index i is NVML's i
            return frozenset(slurm)
        minors = None if order.files is None else slurm_minors(order.files, slurm)
        if minors is None:
            if order.files is not None:
                note(f"Slurm's GPU indices {sorted(slurm)} are not all in gres.conf "
                     f"({', '.join(order.files)}): which GPUs they are is unknown")  # fmt: skip
            return None
        return frozenset(
            g.index for g in self.gpus if g.minor_number is None or g.minor_number in minors
        )

    def order(self) -> Order:
        """What Slurm's indices name here (gres.conf read once, when first asked)."""
        if self._order is None:
            self._order = self._read()
        return self._order

    def _read(self) -> Order:
        isolated = os.path.exists(isolation_file(self.config))
        iso = self.config.isolate
        if (not isolated and (iso is None or iso.unit != "gpu")) or not self.node:
            return BY_INDEX
        try:
            return Order(files=gres_gpu_files(self.config, self.node))
        except (OSError, ValueError) as exc:  # conf.Unsupported is a ValueError
            if not isolated:  # gpugate could not have changed files it cannot read or edit
                return BY_INDEX  # (missing, AutoDetect): Slurm's own order, as before
            note(f"cannot read Slurm's GPU order from gres.conf ({exc}): GPUs unknown")
            return UNKNOWN


class JobGpus:
    """The GPUs a job holds on this node (Slurm's indices `slurm`, SLURM_JOB_GPUS), by device.

    `holds` asks for one finding's GPU, unknown counting as the job's (the job is not blamed
    for a fault outside it, nor spared one inside it). As a collection it is the NVML indices
    known to be the job's (none where unknown), read when first used: a healthy prolog never
    reads gres.conf.
    """

    def __init__(
        self,
        config: Config,
        node: str | None,
        slurm: Collection[int] | None,
        gpus: tuple[Gpu, ...] | None,
    ) -> None:
        self.order = SlurmGpus(config, node, gpus)
        self.slurm = None if slurm is None else frozenset(slurm)  # None: unknown
        self._nvml: frozenset[int] | None = None
        self._read = False

    def nvml(self) -> frozenset[int] | None:
        """The job's GPUs as NVML indices of the gather; None where unknown."""
        if not self._read:
            self._nvml, self._read = self.order.nvml(self.slurm), True
        return self._nvml

    def holds(self, gpu: int | None) -> bool:
        """Whether the GPU with this NVML index is the job's; a node-wide finding (None) and
        a GPU whose owner cannot be told count as the job's."""
        if gpu is None or self.slurm is None:
            return True
        mine = self.nvml()
        return mine is None or gpu in mine

    def __contains__(self, gpu: object) -> bool:
        return gpu in (self.nvml() or frozenset())

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.nvml() or ()))

    def __len__(self) -> int:
        return len(self.nvml() or ())


def gres_gpu_files(config: Config, node: str) -> tuple[str, ...]:
    """The node's GPU device files in Slurm's order (gres.conf's `File=` paths, as written);
    conf.Unsupported (a ValueError) or OSError where they cannot be read."""
    # Only for a finding about one GPU on a site that isolates GPUs.
    from gpugate.isolate import conf
    from gpugate.isolate.apply import conf_paths

    slurm_conf, gres_conf = conf_paths(config)
    texts = (conf.read_text(slurm_conf), conf.read_text(gres_conf))
    where = {"slurm_name": slurm_conf, "gres_name": gres_conf}
    return conf.read_node_gpus(*texts, node, **where).files


def slurm_minors(files: tuple[str, ...], slurm: Collection[int]) -> frozenset[int] | None:
    """The device minors of Slurm's GPU indices `slurm` over `files` (place i: files[i]);
    None where an index has no file or a file is not `/dev/nvidia<minor>`."""
    out = set()
    for i in slurm:
        if not 0 <= i < len(files):
            return None
        m = _DEVICE.fullmatch(os.path.basename(files[i]))
        if m is None:
            return None
        out.add(int(m.group(1)))
    return frozenset(out)


def split_by_job(failing: list[Finding], held: JobGpus) -> tuple[list[Finding], list[Finding]]:
    """(the job's: node-wide or on its GPUs; elsewhere: on GPUs outside its allocation).

    With the job's GPUs unknown every finding counts as the job's (as the prolog does).
    """
    mine: list[Finding] = []
    elsewhere: list[Finding] = []
    for f in failing:
        (mine if held.holds(f.gpu) else elsewhere).append(f)
    return mine, elsewhere


def job_kernel_lines(lines: list[str], facts: Facts, held: JobGpus) -> list[str]:
    """The kernel lines that may concern the job: those naming a GPU outside its allocation
    (by its PCI address) are left out of its diagnosis (they stay in the bundle's kernel.log).

    A line naming no GPU, or an address not among the node's GPUs (an NVSwitch), is kept.
    """
    others = {
        normalize_pci(g.pci_bus_id)
        for g in facts.gpus or ()
        if g.pci_bus_id and not held.holds(g.index)
    }
    if not others:
        return list(lines)
    kept = []
    for line in lines:
        event = read_line(line)
        if event is None or getattr(event, "pci", None) not in others:
            kept.append(line)
    return kept


def note(message: str) -> None:
    """A line for slurmd's log (hook output goes there)."""
    sys.stderr.write(f"gpugate: {message}\n")

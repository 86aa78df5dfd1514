"""Which of a node's GPUs a job holds, told by device: Slurm's GPU indices read through gres.conf.

Slurm's GPU indices (SLURM_JOB_GPUS in the job and in its prolog and epilog, SLURM_STEP_GPUS,
`scontrol -d show job`'s `GRES=gpu:2(IDX:3-4)`) are places in the node's list of GPU device
files, not NVML indices and not device minors (docs/slurm-facts.md, "Slurm's GPU indices"):
with `AutoDetect=off` that list is gres.conf's `File=` paths in the order the file gives them.
Once gpugate takes /dev/nvidia3 out of that list, place 3 is /dev/nvidia4; once it puts the GPU
back (its line goes after the node's others, gpugate/isolate/conf.put_back), place 7 is
/dev/nvidia3. So on a site that isolates GPUs a finding's GPU is matched to the job by its
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
    from collections.abc import Collection

    from gpugate.checks.facts import Facts, Gpu
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config

# A GPU's device file, `/dev/nvidia<minor>` (as gpugate.isolate.conf.gpu_file reads it).
_DEVICE = lazy(r"nvidia(\d+)")


class Devices(Record):
    """How a job's Slurm GPU indices name devices on this node: read as NVML indices
    (`by_index`: gpugate never changed gres.conf here), as these device minors, or neither
    (`minors` None, not `by_index`: unknown, every GPU counts as the job's)."""

    by_index: bool = False
    minors: frozenset[int] | None = None


BY_INDEX = Devices(by_index=True)
UNKNOWN = Devices()


class JobGpus:
    """The GPUs a job holds on this node, asked finding by finding (`holds`)."""

    def __init__(
        self,
        config: Config,
        node: str | None,
        slurm: Collection[int] | None,
        gpus: tuple[Gpu, ...] | None,
    ) -> None:
        self.config, self.node, self.gpus = config, node, gpus or ()
        self.slurm = None if slurm is None else frozenset(slurm)  # None: unknown
        self._devices: Devices | None = None  # read when a finding first needs it

    def holds(self, gpu: int | None) -> bool:
        """Whether the GPU with this NVML index (in `gpus`' gather) is the job's; a node-wide
        finding (None) and any GPU whose owner cannot be told count as the job's."""
        if gpu is None or self.slurm is None:
            return True
        devices = self.devices()
        if devices.by_index:
            return gpu in self.slurm
        if devices.minors is None:
            return True
        minor = next((g.minor_number for g in self.gpus if g.index == gpu), None)
        return minor is None or minor in devices.minors

    def devices(self) -> Devices:
        """What the job's Slurm indices name here (gres.conf read once, when first needed)."""
        if self._devices is None:
            self._devices = self._read()
        return self._devices

    def _read(self) -> Devices:
        isolated = os.path.exists(isolation_file(self.config))
        iso = self.config.isolate
        if (not isolated and (iso is None or iso.unit != "gpu")) or not self.node:
            return BY_INDEX
        try:
            files = gres_gpu_files(self.config, self.node)
        except (OSError, ValueError) as exc:  # conf.Unsupported is a ValueError
            if not isolated:  # gpugate could not have changed files it cannot read or edit
                return BY_INDEX  # (missing, AutoDetect): Slurm's own order, as before
            note(f"cannot tell the job's GPUs from gres.conf ({exc}): every GPU counted")
            return UNKNOWN
        minors = slurm_minors(files, self.slurm or ())
        if minors is None:
            note(f"the job's GPUs {sorted(self.slurm or ())} are not all in gres.conf "
                 f"({', '.join(files)}): every GPU counted")  # fmt: skip
            return UNKNOWN
        return Devices(minors=minors)


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

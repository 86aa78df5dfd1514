"""GPU checks: presence, driver, heat, clocks, memory health, leftovers and settings."""

from __future__ import annotations

from gpugate.checks import findings as F
from gpugate.checks.declare import COOLING, HARDWARE, LOAD_GPU, REBOOT, RESET, TRANSIENT, check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.checks.expect import Context
    from gpugate.checks.facts import Facts, Gpu


def source_missing(check_id: str, facts: Facts, what: str, source: str) -> list[F.Finding]:
    """The unknown finding of a check whose facts are absent, with the source's own error."""
    why = (facts.source_errors or {}).get(source, "not in the snapshot")
    return [F.unknown(check_id, f"{what} missing: {why}", source=source)]


def nvml_missing(check_id: str, facts: Facts) -> list[F.Finding]:
    """The finding every GPU check returns when NVML gave no GPU list at all."""
    if nvml_cannot_start(facts):  # gpu.driver fails the node with the one message
        return [
            F.unknown(check_id, "not judged: NVML cannot start (see gpu.driver)", source="nvml")
        ]
    return source_missing(check_id, facts, "NVML facts", "nvml")


# Why nvmlInit failed (the snapshot's nvml_error) -> (the cause, what an admin does about it);
# docs/gpu-facts.md 3.12, NVML API reference "nvmlInit_v2" return codes.
_NVML_DOWN = {
    "lib_rm_version_mismatch": (
        "driver/library version mismatch, library {lib} vs kernel module {mod}",
        "reboot the node (or reload the nvidia kernel modules) to run the installed driver",
    ),
    "driver_not_loaded": (
        "the nvidia kernel module is not loaded",
        "load it (modprobe nvidia) or reinstall the driver for the running kernel",
    ),
    "library_not_found": (
        "libnvidia-ml.so.1 not found",
        "install the NVIDIA driver's user-space libraries",
    ),
    "no_permission": ("no permission to open /dev/nvidia*", "fix the device files' permissions"),
}


def nvml_cannot_start(facts: Facts) -> str | None:
    """The one message for NVML refusing to start while NVIDIA GPUs are on the PCI bus.

    None when NVML answered, when it did not say why (a hang, a missing Python binding: not the
    node's fault to judge here), or when the bus shows no NVIDIA GPU (a CPU-only node).
    """
    code, on_bus = facts.nvml_error, facts.pci_gpu_count
    if facts.gpus is not None or code is None or not on_bus:
        return None
    cause, todo = _NVML_DOWN.get(code, (f"nvmlInit: {code}", "reboot the node"))
    versions = {"lib": facts.nvml_library_version, "mod": facts.nvidia_module_version}
    cause = cause.format(**{k: v or "?" for k, v in versions.items()})
    gpus = "1 NVIDIA GPU is" if on_bus == 1 else f"{on_bus} NVIDIA GPUs are"
    return f"NVML cannot start ({cause}) while {gpus} on the PCI bus: {todo}"


def not_reported(check_id: str, gpu: Gpu, what: str) -> F.Finding:
    """Unknown for one GPU that answered NVML but gave no value for `what` (NotSupported)."""
    return F.unknown(check_id, f"GPU{gpu.index} did not report {what}", gpu=gpu.index)


def per_gpu(
    check_id: str, facts: Facts, judge: Callable[[Gpu], list[F.Finding]], passed: str
) -> list[F.Finding]:
    """`judge` over every readable GPU: the problems it finds, or one ok "all N GPUs <passed>".

    GPUs NVML reports lost have no values to judge; `gpu.lost` fails them, and the ok names
    them so a passing check never hides a GPU it could not look at.
    """
    if facts.gpus is None:
        return nvml_missing(check_id, facts)
    readable = [g for g in facts.gpus if not g.error]
    problems = [f for g in readable for f in judge(g)]
    if problems:
        return problems
    lost = ", ".join(f"GPU{g.index}" for g in facts.gpus if g.error)
    if not readable:
        return [F.unknown(check_id, f"no GPU could be read ({lost or 'none listed'})")]
    if lost:
        detail = f"all {len(readable)} readable GPUs {passed}; {lost} not read (see gpu.lost)"
        return [F.ok(check_id, detail)]
    return [F.ok(check_id, f"all {len(readable)} GPUs {passed}")]


@check("gpu.count", action=REBOOT, fault=HARDWARE)
def check_gpu_count(facts: Facts, ctx: Context) -> list[F.Finding]:
    """GPUs NVML sees against expect.gpu_count, else Slurm's Gres=gpu:N, else a board's count."""
    expected, said_by = ctx.expected.gpu_count, ctx.expected.gpu_count_from
    on_bus = facts.pci_gpu_count
    if not_gpu_node(facts, ctx):
        return [F.ok("gpu.count", CPU_ONLY, value=0, limit=expected)]
    if facts.gpus is None:
        # The driver is missing or NVML hung: on a GPU node that is itself a failure.
        why = (facts.source_errors or {}).get("nvml", "no GPU facts in the snapshot")
        want = expected or on_bus
        if want and not nvml_cannot_start(facts):  # else gpu.driver fails it, once
            whose = f"{said_by} says {expected}" if expected else f"{on_bus} on the PCI bus"
            return [F.fail("gpu.count", f"NVML sees no GPUs ({why}); {whose}", limit=want)]
        return nvml_missing("gpu.count", facts)
    seen = len(facts.gpus)
    if expected is not None and seen < expected:
        detail = f"{seen} GPUs seen, {said_by} says {expected}"
        return [F.fail("gpu.count", detail, value=seen, limit=expected)]
    if on_bus is not None and on_bus > seen:
        detail = f"{on_bus} NVIDIA GPUs on the PCI bus but NVML sees {seen}"
        return [F.fail("gpu.count", detail, value=seen, limit=on_bus)]
    if expected is not None:
        return [
            F.ok("gpu.count", f"{seen} GPUs ({said_by}: {expected})", value=seen, limit=expected)
        ]
    if on_bus is not None:
        detail = f"{seen} GPUs, as many as on the PCI bus (set expect.gpu_count or Slurm Gres)"
        return [F.ok("gpu.count", detail, value=seen, limit=on_bus)]
    return [
        F.ok("gpu.count", f"{seen} GPUs seen; no expected count (expect.gpu_count)", value=seen)
    ]


CPU_ONLY = "no NVIDIA GPU on the PCI bus and none expected: not judged by GPU rules"


def not_gpu_node(facts: Facts, ctx: Context) -> bool:
    """A CPU-only node: no NVIDIA GPU on its PCI bus, none NVML sees, and none expected."""
    if facts.gpus or facts.pci_gpu_count:
        return False
    expected = ctx.expected.gpu_count
    return expected == 0 or (expected is None and facts.pci_gpu_count == 0)


@check(
    "gpu.lost", hardware=True, action=REBOOT, fault=HARDWARE
)  # reseat it if it does not come back
def check_gpu_lost(facts: Facts, ctx: Context) -> list[F.Finding]:
    """No GPU that NVML reports lost, needing reset, or unreachable."""
    if facts.gpus is None:
        return nvml_missing("gpu.lost", facts)
    bad = [
        F.fail(
            "gpu.lost",
            f"GPU{g.index} ({g.pci_bus_id or '?'}): {g.error}",
            gpu=g.index,
            value=g.error,
        )
        for g in facts.gpus
        if g.error
    ]
    return bad or [F.ok("gpu.lost", f"all {len(facts.gpus)} GPUs answer NVML")]


def _version(text: str | None) -> tuple[int, ...] | None:
    """ "12.10" -> (12, 10), so versions compare numerically; None when unreadable."""
    parts = (text or "").strip().split(".")
    ok = all(p.isdecimal() and len(p) <= 20 for p in parts)  # int() refuses "²", 5000 digits
    return tuple(int(p) for p in parts) if ok else None


@check("gpu.driver", fault=HARDWARE)
def check_driver(facts: Facts, ctx: Context) -> list[F.Finding]:
    """NVML starts where GPUs are on the bus; the pinned driver; CUDA >= `cuda_driver_min`."""
    # The snapshot holds one node-wide driver version (NVML's system version; a user-space /
    # kernel-module mismatch makes NVML fail, which fails this check). Pinning it in the site
    # config keeps every node on the same driver: the seed's "driver versions consistent".
    cfg = ctx.config.checks.gpu
    have = facts.driver_version
    down = nvml_cannot_start(facts)
    if down:
        return [F.fail("gpu.driver", down, value=facts.nvml_error)]
    if have is None:
        return source_missing("gpu.driver", facts, "driver version", "nvml")
    out = []
    if cfg.driver_version is not None and have != cfg.driver_version:
        detail = f"driver {have}, site requires {cfg.driver_version}"
        out.append(F.fail("gpu.driver", detail, value=have, limit=cfg.driver_version))
    cuda, minimum = facts.cuda_driver_version, cfg.cuda_driver_min
    if minimum is not None:
        if cuda is None:
            out += source_missing("gpu.driver", facts, "CUDA driver version", "nvml")
        elif (have_v := _version(cuda)) is None or (min_v := _version(minimum)) is None:
            detail = f"cannot compare CUDA driver version {cuda!r} with {minimum!r}"
            out.append(F.unknown("gpu.driver", detail))
        elif have_v < min_v:
            # The seed: a driver whose CUDA version is below the runtime's crashes jobs at random.
            detail = f"CUDA driver version {cuda} < {minimum} minimum (upgrade the driver)"
            out.append(F.fail("gpu.driver", detail, value=cuda, limit=minimum))
    return out or [F.ok("gpu.driver", f"driver {have}, CUDA {cuda or '?'}")]


@check("gpu.temperature", hardware=True, action=COOLING, fault=TRANSIENT, load=LOAD_GPU)
def check_temperature(facts: Facts, ctx: Context) -> list[F.Finding]:
    """GPU temperature below the warning and failure limits (seed: below 85 C before a job)."""
    cfg = ctx.config.checks.gpu

    def judge(g: Gpu) -> list[F.Finding]:
        t = g.temperature_c
        if t is None:
            return [not_reported("gpu.temperature", g, "its temperature")]
        for limit, verdict in ((cfg.temperature_max_c, F.fail), (cfg.temperature_warn_c, F.warn)):
            if t >= limit:
                detail = f"GPU{g.index} temperature {t:g}C >= {limit:g}C"
                return [verdict("gpu.temperature", detail, gpu=g.index, value=t, limit=limit)]
        return []

    return per_gpu("gpu.temperature", facts, judge, f"below {cfg.temperature_warn_c:g}C")


@check("gpu.throttle", hardware=True, action=COOLING, fault=TRANSIENT, load=LOAD_GPU)
def check_throttle(facts: Facts, ctx: Context) -> list[F.Finding]:
    """No hardware clock slowdown (thermal, power brake); idle and power-cap reasons are fine."""
    cfg = ctx.config.checks.gpu

    def judge(g: Gpu) -> list[F.Finding]:
        if g.throttle_reasons is None:
            return [not_reported("gpu.throttle", g, "its clock-event (throttle) reasons")]
        # An idle GPU held down by hardware protection has a cooling or power-supply fault.
        for reasons, verdict in ((cfg.throttle_fail, F.fail), (cfg.throttle_warn, F.warn)):
            hit = [r for r in g.throttle_reasons if r in reasons]
            if hit:
                detail = f"GPU{g.index} clocks slowed by {', '.join(hit)}"
                return [verdict("gpu.throttle", detail, gpu=g.index, value=hit)]
        return []

    return per_gpu("gpu.throttle", facts, judge, "free of hardware clock slowdown")


@check("gpu.ecc", hardware=True, action=RESET, fault=HARDWARE)
def check_ecc(facts: Facts, ctx: Context) -> list[F.Finding]:
    """ECC on, no volatile uncorrected errors, lifetime uncorrected errors under the limit."""
    cfg = ctx.config.checks.gpu
    # Volatile: since the driver loaded; any means the GPU needs a reset (NVIDIA memory error
    # management). Aggregate: the InfoROM's lifetime count; the fault-domain seed alerts > 100.
    counters = (
        ("volatile", "ecc_volatile_uncorrected", cfg.ecc_volatile_uncorrected_max, " (reset it)"),
        (
            "aggregate",
            "ecc_aggregate_uncorrected",
            cfg.ecc_aggregate_uncorrected_max,
            " (RMA candidate: open a ticket with its serial)",
        ),
    )

    def judge(g: Gpu) -> list[F.Finding]:
        if g.ecc_mode_enabled is False:
            # With ECC off there are no counts to judge; only the mode itself can fail.
            if not cfg.require_ecc_mode:
                return []
            return [F.fail("gpu.ecc", f"GPU{g.index} ECC mode disabled (required on)", gpu=g.index)]
        out = []
        if g.ecc_mode_enabled is None and cfg.require_ecc_mode:
            out.append(not_reported("gpu.ecc", g, "its ECC mode"))
        for label, field, limit, why in counters:
            count = getattr(g, field)
            if count is None:
                out.append(not_reported("gpu.ecc", g, f"its {label} uncorrected ECC count"))
            elif count > limit:
                detail = f"GPU{g.index} {label} uncorrected ECC {count} > {limit}{why}"
                out.append(F.fail("gpu.ecc", detail, gpu=g.index, value=count, limit=limit))
        return out

    return per_gpu("gpu.ecc", facts, judge, "within the uncorrected ECC limits")


@check(
    "gpu.memory_errors", hardware=True, action=RESET, fault=HARDWARE
)  # a pending remap needs a reset
def check_memory_errors(facts: Facts, ctx: Context) -> list[F.Finding]:
    """No pending page retirement or row remap (needs a GPU reset), no remap failure (RMA)."""

    def judge(g: Gpu) -> list[F.Finding]:
        rows = g.remapped_rows
        remap_known = rows is not None and (rows.pending is not None or rows.failure is not None)
        # Pre-Ampere GPUs retire pages, Ampere and newer remap rows: one of the two is reported.
        if g.retired_pages_pending is None and not remap_known:
            return [not_reported("gpu.memory_errors", g, "page-retirement or row-remap state")]
        # A pending repair takes effect only after a GPU reset, and a remapping failure is one of
        # NVIDIA's RMA criteria (GPU memory error management).
        problems = [
            (g.retired_pages_pending, "page retirement pending: reset the GPU before the next job"),
            (
                rows is not None and rows.pending,
                "row remap pending: reset the GPU before the next job",
            ),
            (rows is not None and rows.failure, "row remapping failed: RMA candidate"),
        ]
        return [
            F.fail("gpu.memory_errors", f"GPU{g.index} {text}", gpu=g.index)
            for bad, text in problems
            if bad
        ]

    return per_gpu("gpu.memory_errors", facts, judge, "have no pending or failed memory repair")


# NVML's GPU recovery action (field 230) in words; NVIDIA pairs it with Xid 154.
_RECOVERY = {
    "gpu_reset": "reset the GPU",
    "node_reboot": "reboot the node",
    "drain_p2p": "drain peer-to-peer traffic",
    "drain_and_reset": "drain, then reset the GPU",
}


@check("gpu.recovery_action", hardware=True, action=RESET, fault=HARDWARE)
def check_recovery_action(facts: Facts, ctx: Context) -> list[F.Finding]:
    """The driver's own verdict: no GPU asks for a reset, reboot or drain (NVML field 230)."""

    def judge(g: Gpu) -> list[F.Finding]:
        action = g.recovery_action
        if action is None:
            return [not_reported("gpu.recovery_action", g, "a recovery action (driver too old?)")]
        if action == "none":
            return []
        detail = f"GPU{g.index} driver requires recovery action {action}"
        detail += f" ({_RECOVERY.get(action, 'see nvidia-smi -q')})"
        return [F.fail("gpu.recovery_action", detail, gpu=g.index, value=action)]

    return per_gpu("gpu.recovery_action", facts, judge, "need no recovery action")


@check("gpu.processes", fault=TRANSIENT, load=LOAD_GPU)
def check_processes(facts: Facts, ctx: Context) -> list[F.Finding]:
    """No process, and at most `leftover_memory_max_mib` used, on any GPU before the job."""
    limit = ctx.config.checks.gpu.leftover_memory_max_mib

    def judge(g: Gpu) -> list[F.Finding]:
        procs, used = g.processes, g.memory_used_mib
        if procs is None and used is None:
            return [not_reported("gpu.processes", g, "its processes or memory use")]
        # A previous job's leftovers hold memory and contexts the next job will be short of.
        if procs:
            names = ", ".join(
                f"pid {p.pid} {p.name or '?'} ({_mib(p.used_memory_mib)})" for p in procs
            )
            detail = f"GPU{g.index} has {len(procs)} leftover process(es): {names} (kill them)"
            return [F.fail("gpu.processes", detail, gpu=g.index, value=[p.pid for p in procs])]
        if used is not None and used > limit:
            detail = f"GPU{g.index} {used} MiB in use by no listed process > {limit} MiB"
            return [F.fail("gpu.processes", detail, gpu=g.index, value=used, limit=limit)]
        return []

    return per_gpu("gpu.processes", facts, judge, f"free: no processes, <= {limit} MiB used")


def _mib(value: int | None) -> str:
    return "? MiB" if value is None else f"{value} MiB"


@check("gpu.persistence", fault=TRANSIENT)
def check_persistence(facts: Facts, ctx: Context) -> list[F.Finding]:
    """Persistence mode on (NVIDIA's advice); off warns unless the site requires it."""
    verdict = F.fail if ctx.config.checks.gpu.require_persistence_mode else F.warn

    def judge(g: Gpu) -> list[F.Finding]:
        if g.persistence_mode is None:
            return [not_reported("gpu.persistence", g, "its persistence mode")]
        if g.persistence_mode:
            return []
        return [verdict("gpu.persistence", f"GPU{g.index} persistence mode off", gpu=g.index)]

    return per_gpu("gpu.persistence", facts, judge, "in persistence mode")


@check("gpu.power_limit", fault=TRANSIENT)
def check_power_limit(facts: Facts, ctx: Context) -> list[F.Finding]:
    """Enforced power limit within the tolerance of the site's `power_limit_w`, when set."""
    cfg = ctx.config.checks.gpu
    want, tolerance = cfg.power_limit_w, cfg.power_limit_tolerance_w
    if want is None:
        return [F.ok("gpu.power_limit", "not configured (checks.gpu.power_limit_w)")]

    def judge(g: Gpu) -> list[F.Finding]:
        have = g.power_limit_w
        if have is None:
            return [not_reported("gpu.power_limit", g, "its enforced power limit")]
        if abs(have - want) <= tolerance:
            return []
        detail = f"GPU{g.index} power limit {have:g} W, configured {want:g} W +-{tolerance:g} W"
        return [F.fail("gpu.power_limit", detail, gpu=g.index, value=have, limit=want)]

    return per_gpu("gpu.power_limit", facts, judge, f"at {want:g} W +-{tolerance:g} W")

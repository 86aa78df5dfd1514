"""Types of the site configuration. The values, documented, are in `gpugate.yaml` beside this.

Every field here must appear in the packaged `gpugate.yaml` (the loader refuses a default file
that lacks one), so the YAML is the one place where defaults live and are explained.
"""

from __future__ import annotations

from gpugate.record import Record


class BoardProfile(Record):
    """What a healthy node of one board type has."""

    # Model-family patterns: each is whole words (case-insensitive, '-' and ' ' alike) that
    # must appear in order in the GPU name ("H200" matches "NVIDIA H200" and "NVIDIA H200 NVL", never
    # "NVIDIA GH200 480GB"); the profile whose pattern has the most words wins.
    match: list[str]
    # null (or left out of a site board): no expectation from the board; the check judges
    # what it can without it (gpu.count: Slurm's Gres / the PCI bus; ib.ports: all ACTIVE).
    gpu_count: int | None = None
    nvlinks_per_gpu: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    ib_ports: int | None = None
    ib_rate_gbps: float | None = None
    nvswitch: bool | None = None
    # GPUs on NVLink-C2C to a Grace CPU (GH200, GB200, GB300): the PCIe link NVML reports is
    # not a host PCIe link and pcie.link does not judge it.
    c2c: bool | None = None
    # Qualification floors (gpugate/qualify/floors.py), GB/s as NCCL-tests reports them: the
    # in-node NCCL all_reduce busbw and the pinned host-to-device copy per GPU; null: judged
    # against the median of the nodes qualified together only.
    qualify_busbw_gbps: float | None = None
    qualify_h2d_gbps: float | None = None


class Expect(Record):
    """Site overrides of the board profile; null keeps the profile's value."""

    gpu_count: int | None
    nvlinks_per_gpu: int | None
    pcie_gen: int | None
    pcie_width: int | None
    ib_ports: int | None
    ib_rate_gbps: float | None
    nvswitch: bool | None
    c2c: bool | None


class SourceTimeouts(Record):
    """Seconds each fact source may take before it is recorded as timed out."""

    nvml: float
    kernel_log: float
    infiniband: float
    host: float
    mounts: float


class Sources(Record):
    """Where facts come from."""

    timeout_s: SourceTimeouts
    sysfs_root: str
    proc_root: str
    kernel_log_file: str | None
    kernel_log_max_lines: int
    required_mounts: list[RequiredMount]


class RequiredMount(Record):
    """A filesystem jobs need (checkpoints, datasets)."""

    path: str
    fsync_ms_max: float


class GpuChecks(Record):
    """Thresholds of the GPU checks."""

    temperature_max_c: float
    temperature_warn_c: float
    ecc_volatile_uncorrected_max: int
    ecc_aggregate_uncorrected_max: int
    driver_version: str | None
    cuda_driver_min: str | None
    throttle_fail: list[str]
    throttle_warn: list[str]
    leftover_memory_max_mib: int
    require_persistence_mode: bool
    require_ecc_mode: bool
    power_limit_w: float | None
    power_limit_tolerance_w: float


class PcieChecks(Record):
    """PCIe link thresholds."""

    generation: str  # "max": the trained maximum; "current": also the current link (under load)


class IbChecks(Record):
    """InfiniBand/RoCE thresholds."""

    require_peermem: bool
    link_layers: list[str]


class KernelChecks(Record):
    """Kernel-log thresholds."""

    app_xid_repeat_max: int  # no longer drains by itself (kept so site files stay valid)
    app_xid_jobs_min: int
    app_xid_users_min: int
    app_xid_jobs_per_user: int
    app_xid_window_h: float
    xid_actions: dict[str, str]  # Xid code -> drain / reboot / warn / ignore (site override)


class HostChecks(Record):
    """Host limits and memory."""

    nofile_min: int
    memory_available_min_mib: int
    swap_used_max_mib: int
    fsync_ms_max: float


class Checks(Record):
    """The checklist's settings."""

    disabled: list[str]
    gpu: GpuChecks
    pcie: PcieChecks
    ib: IbChecks
    kernel: KernelChecks
    host: HostChecks


class Canary(Record):
    """Checks that act (drain, refuse) only on the nodes of some partitions (gate/policy.py)."""

    checks: list[str]  # check ids or families (`ib.*`)
    partitions: list[str]


class Policy(Record):
    """How findings become a decision."""

    unknown: str  # ok / warn / fail: what "could not evaluate" means
    warn_only: list[str]
    report_only: bool  # every check: reported, never acted on
    # Staged roll-out (gate/policy.py: rollout): these checks (ids or families, `ib.*`) report
    # as report_only does and never act; the canary's act only in its partitions.
    report_only_checks: list[str] = []
    canary: Canary = Canary(checks=[], partitions=[])


class Peers(Record):
    """The multi-node peer probe (the seed's `ping -M do -s 1400`, 100 probes, 10 ms)."""

    enabled: bool
    neighbours: int  # ring neighbours probed, half before and half after (choose_peers)
    random: int  # other nodes probed besides, seeded by the job id and the node
    packet_size: int
    count: int
    interval_s: float
    max_avg_ms: float
    max_loss_pct: float


class Budget(Record):
    """How much of the cluster gpugate may drain on its own."""

    max_drained_share: float
    min_drains_allowed: int
    max_drains_per_window: int
    window_s: float
    settle_s: float
    jitter_s: float  # before counting, a failing hook waits up to this long (spreads a storm)
    # Checks whose fault makes the node useless for any job: drained up to hardware_share
    # of a partition (rounded up), never its last node in service (gpugate/gate/budget.py).
    hardware_checks: list[str]
    hardware_share: float


class Prolog(Record):
    """How the Prolog gates a node."""

    deadline_s: float
    allow_user_skip: bool
    refuse_for_other_gpus: bool
    admin_comment: bool
    on_error: str  # allow / refuse: what gpugate's own crash means for the job
    peers: Peers


class TaskProlog(Record):
    """What the TaskProlog exports into the job's environment."""

    enabled: bool
    nccl_debug: str | None
    nccl_ib_timeout: int | None
    nccl_ib_retry_cnt: int | None
    async_error_handling: bool
    nccl_debug_dir: str | None
    # PyTorch's flight recorder (gpugate/hooks/task_prolog.py: flight_recorder_exports).
    flight_recorder: bool
    fr_buffer_size: int
    # Also the TORCH_NCCL_* names, for PyTorch before 2.8 (2.8+ warns once per process).
    fr_legacy_names: bool = True


class Epilog(Record):
    """What the Epilog collects after an abnormal end, and what it may do."""

    always_bundle: bool
    deadline_s: float
    read_timeout_s: float
    log_tail_kib: int
    max_log_files: int
    diagnose_max_mib: float
    kernel_lines_max: int
    drain_on_hardware: bool
    evidence_group: str | None
    view_group: str | None  # SlurmUser's group: the controller's decision records (issue 41)
    retention_days: float | None
    evidence_max_mib: float | None
    evidence_user_share: float | None
    # Flight-recorder dumps collected per node (gpugate/hooks/flightrec_collect.py).
    fr_max_dumps: int
    fr_max_dump_mib: float


class Requeue(Record):
    """Automatic requeue after infrastructure failures (EpilogSlurmctld)."""

    opt_in: bool
    max_restarts: int
    max_restarts_limit: int
    wait_for_bundles_s: float
    max_records: int  # a larger job's records: its digest, and this many in full
    exclude_suspects: bool
    start_now: bool


class Slurm(Record):
    """How gpugate talks to Slurm."""

    backend: str  # auto / cli / pyslurm
    timeout_s: float


class Isolate(Record):
    """One faulty GPU out of service instead of its whole node (gpugate/isolate/; opt in)."""

    unit: str  # "node": drain the node (the default); "gpu": take out only the faulty GPU(s)
    max_gpus: int  # more faulty GPUs than this on one node: drain the node
    checks: list[str]  # check ids whose fault, confined to one GPU, may be isolated
    slurm_conf: str | None  # the slurm.conf slurmctld reads (None: the hook's SLURM_CONF)
    gres_conf: str | None  # the gres.conf with the node's GPU lines (None: beside slurm_conf)
    cgroup_devices: str  # the cgroup v1 devices controller (Slurm's CgroupMountpoint/devices)
    settle_s: float  # how long Slurm may take to report the new GPU count after the reload
    wait_idle_s: float  # how long the isolation waits for the node's last jobs to end
    quiet_s: float  # how long a reconfigure waits for the controller's scripts (isolate/quiet.py)


class ResumeQualify(Record):
    """The qualification level (`gpugate qualify`, 0: none) a drain of each fault class calls for."""

    hardware: int
    transient: int


class Admin(Record):
    """Admin review: the drain history, repeat offenders, the metrics textfile."""

    history_dir: str | None
    history_window_days: float
    history_max_per_node: int
    history_max_entries: int
    rma_after_drains: int
    metrics_file: str | None
    # Resume only after proof (gpugate/admin/resume.py): levels by the drain's check fault class.
    resume_qualify: ResumeQualify = ResumeQualify(hardware=0, transient=0)


class Health(Record):
    """Between jobs: the HealthCheckProgram, healing, repair through Slurm."""

    # `gpugate health` (gpugate/hooks/health.py): its whole run's deadline, and how many passing
    # runs in a row lift a drain gpugate set for a transient check (gpugate/health/heal.py).
    deadline_s: float
    heal_after_passes: int
    # Repair (gpugate/gate/repair.py), opt in: hand reboot-class faults to `scontrol reboot
    # ASAP nextstate=RESUME`; reset a reset-class GPU with `nvidia-smi -r` on an idle node.
    reboot: bool
    gpu_reset: bool
    gpu_reset_timeout_s: float
    # The repair ladder (gpugate/gate/ladder.py): what Slurm makes of a rebooted node (down:
    # out of service until gpugate's post-reboot check and qualification pass; resume: Slurm
    # resumes it as slurmd registers), and how long it waits for a drained node's jobs before
    # it leaves the repair to a person (it acts only on an idle node).
    reboot_nextstate: str = "down"
    repair_wait_h: float = 72.0
    # Per check id, the ladder's steps a drain of that check takes (reset, reboot; [] none),
    # in place of NVIDIA's catalog action; checks not named follow the catalog.
    ladder: dict[str, list[str]] = {}
    # Cross-job suspect voting (gpugate/gate/suspicion.py): a node that failed first in this
    # many failed multi-node jobs within the window (hours) is flagged suspect; 0: no voting.
    suspect_votes: int
    suspect_window_h: float
    suspect_users_min: int  # votes must come from jobs of this many distinct users
    suspect_votes_per_user: int  # one user's jobs count at most this many votes
    # A flag asks for `qualify` (gpugate runs it) or a `review` (an admin looks, gpugate nodes);
    # at most suspect_qualify_per_day qualifications a day for suspects, across the cluster,
    # and a user's jobs at most suspect_qualify_per_user_per_day of them (gate/suspicion.py).
    suspect_action: str
    suspect_qualify_per_day: int
    suspect_qualify_per_user_per_day: int


class Checkpoints(Record):
    """The checkpoint policy the epilog measures jobs against (gpugate/checkpoints/freshness.py)."""

    max_age_s: float  # the newest complete checkpoint at a job's end: older than this is stale


class Drill(Record):
    """Fault drills (`gpugate drill`, gpugate/drill/__init__.py)."""

    max_minutes: float  # the longest window a drill may ask for


class Qualify(Record):
    """Active qualification (`gpugate qualify`, gpugate/qualify/run.py); see gpugate.yaml."""

    reservation: str | None  # null: a MAINT reservation gpugate creates per run
    partition: str | None
    qos: str | None
    account: str | None
    time_limit_min: int
    level: int  # dcgmi diag -r LEVEL (1-4)
    tests: list[str]  # of dcgm, allreduce, h2d, pairs
    python: str  # the interpreter with torch that runs payload.py inside the jobs
    dcgmi: str
    size_mib: int
    iters: int
    min_fraction_of_median: float
    gloo_busbw_gbps: float | None
    pair_busbw_gbps: float | None
    wait_s: float
    ntasks_per_node: int | None  # null: one per GPU from Slurm's Gres, 1 without GPUs
    # Priority (sbatch --nice) of every qualification job; a sweep's (`--idle`, sweep.py) QOS
    # and nice instead.
    nice: int
    sweep_qos: str | None
    sweep_nice: int


class SubmitPartition(Record):
    """One partition's own thresholds of the checkpoint policy (null: the section's)."""

    min_gpus: int | None = None
    min_nodes: int | None = None


class Submit(Record):
    """The checkpoint policy at submission (`gpugate submit-policy --lua`, job_submit.lua)."""

    # A job of this many GPUs in all, or this many nodes, or more must declare a checkpoint
    # directory; 0 turns that threshold off.
    min_gpus: int
    min_nodes: int
    partitions: dict[str, SubmitPartition]
    allow_opt_out: bool
    message: str


class Config(Record):
    """The whole site configuration."""

    facts_file: str | None
    state_dir: str
    admin_group: str | None  # may read state_dir's files (0640 root:<group>); None: root only
    evidence_dir: str
    board: str
    boards: dict[str, BoardProfile]
    expect: Expect
    sources: Sources
    checks: Checks
    policy: Policy
    budget: Budget
    prolog: Prolog
    task_prolog: TaskProlog
    epilog: Epilog
    requeue: Requeue
    slurm: Slurm
    admin: Admin
    health: Health
    submit: Submit
    checkpoints: Checkpoints
    drill: Drill = Drill(max_minutes=30.0)  # a default: configs built before drills
    isolate: Isolate | None = None  # None: a config built in code (the packaged file has it)
    # Where EpilogSlurmctld writes (events, votes, flags, locks, log); None: <state_dir>/controller.
    controller_dir: str | None = None
    qualify: Qualify | None = None  # None: a config built in code (the packaged file has it)

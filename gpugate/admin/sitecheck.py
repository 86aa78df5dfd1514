"""`gpugate selftest`'s checks of the site around the hooks: what would lose a requeue.

Gather once (`gather_slurm`: `scontrol show config`, the nodes and the partitions, through the
Slurm adapter, each call with its timeout) into `SlurmFacts`; the checks are pure functions over
those facts, except the controller's directories, judged from their mode bits for SlurmUser
(gpugate/admin/access.py). Each problem comes with the exact fix:
- SlurmUser cannot reach the nodes' decision records (`<evidence_dir>/controller-view/`) or
  cannot write `controller_dir`: EpilogSlurmctld cannot decide a requeue or record it.
- HealthCheckProgram and EpilogSlurmctld get no `SLURM_CONF` from Slurm: where scontrol finds
  no (or another) slurm.conf without it, hook.env must set it.
- `JobRequeue=0` (jobs without `--requeue` cannot be requeued) and `SchedulerParameters`
  without `nohold_on_prolog_fail` (a job gpugate's prolog refused waits, held).
- a `qualify:` section the nodes cannot run (no such partition, more ranks than GPUs).
- a HealthCheckProgram Slurm never runs periodically (HealthCheckNodeState=REBOOT_ONLY or
  START_ONLY, HealthCheckInterval=0): a warning, what gpugate loses, and the fix.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field, replace

from gpugate.admin.access import Account, Caution, Problem, bits, closed_dirs, denied, group_name
from gpugate.qualify.jobs import ntasks_for
from gpugate.slurm.cli import CliBackend
from gpugate.slurm.control import SlurmError
from gpugate.slurm.parse_text import parse_kv, parse_show_node_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Qualify
    from gpugate.slurm.cli import Runner
    from gpugate.slurm.records import NodeInfo

SLURM_TIMEOUT_S = 15.0
# Where the node epilog leaves its decision record for the controller (docs/flow.md).
CONTROLLER_VIEW = "controller-view"
# The hooks Slurm starts without SLURM_CONF (docs/slurm-facts.md), by their slurm.conf names.
NO_SLURM_CONF = {"health": "HealthCheckProgram", "epilog-slurmctld": "EpilogSlurmctld"}
# How many of the records and controller files are judged: enough to catch a wrong mode, few
# enough that a large evidence tree on shared storage costs no time.
SAMPLE = 200


@dataclass(frozen=True)
class SlurmFacts:
    """What selftest read of the running Slurm; the error says why a part is missing."""

    conf: dict[str, str]  # `scontrol show config`: name -> value; {} when unread
    error: str = ""
    # `scontrol show config` as a hook without SLURM_CONF runs it: the slurm.conf it found.
    bare_path: str | None = None
    bare_error: str = ""
    nodes: tuple[NodeInfo, ...] = ()
    cpus: dict[str, int] = field(default_factory=dict)  # node -> CPUTot
    partitions: tuple[str, ...] = ()
    default_partition: str | None = None
    nodes_error: str = ""

    @property
    def slurm_user(self) -> str | None:
        """SlurmUser without its uid (`SlurmUser = slurm(64030)` -> slurm)."""
        return self.conf.get("SlurmUser", "").split("(")[0] or None


def parse_show_config(text: str) -> dict[str, str]:
    """`scontrol show config`'s `Name = value` lines as {name: value} (the first of each)."""
    conf: dict[str, str] = {}
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        name = name.strip()
        if eq and name and " " not in name:
            conf.setdefault(name, value.strip())
    return conf


def _show_config(backend: CliBackend, *prefix: str) -> tuple[dict[str, str], str]:
    try:
        return parse_show_config(backend.call(*prefix, "scontrol", "show", "config")), ""
    except SlurmError as exc:
        return {}, str(exc)


def gather_slurm(
    slurm_conf: str | None, timeout: float = SLURM_TIMEOUT_S, runner: Runner | None = None
) -> SlurmFacts:
    """Slurm as the hooks see it: with hook.env's SLURM_CONF (else this shell's), and without."""
    backend = CliBackend(timeout=timeout, runner=runner, slurm_conf=slurm_conf)
    conf, error = _show_config(backend)
    if slurm_conf is None and "SLURM_CONF" not in os.environ:
        bare, bare_error = conf, error  # that was already a run without SLURM_CONF
    else:
        # HealthCheckProgram's scontrol, as Slurm starts it: `env -u` drops what this shell or
        # hook.env gives (an empty SLURM_CONF would be read as a file name).
        bare, bare_error = _show_config(backend, "env", "-u", "SLURM_CONF")
    facts = SlurmFacts(conf=conf, error=error, bare_path=bare.get("SLURM_CONF"),
                       bare_error=bare_error)  # fmt: skip
    if error:
        return facts
    try:
        text = backend.scontrol("-o", "show", "node")
        partitions = _records(backend.scontrol("-o", "show", "partition"), "PartitionName")
    except SlurmError as exc:
        return replace(facts, nodes_error=str(exc))
    cpus = {kv["NodeName"]: int(kv["CPUTot"]) for kv in _records(text, "NodeName")
            if kv.get("CPUTot", "").isdigit()}  # fmt: skip
    default = next((p["PartitionName"] for p in partitions if p.get("Default") == "YES"), None)
    return replace(facts, nodes=tuple(parse_show_node_text(text)), cpus=cpus,
                   partitions=tuple(p["PartitionName"] for p in partitions),
                   default_partition=default)  # fmt: skip


def _records(text: str, key: str) -> list[dict[str, str]]:
    """The `scontrol -o` records of `text` that start with `key=`."""
    return [parse_kv(line) for line in text.splitlines() if line.startswith(f"{key}=")]


# --- Slurm's settings ------------------------------------------------------------------------


def check_slurm_read(facts: SlurmFacts) -> list[Problem]:
    """Slurm's config must be readable, or none of the checks below could run."""
    if not facts.error:
        return []
    what = (
        f"cannot read Slurm's config ({facts.error}): JobRequeue, nohold_on_prolog_fail, "
        "SLURM_CONF for the hooks and the qualify partition are unchecked"
    )
    if controller_down(facts.error):
        # scontrol found slurm.conf (it names the controller) but nobody answered there.
        return [Problem(what, "start slurmctld on the controller (systemctl start slurmctld; "
                        "`scontrol ping` says UP), or let this host reach SlurmctldHost on "
                        "SlurmctldPort (6817 by default; a firewall, the name's address), "
                        "then run gpugate selftest again")]  # fmt: skip
    return [Problem(what, "run gpugate selftest where scontrol works "
                    "(SLURM_CONF=/path/to/slurm.conf gpugate selftest), and put the line "
                    "SLURM_CONF=/path/to/slurm.conf in /etc/gpugate/hook.env")]  # fmt: skip


# scontrol's words when slurm.conf was read but slurmctld did not answer (22.05 to 25.11).
CONTROLLER_DOWN = ("Unable to contact slurm controller", "Socket timed out on send/recv",
                   "Connection refused", "Zero Bytes were transmitted or received")  # fmt: skip


def controller_down(error: str) -> bool:
    """Whether scontrol's error says slurmctld is down or unreachable (not slurm.conf missing)."""
    return any(words in error for words in CONTROLLER_DOWN)


def check_node_known(node: str, facts: SlurmFacts) -> list[Problem]:
    """This node's name (SLURMD_NODENAME, else the host name) must be a Slurm node: the
    hooks' drains, `{node}` in facts_file and Gres are all read under Slurm's name."""
    if facts.nodes_error or not facts.nodes or any(n.name == node for n in facts.nodes):
        return []
    names = ", ".join(n.name for n in facts.nodes[:5]) + (" ..." if len(facts.nodes) > 5 else "")
    return [Problem(f"{node} (SLURMD_NODENAME, else this host's name) is no Slurm node "
                    f"({names}): the hooks were run under a name Slurm never gives them",
                    "gpugate selftest --node NAME (Slurm's NodeName of this host), or "
                    "SLURMD_NODENAME=NAME gpugate selftest")]  # fmt: skip


def check_job_requeue(conf: dict[str, str]) -> list[Problem]:
    """JobRequeue=0: a job without `--requeue` can be neither requeued nor refused into the queue.

    slurm.conf(5) JobRequeue: "If JobRequeue is set to a value of 0, then batch jobs will not be
    requeued unless explicitly enabled by the user" (default 1). Seen on 22.05.8: `scontrol
    requeue` of such a job fails with "Requested operation is presently disabled", and a job
    whose prolog failed is cancelled, not requeued (docs/slurm-facts.md).
    """
    if conf.get("JobRequeue", "").strip() != "0":
        return []
    return [Problem("JobRequeue = 0: batch jobs are not requeueable unless submitted with "
                    "--requeue; EpilogSlurmctld's `scontrol requeue` of an opted-in job is "
                    "refused (\"Requested operation is presently disabled\"), and a job "
                    "gpugate's prolog refuses is cancelled instead of requeued",
                    "set JobRequeue=1 in slurm.conf (Slurm's default) and run `scontrol "
                    "reconfigure`, or have every opted-in job submitted with sbatch --requeue")]  # fmt: skip


def check_prolog_hold(conf: dict[str, str]) -> list[Problem]:
    """Without nohold_on_prolog_fail a job gpugate's prolog refused waits, held, for an admin.

    slurm.conf(5) SchedulerParameters, nohold_on_prolog_fail: "By default, if the Prolog exits
    with a non-zero value the job is requeued in a held state. By specifying this parameter the
    job will be requeued but not held so that the scheduler can dispatch it to another host."
    """
    raw = conf.get("SchedulerParameters", "")
    params = [] if raw in ("", "(null)") else [p.strip() for p in raw.split(",") if p.strip()]
    if "nohold_on_prolog_fail" in params:
        return []
    wanted = ",".join([*params, "nohold_on_prolog_fail"])
    return [Problem("SchedulerParameters lacks nohold_on_prolog_fail: a job gpugate's prolog "
                    "refuses goes back to the queue held (Priority 0, `launch failed requeued "
                    "held`) and waits for `scontrol release` instead of starting on a healthy "
                    "node", f"set SchedulerParameters={wanted} in slurm.conf and run `scontrol "
                    "reconfigure`")]  # fmt: skip


# HealthCheckNodeState's words that stop the periodic runs, as `scontrol show config` prints
# them (health_check_node_state_str, src/common/slurm_protocol_defs.c), each with when slurmd
# runs the program instead. Read at slurm-25-11-7-1 and slurm-26-05-3-1 (docs/slurm-facts.md,
# "HealthCheckNodeState=REBOOT_ONLY"): slurmctld sends no periodic request under either
# (src/slurmctld/controller.c); under REBOOT_ONLY slurmd skips its start-up run
# (src/slurmd/slurmd/slurmd.c) and slurmctld asks for one run when a node whose reboot it
# issued (`scontrol reboot`: REBOOT_ISSUED) registers again (validate_node_specs,
# src/slurmctld/node_mgr.c), not after a reboot it did not issue. Neither combines with another
# state: slurmctld and slurmd refuse to start (fatal, src/common/read_config.c, 26.05).
ONLY_STATES = {
    "REBOOT_ONLY": "only when a node comes back from a reboot Slurm issued (`scontrol reboot`, "
    "which gpugate's health.reboot asks for), once it has registered: not when slurmd starts, "
    "not after a reboot Slurm did not issue",
    "START_ONLY": "only when slurmd starts, before it registers",
}
# What gpugate's health run does between jobs, which a site without periodic runs goes without
# (docs/guide/between-jobs.md).
PERIODIC_WORK = (
    "gpugate's transient drains are not lifted by passing runs (health.heal_after_passes): they "
    "wait for `gpugate resume`; a GPU that fails on an idle node waits for the next job's "
    "prolog; the NCCL sweep, an asked isolation put-back and a drill whose command died wait too"
)
PERIODIC_FIX = (
    "set HealthCheckNodeState=ANY,CYCLE and HealthCheckInterval=300 in slurm.conf and run "
    "`scontrol reconfigure`: slurmd then also runs the health check when it starts, before it "
    "registers, after any reboot (the post-reboot check REBOOT_ONLY gives, earlier)"
)


def check_health_periodic(conf: dict[str, str]) -> list[Problem]:
    """A HealthCheckProgram Slurm never runs periodically: gpugate's healing does not run."""
    program = conf.get("HealthCheckProgram", "").strip()
    if program in ("", "(null)"):
        return []
    states = {w.strip().upper() for w in conf.get("HealthCheckNodeState", "").split(",")}
    only = sorted(states & ONLY_STATES.keys())
    interval = conf.get("HealthCheckInterval", "").split()
    if only:
        when = f"HealthCheckNodeState = {only[0]}: slurmd runs {program} {ONLY_STATES[only[0]]}"
    elif interval and interval[0] == "0":
        when = (f"HealthCheckInterval = 0: slurmd never runs {program} periodically (at its "
                "start only from Slurm 25.11; never before)")  # fmt: skip
    else:
        return []
    return [Caution(f"{when}; {PERIODIC_WORK}", PERIODIC_FIX)]


def check_slurm_conf_reaches(hook: str, env: dict[str, str], facts: SlurmFacts) -> list[Problem]:
    """A hook Slurm starts without SLURM_CONF finds this cluster's slurm.conf (hook.env's line)."""
    if hook not in NO_SLURM_CONF or env.get("SLURM_CONF") or facts.error:
        return []
    running = facts.conf.get("SLURM_CONF")
    fix = f"add the line SLURM_CONF={running or '/path/to/slurm.conf'} to /etc/gpugate/hook.env"
    label = NO_SLURM_CONF[hook]
    if facts.bare_error:
        return [Problem(f"{label} gets no SLURM_CONF from Slurm and hook.env sets none; "
                        f"without it scontrol fails here ({facts.bare_error}); every "
                        f"{hook} run would fail the same way", fix)]  # fmt: skip
    if running and facts.bare_path and not _same_file(running, facts.bare_path):
        return [Problem(f"{label} gets no SLURM_CONF from Slurm and hook.env sets none; without "
                        f"it scontrol reads {facts.bare_path}, not this cluster's {running}",
                        fix)]  # fmt: skip
    return []


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def check_qualify_geometry(qc: Qualify | None, facts: SlurmFacts) -> list[Problem]:
    """`qualify:` asks for a partition and ranks per node the nodes can give."""
    if qc is None or facts.error or facts.nodes_error:
        return []
    choose = f"set qualify.partition to one of: {', '.join(facts.partitions) or '(none)'}"
    partition = qc.partition or facts.default_partition
    if partition is None:
        return [Problem("qualify.partition is null and the cluster has no default partition: "
                        "`gpugate qualify`'s jobs have nowhere to run", choose)]  # fmt: skip
    if partition not in facts.partitions:
        return [Problem(f"qualify.partition {partition!r} is no partition of this cluster: "
                        "`gpugate qualify`'s sbatch would be refused", choose)]  # fmt: skip
    nodes = [n for n in facts.nodes if partition in n.partitions]
    if not nodes:
        return [Problem(f"qualify partition {partition!r} holds no nodes", choose)]
    return [*_more_ranks_than_gpus(qc, nodes), *_more_ranks_than_cpus(qc, nodes, facts.cpus)]


def _more_ranks_than_gpus(qc: Qualify, nodes: list[NodeInfo]) -> list[Problem]:
    wanted = qc.ntasks_per_node
    short = sorted((n for n in nodes if wanted and n.gres_gpus and n.gres_gpus < wanted),
                   key=lambda n: n.gres_gpus or 0)  # fmt: skip
    if short:
        names = ", ".join(n.name for n in short[:5]) + (" ..." if len(short) > 5 else "")
        return [Problem(f"qualify.ntasks_per_node {wanted} is more than the GPUs Slurm gives "
                        f"{names} ({short[0].gres_gpus} from Gres): ranks would share a GPU, "
                        "which NCCL refuses", f"set qualify.ntasks_per_node: null (one rank "
                        f"per GPU, from Gres) or at most {short[0].gres_gpus}")]  # fmt: skip
    return []


def _more_ranks_than_cpus(
    qc: Qualify, nodes: list[NodeInfo], cpus: dict[str, int]
) -> list[Problem]:
    """A job asking more tasks per node than the node has CPUs is accepted by sbatch and then
    stays PENDING (Reason=PartitionConfig; seen on 22.05.8) until qualify.wait_s cancels it.

    qualify refuses a set ntasks_per_node above the CPUs and caps its default (one per GPU) at
    them (jobs.ntasks_for); a capped run tests fewer GPUs than the node has, so both are said."""
    short = [(n.name, ntasks_for(qc, n.gres_gpus), cpus[n.name]) for n in nodes
             if n.name in cpus and ntasks_for(qc, n.gres_gpus) > cpus[n.name]]  # fmt: skip
    if not short:
        return []
    fewest = min(c for _, _, c in short)
    names = ", ".join(name for name, _, _ in short[:5]) + (" ..." if len(short) > 5 else "")
    ranks = (
        f"qualify.ntasks_per_node {qc.ntasks_per_node}"
        if qc.ntasks_per_node
        else ("one rank per Gres GPU")
    )
    then = ("qualify refuses it (a job Slurm would keep PENDING, PartitionConfig)"
            if qc.ntasks_per_node else f"qualify runs {fewest} ranks, testing {fewest} of the "
            "node's GPUs (a job of more would stay PENDING, PartitionConfig)")  # fmt: skip
    # The default (one rank per GPU) is capped at the CPUs and still runs: a warning only.
    kind = Problem if qc.ntasks_per_node else Caution
    return [kind(f"{ranks} asks {short[0][1]} tasks of {names}, which has {short[0][2]} CPUs: "
                 f"{then}", f"set qualify.ntasks_per_node: {fewest} (the all-reduce then "
                 "runs on that many GPUs of each node)")]  # fmt: skip


# --- what SlurmUser must reach -----------------------------------------------------------------


def controller_dir_of(config: object) -> str:
    """controller_dir, or its default `<state_dir>/controller` (and for configs without it)."""
    state_dir = str(getattr(config, "state_dir", "/var/lib/gpugate"))
    return getattr(config, "controller_dir", None) or os.path.join(state_dir, "controller")


def check_controller_access(evidence_dir: str, controller_dir: str, who: Account) -> list[Problem]:
    """EpilogSlurmctld, as SlurmUser, reads the nodes' decision records and writes controller_dir."""
    return [*check_records(evidence_dir, who), *check_controller_dir(controller_dir, who)]


def check_records(evidence_dir: str, who: Account) -> list[Problem]:
    """Every directory down to `<evidence_dir>/controller-view/<job>/` is traversable by `who`,
    and the records are readable."""
    view = os.path.join(evidence_dir, CONTROLLER_VIEW)
    # Above controller-view/: passable by others (o+x, nothing listed). controller-view/ and
    # below: root's and SlurmUser's group only (issue 41), never opened to others.
    closed = [(d, c) for d, c in closed_dirs(evidence_dir, who)]
    group = group_name(who)
    mine = (f"chgrp -R {group} {view} && find {view} -type d -exec chmod 0750 {{}} + "
            "-o -type f -exec chmod 0640 {} +")  # fmt: skip
    if os.path.isdir(view) and who.uid != 0 and not bits(os.stat(view), who) & 1:
        closed.append((view, mine))
    if closed:
        return [Problem(f"EpilogSlurmctld (as {who.name}) cannot reach the nodes' decision "
                        f"records in {view}: {', '.join(d for d, _ in closed)} closed to "
                        f"{who.name}; it could not see an infrastructure failure, and no "
                        "opted-in job would be requeued (the fix opens evidence_dir for "
                        f"traversal only and gives the records to {group}: the evidence stays "
                        "unlisted and unread, the records closed to others; set "
                        f"epilog.view_group: {group})",
                        " && ".join(c for _, c in closed))]  # fmt: skip
    bad = unreadable_records(view, who)
    if not bad:
        return []
    return [Problem(f"{len(bad)} decision record(s) or job directories under {view} are closed "
                    f"to {who.name} (e.g. {bad[0]}); set epilog.view_group: {group}",
                    mine)]  # fmt: skip


def unreadable_records(view: str, who: Account) -> list[str]:
    """The job directories `who` cannot traverse and records it cannot read (a sample)."""
    bad: list[str] = []
    for job in _entries(view):
        if not stat.S_ISDIR(job[1].st_mode):
            continue
        if not _allows(job[1], who, 1):
            bad.append(f"{job[0]}: mode {job[1].st_mode & 0o7777:04o}")
            continue
        bad += [f"{path}: mode {st.st_mode & 0o7777:04o}" for path, st in _entries(job[0])
                if stat.S_ISREG(st.st_mode) and not _allows(st, who, 4)]  # fmt: skip
    return bad


def check_controller_dir(controller_dir: str, who: Account) -> list[Problem]:
    """controller_dir exists (or `who` may create it) and `who` may write it and its files."""
    create = f"install -d -o {who.name} -g {group_name(who)} -m 0750 {controller_dir}"
    opened = [c for _, c in closed_dirs(os.path.dirname(controller_dir), who)]
    fix = " && ".join([*opened, create])
    if not os.path.isdir(controller_dir):
        parent = os.path.dirname(controller_dir)
        while not os.path.exists(parent) and parent != os.path.dirname(parent):
            parent = os.path.dirname(parent)
        why = denied(parent, who, 3)
        if why is None:
            return []  # EpilogSlurmctld creates it
        return [Problem(f"controller_dir {controller_dir} does not exist and EpilogSlurmctld "
                        f"(as {who.name}) cannot create it: {why}", fix)]  # fmt: skip
    why = denied(controller_dir, who, 3)
    if why:
        return [Problem(f"EpilogSlurmctld (as {who.name}) cannot record its decisions in "
                        f"controller_dir {controller_dir}: {why}; `gpugate report` would show "
                        "no requeue decision", fix)]  # fmt: skip
    bad = [path for path, st in _entries(controller_dir)
           if not _allows(st, who, 3 if stat.S_ISDIR(st.st_mode) else 2)]  # fmt: skip
    if bad:
        return [Problem(f"{len(bad)} file(s) in controller_dir {controller_dir} are not "
                        f"writable by {who.name} (e.g. {bad[0]})",
                        f"chown -R {who.name}:{group_name(who)} {controller_dir}")]  # fmt: skip
    return []


def _entries(directory: str) -> list[tuple[str, os.stat_result]]:
    """Up to SAMPLE entries of `directory`, each with its lstat (no link is followed)."""
    found: list[tuple[str, os.stat_result]] = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if len(found) >= SAMPLE:
                    break
                try:
                    found.append((entry.path, entry.stat(follow_symlinks=False)))
                except OSError:
                    continue
    except OSError:
        return []
    return [(p, st) for p, st in found if not stat.S_ISLNK(st.st_mode)]


def _allows(st: os.stat_result, who: Account, want: int) -> bool:
    """Whether the mode bits of this stat give `who` all of `want` (root: everything)."""
    return who.uid == 0 or bits(st, who) & want == want

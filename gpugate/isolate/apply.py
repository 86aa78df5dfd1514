"""Take one GPU out of Slurm's service, and put it back: the sequence measured on real Slurm.

docs/slurm-facts.md ("One GPU out of a node") has the measurements; in short, with the node
drained by gpugate first (nothing new starts while its configuration changes):

1. deny the GPU's device below slurmd's cgroup (cgroup.py): Slurm itself never denies a
   device that gres.conf no longer names;
2. write gres.conf without the GPU's file and slurm.conf's `Gres=gpu:N-1`, together
   (conf.py): either alone, and Slurm marks the node INVAL and drains it itself;
3. `scontrol reconfigure`: on 24.11 it restarts slurmctld and the slurmds, which take the new
   count; 22.05's does not (the node goes INVALID_REG and cannot be resumed), so 22.05 is a
   site that cannot isolate (`site_problem`) and keeps today's drain. Every reconfigure here
   (isolating, putting back, undoing) waits for a quiet controller first (quiet.py: 24.11's
   reconfigure kills slurmctld's running PrologSlurmctld/EpilogSlurmctld and can crash it);
   steps 1-3 start only once it is quiet, so a refusal there changes nothing;
4. read the node back: `Gres=gpu:N-1`, no INVALID_REG, still drained by gpugate;
5. prove the deny on the node (probe.py: a process in a job-like group gets EPERM opening the
   GPU's device), write the node Comment naming the GPU (comment.py) and resume.

The deny reaches a job only where Slurm confines jobs to their devices (task/cgroup with
ConstrainDevices=yes): elsewhere the isolation is refused (confine.py, `site_problem`).

A hook never runs these steps itself: 24.11's reconfigure restarts the slurmd that is waiting
for the hook. The hook drains as today, records the request, and starts `gpugate isolate
apply NODE` in a session of its own (`request`), which waits for the node to be idle. Any
step that fails, or an answer from Slurm that is not the expected one, puts the files back
and leaves the node drained, with a reason saying why: never worse than a drain.
"""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import AbstractContextManager, nullcontext

from gpugate import log
from gpugate.child import cli_command
from gpugate.config.classes import this_node
from gpugate.fsutil import FileLock, lock_file
from gpugate.isolate import cgroup, conf, confine, probe, quiet, state
from gpugate.isolate.comment import IsolatedGpu, format_comment
from gpugate.isolate.plan import targets
from gpugate.slurm.reasons import drain_reason
from gpugate.store.locks import ISOLATE
from gpugate.store.metrics import note_isolated

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpugate.checks.facts import Gpu
    from gpugate.checks.findings import Finding
    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl
    from gpugate.slurm.records import NodeInfo

    # (slurmd's devices group, GPU minor, a root-only scratch directory) -> why the GPU's
    # device is not denied to jobs there, or None (probe.not_denied)
    Prove = Callable[[str, int, str], str | None]

# Measured: 24.11's `scontrol reconfigure` takes a GPU count change; 22.05's does not. (23.11
# made reconfigure a restart too, by its release notes; not measured, so not trusted.)
MIN_SLURM = (24, 11)
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
POLL_S = 0.5


class IsolationFailed(RuntimeError):
    """A step of the isolation (or of putting a GPU back) did not do what it must."""


class Abandoned(IsolationFailed):
    """The node is no longer gpugate's to change (an admin resumed or drained it)."""


def conf_paths(config: Config, slurm_conf: str | None = None) -> tuple[str, str]:
    """(slurm.conf, gres.conf) as the isolation edits them: `isolate.slurm_conf`, else the one
    Slurm's commands read here (`slurm_conf`, SLURM_CONF, Slurm's default)."""
    iso = config.isolate
    slurm_conf = (
        (iso.slurm_conf if iso else None)
        or slurm_conf
        or os.environ.get("SLURM_CONF")
        or DEFAULT_SLURM_CONF
    )
    gres_conf = (iso.gres_conf if iso else None) or os.path.join(
        os.path.dirname(slurm_conf), "gres.conf"
    )
    return slurm_conf, gres_conf


def site_problem(
    config: Config, slurm: SlurmControl, node: str, slurm_conf: str | None = None
) -> str | None:
    """Why GPUs of `node` cannot be isolated safely here; None when they can."""
    version = slurm.cli.version()
    if version is None or version < MIN_SLURM:
        have = ".".join(map(str, version)) if version else "unknown"
        return (
            f"Slurm {have}: `scontrol reconfigure` does not take a GPU count change before "
            f"{MIN_SLURM[0]}.{MIN_SLURM[1]} (docs/slurm-facts.md)"
        )
    shown = slurm.cli.scontrol("show", "config")
    if configless(shown):
        return (
            "configless Slurm (SlurmctldParameters=enable_configless): slurmd reads slurm.conf "
            "and gres.conf from the controller, not the files gpugate would edit here"
        )
    # Before anything else about the files: a deny no job is below is no isolation (issue 44).
    unconfined = confine.problem(shown, conf_paths(config, slurm_conf)[0])
    if unconfined:
        return unconfined
    devices = config.isolate.cgroup_devices if config.isolate else "/sys/fs/cgroup/devices"
    why = cgroup.problem(devices)
    if why:
        return why
    slurm_conf, gres_conf = conf_paths(config, slurm_conf)
    for path in (slurm_conf, gres_conf):
        if not os.access(path, os.R_OK | os.W_OK):
            return f"{path}: not writable here"
    try:
        texts = (conf.read_text(slurm_conf), conf.read_text(gres_conf))
        conf.read_node_gpus(*texts, node, slurm_name=slurm_conf, gres_name=gres_conf)
    except (conf.Unsupported, OSError, ValueError) as exc:
        return str(exc)
    return None


def route(config: Config, node: str) -> str:
    """How this node would deny an isolated GPU's device, and why that way (cgroup.route)."""
    devices = config.isolate.cgroup_devices if config.isolate else "/sys/fs/cgroup/devices"
    return cgroup.route(devices, node)


def configless(shown: str) -> bool:
    """Whether `scontrol show config` says the controller serves the configuration."""
    for line in shown.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "SlurmctldParameters" and "enable_configless" in value:
            return True
    return False


def request(
    config: Config,
    slurm: SlurmControl,
    node: str,
    failing: list[Finding],
    gpus: tuple[Gpu, ...] | None,
    boot_id: str | None = None,
) -> str:
    """After a hook drained `node` for `failing`: start the isolation of the faulty GPU(s) if
    this site and fault allow it. Returns a line for the hook's log: what it started or why
    the node stays drained. Never raises. `boot_id`: the node's boot now (a reboot since the
    fault is repair evidence for the health check)."""
    try:
        chosen = targets(config, failing, gpus)
        if isinstance(chosen, str):
            return f"node drained, not isolated: {chosen}"
        earlier = state.load_local(config)
        if earlier is not None and earlier.state in (state.REQUESTED, state.APPLIED):
            # One isolation per node at a time; a fault on a second GPU while one is out is
            # more than one GPU at fault: the node stays drained (isolate.max_gpus).
            return f"node drained, not isolated: an isolation is already {earlier.state} here"
        why = site_problem(config, slurm, node)
        if why:
            _event(config, node, "refused", chosen, why)
            return f"node drained, not isolated: {why}"
        record = state.Isolation(
            node=node,
            state=state.REQUESTED,
            gpus=tuple(state.Isolated(gpu=g) for g in chosen),
            updated=time.time(),
            boot_id=boot_id or "",
        )
        state.save(config, record)
        pid = _spawn(config, node)
        _event(config, node, "requested", chosen, f"gpugate isolate apply, pid {pid}")
        return f"isolating {_names(chosen)} (gpugate isolate apply {node}, pid {pid})"
    except Exception as exc:  # the drain stands: an isolation is only ever an improvement
        return f"node drained, not isolated: {type(exc).__name__}: {exc}"


def _spawn(config: Config, node: str) -> int:
    """`gpugate isolate apply NODE`, detached (spawn)."""
    return spawn(config, node, "apply")


def spawn(config: Config, node: str, action: str) -> int:
    """`gpugate isolate ACTION NODE` (apply, put-back) in a session of its own, outliving the
    hook and slurmd's restart; its output appended to <state_dir>/isolate.log. Its pid."""
    path = os.path.join(config.state_dir, "isolate.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        proc = subprocess.Popen(
            [*cli_command(), "isolate", action, node],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            close_fds=True,
            start_new_session=True,
        )
    finally:
        os.close(fd)
    return proc.pid


def apply(
    config: Config, slurm: SlurmControl, node: str, prove: Prove = probe.not_denied
) -> state.Isolation:
    """Carry out the requested isolation of `node` (run on the node, as root), one at a time:
    two hooks of one node may both have asked (IsolationFailed for the second). `prove`: the
    proof that a job cannot open the GPU (probe.py; a test passes its own)."""
    with FileLock(lock_file(config.state_dir, ISOLATE), wait_s=0) as lock:
        if not lock.held:
            raise IsolationFailed(f"{node}: another `gpugate isolate apply` runs")
        return _apply(config, slurm, node, prove)


def _apply(config: Config, slurm: SlurmControl, node: str, prove: Prove) -> state.Isolation:
    record = state.load_local(config)
    if record is None or record.state != state.REQUESTED:
        raise IsolationFailed(f"{node}: no isolation requested here")
    iso = config.isolate
    assert iso is not None  # request() checked
    slurm_conf, gres_conf = conf_paths(config)
    original = ("", "")
    denied: list[int] = []
    lines: list[str] = []
    changed = commented = reconfigured = False
    try:
        _wait_idle_drained(slurm, node, iso.wait_idle_s)
        # Held until Slurm reports the new count: the next gpugate reconfigure waits for the
        # controller this one restarts. ControllerBusy here: nothing changed yet.
        with quiet.reconfigure_slot(config, slurm.cli, iso.quiet_s):
            # Read only now: an admin may have edited them while the node's last jobs ran.
            original = (conf.read_text(slurm_conf), conf.read_text(gres_conf))
            count, texts, lines = _taken_out(record, node, original, (slurm_conf, gres_conf))
            for item in record.gpus:
                cgroup.deny(iso.cgroup_devices, node, item.gpu.minor)
                denied.append(item.gpu.minor)
            conf.write_conf(gres_conf, texts[1])
            conf.write_conf(slurm_conf, texts[0])
            changed = reconfigured = True  # from the call on, Slurm may hold the new count
            slurm.cli.scontrol("reconfigure")
            want = count - len(record.gpus)
            _wait_count(slurm, node, want, iso.settle_s)
        isolated = [item.gpu for item in record.gpus]
        _prove_denied(prove, iso.cgroup_devices, node, isolated, config.state_dir)
        slurm.set_node_comment(node, format_comment(isolated))
        commented = True
        done = record.replace(
            state=state.APPLIED,
            gpus=tuple(
                item.replace(line=line) for item, line in zip(record.gpus, lines, strict=True)
            ),
            why="",
            updated=time.time(),
        )
        state.save(config, done)
        slurm.resume(node)
        note_isolated(config, node, len(isolated))
        _event(config, node, "applied", isolated, f"Gres=gpu:{want}")
        return done
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        paths = (slurm_conf, gres_conf)
        if not _undo(config, slurm, node, original, changed, denied, paths, reconfigured, True):
            return _kept_out(config, slurm, record, lines, why)
        if commented:  # the Comment must not name a GPU that is not out
            try:
                slurm.clear_node_comment(node)
            except Exception as error:
                log.error(config.state_dir, f"isolate {node}: could not clear the Comment", error)
        failed = record.replace(state=state.FAILED, why=why, updated=time.time())
        if isinstance(exc, Abandoned):  # someone else decided about the node: leave it be
            state.forget(config, node, here=True)
        else:
            state.save(config, failed)
            _keep_drained(slurm, node, record, why)
        _event(config, node, "failed", [g.gpu for g in record.gpus], why)
        return failed


def _prove_denied(
    prove: Prove, devices: str, node: str, gpus: list[IsolatedGpu], scratch: str
) -> None:
    """IsolationFailed unless a process in a job-like group is refused each GPU's device: the
    node's own answer, just before it is resumed with the GPU claimed out of service."""
    group = cgroup.slurm_group(devices, node)
    for gpu in gpus:
        try:
            why = prove(group, gpu.minor, scratch)
        except (probe.ProbeError, OSError) as exc:
            why = f"the proof could not run: {exc}"
        if why:
            raise IsolationFailed(f"GPU {gpu.index}'s device is not denied to jobs: {why}")


def _taken_out(
    record: state.Isolation, node: str, original: tuple[str, str], paths: tuple[str, str]
) -> tuple[int, tuple[str, str], list[str]]:
    """(the node's GPU count now, (slurm.conf, gres.conf) with the record's GPUs taken out,
    each GPU's removed gres.conf line); conf.Unsupported when the files cannot be edited so."""
    where = {"slurm_name": paths[0], "gres_name": paths[1]}
    gpus = conf.read_node_gpus(*original, node, **where)
    texts = original
    lines = []
    for item in record.gpus:
        path = conf.gpu_file(gpus, item.gpu.minor)
        new_slurm, new_gres, line = conf.take_out(*texts, node, path, **where)
        texts = (new_slurm, new_gres)
        lines.append(line)
    return gpus.count, texts, lines


def preview(config: Config, slurm: SlurmControl, node: str) -> list[str]:
    """What `apply` would do now, each a line, done not at all (`gpugate isolate apply NODE
    --dry-run`): the node state it waits for, the device rules, each file's changed lines, the
    Slurm calls, the record. Reads the request, the two files and Slurm's node; writes nothing,
    takes no lock, waits for nothing. IsolationFailed where apply would fail before changing
    anything (no request here, files it cannot edit): the node would stay drained."""
    record = state.load_local(config)
    if record is None or record.state != state.REQUESTED:
        raise IsolationFailed(f"{node}: no isolation requested here")
    iso = config.isolate
    if iso is None:
        raise IsolationFailed("isolate is not configured (isolate.unit: gpu)")
    paths = conf_paths(config)
    try:
        original = (conf.read_text(paths[0]), conf.read_text(paths[1]))
        count, texts, _ = _taken_out(record, node, original, paths)
    except (conf.Unsupported, OSError, ValueError) as exc:
        raise IsolationFailed(f"{node}: {exc}") from exc
    info = slurm.node(node)
    now = "+".join((info.state, *info.flags))
    out = [f"wait until {node} is idle and still drained by gpugate, at most {iso.wait_idle_s:g} s "
           f"(now {now}, Reason={info.reason!r})"]  # fmt: skip
    out.append(f"wait until no job is CONFIGURING or COMPLETING anywhere (slurmctld may run "
               f"PrologSlurmctld/EpilogSlurmctld) and no other gpugate reconfigure runs, at "
               f"most {iso.quiet_s:g} s (quiet.py)")  # fmt: skip
    group = cgroup.slurm_group(iso.cgroup_devices, node)
    for item in record.gpus:
        how = cgroup.describe(iso.cgroup_devices, node, item.gpu.minor)
        out.append(f"deny GPU {item.gpu.index}'s device to slurmd's jobs: {how}")
    for path, old, new in zip((paths[1], paths[0]), original[::-1], texts[::-1], strict=True):
        out.append(f"write {path}:")
        out += [f"  {line}" for line in _changed(old, new)]
    isolated = [item.gpu for item in record.gpus]
    out += ["scontrol reconfigure",
            f"wait for Slurm to report {node} Gres=gpu:{count - len(isolated)}, registered, "
            f"at most {iso.settle_s:g} s",
            f"prove it: a process in a new group below {group} must get EPERM opening "
            f"{', '.join(cgroup.rule(g.minor).removesuffix(' rwm') for g in isolated)}",
            f"set {node}'s Comment: {format_comment(isolated)}",
            f"save the isolation as applied ({state.shared_path(config, node)}, "
            f"{state.local_path(config)})",
            f"resume {node}",
            f"metrics: {len(isolated)} GPU(s) isolated"]  # fmt: skip
    return out


def _changed(old: str, new: str) -> list[str]:
    """The lines `new` removes (`- `) and adds (`+ `) to `old`, in order, no context."""
    import difflib  # only a dry run

    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
    return [f"{d[0]} {d[1:]}" for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---")]


def _undo(
    config: Config,
    slurm: SlurmControl,
    node: str,
    original: tuple[str, str],
    changed: bool,
    denied: list[int],
    paths: tuple[str, str],
    reload: bool = True,
    keep: bool = False,
) -> bool:
    """Put the files back as they were, lift the denies; with `reload` (Slurm was told to read
    the changed files), `scontrol reconfigure` again, in a quiet slot (quiet.py).

    Without `reload` no reconfigure is needed: slurmctld and the slurmds still hold what the
    files said before, so the files put back agree with them again. With `reload` and no quiet
    slot in time, no reconfigure is issued and False is returned: with `keep`, the files and
    the denies are left as they are (what Slurm was told last, the GPU out and denied: safe
    beside a drain, and `gpugate resume` puts it back), else the files alone are put back,
    for Slurm's next restart to read."""
    devices = config.isolate.cgroup_devices if config.isolate else ""
    undone = True
    if changed:
        slot: AbstractContextManager[None] = nullcontext()
        if reload:
            slot = quiet.reconfigure_slot(config, slurm.cli, _quiet_s(config))
        try:
            try:
                with slot:
                    _write_back(paths, original)
                    if reload:
                        slurm.cli.scontrol("reconfigure")
            except quiet.ControllerBusy as busy:
                log.error(config.state_dir, f"isolate {node}: no reconfigure to undo", busy)
                undone = False
                if keep:
                    return False
                _write_back(paths, original)
        except Exception as exc:
            log.error(config.state_dir, f"isolate {node}: could not put the files back", exc)
    for minor in denied:
        try:
            cgroup.allow(devices, node, minor)
        except OSError as exc:
            log.error(config.state_dir, f"isolate {node}: could not allow minor {minor}", exc)
    return undone


def _write_back(paths: tuple[str, str], original: tuple[str, str]) -> None:
    """(slurm.conf, gres.conf) as they were, gres.conf first (as they were written)."""
    conf.write_conf(paths[1], original[1])
    conf.write_conf(paths[0], original[0])


def _quiet_s(config: Config) -> float:
    """How long a reconfigure waits for a quiet controller (`isolate.quiet_s`)."""
    return config.isolate.quiet_s if config.isolate else 300.0


def _kept_out(
    config: Config, slurm: SlurmControl, record: state.Isolation, lines: list[str], why: str
) -> state.Isolation:
    """After a failure past the reconfigure that could not be undone (the controller stayed
    busy): the GPU stays out as Slurm was last told, its device denied, the node drained. The
    record says applied (with each GPU's line), so `gpugate resume` puts it back properly."""
    node = record.node
    why = (f"{why}; not undone: the controller stayed busy, so the GPU stays out and denied "
           f"(gpugate resume {node} puts it back)")  # fmt: skip
    kept = record.replace(
        state=state.APPLIED,
        gpus=tuple(item.replace(line=line) for item, line in zip(record.gpus, lines, strict=True)),
        why=why,
        updated=time.time(),
    )
    try:
        state.save(config, kept)
    except Exception as exc:
        log.error(config.state_dir, f"isolate {node}: could not save the isolation", exc)
    gpus = ", ".join(f"GPU{g.gpu.index}" for g in record.gpus)
    try:
        slurm.drain(node, drain_reason("isolate", f"{gpus} out, node not resumed ({why})"))
    except Exception as exc:
        log.error(None, f"isolate {node}: could not write the drain reason", exc)
    _event(config, node, "failed", [g.gpu for g in record.gpus], why)
    return kept


def _keep_drained(slurm: SlurmControl, node: str, record: state.Isolation, why: str) -> None:
    """Drained with a reason that says the isolation failed and why (never resumed)."""
    first = record.gpus[0].gpu if record.gpus else None
    detail = f"GPU{first.index} not isolated ({why}); {first.why}" if first else why
    try:
        slurm.drain(node, drain_reason("isolate", detail))
    except Exception as exc:
        log.error(None, f"isolate {node}: could not write the drain reason", exc)


def restore(config: Config, slurm: SlurmControl, node: str) -> str:
    """Put every isolated GPU of `node` back (before a resume), on the node itself: drain, the
    devices allowed, both files, reconfigure, the full count read back. Returns what it did;
    IsolationFailed when a step fails (the files and the rules then as they were, drained)."""
    record = state.load(state.shared_path(config, node))
    if record is None or record.state == state.REQUESTED:
        return ""
    if not this_node_is(node):
        raise IsolationFailed(f"run it on {node} itself: its GPUs' device rules are there")
    iso = config.isolate
    devices = iso.cgroup_devices if iso else "/sys/fs/cgroup/devices"
    settle = iso.settle_s if iso else 30.0
    names = _names([g.gpu for g in record.gpus])
    if record.state == state.APPLIED:
        slurm_conf, gres_conf = conf_paths(config)
        original = (conf.read_text(slurm_conf), conf.read_text(gres_conf))
        where = {"slurm_name": slurm_conf, "gres_name": gres_conf}
        before = conf.read_node_gpus(*original, node, **where)
        texts = original
        for item in record.gpus:
            if not item.line:
                raise IsolationFailed(f"{node}: no gres.conf line kept for GPU{item.gpu.index}")
            texts = conf.put_back(*texts, node, item.line, **where)
        if not slurm.node(node).drained:
            slurm.drain(node, drain_reason("isolate", f"putting back {names}"))
        allowed = changed = reconfigured = False
        try:
            # ControllerBusy here: nothing changed but the drain (quiet.py).
            with quiet.reconfigure_slot(config, slurm.cli, _quiet_s(config)):
                # The rule goes first: once the count is up Slurm may hand the GPU out at once
                # (24.11 once dropped a drain across a reconfigure); until then the node is
                # drained, and the jobs still running keep the deny they were made with (v1
                # copies it into each group).
                allowed = True
                for item in record.gpus:
                    cgroup.allow(devices, node, item.gpu.minor)
                changed = True
                conf.write_conf(gres_conf, texts[1])
                conf.write_conf(slurm_conf, texts[0])
                reconfigured = True
                slurm.cli.scontrol("reconfigure")
                _wait_count(slurm, node, before.count + len(record.gpus), settle)
        except Exception as exc:
            # The isolated files back, reloaded when the controller is quiet (else for its next
            # restart: the node stays drained and the device denied meanwhile).
            paths = (slurm_conf, gres_conf)
            _undo(config, slurm, node, original, changed, [], paths, reconfigured)
            if allowed:
                for item in record.gpus:
                    cgroup.deny(devices, node, item.gpu.minor)
            raise IsolationFailed(f"{names} not put back: {type(exc).__name__}: {exc}") from exc
    else:  # FAILED: the files were put back then; only a rule may be left
        for item in record.gpus:
            cgroup.allow(devices, node, item.gpu.minor)
    note_isolated(config, node, 0)  # the node's own metrics file
    state.forget(config, node, here=True)
    slurm.clear_node_comment(node)
    _event(config, node, "restored", [g.gpu for g in record.gpus], "")
    return f"{names} back in service"


def listed_again(config: Config, node: str) -> str | None:
    """On an isolated node: why its GPU lines no longer match the isolation (someone put a GPU
    back into gres.conf, configuration management reverting gpugate's edit), or None. Slurm
    would then hand out a GPU whose device stays denied: the prolog refuses such a node."""
    record = state.load_local(config)
    if record is None or record.state != state.APPLIED:
        return None
    slurm_conf, gres_conf = conf_paths(config)
    try:
        gpus = conf.read_node_gpus(conf.read_text(slurm_conf), conf.read_text(gres_conf), node)
    except (conf.Unsupported, OSError, ValueError) as exc:
        return f"cannot read the node's GPU lines: {exc}"
    names = {os.path.basename(path) for path in gpus.files}
    back = [g.gpu for g in record.gpus if f"nvidia{g.gpu.minor}" in names]
    if back:
        return (
            f"{_names(back)} isolated by gpugate, but {gres_conf} lists its device again; "
            f"run `gpugate resume {node}` to put it back properly"
        )
    return None


def this_node_is(node: str) -> bool:
    """Whether this process runs on `node` (its cgroup rules are here)."""
    here, _ = this_node()
    return here == node


def _wait_idle_drained(slurm: SlurmControl, node: str, timeout: float) -> None:
    """Until no job is on the node and it is still drained by gpugate; else IsolationFailed."""
    deadline = time.monotonic() + timeout
    while True:
        info = slurm.node(node)
        if not (info.drained and info.gpugate_owned):
            raise Abandoned(f"{node} is no longer drained by gpugate ({info.reason!r})")
        if _idle(info):
            return
        if time.monotonic() > deadline:
            raise IsolationFailed(f"{node} still ran jobs after {timeout:g} s")
        time.sleep(POLL_S)


def _idle(info: NodeInfo) -> bool:
    """No job allocated or completing on the node."""
    busy = {"ALLOCATED", "MIXED", "COMPLETING", "DRAINING"}
    return info.state not in busy and not busy.intersection(info.flags)


def _wait_count(slurm: SlurmControl, node: str, want: int, timeout: float) -> None:
    """Until Slurm reports `Gres=gpu:<want>` for the node, valid, and its slurmd registered
    again; else IsolationFailed.

    Seen on 24.11: right after `scontrol reconfigure` the restarted slurmctld lists the node
    UNKNOWN (no slurmd registered yet) with the new count; a resume then is refused ("Invalid
    node state specified"), and once, the node that registered next came back without its
    DRAIN. So the count counts only from a registered node (not UNKNOWN, responding).
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            info = slurm.node(node)
        except Exception as exc:  # slurmctld restarting
            last = exc
            time.sleep(POLL_S)
            continue
        if "INVALID_REG" in info.flags or "INVAL" in info.flags:
            raise IsolationFailed(f"Slurm marked {node} {'+'.join(info.flags)}: {info.reason}")
        registered = info.state != "UNKNOWN" and "NOT_RESPONDING" not in info.flags
        if info.gres_gpus == want and registered:
            return
        last = f"Gres=gpu:{info.gres_gpus}"
        time.sleep(POLL_S)
    raise IsolationFailed(f"{node} did not report Gres=gpu:{want} within {timeout:g} s ({last})")


def _names(gpus: list[IsolatedGpu]) -> str:
    return ", ".join(f"GPU {g.index}" for g in gpus)


def _event(config: Config, node: str, outcome: str, gpus: list[IsolatedGpu], why: str) -> None:
    log.event(
        config.state_dir,
        "isolate",
        node=node,
        outcome=outcome,
        gpus=[{"index": g.index, "minor": g.minor, "serial": g.serial} for g in gpus],
        why=why,
    )

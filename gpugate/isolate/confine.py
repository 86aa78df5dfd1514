"""Whether Slurm confines this node's jobs to their devices, which the isolation relies on.

gpugate's deny (cgroup.py) sits on slurmd's devices group; it reaches a job only when Slurm
puts the job's tasks into a group below it, which task/cgroup does with ConstrainDevices=yes
(docs/slurm-facts.md, "Device confinement is required"). With `TaskPlugin=task/none` no job
is in that group and every job opens the "isolated" GPU (issue 44): the isolation is refused.

Slurm's own rules, read in SchedMD/slurm (22.05.8, 24.11.5, 25.11.7):
- `scontrol show config` prints `TaskPlugin = ...` as slurm.conf has it; each comma-separated
  name counts with or without its `task/` prefix (src/interfaces/task.c, task_g_init).
- it prints a "Cgroup Support Configuration:" section with `ConstrainDevices = yes|no` only
  when TaskPlugin, ProctrackType or JobAcctGatherType names cgroup (src/slurmctld/proc_req.c,
  _fill_ctld_conf), and that is the controller's cgroup.conf, not this node's;
- this node's slurmd reads the cgroup.conf beside its slurm.conf; without one,
  ConstrainDevices is no (cgroup.conf(5)).
- cgroup.conf: keys case-insensitive, `#` starts a comment unless escaped, `Key = value`
  pairs (several to a line allowed), the last one wins; a boolean is yes/up/true/1 or
  no/down/false/0, any case (src/common/parse_config.c, parse_value.c s_p_handle_boolean).
"""

from __future__ import annotations

import os

from gpugate.regex import lazy

TASK_FIX = "TaskPlugin=task/cgroup (slurm.conf; task/affinity may stay beside it)"
DEVICES_FIX = "ConstrainDevices=yes"
_TRUE = {"yes", "up", "true", "1"}
# Slurm's key=value pattern (parse_config.c keyvalue_pattern): a quoted value or a word.
_PAIR = lazy(r'([A-Za-z0-9_.]+)\s*[-*+/]?=\s*(?:"([^"]*)"|(\S+))')


def shown_value(shown: str, key: str) -> str | None:
    """The value of `key` in `scontrol show config` output (`Key = value` lines), or None."""
    for line in shown.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip().lower() == key.lower():
            return value.strip()
    return None


def has_task_cgroup(task_plugin: str | None) -> bool:
    """Whether a TaskPlugin value names task/cgroup (Slurm accepts `cgroup` alone too)."""
    names = (n.strip().lower() for n in (task_plugin or "").split(","))
    return any(n.removeprefix("task/") == "cgroup" for n in names)


def cgroup_conf_value(text: str, key: str) -> str | None:
    """The last value of `key` in a cgroup.conf text, as Slurm's parser reads it, or None."""
    found = None
    for raw in text.splitlines():
        line = _strip_comment(raw)
        for match in _PAIR.finditer(line):
            if match.group(1).lower() == key.lower():
                found = match.group(2) if match.group(2) is not None else match.group(3)
    return found


def _strip_comment(line: str) -> str:
    """The line up to its first `#` not escaped by an odd number of backslashes."""
    slashes = 0
    for i, ch in enumerate(line):
        if ch == "#" and slashes % 2 == 0:
            return line[:i]
        slashes = slashes + 1 if ch == "\\" else 0
    return line


def problem(shown: str, slurm_conf: str) -> str | None:
    """Why this node's jobs are not confined to their devices (each missing setting, and the
    lines that fix it), or None. `shown`: `scontrol show config`; `slurm_conf`: the slurm.conf
    this node's slurmd reads (its cgroup.conf is beside it)."""
    missing: list[str] = []
    task_plugin = shown_value(shown, "TaskPlugin")
    if not has_task_cgroup(task_plugin):
        missing.append(f"TaskPlugin is {task_plugin or 'unset'}, not task/cgroup")
    path = os.path.join(os.path.dirname(slurm_conf), "cgroup.conf")
    devices = _constrain_devices(shown, path)
    if devices:
        missing.append(devices)
    if not missing:
        return None
    fix = [] if has_task_cgroup(task_plugin) else [TASK_FIX]
    if devices:
        fix.append(f"{DEVICES_FIX} (cgroup.conf beside slurm.conf, here {path})")
    return (
        f"jobs here are not confined to their devices ({'; '.join(missing)}), so a denied GPU "
        f"would still open in every job; add {' and '.join(fix)}, restart slurmd and "
        "slurmctld, then check again"
    )


def _constrain_devices(shown: str, path: str) -> str | None:
    """Why ConstrainDevices is not yes for this node's slurmd, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            value = cgroup_conf_value(fh.read(), "ConstrainDevices")
    except FileNotFoundError:
        return f"no {path}, so ConstrainDevices is no (Slurm's default)"
    except OSError as exc:
        return f"{path} unreadable ({exc.strerror})"
    if value is None:
        return f"{path} does not set ConstrainDevices (Slurm's default: no)"
    if value.lower() not in _TRUE:
        return f"{path} has ConstrainDevices={value}"
    controller = shown_value(shown, "ConstrainDevices")
    if controller is not None and controller.lower() not in _TRUE:
        # Only the node's file counts for its slurmd, but a controller that disagrees means
        # the files differ across the cluster: no claim is made on a mixed configuration.
        return f"slurmctld's cgroup.conf has ConstrainDevices={controller} (`scontrol show config`)"
    return None

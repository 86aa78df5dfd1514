"""Site configuration: packaged defaults overlaid by the site file, checked against the schema.

Search order (docs/interfaces.md): `--config FILE`, else `$GPUGATE_CONFIG`, else
`/etc/gpugate/gpugate.yaml`; a missing site file at the default path means the packaged
defaults. Unknown keys, wrong types and bad values are refused as `file: key.path: problem`.
"""

from __future__ import annotations

import os
import sys

from gpugate.checks.registry import registered, selects
from gpugate.config import built, schema
from gpugate.config.classes import matches, overlay, split_classes, this_node
from gpugate.record import Record
from gpugate.yamlio import YamlError, load_yaml_identified

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    _R = TypeVar("_R", bound=Record)

DEFAULT_SITE_FILE = "/etc/gpugate/gpugate.yaml"
PACKAGED_FILE = os.path.join(os.path.dirname(__file__), "gpugate.yaml")

# Values that are not just typed but drawn from a closed set.
_CHOICES = {
    "policy.unknown": ("ok", "warn", "fail"),
    "checks.pcie.generation": ("max", "current"),
    "slurm.backend": ("auto", "cli", "pyslurm"),
    "prolog.on_error": ("allow", "refuse"),
    "health.suspect_action": ("qualify", "review"),
    # scontrol(1) reboot's nextstate= (RESUME, DOWN), as the ladder may ask it (gate/repair.py).
    "health.reboot_nextstate": ("down", "resume"),
    "isolate.unit": ("node", "gpu"),
}
# Mappings whose keys and values are closed sets: path -> (key pattern, what a key is, values).
_KEYED = {
    "checks.kernel.xid_actions": (
        r"[1-9]\d{0,3}",
        "an Xid code",
        ("drain", "reboot", "warn", "ignore"),
    )
}
# Shares of a whole (non-negative is checked for every number).
_AT_MOST = {
    # The controller's reads stay under controller_view.READ_BUDGET (64 MiB) whatever this is.
    "requeue.max_records": 4096,
    "epilog.evidence_user_share": 1.0,
    "budget.hardware_share": 1.0,
    "budget.max_drained_share": 1.0,
    # Before the prolog's deadline (20 s by default) and Slurm's PrologEpilogTimeout.
    "budget.jitter_s": 10.0,
    # Slurm 26.05's HealthCheckTimeout goes up to 65535 s; the run keeps its budget 5 s below
    # the limit it reads (60 s before 26.05: gpugate/slurm/health_check.py).
    "health.deadline_s": 65530.0,
    "drill.max_minutes": 1440.0,  # a day: a drill is an exercise, not an outage
    "qualify.level": 4,  # dcgmi diag -r 1..4
    "qualify.min_fraction_of_median": 1.0,
    # `dcgmi diag -r` has levels 1 to 4 (gpugate/qualify/dcgm.py: LEVELS); 0 is none.
    "admin.resume_qualify.hardware": 4,
    "admin.resume_qualify.transient": 4,
    # The reader child's whole answer is capped (gpugate.userfiles.ANSWER_MAX, 64 MiB).
    "epilog.fr_max_dump_mib": 32.0,
}
# Counts that mean nothing below a floor (0 passes would lift a drain on the failing run).
_AT_LEAST = {
    "requeue.max_records": 1,
    "health.heal_after_passes": 1,
    "isolate.max_gpus": 1,
    "health.suspect_users_min": 1,
    "health.suspect_votes_per_user": 1,
    "health.suspect_qualify_per_user_per_day": 1,
    "checks.kernel.app_xid_users_min": 1,
    "checks.kernel.app_xid_jobs_per_user": 1,
    "checkpoints.max_age_s": 1,
    "qualify.level": 1,
    "qualify.time_limit_min": 1,
    "qualify.size_mib": 1,
    "qualify.iters": 1,
    "qualify.ntasks_per_node": 1,
}
# Lists of check ids: each must name a registered check (a typo would silently check nothing).
_CHECK_IDS = ("checks.disabled", "policy.warn_only", "budget.hardware_checks",
              "policy.report_only_checks", "policy.canary.checks")  # fmt: skip
# Of those, the lists that may also name a family of checks (`ib.*`: registry.selects).
_FAMILIES_ALLOWED = ("policy.report_only_checks", "policy.canary.checks")


class ConfigError(ValueError):
    """The configuration is wrong; the message names the file and the key path."""


def site_config_path(explicit: str | None = None) -> tuple[str | None, bool]:
    """The site file to read and whether it must exist (explicitly named files must)."""
    if explicit:
        return explicit, True
    env = os.environ.get("GPUGATE_CONFIG")
    if env:
        return env, True
    return DEFAULT_SITE_FILE, False


def load_config(path: str | None = None) -> schema.Config:
    """Load the packaged defaults and the site file over them; warnings go to stderr."""
    config, warnings = load_config_warned(path)
    say_once(warnings)
    return config


def load_config_warned(path: str | None = None) -> tuple[schema.Config, list[str]]:
    """The Config, and what was migrated on the way (`FILE: KEY: ...` lines for the admin)."""
    site_path, defaults, defaults_id, site, site_id = _read(path)
    # The same files, node and code as a run before: its Config (gpugate/config/built.py).
    inputs = built.inputs(defaults_id, site_id, defaults, site)
    cached = built.fetch(inputs)
    if cached is not None:
        return cached
    config, warnings = _build_over(defaults, site, site_path)
    built.keep(inputs, config, warnings)
    return config, warnings


def load_config_for_hook(path: str | None = None) -> tuple[schema.Config, list[str]]:
    """The Config a Slurm hook gates with, and the problems to say loudly on every run.

    A site file the strict loader refuses does not turn gating off: each refused key is left
    out (`FILE: KEY: problem; REFUSED: ...` in the lines returned) and the hook gates with the
    packaged default for it and every valid key of the site file. Failing the prolog instead
    would drain every node of the cluster for one stale line (Slurm drains a node whose prolog
    fails, and holds the job), and letting jobs through unchecked let a job run on a node with
    ECC errors (issue 40). Only a broken packaged file (a broken install) still raises.
    """
    try:
        return load_config_warned(path)
    except ConfigError as refused:
        first = refused
    site_path, defaults, _, site, _ = _read(path, salvage=True)
    import copy  # late: only a hook whose site file was refused

    site = copy.deepcopy(site)  # keys are dropped from it: never from a parse kept for reuse
    problems: list[str] = []
    if not site and site_path and str(first).startswith(f"{site_path}: "):
        # Unreadable, not YAML, or not a mapping: nothing of it can be used.
        problems.append(_ignored(str(first), "the whole file"))
    for _ in range(_MAX_DROPPED):
        try:
            config, warnings = _build_over(defaults, site, site_path)
        except ConfigError as exc:
            key = error_key(str(exc), site_path or "")
            if key is None or not _drop(site, key):
                if not site:
                    raise  # the packaged defaults alone fail: the install is broken
                problems.append(_ignored(str(exc), "the whole file"))
                site = {}
                continue
            problems.append(_ignored(str(exc), key))
            continue
        return config, problems + warnings
    raise first


# A site file with more refused keys than this is left out whole (each pass builds the Config).
_MAX_DROPPED = 50


def _ignored(problem: str, what: str) -> str:
    """One loud line: the problem, what is left out, what gates instead, how to check."""
    if what == "the whole file":
        instead = "gating with the packaged defaults"
    elif what.endswith("]"):
        instead = "gating with the rest of the list"
    else:
        instead = "gating with its packaged default"
    return (
        f"{problem}; REFUSED: {what} ignored, {instead} until it is fixed "
        "(`gpugate config check` lists every problem)"
    )


def _read(
    path: str | None, salvage: bool = False
) -> tuple[str | None, dict[str, Any], str, dict[str, Any], str]:
    """(site path, packaged mapping, its id, site mapping, its id).

    salvage: a site file that cannot be read or is no mapping reads as empty instead of raising.
    """
    try:
        defaults, defaults_id = load_yaml_identified(PACKAGED_FILE)
    except YamlError as exc:
        raise ConfigError(str(exc)) from None
    site_path, required = site_config_path(path)
    site: object = {}
    site_id = "none"
    # /dev/null names "no site file" (the only non-regular file read, as empty): any other
    # device or FIFO is refused by load_yaml, never waited on.
    if site_path and site_path != os.devnull and (required or os.path.exists(site_path)):
        try:
            site, site_id = load_yaml_identified(site_path)
        except YamlError as exc:
            if not salvage:
                raise ConfigError(str(exc)) from None
            site = {}
        if site is None:
            site = {}  # an empty file is fine
    if not isinstance(defaults, dict):
        raise ConfigError(f"{PACKAGED_FILE}: expected a mapping at the top")
    if not isinstance(site, dict):
        if not salvage:
            raise ConfigError(f"{site_path}: expected a mapping at the top")
        site = {}
    return site_path, defaults, defaults_id, site, site_id


def _build_over(
    defaults: dict[str, Any], site: dict[str, Any], site_path: str | None
) -> tuple[schema.Config, list[str]]:
    """Validate the site mapping, merge it over the defaults, build and migrate the Config."""
    defaults, _ = split_classes(defaults, PACKAGED_FILE, ConfigError)
    site, classes = split_classes(site, site_path or "", ConfigError)
    # Check the site file on its own first, so an error names the file that holds it.
    _check_partial(schema.Config, site, site_path or "", "")
    merged = _with_classes(_merge(defaults, site), classes, site_path or "")
    config = build(schema.Config, merged, f"{PACKAGED_FILE} + {site_path}", "")
    _check_canary(config.policy.canary, f"{PACKAGED_FILE} + {site_path}")
    return migrate(config, site_path or PACKAGED_FILE)


def _check_canary(canary: schema.Canary, source: str) -> None:
    """A canary needs its partitions: without them its checks would act nowhere, which is
    report_only_checks said in a way that reads as if they acted somewhere. The error names
    `policy.canary.checks`, so a hook that leaves the key out (load_config_for_hook) is left
    with a valid canary (none)."""
    if canary.checks and not canary.partitions:
        raise ConfigError(
            f"{source}: policy.canary.checks: names checks but policy.canary.partitions is "
            "empty: name the partitions where they may act (or list the checks in "
            "policy.report_only_checks to have them only report everywhere)"
        )
    for i, name in enumerate(canary.partitions):
        if not name.strip() or "," in name:
            raise ConfigError(
                f"{source}: policy.canary.partitions[{i}]: {name!r} is not a partition name"
            )


def migrate(config: schema.Config, source: str) -> tuple[schema.Config, list[str]]:
    """Values an earlier release accepted, made safe, each with a warning naming the change.

    The validations added since the previous release (0.1.0 of 2026-12-03), and their fate:
    - requeue.wait_for_bundles_s >= epilog.deadline_s (issue 26): the old default, 30 s,
      is below the 45 s epilog deadline. Raised to the deadline here: a longer wait delays a
      requeue decision by seconds, while refusing the file had stopped all gating.
    - budget.jitter_s <= 10, requeue.max_records 1..4096, isolate.unit, isolate.max_gpus >= 1:
      keys new since then, so no old file sets them; still refused (a hook leaves a refused
      key out and gates with its default: load_config_for_hook).
    """
    warnings: list[str] = []
    wait = config.requeue.wait_for_bundles_s
    deadline = config.epilog.deadline_s
    if wait < deadline:
        warnings.append(
            f"{source}: requeue.wait_for_bundles_s: {wait:g} s is shorter than "
            f"epilog.deadline_s ({deadline:g} s) (releases before 2026-12-03 accepted it): "
            f"raised to {deadline:g} s (the controller would decide while a node epilog may "
            f"still be finding the fault); set it to at least {deadline:g} in {source}"
        )
        config = config.replace(requeue=config.requeue.replace(wait_for_bundles_s=deadline))
    return config, warnings


def error_key(message: str, site_path: str) -> str | None:
    """The key path a ConfigError message names in the site file (`FILE: KEY: problem`)."""
    for source in (site_path, f"{PACKAGED_FILE} + {site_path}"):
        if source and message.startswith(f"{source}: "):
            key, sep, _ = message[len(source) + 2 :].partition(": ")
            key = key.rstrip(".")
            if sep and key and key != "top" and " " not in key:
                return key
    return None


def _drop(site: dict[str, Any], key: str) -> bool:
    """Remove KEY (`a.b[2].c`) from the site mapping; False when nothing was removed."""
    import re  # late: only a hook whose site file was refused

    steps: list[str | int] = [
        int(part[1:-1]) if part.startswith("[") else part
        for part in re.findall(r"\[\d+\]|[^.\[\]]+", key)
    ]
    node: Any = site
    for step in steps[:-1]:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            return _drop_top(site, steps)
    last = steps[-1] if steps else None
    if isinstance(node, dict) and last in node:
        del node[last]
        return True
    if isinstance(node, list) and isinstance(last, int) and last < len(node):
        del node[last]
        return True
    return _drop_top(site, steps)


def _drop_top(site: dict[str, Any], steps: list[str | int]) -> bool:
    """A key path that does not walk (a board named with a dot): its top-level key goes."""
    if len(steps) > 1 and isinstance(steps[0], str) and steps[0] in site:
        del site[steps[0]]
        return True
    return False


_said: set[str] = set()


def say_once(lines: list[str]) -> None:
    """Each config warning once per process, on stderr (never stdout: the TaskProlog's is the
    job's environment), where slurmd's log and the admin's terminal get it."""
    for line in lines:
        if line not in _said:
            _said.add(line)
            sys.stderr.write(f"gpugate: config: {line}\n")
    sys.stderr.flush()


def _with_classes(
    merged: dict[str, Any], classes: list[dict[str, Any]], source: str
) -> dict[str, Any]:
    """`merged` with every node class that this node (or the job's partition) is in over it."""
    if not classes:
        return merged
    node, partition = this_node()
    for i, cls in enumerate(classes):
        _check_partial(schema.Config, overlay(cls), source, f"classes[{i}].")
        if matches(cls, node, partition):
            merged = _merge(merged, overlay(cls))
    return merged


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "boards":
            out[key] = _merge(out[key], value)
        elif key == "boards" and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}  # a site board replaces a packaged one whole
        else:
            out[key] = value
    return out


def _fields(cls: type[Record]) -> dict[str, str]:
    return {f: cls.__annotations__[f] for f in cls._fields}


def _check_partial(cls: type[Record], data: dict[str, Any], source: str, prefix: str) -> None:
    """Validate the keys and types present in a partial (site) mapping."""
    types = _fields(cls)
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in types:
            raise ConfigError(f"{source}: {path}: unknown key (known: {', '.join(types)})")
        ann = types[key]
        record = _record_type(ann)
        if record is not None and isinstance(value, dict):
            _check_partial(record, value, source, path + ".")
        else:
            _convert(ann, value, source, path)


def build(cls: type[_R], data: object, source: str, prefix: str) -> _R:
    """Build a typed record from a complete mapping."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'top'}: expected a mapping")
    types = _fields(cls)
    values = {}
    for key, value in data.items():
        if key not in types:
            raise ConfigError(f"{source}: {prefix}{key}: unknown key")
        values[key] = _convert(types[key], value, source, prefix + key)
    missing = [f for f in types if f not in values and f not in cls._defaults]
    if missing:
        raise ConfigError(f"{source}: {prefix or 'top'}: missing key(s) {', '.join(missing)}")
    return cls(**values)


def _record_type(ann: str) -> type[Record] | None:
    record = getattr(schema, ann.replace(" | None", "").strip(), None)
    return record if isinstance(record, type) and issubclass(record, Record) else None


def _convert(ann: str, value: object, source: str, path: str) -> object:
    """Check `value` against a type annotation string and convert it."""
    ann = ann.strip()
    if ann.endswith("| None"):
        if value is None:
            return None
        ann = ann[: -len("| None")].strip()
    if value is None:
        raise ConfigError(f"{source}: {path}: must not be null (expected {ann})")
    if ann.startswith("list["):
        inner = ann[5:-1]
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {path}: expected a list, got {_show(value)}")
        items = [_convert(inner, v, source, f"{path}[{i}]") for i, v in enumerate(value)]
        if path in _CHECK_IDS and items:
            _check_ids(items, source, path)
        return items
    if ann.startswith("dict[str,"):
        inner = ann[len("dict[str,") : -1]
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {path}: expected a mapping, got {_show(value)}")
        out = {str(k): _convert(inner, v, source, f"{path}.{k}") for k, v in value.items()}
        if path in _KEYED:
            _check_keyed(out, source, path)
        if path == "health.ladder" and out:
            _check_ladder(out, source, path)
        return out
    record = _record_type(ann)
    if record is not None:
        return build(record, value, source, path + ".")
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }.get(ann)
    if ok is None:
        raise ConfigError(f"{source}: {path}: schema type {ann!r} is not supported")
    if not ok:
        raise ConfigError(f"{source}: {path}: expected {ann}, got {_show(value)}")
    choices = _CHOICES.get(path)
    if choices and value not in choices:
        raise ConfigError(f"{source}: {path}: {value!r} is not one of {', '.join(choices)}")
    if not isinstance(value, (int, float)):
        return value
    if ann == "float":
        value = float(value)
    if value < 0 and not path.endswith("_c"):
        raise ConfigError(f"{source}: {path}: must not be negative, got {value!r}")
    if path in _AT_MOST and value > _AT_MOST[path]:
        raise ConfigError(f"{source}: {path}: must be at most {_AT_MOST[path]:g}, got {value!r}")
    if path in _AT_LEAST and value < _AT_LEAST[path]:
        raise ConfigError(f"{source}: {path}: must be at least {_AT_LEAST[path]:g}, got {value!r}")
    return value


def _check_keyed(mapping: dict[str, Any], source: str, path: str) -> None:
    """Refuse a key or a value outside a closed mapping's sets (`checks.kernel.xid_actions`)."""
    if not mapping:
        return  # the packaged defaults: nothing to match, and no `re` to import
    import re  # late: only a site that sets a keyed mapping (gpugate/startup.py)

    pattern, what, values = _KEYED[path]
    for key, value in mapping.items():
        if not re.fullmatch(pattern, key):
            raise ConfigError(f"{source}: {path}: key {key!r} is not {what}")
        if value not in values:
            raise ConfigError(
                f"{source}: {path}.{key}: {value!r} is not one of {', '.join(values)}"
            )


# The repair ladder's steps a site may name per check (gpugate/gate/ladder.py), in this order.
LADDER_STEPS = ("reset", "reboot")


def _check_ladder(ladder: dict[str, Any], source: str, path: str) -> None:
    """Refuse a check id no check has, a step the ladder does not take, or steps out of order."""
    known = registered()
    for check_id, steps in ladder.items():
        if check_id not in known:
            raise ConfigError(f"{source}: {path}: unknown check {check_id!r} (known: "
                              f"{', '.join(known)})")  # fmt: skip
        unknown = [s for s in steps if s not in LADDER_STEPS]
        if unknown:
            raise ConfigError(f"{source}: {path}.{check_id}: {unknown[0]!r} is not a step "
                              f"({', '.join(LADDER_STEPS)}; [] for none)")  # fmt: skip
        if steps != sorted(set(steps), key=LADDER_STEPS.index):
            raise ConfigError(f"{source}: {path}.{check_id}: {steps} must name each step once, "
                              f"in the ladder's order ({', '.join(LADDER_STEPS)})")  # fmt: skip


def _check_ids(ids: list[Any], source: str, path: str) -> None:
    """Refuse an id that names no registered check, like an unknown key."""
    # Only a non-empty list costs the registry's import: the prolog imports it anyway to run
    # the checks, and the packaged defaults (empty lists) load without it.

    known = registered()
    families = path in _FAMILIES_ALLOWED
    for i, check_id in enumerate(ids):
        if check_id in known:
            continue
        if families and check_id.endswith(".*") and any(selects([check_id], k) for k in known):
            continue
        also = " or a family such as 'ib.*'" if families else ""
        raise ConfigError(
            f"{source}: {path}[{i}]: unknown check {check_id!r}{also} (known: {', '.join(known)})"
        )


def _show(value: object) -> str:
    text = repr(value)
    return (text[:60] + "...") if len(text) > 60 else f"{text} ({type(value).__name__})"

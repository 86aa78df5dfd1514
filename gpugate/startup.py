"""The start-up budget: the imports gpugate keeps out of a hook's start, in one place.

The Prolog runs before every job and the TaskProlog before every task, each a fresh process,
so what gpugate imports is paid on every node for every job. Modules import what they use at
the top, so that a file's header tells what it depends on; the exceptions are listed in LAZY,
each imported inside the function that needs it. Each entry says what waiting saves the warm
hook runs that do not need it (milliseconds, median, on the 2-core CI machine: measured by
`python bench/bench_lazy.py`) and why the module waits. tests/unit/commands/test_startup.py holds the list
true both ways: every import inside a function names a module listed here, and no module listed
here is imported by every measured hook run (then it saves nothing and belongs at the top).

Besides, the packaged launcher holds the cyclic garbage collector off for start-up
(`pause_gc`, ended by cli.main's `resume_gc` once the command's module is imported).
"""

from __future__ import annotations

import gc
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

# module -> (ms it saves the warm hook runs that skip it; why it waits). Figures: `python
# bench/bench_lazy.py` (2026-12-03, the 2-core CI VM, shared and noisy: medians of 5, each
# measured in the first run that skips the module, after what that run imports); 0.0 where
# every run imports it anyway or it is not installed there (the figure in the reason is
# docs/performance.md's). The first part waits for start-up; the second for the reason it gives, and saves
# what it says besides.
LAZY: dict[str, tuple[float, str]] = {
    # -- kept out of a replayed check (the start-up target) and of the hooks that need none --
    "re": (
        14.2,
        "regex.lazy (a pattern's first use), readable.with_serial, xid.nvlink5_fatal, "
        "config's keyed mappings: with enum and functools, the largest import a hook could "
        "make; a healthy replayed check matches no pattern (plain-text prefilters first)",
    ),
    "argparse": (
        4.5,
        "cli.make_parser: --help, errors and the commands without quick_options; "
        "the hooks and a replayed check parse their long options without it",
    ),
    "json": (
        16.9,
        "text.dumps, drill: only where JSON is written or read; a replayed check "
        "(no --json) writes none (the figure includes re, which json imports)",
    ),
    "gpugate.jsonl": (0.3, "log.event: the event log's JSON lines, for runs that record one"),
    "gpugate.slurm.choose": (
        2.8,
        "the Slurm adapter (backends, cli, control, parsers, pyslurm): "
        "only for commands that ask Slurm; a replayed check never does",
    ),
    "gpugate.isolate.apply": (
        0.0,
        "gate.drain.isolate_after_drain, admin.resume.restore_isolated, commands.resume, "
        "gate.allocation (conf_paths): the "
        "GPU isolation (slurm.conf/gres.conf parser, child), only where `isolate.unit: gpu` "
        "meets a fault or a resume puts a GPU back; no measured hook run takes it",
    ),
    "gpugate.isolate.conf": (
        0.0,
        "gate.allocation.gres_gpu_files: gres.conf's GPU files, only for a failing finding about "
        "one GPU on a site that isolates GPUs (issue 44); no measured hook run takes it",
    ),
    "platform": (1.7, "isolate.bpf: the bpf(2) syscall's number, only on a cgroup v2 isolation"),
    "difflib": (
        1.0,
        "isolate.apply.preview: the files' changed lines, `isolate apply --dry-run` only",
    ),
    "gpugate.slurm.control": (0.9, "commands.ask.ask_slurm_for: the adapter's errors, with it"),
    "threading": (1.5, "checks.sources.gather_dict: a live gather's threads; a replay has none"),
    "signal": (0.9, "runner._kill_group: only a command past its timeout is killed"),
    "subprocess": (7.2, "runner, child: only when a command runs; a replay runs none"),
    "shutil": (3.9, "runner (which), diagnosis.scan (grep): only for a command or a log scan"),
    "select": (0.1, "child: the as-user child's pipe, only when one runs"),
    "ctypes": (2.9, "child: prctl for the as-user child, only when one runs"),
    "fcntl": (0.1, "fsutil.FileLock: only the stores that lock"),
    "grp": (0.1, "store.state, store.evidence: the admin group, only when a directory is made"),
    "glob": (1.5, "store.evidence: listing bundles, for the epilog that writes one"),
    "gzip": (1.1, "diagnosis.scan: a .gz log only"),
    "hashlib": (5.0, "hooks.flightrec_collect: a dump's digest, only when dumps are kept"),
    "math": (0.1, "checkpoints.layouts: one layout's arithmetic"),
    "pickletools": (4.8, "checkpoints.torchfile: reading a torch checkpoint's pickle"),
    "gpugate.admin.resume": (
        7.6,
        "hooks.health (the Lift's path it hands the executor): lifting a drain, only when "
        "one has healed",
    ),
    "gpugate.gate.repair": (4.1, "hooks.health: a reset, only for a drain that asks one"),
    "gpugate.checkpoints.freshness": (5.2, "hooks.collect: a job with gpugate:ckpt= only"),
    "gpugate.flightrec.culprit": (6.4, "diagnosis.multinode: a multi-node job's flight records"),
    "gpugate.store.held": (1.0, "act.execute (RecordHeld): a drain held back by the budget"),
    "gpugate.act.execute": (
        1.0,
        "commands.check: `gpugate check --dry-run` only (the hooks import it at the top)",
    ),
    "gpugate.act.plans": (
        0.1,
        "hooks.prolog (a failing prolog's plan), commands.check (the same --dry-run); "
        "the epilog and health import it at the top",
    ),
    "gpugate.gate.requeue": (
        5.2,
        "act.execute (StartNow, NoteBeside): the controller's requeue steps; no node hook "
        "takes one",
    ),
    "gpugate.gate.drain": (
        0.4,
        "act.execute (Drain, Undo, TellHeld, Isolate), hooks.prolog (the failure's plan): only a "
        "failing prolog drains; a healthy one takes no drain step",
    ),
    "gpugate.store.entries": (
        0.3,
        "store.history: the history's line records, only for a run that writes or reads "
        "the history (a drain, an unknown Xid, a listing); a healthy hook run does neither",
    ),
    "gpugate.store.ledger": (
        0.1,
        "store.history (a drain's, resume's or reset's repair ledger line: the ledger imports "
        "history), hooks.outside_resume (a resume seen outside gpugate): only a run that "
        "takes a step writes one (python -X importtime after history, 2026-12-07)",
    ),
    "gpugate.store.fleet_view": (0.5, "gate.drain: the budget's shared read, only when draining"),
    "random": (2.6, "gate.drain: the spread before a budget count, only when draining"),
    "gpugate.store.runs": (2.8, "hooks.prolog: the run record, once the job is admitted"),
    "gpugate.checks.sources.peers": (1.2, "hooks.prolog: the peer probe, when configured"),
    "gpugate.checks.sources": (
        1.2,
        "commands.guarded.facts_problem: selftest mode's gather, for the hooks that gather; "
        "the TaskProlog and EpilogSlurmctld never do (python -X importtime, 2026-12-06)",
    ),
    "gpugate.gate.suspicion": (27.5, "hooks.epilog: suspects, after an abnormal end only"),
    "gpugate.checks.xid_catalog": (
        0.5,
        "xid.catalog, xid.nvlink5_resolution: NVIDIA's Xid rows, only when an Xid is read",
    ),
    "gpugate.checks.sxid_catalog": (0.4, "sxid.table: the SXid rows, only when an SXid is read"),
    "syslog": (0.0, "log.alarm: a hook's config problem, said to syslog too (rare by design)"),
    "copy": (0.0, "config.load_config_for_hook: a refused site file's copy, keys left out"),
    "gpugate.node": (
        0.1,
        "config.classes, gate.guard, commands.guarded: this node's name, when a class, an "
        "error or selftest mode needs it (the TaskProlog needs none)",
    ),
    # -- waiting for another reason --
    "gpugate.gate": (0.0, "hooks.health: `from gpugate.gate import repair` (see gate.repair)"),
    "gpugate.checks": (
        0.0,
        "registry loads the catalog on first use: the catalog imports "
        "every check module, each of which imports the registry (a circle)",
    ),
    "gpugate.store.history": (
        1.3,
        "act.execute (the drain's and the unknown Xids' history steps: a healthy prolog has "
        "none), gate.guard, qualify.settle: in the guard's error path, which must survive a "
        "failing import",
    ),
    "gpugate.store.metrics": (1.0, "gate.guard: the same error path"),
    "gpugate.store.state": (0.8, "gate.guard: the same error path"),
    "gpugate.fsutil": (
        0.0,
        "tests replace fsutil.atomic_write / private_dir by name: the "
        "commands look them up when they run",
    ),
    "gpugate.fstree": (0.2, "store.evidence: inside its own try, as fsutil"),
    "gpugate.runner": (0.0, "commands.drill: tests replace runner.run by name"),
    "gpugate.userfiles": (2.6, "tests replace userfiles.as_user by name"),
    "gpugate.admin.selftest": (28.0, "commands.selftest: tests replace selftest by name"),
    "gpugate.qualify.run": (15.6, "tests put a stand-in gpugate.qualify.run in sys.modules"),
    "gpugate.qualify.sweep": (33.1, "commands.qualify: inside a try that reports its failure"),
    "gpugate.store.qualify": (1.6, "tests put a stand-in gpugate.store.qualify in sys.modules"),
    "gpugate.flightrec.reader": (3.6, "tests put a stand-in reader in sys.modules"),
    "yaml": (
        21.8,
        "PyYAML (~22 ms): only on a parsed-cache miss (yamlio) and for `profile`; "
        "kept out of every warm run by the cache (FORBIDDEN in tests/unit/commands/test_startup.py)",
    ),
    "loguru": (0.0, "optional: log.py falls back to stderr without it (150 ms to import)"),
    "pynvml": (0.0, "optional: the NVML source, only on a GPU node's live gather (40 ms)"),
    "pyslurm": (0.0, "optional: the pyslurm backend, when configured and installed"),
    "importlib.metadata": (57.4, "slurm.choose: pyslurm's version, with the pyslurm backend"),
    "torch": (0.0, "optional: the qualification payload, in the job's own environment"),
    "torch.distributed": (0.0, "the same"),
}


# Start-up allocates tens of thousands of objects (modules, classes, functions, the config's
# records) that live until exit; the cyclic collector passes over all of them several times
# while they are made (gen 0 and 1 runs during the imports, a full one at exit): ~2-3 ms of a
# 40 ms replayed check. The packaged launcher holds it off until the command's module is
# imported (cli.main calls resume_gc); the command's own work runs with it on, as always.
_gc_paused = False


def pause_gc() -> None:
    """Hold the cyclic garbage collector off for start-up (the packaged launcher calls this)."""
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def resume_gc() -> None:
    """End pause_gc's hold: what start-up made is frozen (never scanned again), collector on."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.freeze()  # start-up's objects live until exit: no collection need pass over them
        gc.enable()


def import_module(name: str) -> ModuleType:
    """The module `name`, imported: importlib.import_module without importing importlib.

    importlib (with warnings) costs a run about 1 ms; `__import__` is the same import.
    """
    __import__(name)
    return sys.modules[name]

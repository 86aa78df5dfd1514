"""Every lock file gpugate takes, where it lives and how long a hook waits for it.

Lock files are 0600 in a `locks/` directory 0700 of root's (fsutil.lock_file): a user who can
open one, even read-only, can flock it and stall every hook that waits on it (issue 25,
attack 8: a 0644 lock in node_exporter's directory held for 150 s made the next prolog run
past PrologEpilogTimeout and Slurm drain the node). No wait is unbounded; what each store does
when the lock does not come in time:

| lock | in | wait | without it |
|---|---|---|---|
| HISTORY | `<history_dir>/locks/`; the controller's votes and flags: `<controller_dir>/locks/` (the SlurmUser's) | HISTORY_WAIT_S | writes anyway (atomic rewrite; an entry may be lost to a stuck writer), says so |
| EVIDENCE | `<state_dir>/locks/` (node-local even when evidence_dir is shared) | EVIDENCE_WAIT_S | indexes the bundle, prunes at the next run |
| APP_XIDS | `<state_dir>/locks/` | APP_XIDS_WAIT_S | appends (one O_APPEND write), prunes at the next run |
| REPAIRS | `<state_dir>/locks/` | REPAIRS_WAIT_S | writes anyway (atomic), says so |
| metrics_lock() | `<state_dir>/locks/` (never node_exporter's textfile directory) | METRICS_WAIT_S | skips the update: logged, counted in gpugate_metrics_skipped_total |
| a job's digest (controller_view.note_done) | `<evidence_dir>/controller-view/<job>/locks/digest-r<run>.lock` (shared: every node of the job) | controller_view.DIGEST_WAIT_S | writes anyway (atomic rewrite; another node's entry may be lost: the controller then reads that node's record itself) |
| ISOLATE | `<state_dir>/locks/` | 0 (one try) | `gpugate isolate apply` stops: another one runs the node's isolation |
| RECONFIGURE | `<history_dir>/locks/` (every host sharing it) | `isolate.quiet_s` | no `scontrol reconfigure`: the isolation (or putting back) fails, the node stays drained (isolate/quiet.py) |

The hooks' waits are short next to their deadlines (prolog 20 s, epilog 45 s, health 20 s) even
all together; the holder can only be another gpugate run, whose hold is milliseconds.

RECONFIGURE is no hook's: `gpugate isolate apply` (detached) and `gpugate resume` hold it
across one reconfigure and the controller's restart, and wait for it as long as for a quiet
controller.
"""

from __future__ import annotations

import os

from gpugate.fsutil import LOCK_DIR
from gpugate.store.dirs import QUALIFY_FILE, controller_dir, history_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config

HISTORY = "history.lock"  # drains, audit, held, unknown Xids, suspects, qualifications, drills
EVIDENCE = "evidence.lock"  # the node's evidence index and its pruning
APP_XIDS = "app_xids.lock"  # app_xids.jsonl: appends and its pruning
REPAIRS = "repairs.lock"  # repairs.json (gpugate/gate/repair.py)
ISOLATE = "isolate.lock"  # one GPU isolation at a time per node (gpugate/isolate/apply.py)
RECONFIGURE = "reconfigure.lock"  # one gpugate `scontrol reconfigure` at a time (isolate/quiet.py)

HISTORY_WAIT_S = 5.0
EVIDENCE_WAIT_S = 5.0
APP_XIDS_WAIT_S = 5.0
REPAIRS_WAIT_S = 5.0
# A fold of the textfile takes milliseconds: past this the holder is not folding, and a
# metric is never worth a hook's time.
METRICS_WAIT_S = 0.2


def metrics_lock(textfile: str) -> str:
    """The lock file's name for one metrics textfile (`metrics-gpugate.prom.lock`)."""
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in os.path.basename(textfile))
    return f"metrics-{name}.lock"


def lock_paths(config: Config) -> list[str]:
    """Every lock file gpugate's hooks and commands may take under `config` (none created)."""
    state = os.path.join(config.state_dir, LOCK_DIR)
    shared = os.path.join(history_dir(config), LOCK_DIR)
    paths = [os.path.join(shared, HISTORY), os.path.join(shared, RECONFIGURE)]
    # EpilogSlurmctld's votes and flags, in its own directory.
    paths.append(os.path.join(controller_dir(config), LOCK_DIR, HISTORY))
    paths += [os.path.join(state, name) for name in (EVIDENCE, APP_XIDS, REPAIRS, ISOLATE)]
    textfile = config.admin.metrics_file
    if textfile:
        paths.append(os.path.join(state, metrics_lock(textfile)))
        paths.append(os.path.join(state, metrics_lock(QUALIFY_FILE)))
    return paths

"""Putting isolated GPUs back when asked on another host: the request, and the node's own run.

The deny that keeps jobs off an isolated GPU is a cgroup rule on the node itself, so only the
node can put the GPU back. `gpugate resume NODE` run elsewhere (an admin host) therefore
records a request in the shared isolation record (state.shared_path, in the history directory
the hosts share) and keeps the node drained with a reason that says who asked
(`ask_put_back`). The node's own `gpugate health` (Slurm's HealthCheckProgram, every
HealthCheckInterval) sees the request (`asked`) and starts `gpugate isolate put-back NODE` in a
session of its own: a hook never reconfigures itself (24.11's reconfigure restarts the slurmd
that waits for it, apply.py). That command takes the local resume's path (the node's checks,
the quiet controller and its lock, the files, the audit) and resumes the node; a refusal ends
the request and says why in the drain reason (`give_up`).

A site without a HealthCheckProgram (or with HealthCheckInterval=0: slurmd runs it only when it
starts) has nothing on the node to act on a request: the admin host refuses, saying so.
"""

from __future__ import annotations

import time

from gpugate.isolate import state
from gpugate.slurm.reasons import drain_reason

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl

# A started put-back holds the node this long at most before health may start it again: the
# quiet wait (isolate.quiet_s), Slurm settling (isolate.settle_s) and the checks' own time.
RESTART_SLACK_S = 120.0


class Refused(RuntimeError):
    """The put-back cannot be asked from here; str(exc) says why and what to do instead."""


def health_check(shown: str) -> tuple[str, int]:
    """(HealthCheckProgram, HealthCheckInterval in seconds) from `scontrol show config`; ("",
    0) where unset (Slurm prints `(null)` and `0 sec`: src/api/config_info.c)."""
    program, interval = "", 0
    for line in shown.splitlines():
        name, eq, value = line.partition("=")
        if not eq:
            continue
        key, value = name.strip(), value.strip()
        if key == "HealthCheckProgram" and value not in ("", "(null)"):
            program = value
        elif key == "HealthCheckInterval":
            first = value.split()[0] if value.split() else ""
            interval = int(first) if first.isdigit() else 0
    return program, interval


def gpu_names(record: state.Isolation) -> str:
    """`GPU 3` or `GPU 3, GPU 5`: the GPUs as isolated (their NVML index then)."""
    return ", ".join(f"GPU {g.gpu.index}" for g in record.gpus)


def ask_put_back(
    config: Config, slurm: SlurmControl, node: str, who: str, host: str, why: str = ""
) -> str:
    """On a host other than `node`: ask the node's health check to put its isolated GPUs back.
    Records the request, drains the node (or keeps gpugate's drain) with a reason naming who
    asked; returns what will happen and when. Refused when nothing on the node would act
    (no HealthCheckProgram), or the node is not gpugate's to drain."""
    record = state.load(state.shared_path(config, node))
    if record is None or record.state != state.APPLIED:
        raise Refused(f"{node} has no GPU isolated")
    program, interval = health_check(slurm.cli.scontrol("show", "config"))
    if not program or interval <= 0:
        what = "no HealthCheckProgram" if not program else "HealthCheckInterval=0"
        raise Refused(
            f"{what} in slurm.conf: nothing on {node} would put the GPU back. Run `gpugate "
            f"resume {node}` on {node} itself, or set HealthCheckProgram=<gpugate's health "
            "wrapper> and HealthCheckInterval (docs/guide/isolation.md)"
        )
    names = gpu_names(record)
    info = slurm.node(node)
    if info.drained and info.reason and not info.gpugate_owned:
        raise Refused(
            f"{node} is drained by {info.reason_user or 'someone else'} ({info.reason!r}); "
            "gpugate does not replace that drain"
        )
    asked = state.PutBack(who=who, host=host, asked=time.time(), why=why)
    state.save(config, record.replace(put_back=asked), local=False)
    # Drained first: no new job starts while it waits; the put-back resumes it.
    slurm.drain(node, drain_reason("isolate", f"putting back {names} (asked by {who} on {host})"))
    # gpugate cannot see inside another program (NHC may call `gpugate health`): it says what
    # must hold rather than refuse a site whose wrapper does it.
    other = "" if "gpugate" in program else (
        f" (HealthCheckProgram is {program}, not gpugate's: it must run `gpugate health` for "
        "this to happen)"
    )  # fmt: skip
    return (
        f"{names} of {node}: put-back asked; {node} is drained meanwhile. Its health check "
        f"({program}, every {interval} s) puts the GPU back once its jobs have ended and "
        f"its checks pass, then resumes it{other}; `gpugate nodes` shows the node's reason "
        "until then"
    )


def asked(config: Config, node: str) -> state.Isolation | None:
    """On the node: its shared record when a put-back was asked (started or not); else None.
    Never raises (an unreadable record asks nothing)."""
    try:
        record = state.load(state.shared_path(config, node))
    except ValueError:
        return None
    if record is None or record.state != state.APPLIED or record.put_back is None:
        return None
    return record


def under_way(config: Config, record: state.Isolation, now: float | None = None) -> bool:
    """Whether the asked put-back was started recently enough that it may still run (its
    quiet wait, Slurm settling): not started again meanwhile."""
    started = record.put_back.started if record.put_back else 0.0
    iso = config.isolate
    hold = (iso.quiet_s + iso.settle_s if iso else 330.0) + RESTART_SLACK_S
    return bool(started) and (now if now is not None else time.time()) - started < hold


def mark_started(config: Config, record: state.Isolation) -> None:
    """Note in the shared record that the node started the put-back now."""
    if record.put_back is not None:
        started = record.put_back.replace(started=time.time())
        state.save(config, record.replace(put_back=started), local=False)


def who_asked(record: state.Isolation) -> str:
    """`alice on admin1`: for the audit and the reasons; "" without a request."""
    asked = record.put_back
    return f"{asked.who} on {asked.host}" if asked else ""


def give_up(config: Config, slurm: SlurmControl, node: str, why: str) -> None:
    """A put-back the node refused: the request ends (an admin asks again), the node stays
    drained with a reason that says why, the GPUs stay out (their record as it was)."""
    try:
        record = state.load(state.shared_path(config, node))
    except ValueError:
        record = None
    if record is not None and record.put_back is not None:
        names, asker = gpu_names(record), who_asked(record)
        state.save(config, record.replace(put_back=None), local=False)
        detail = f"{names} not put back (asked by {asker}): {why}"
        slurm.drain(node, drain_reason("isolate", detail))

"""The qualification's Slurm jobs: their batch scripts and sbatch argv (no Slurm call here).

A batch script is written by gpugate into the run's root-only directory, from validated node
names and the site's config only, every word shell-quoted: no user input reaches it. A node's
job runs the DCGM step through gpugate's own interpreter (`gpugate qualify --step dcgm` by
child.cli_command(): this process's python and sys.path, so the .deb's /opt/gpugate/lib too;
its stderr kept in STEP_STDERR), then the payload (payload.py, a standalone script the site's
torch interpreter runs) under srun: `allreduce` across the node's ranks and `h2d` once per node.
A pair's job runs the all-reduce across both nodes. Each step writes its own JSON result file;
one failing step does not stop the next, and the script's exit status says whether any failed.
A qualify.python the node does not have is checked before srun: the test's result is then
"not run" with the fix (issue 28), never an error of the node.
"""

from __future__ import annotations

import json
import os
import shlex

from gpugate.child import cli_command
from gpugate.qualify.progress import STEP_MARK
from gpugate.slurm.control import valid_node_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpugate.config.schema import Qualify

JOB_NAME = "gpugate-qualify"
PAYLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "payload.py")
# MASTER_PORT from the job id: concurrent jobs (a round's pairs, nodes sharing one host in a
# test cluster) never pick the same port; the range stays clear of the ephemeral ports.
_PORT = "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))"
# The batch step runs on the allocation's first node: the all-reduce's rendezvous.
_ADDR = 'export MASTER_ADDR="$(hostname)"'
# The DCGM step's stderr, next to its result: when gpugate cannot start on the node (its python
# cannot import gpugate), the judge names the error instead of "no result" (issue 28).
STEP_STDERR = "dcgm.stderr"


def q(word: object) -> str:
    """One shell word, quoted."""
    return shlex.quote(str(word))


def _step(argv: list[str], stderr: str | None = None) -> str:
    """One script line running `argv`; a failure is remembered, the script goes on. `stderr`:
    a file that keeps the step's stderr (copied to the job's output after it)."""
    line = " ".join(q(a) for a in argv)
    if stderr:
        return f"{line} 2>{q(stderr)} || rc=1; cat {q(stderr)} >&2"
    return line + " || rc=1"


def _payload_step(python: str, argv: list[str], test: str, out: str) -> str:
    """The srun line of a payload test, run only when qualify.python is there to run it; else
    the test's "not run" result, with the fix (the node is not at fault: issue 28)."""
    why = {"test": test, "not_run": f"qualify.python {python} is not found or not executable "
           "on the job's node", "fix": "install PyTorch there and set qualify.python to its "
           "interpreter (e.g. /opt/pytorch/bin/python), or drop allreduce,h2d,pairs from "
           "--tests"}  # fmt: skip
    note = json.dumps(why, sort_keys=True)
    return (
        f"if command -v {q(python)} >/dev/null 2>&1; then {_step(argv)}; "
        f"else printf '%s\\n' {q(note)} > {q(out)}; fi"
    )


def _mark(name: str) -> str:
    """The line announcing a step in the job's output: `gpugate qualify` shows the step running
    (progress.last_step)."""
    return f"echo {q(STEP_MARK + name)}"


def node_script(
    run_dir: str, node: str, tests: list[str], qc: Qualify, level: int, ntasks: int
) -> str:
    """The batch script of one node's job: DCGM step, intra-node all-reduce, h2d."""
    node = valid_node_name(node)
    out = os.path.join(run_dir, node)
    lines = [f"# gpugate qualify: node {node}", f"mkdir -p {q(out)}"]
    if "dcgm" in tests:
        lines.append(_mark("dcgm"))
        timeout = max(60, qc.time_limit_min * 60 - 120)  # leave the payload its share
        lines.append(_step([*cli_command(), "qualify", "--step", "dcgm",
                            "--level", str(level), "--dcgmi", qc.dcgmi, "--node", node,
                            "--timeout", str(timeout), "--out", f"{out}/dcgm.json"],
                           stderr=f"{out}/{STEP_STDERR}"))  # fmt: skip
    if "allreduce" in tests:
        lines.append(_mark("allreduce"))
        lines.append(_payload_step(qc.python, ["srun", f"--ntasks-per-node={ntasks}", qc.python,
                     PAYLOAD, "allreduce", *_sizes(qc), "--out", f"{out}/allreduce.json"],
                     "allreduce", f"{out}/allreduce.json"))  # fmt: skip
    if "h2d" in tests:
        lines.append(_mark("h2d"))
        lines.append(_payload_step(qc.python, ["srun", "--ntasks=1", "--ntasks-per-node=1",
                     qc.python, PAYLOAD, "h2d", "--out", f"{out}/h2d.json"], "h2d",
                     f"{out}/h2d.json"))  # fmt: skip
    return _script(lines)


def pair_script(run_dir: str, pair: tuple[str, str], qc: Qualify, ntasks: int) -> str:
    """The batch script of one pair's job: the all-reduce across both nodes."""
    a, b = (valid_node_name(n) for n in pair)
    out = os.path.join(run_dir, f"pair-{a}-{b}")
    lines = [f"# gpugate qualify: pair {a} {b}", f"mkdir -p {q(out)}", _mark("allreduce"),
             _payload_step(qc.python, ["srun", f"--ntasks-per-node={ntasks}", qc.python, PAYLOAD,
                           "allreduce", *_sizes(qc), "--out", f"{out}/allreduce.json"],
                           "allreduce", f"{out}/allreduce.json")]  # fmt: skip
    return _script(lines)


def _sizes(qc: Qualify) -> list[str]:
    return ["--size-mib", str(qc.size_mib), "--iters", str(qc.iters)]


def _script(body: list[str]) -> str:
    head = ["#!/bin/sh", "# Written by gpugate (gpugate/qualify/jobs.py); run as root by Slurm.",
            "rc=0", _ADDR, _PORT]  # fmt: skip
    return "\n".join([*head, *body, "exit $rc", ""])


def result_path(run_dir: str, nodes: tuple[str, ...] | list[str], test: str) -> str:
    """Where a job's step writes its result: `<node>/<test>.json`, `pair-A-B/allreduce.json`."""
    where = nodes[0] if len(nodes) == 1 else f"pair-{nodes[0]}-{nodes[1]}"
    return os.path.join(run_dir, where, f"{test}.json")


def sbatch_argv(
    script: str,
    nodes: list[str],
    qc: Qualify,
    ntasks: int,
    output: str,
    reservation: str | None,
    gpus_per_node: int | None = None,
) -> list[str]:
    """`sbatch` for one qualification job: exclusive, on exactly these nodes, the site's
    reservation/partition/QOS/account, a time limit, never requeued."""
    names = [valid_node_name(n) for n in nodes]
    argv = ["sbatch", "--parsable", f"--job-name={JOB_NAME}", f"--nodes={len(names)}",
            f"--nodelist={','.join(names)}", "--exclusive", f"--ntasks-per-node={ntasks}",
            f"--time={qc.time_limit_min}", f"--output={output}",
            f"--chdir={os.path.dirname(output)}", "--no-requeue",
            # job_submit.lua (submit-policy) asks multi-node jobs for a checkpoint directory.
            "--comment=gpugate:no-ckpt"]  # fmt: skip
    if qc.nice:  # a sweep's jobs wait behind the users' (gpugate/qualify/sweep.py)
        argv.append(f"--nice={int(qc.nice)}")
    if gpus_per_node:
        # Every GPU of the node for the job's tasks (an exclusive job's CPUs are not its GPUs).
        argv.append(f"--gres=gpu:{int(gpus_per_node)}")
    for flag, value in (("reservation", reservation), ("partition", qc.partition),
                        ("qos", qc.qos), ("account", qc.account)):  # fmt: skip
        if value:
            if str(value).startswith("-"):
                raise ValueError(f"qualify.{flag}: {value!r} is not a Slurm name")
            argv.append(f"--{flag}={value}")
    return [*argv, script]


def ntasks_for(qc: Qualify, gres_gpus: int | None, cpus: int | None = None) -> int:
    """Ranks per node: qualify.ntasks_per_node, else one per GPU from Gres (1 without), never
    more than the node's CPUs: a default must fit the node it runs on (a test node with 8 GPUs
    in Gres and 2 CPUs gets 2 ranks; a set value above the CPUs is refused, run.check_nodes)."""
    if qc.ntasks_per_node:
        return qc.ntasks_per_node
    ranks = gres_gpus if gres_gpus else 1
    return min(ranks, cpus) if cpus else ranks

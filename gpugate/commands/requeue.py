"""`gpugate requeue JOBID [--dry-run]`: the controller's requeue decision, by hand."""

from __future__ import annotations

import json
import sys

from gpugate.cli import make_parser
from gpugate.commands.ask import ask_slurm_for
from gpugate.gate.requeue import JobEnd
from gpugate.hooks.epilog_slurmctld import run_requeue

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser
    from collections.abc import Callable

    from gpugate.config.schema import Config
    from gpugate.slurm.control import SlurmControl


def parser() -> ArgumentParser:
    """Options of `gpugate requeue`."""
    p = make_parser(
        "gpugate requeue",
        "Decide, as EpilogSlurmctld would, whether a finished job is requeued (infrastructure "
        "cause, opted in, restarts left), and do it: requeue, exclude the suspected nodes, "
        "record the checkpoint it resumes from. Exit 0 when requeued (or would be), 1 when not "
        "(or when Slurm does not know the job), 2 when JOBID is not one job id (123 or 123_4).",
    )
    p.add_argument("job_id", metavar="JOBID")
    p.add_argument("--dry-run", action="store_true", help="decide and print, change nothing")
    p.add_argument("--json", action="store_true", help="print the decision as JSON")
    p.add_argument("--config", metavar="FILE", help="site config")
    return p


def main(argv: list[str], make_slurm: Callable[[Config], SlurmControl] | None = None) -> int:
    """Run `gpugate requeue`; `make_slurm` makes the Slurm backend (default: the site's)."""
    args = parser().parse_args(argv)

    found = ask_slurm_for(
        "gpugate requeue",
        "job",
        args.job_id,
        args.config,
        lambda slurm, job: slurm.job(job),
        make_slurm,
    )
    if isinstance(found, int):
        return found
    config, slurm, info = found
    job = JobEnd(job_id=str(info.job_id), uid=info.uid, comment=info.comment or "", restarts=info.restarts,
                 state=info.state, nodes=tuple(info.nodes))  # fmt: skip
    decision, done = run_requeue(config, job, slurm, wait_s=0, dry_run=args.dry_run)
    if args.json:
        sys.stdout.write(json.dumps({**decision.to_dict(), "steps": done}, indent=1) + "\n")
    else:
        sys.stdout.write(
            f"job {job.job_id}: {decision.describe()}\n" + "".join(f"  {d}\n" for d in done)
        )
    return 0 if decision.requeue else 1

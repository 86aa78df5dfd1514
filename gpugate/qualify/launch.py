"""Qualifications a hook starts in a detached child: a suspect's (gpugate/gate/suspicion.py)
and a repaired node's before its resume (the repair ladder, gpugate/gate/ladder.py)."""

from __future__ import annotations

from gpugate import log
from gpugate.config import load_config


def qualify_suspect(node: str, trigger: str, config: str | None = None) -> bool:
    """In the detached child: qualify `node` at the configured level; whether it passed.

    The node is in service: qualify_nodes reserves it (MAINT, IGNORE_JOBS: its running jobs
    finish, no new one starts) and runs the jobs when it is free. A failure drains it as any
    root-evidenced fault does; a pass closes the suspicion (gpugate/store/suspects.py closed_at).
    """
    from gpugate.qualify.run import qualify_nodes
    from gpugate.slurm.choose import backend

    cfg = load_config(config)
    if cfg.qualify is None:
        return False
    slurm = backend(cfg.slurm.backend, timeout=cfg.slurm.timeout_s)
    try:
        run = qualify_nodes(cfg, slurm, [node], cfg.qualify.level, None,
                            requested_by="gpugate (suspect)", trigger=trigger)  # fmt: skip
    except Exception as exc:  # the flag stays open; the sweep or an admin takes it
        log.error(cfg.state_dir, f"qualify {node} (suspect): not run", exc)
        return False
    return bool(run.verdicts[node]["passed"])


def qualify_repaired(node: str, level: int, config: str | None = None) -> bool:
    """In the detached child: qualify the repaired, drained `node` at `level`; whether it passed.

    qualify_nodes resumes the drained node into gpugate's reservation, runs the node's own
    jobs (no pairs: one node), and settles: a pass resumes it, audited (resume_passed); a
    failure drains it again for the failed test, and the ladder starts over on that drain.
    """
    from gpugate.qualify.run import qualify_nodes
    from gpugate.slurm.choose import backend

    cfg = load_config(config)
    if cfg.qualify is None:
        return False
    tests = [t for t in cfg.qualify.tests if t != "pairs"]  # one node: no pair to test
    slurm = backend(cfg.slurm.backend, timeout=cfg.slurm.timeout_s)
    try:
        run = qualify_nodes(cfg, slurm, [node], level, tests or None, resume_passed=True,
                            requested_by="gpugate (repair)", trigger="after a repair")  # fmt: skip
    except Exception as exc:  # the node stays drained: the ledger says it was started
        log.error(cfg.state_dir, f"qualify {node} (after a repair): not run", exc)
        return False
    return bool(run.verdicts[node]["passed"])
